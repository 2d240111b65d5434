"""Fast per-sample clipping for chains of Linear / Conv2d / GroupNorm / LayerNorm / Embedding layers
("ghost clipping").

For a Linear layer ``z_s = W a_s + b`` the per-sample gradient is ``G_s a_s^T`` (``G_s = dl_s/dz_s``),
so its squared norm is ``||G_s||^2 ||a_s||^2`` (+ ``||G_s||^2`` for the bias) — no per-sample
gradient is ever formed. Applied at ``T`` positions of a sample (``a_s`` of shape ``(T, in)``, a
token sequence), it is ``G_s^T A_s``: formed directly or as ``<G_s G_s^T, A_s A_s^T>``, as for a
convolution below. The clipped sum ``sum_s w_s G_s a_s^T`` is one batched matmul
``(w * G)^T a``. For Conv2d with unfolded input ``U_s (Ck^2, L)`` and ``G_s (O, L)`` the per-sample
gradient is ``G_s U_s^T``; its squared norm is either formed directly (cost ``O Ck^2 L``) or as
``<G_s^T G_s, U_s^T U_s>`` (cost ``L^2 (O + Ck^2)``), whichever is cheaper. For an Embedding
read at the indices ``t_1 .. t_L`` of sample ``s`` the per-sample gradient is
``sum_l e_{t_l} G_{s,l}^T``: its rows are the sums of ``G_{s,l}`` over the positions of each
distinct index, so its squared norm is ``sum_v ||sum_{l: t_l = v} G_{s,l}||^2`` (one segment sum
over the distinct (sample, index) pairs, cost ``O(L D)`` a sample, where the per-sample gradient
would hold ``V D`` entries), and the clipped sum is one ``index_add`` of ``w_s G_{s,l}`` into the
table rows.

One forward and one backward to the layer outputs serve all nodes and samples; this reproduces
DP-SGD's per-example clipping (DECOR Alg. 1 line 2, Robust-HDP Alg. 1) exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from privdl.engine.clipping import ClipKind, clip_factor
from privdl.models.attention import InProjection, SelfAttention
from privdl.models.base import (
    Activation,
    AvgPool2d,
    Conv2d,
    Flatten,
    GroupNorm,
    Layer,
    Linear,
    MaxPool2d,
    StackedModel,
)
from privdl.models.recurrent import Recurrent
from privdl.models.sequence import (
    AddParameter,
    Conv1d,
    Embedding,
    Index,
    LayerNorm,
    Reduce,
    Transpose,
)

_SAMPLEWISE = (
    Linear, Conv2d, Activation, MaxPool2d, AvgPool2d, Flatten, GroupNorm, LayerNorm, Embedding,
    Reduce, Conv1d, Transpose, InProjection, SelfAttention, AddParameter, Index, Recurrent,
)  # fmt: skip
ConvMode = Literal["auto", "direct", "ghost"]


def unfold(x: Tensor, kernel_size: int, *, padding: int, stride: int) -> Tensor:
    """``F.unfold(x, kernel_size, padding=padding, stride=stride)`` for ``x (B, C, H, W)``: the
    patches ``(B, C k^2, L)`` as one strided copy of the zero-padded input.

    Same values bit for bit (a copy; tested against ``F.unfold``). On a quiet 2-core CPU it is
    as fast as torch's ``im2col`` (benchmarks/bench_cnn.py); with another process keeping both
    cores busy, ``im2col`` degraded 10-80x where this copy did not.
    """
    b, c, h, w = x.shape
    xp = F.pad(x, (padding,) * 4) if padding else x.contiguous()
    out_h = (h + 2 * padding - kernel_size) // stride + 1
    out_w = (w + 2 * padding - kernel_size) // stride + 1
    s0, s1, s2, s3 = xp.stride()
    patches = xp.as_strided(
        (b, c, kernel_size, kernel_size, out_h, out_w),
        (s0, s1, s2, s3, s2 * stride, s3 * stride),
    )
    return patches.reshape(b, c * kernel_size * kernel_size, out_h * out_w)


def per_sample_conv_weight_grads(
    x: Tensor, g: Tensor, kernel_size: int, *, padding: int, stride: int
) -> Tensor:
    """Per-sample weight gradients ``G_s U_s^T`` of a conv layer, ``(B, O, C k^2)`` in the
    weight's ``(O, C, k, k)`` order, from its input ``x (B, C, H, W)`` and output gradient
    ``g (B, O, H', W')``.

    With stride 1 the patches are unfolded along the kernel's columns only (``k`` shifted
    copies of the padded input, ``C k Hp W'`` per sample instead of ``C k^2 H' W'``): for
    kernel row ``kh`` the patch matrix is then a plain strided view, rows ``kh .. kh + H'`` of
    that copy, so one ``bmm`` per kernel row reads it without a further copy. The values equal
    ``bmm(G, unfold(x)^T)`` up to rounding (tested; bit for bit on the Robust-HDP CNN's
    float32 shapes); on 2 CPU cores that CNN's second conv took 95 instead of 176 us per
    sample. Other strides take the full unfold.
    """
    rows = _conv_grads_by_kernel_row(x, g, kernel_size, padding=padding, stride=stride)
    if rows.shape[0] == 1:
        return rows[0]
    b, o, k = g.shape[0], g.shape[1], kernel_size
    return rows.view(k, b, o, -1, k).permute(1, 2, 3, 0, 4).reshape(b, o, -1)


def _conv_grads_by_kernel_row(
    x: Tensor, g: Tensor, kernel_size: int, *, padding: int, stride: int
) -> Tensor:
    """The per-sample conv weight gradients as ``(R, B, O, F)``: for stride 1, ``R = k``
    kernel rows of ``F = C k`` entries in ``(c, kw)`` order; otherwise ``R = 1``, ``F = C k^2``.
    Each kernel row's ``bmm`` writes straight into its slice (no stacking copy)."""
    b, o = g.shape[:2]
    gf = g.reshape(b, o, -1)
    k = kernel_size
    if stride != 1:
        u = unfold(x, k, padding=padding, stride=stride)
        return torch.bmm(gf, u.transpose(1, 2)).unsqueeze(0)
    xp = F.pad(x, (padding,) * 4) if padding else x
    _, c, hp, wp = xp.shape
    out_h, out_w = hp - k + 1, wp - k + 1
    s0, s1, s2, s3 = xp.stride()
    # cols[s, c, kw, h, j] = xp[s, c, h, j + kw]
    cols = xp.as_strided((b, c, k, hp, out_w), (s0, s1, s3, s2, s3)).reshape(b, c * k, -1)
    rows = torch.empty((k, b, o, c * k), dtype=gf.dtype, device=gf.device)
    for kh in range(k):  # kernel rows, not nodes or samples
        torch.bmm(gf, cols[:, :, kh * out_w : (kh + out_h) * out_w].transpose(1, 2), out=rows[kh])
    return rows


#: The smallest kernel size :func:`_conv_grads_grouped` takes. Measured (2026-11-28, one CPU
#: thread under load, grouped / kernel-row time): the Robust-HDP CNN's 5x5 convs 0.45-0.92 (second
#: conv, 20-200 samples) and 0.69-1.17 (first conv); 3x3 convs of ResNet shapes at 8 samples
#: anywhere from 0.19 (64 -> 64 channels, 16x16) to 10.3 (3 -> 64, 32x32) and 2.55 (128 -> 128,
#: 8x8), so they keep the kernel rows.
GROUPED_MIN_KERNEL = 5


def _grouped_backward_applies(x: Tensor, kernel_size: int) -> bool:
    """Whether :func:`_conv_grads_grouped` serves this input: float32 on a CPU with oneDNN
    (mkldnn) and a kernel of at least :data:`GROUPED_MIN_KERNEL`. Others keep
    :func:`_conv_grads_by_kernel_row` (float64 has no oneDNN kernel; the CUDA path is left as
    it is)."""
    return (
        kernel_size >= GROUPED_MIN_KERNEL
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


def _conv_grads_grouped(
    x: Tensor, g: Tensor, kernel_size: int, *, padding: int, stride: int
) -> Tensor:
    """The per-sample conv weight gradients of :func:`_conv_grads_by_kernel_row`, in its layout
    (``(k, B, O, C k)`` kernel rows for stride 1, else ``(1, B, O, C k^2)``), by one grouped
    weight-gradient call: the ``B`` samples side by side as ``B`` groups
    of one convolution (input ``(1, B C, H, W)``, weight ``(B O, C, k, k)``), so the gradient of
    group ``s``'s weight is sample ``s``'s ``G_s U_s^T`` (the grouped-convolution form of
    per-example conv gradients, Rochette, Manoel & Tramel 2019), by oneDNN's kernel. On the
    2-core CPU (float32, one thread, under load) it took 0.71x the kernel-row path's time for
    the Robust-HDP CNN's second conv at 200 samples with the layout copy (0.45x without it); the
    same values bit for bit on that CNN (docs/engine.md, the federated round)."""
    b, c, h, w = x.shape
    o = g.shape[1]
    out_h = (h + 2 * padding - kernel_size) // stride + 1
    out_w = (w + 2 * padding - kernel_size) // stride + 1
    weight = x.new_empty((b * o, c, kernel_size, kernel_size))  # its shape only, never read
    grad = torch.ops.aten.convolution_backward(
        g.reshape(1, b * o, out_h, out_w),
        x.reshape(1, b * c, h, w),
        weight,
        None,
        [stride, stride],
        [padding, padding],
        [1, 1],
        False,
        [0, 0],
        b,
        [False, True, False],
    )[1]
    k = kernel_size
    if stride != 1:
        return grad.reshape(1, b, o, c * k * k)
    # the kernel-row layout (k, B, O, C k) of _conv_grads_by_kernel_row, so that the norms and
    # the weighted sum downstream run the same reductions (one copy of B O C k^2 entries)
    return grad.view(b, o, c, k, k).permute(3, 0, 1, 2, 4).contiguous().view(k, b, o, c * k)


def _direct_is_cheaper(out_channels: int, patch_rows: int, positions: int) -> bool:
    """``conv_mode="auto"``'s choice: the direct per-sample gradient ``G_s U_s^T`` (cost
    ``O Ck^2 L``) over the Gram form ``<G^T G, U^T U>`` (cost ``L^2 (O + Ck^2)``)."""
    o, ck, length = out_channels, patch_rows, positions
    return o * ck * length <= length * length * (o + ck)


def _positional_linear_norms(a: Tensor, g: Tensor, *, bias: bool) -> list[Tensor]:
    """Rows (n, B) of the per-sample gradient norms of a Linear applied at ``T`` positions,
    ``a (n, B, *T, in)``, ``g (n, B, *T, out)``: the weight's ``G_s^T A_s`` formed directly (cost
    ``T in out``) or as ``<G_s G_s^T, A_s A_s^T>`` (cost ``T^2 (in + out)``), whichever is
    cheaper (module docstring's conv rule, :func:`_direct_is_cheaper`); the bias's
    ``sum_t G_st``."""
    n, b = a.shape[:2]
    flat_a = a.reshape(n * b, -1, a.shape[-1])  # (nB, T, in)
    flat_g = g.reshape(n * b, -1, g.shape[-1])  # (nB, T, out)
    positions, d_in, d_out = flat_a.shape[1], flat_a.shape[2], flat_g.shape[2]
    if _direct_is_cheaper(d_out, d_in, positions):
        per_sample = torch.bmm(flat_g.transpose(1, 2), flat_a)  # (nB, out, in)
        weight = torch.linalg.vector_norm(per_sample.flatten(1), dim=1)
    else:
        gram = torch.bmm(flat_g, flat_g.transpose(1, 2)) * torch.bmm(flat_a, flat_a.transpose(1, 2))
        weight = gram.sum((1, 2)).clamp_min(0).sqrt()
    rows = [weight.reshape(n, b)]
    if bias:
        rows.append(torch.linalg.vector_norm(flat_g.sum(1), dim=-1).reshape(n, b))
    return rows


def embedding_norms(tokens: Tensor, g: Tensor, vocabulary: int) -> Tensor:
    """Per-sample gradient norms ``(n, B)`` of an Embedding read at ``tokens (n, B, L)`` (int64,
    in ``0 .. V - 1``) with output gradients ``g (n, B, L, D)`` (module docstring): the
    gradients of equal indices of a sample summed (one ``unique`` and one ``index_add`` over
    the ``n B L`` positions), then the squared row norms summed per sample."""
    n, b, length, d = g.shape
    if length == 1:  # one index a sample: its row is G_s
        return torch.linalg.vector_norm(g[:, :, 0], dim=-1)
    sample = torch.arange(n * b, device=tokens.device).reshape(n, b, 1)
    keys, where = torch.unique((sample * vocabulary + tokens).reshape(-1), return_inverse=True)
    rows = g.new_zeros((len(keys), d)).index_add_(0, where, g.reshape(-1, d))
    row_sq = torch.linalg.vector_norm(rows, dim=1).square()
    squared = g.new_zeros(n * b).index_add_(0, keys // vocabulary, row_sq)
    return squared.sqrt().reshape(n, b)


def supports_ghost(model: StackedModel) -> bool:
    """True when the model runs its layers through ``forward_with`` and lists them with
    ``layer_inputs`` (:class:`SequentialModel`, and the graph of a traced module with residual
    sums, ``privdl.models.module.GraphModuleModel``; each parameterised layer runs once), and
    every layer acts on each sample separately and is one we can ghost-clip."""
    listed = getattr(model, "layer_inputs", None)
    return (
        callable(listed)
        and callable(getattr(model, "forward_with", None))
        and all(type(layer) in _SAMPLEWISE for _, layer, _ in listed())
    )


def patch_elements(model: StackedModel) -> int:
    """Per-sample size of the conv patches the ghost path forms (``conv_mode="auto"``): sum over
    Conv2d layers of ``C k Hp W'`` for a stride-1 layer in the direct form (column-only
    unfolding, :func:`per_sample_conv_weight_grads`) and ``C k^2 L`` otherwise (``L = H' W'``
    output positions, ``Hp`` the padded input height)."""
    total = 0
    for _, layer, shape in model.layer_inputs():  # type: ignore[attr-defined]
        if isinstance(layer, Conv2d):
            _, out_h, out_w = layer.out_shape(shape)
            o, ck, length = (
                layer.out_channels,
                layer.in_channels * layer.kernel_size**2,
                out_h * out_w,
            )
            if _direct_is_cheaper(o, ck, length) and layer.stride == 1:
                padded_h = shape[1] + 2 * layer.padding
                total += layer.in_channels * layer.kernel_size * padded_h * out_w
            else:
                total += ck * length
    return total


#: ``method="auto"`` on a CPU takes the ghost path while the conv patches per sample are at
#: most this many times the parameters. Measured (2026-11-24, one CPU thread, 16 nodes x 64
#: samples of 1x28x28, vmap / ghost time per clipped step): patches/p = 0.63 -> 1.31x,
#: 0.85 (the Robust-HDP CNN) -> 1.48x, 2.54 (a GroupNorm CNN) -> 1.27x, 8.4 (two 32-channel
#: 3x3 convs at full resolution) -> 0.74x; the crossover lies between 2.5 and 8.4.
GHOST_PATCH_RATIO = 3.0


def prefers_ghost(model: StackedModel, device: torch.device) -> bool:
    """``method="auto"``'s choice: the ghost path where it applies, except on a CPU when its conv
    patches per sample exceed :data:`GHOST_PATCH_RATIO` times the parameters vmap's per-sample
    gradients would hold.

    The Robust-HDP MNIST CNN has p = 28,938 and, with column-only unfolding, 24,640 patch
    entries per sample (98,000 with the full unfold, when vmap was 1.6x faster): on 2 CPU cores
    a federated round (20 clients, Dist6 batch sizes) took 16.4 s by the ghost path against
    22.8 s by vmap (2026-11-23). MLPs have no patches. GPUs keep the ghost path, on which the
    engine benchmarks were taken.
    """
    if not supports_ghost(model):
        return False
    if device.type != "cpu":
        return True
    n_params = sum(math.prod(shape) for shape in model.param_shapes().values())
    return patch_elements(model) <= GHOST_PATCH_RATIO * n_params  # type: ignore[arg-type]


def ghost_clipped_sum(
    model: StackedModel,
    params: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    mask: Tensor | None,
    weights: Tensor | float,
    threshold: float,
    kind: ClipKind,
    conv_mode: ConvMode = "auto",
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """``sum_s weights[:, s] * clip(g_s)`` per node, the per-sample losses and gradient norms.

    Returns ``(grads, losses (n, B), norms (n, B))``; masked samples have zero norm and weight.
    """
    records: list[tuple[str, Layer, dict[str, Tensor], Tensor, Tensor]] = []

    def run(lname: str, layer, lp: dict[str, Tensor], a: Tensor) -> Tensor:
        """One layer; a parameterised one's input (its ``x_hat`` for GroupNorm) and output
        are recorded for the per-sample norms."""
        lp = {k: v.detach() for k, v in lp.items()}
        if isinstance(layer, (Linear, Conv2d, Conv1d, Embedding)):
            inp, z = a.detach(), layer.forward(lp, a)
        elif isinstance(layer, (GroupNorm, LayerNorm)) and layer.affine:
            xhat = layer.normalize(a)  # the affine map's input
            inp, z = xhat.detach(), layer.affine_map(lp, xhat)
        elif isinstance(layer, AddParameter) and lp:
            inp, z = a.detach(), layer.forward(lp, a)  # its gradient is the output gradient's
        elif isinstance(layer, Recurrent):  # two token-wise Linear maps a layer, recorded
            maps: list[Any] = []
            out = layer.run(lp, a, record=maps)
            records.extend((lname, m, mp, m_in, m_out) for m, mp, m_in, m_out in maps)
            return out
        else:
            return layer.forward(lp, a)
        if not z.requires_grad:
            z.requires_grad_(True)
        records.append((lname, layer, lp, inp, z))
        return z

    with torch.enable_grad():
        a = model.forward_with(params, x, run)  # type: ignore[attr-defined]
        losses = loss_fn(a, y)
        total = (losses * mask).sum() if mask is not None else losses.sum()
        outs = torch.autograd.grad(total, [r[4] for r in records])

    n, b = x.shape[:2]
    # rows r_j (n, B) with ||g_s||^2 = sum_j r_j^2: one vector norm over the rows at the end
    rows: list[Tensor] = []
    # (name, layer, input or per-sample grads: None for a direct-path Conv2d, which has psg, ...)
    cache: list[tuple[str, Layer, Any, Any, Tensor | None]] = []
    for (lname, layer, lp, inp, _), g in zip(records, outs, strict=True):
        if isinstance(layer, Linear) and inp.dim() > 3:  # positions: (n, B, *T, in)
            rows.extend(_positional_linear_norms(inp, g, bias="bias" in lp))
            cache.append((lname, layer, inp, g, None))
        elif isinstance(layer, Linear):
            # ||G_s a_s^T||_F = ||G_s|| ||a_s||; the bias gradient G_s has norm ||G_s||
            g_norm = torch.linalg.vector_norm(g, dim=-1)
            rows.append(g_norm * torch.linalg.vector_norm(inp, dim=-1))
            if "bias" in lp:
                rows.append(g_norm)
            cache.append((lname, layer, inp, g, None))
        elif isinstance(layer, Conv1d):  # a Linear at the L' positions: G_s U_s^T, U_s the patches
            u = layer.patches(inp)  # (nB, C k, L')
            patch_rows = u.transpose(1, 2).reshape(n, b, u.shape[2], u.shape[1])
            rows.extend(_positional_linear_norms(patch_rows, g.transpose(2, 3), bias="bias" in lp))
            cache.append((lname, layer, u.reshape(n, b, *u.shape[1:]), g, None))
        elif isinstance(layer, Embedding):
            tokens = inp.long().reshape(n, b, -1)
            flat_g = g.reshape(n, b, tokens.shape[2], -1)
            read = layer.read(tokens)
            if read is not None:  # the padding row gets no gradient
                flat_g = flat_g * read.to(flat_g.dtype)
            rows.append(embedding_norms(tokens, flat_g, layer.num_embeddings))
            cache.append((lname, layer, layer.rows(tokens), flat_g, None))
        elif isinstance(layer, LayerNorm):
            # per-sample gradients of the elementwise weight and bias: the sums over the
            # sample's positions of G_s * x_hat_s and of G_s, shaped as normalized_shape
            k = len(layer.normalized_shape)
            positions = tuple(range(2, g.dim() - k))
            gw = (g * inp).sum(positions) if positions else g * inp
            gb = (g.sum(positions) if positions else g) if layer.bias else None
            rows.append(torch.linalg.vector_norm(gw.reshape(n, b, -1), dim=-1))
            if gb is not None:
                rows.append(torch.linalg.vector_norm(gb.reshape(n, b, -1), dim=-1))
            cache.append((lname, layer, gw, gb, None))
        elif isinstance(layer, AddParameter):  # G_s summed where P broadcasts
            offsets = layer.per_sample(g)
            rows.append(torch.linalg.vector_norm(offsets.reshape(n, b, -1), dim=-1))
            cache.append((lname, layer, offsets, None, None))
        elif isinstance(layer, GroupNorm):
            # per-sample gradients of the per-channel weight and bias are C numbers each:
            # sum over positions of G_s * x_hat_s and of G_s; formed directly
            spatial = tuple(range(3, g.dim()))
            gw = (g * inp).sum(spatial) if spatial else g * inp  # (n, B, C)
            gb = g.sum(spatial) if spatial else g
            rows.append(torch.linalg.vector_norm(gw, dim=-1))
            rows.append(torch.linalg.vector_norm(gb, dim=-1))
            cache.append((lname, layer, gw, gb, None))
        else:
            assert isinstance(layer, Conv2d)
            flat_in = inp.reshape(n * b, *inp.shape[2:])
            gf = g.reshape(n * b, g.shape[2], -1)  # (nB, O, L)
            o, length = gf.shape[1], gf.shape[2]
            ck = layer.in_channels * layer.kernel_size**2
            direct = conv_mode == "direct" or (
                conv_mode == "auto" and _direct_is_cheaper(o, ck, length)
            )
            psg, u = None, None
            if direct:
                per_sample = (
                    _conv_grads_grouped
                    if _grouped_backward_applies(flat_in, layer.kernel_size)
                    else _conv_grads_by_kernel_row
                )
                psg = per_sample(
                    flat_in, gf, layer.kernel_size, padding=layer.padding, stride=layer.stride
                )  # (R, nB, O, F): R kernel rows (stride 1, by rows) or R = 1 and F = Ck^2
                flat_psg = psg.view(psg.shape[0], n * b, -1)
                per_row = torch.linalg.vector_norm(flat_psg, dim=2)  # contiguous reductions
                rows.append(torch.linalg.vector_norm(per_row, dim=0).reshape(n, b))
            else:  # <G^T G, U^T U> = ||G U^T||_F^2
                u = unfold(flat_in, layer.kernel_size, padding=layer.padding, stride=layer.stride)
                gg = torch.bmm(gf.transpose(1, 2), gf)
                uu = torch.bmm(u.transpose(1, 2), u)
                rows.append((gg * uu).sum((1, 2)).clamp_min(0).sqrt().reshape(n, b))
                u = u.reshape(n, b, ck, length)
            if "bias" in lp:
                rows.append(torch.linalg.vector_norm(gf.sum(-1), dim=-1).reshape(n, b))
            cache.append((lname, layer, u, gf.reshape(n, b, o, length), psg))
    norms = torch.linalg.vector_norm(torch.stack(rows), dim=0)
    w = clip_factor(norms, threshold, kind=kind, scale=weights)  # (n, B): weight * clip factor
    grads: dict[str, Tensor] = {}
    for lname, layer, inp, g, psg in cache:
        if isinstance(layer, Linear):  # positions flattened: sum_s w_s sum_t G_st a_st^T
            gw = (g * w.reshape(n, b, *([1] * (g.dim() - 2)))).reshape(n, -1, g.shape[-1])
            grads[layer.param_key(lname, "weight")] = torch.bmm(
                gw.transpose(1, 2), inp.reshape(n, -1, inp.shape[-1])
            )
            if layer.bias:
                grads[layer.param_key(lname, "bias")] = gw.sum(1)
        elif isinstance(layer, Conv1d):  # inp: the patches (n, B, C k, L')
            gw_flat = torch.einsum("nbol,nbkl->nok", g * w[:, :, None, None], inp)
            grads[layer.param_key(lname, "weight")] = gw_flat.reshape(
                n, *params[layer.param_key(lname, "weight")].shape[1:]
            )
            if layer.bias:
                grads[layer.param_key(lname, "bias")] = torch.einsum("nbol,nb->no", g, w)
        elif isinstance(layer, Embedding):  # inp: the rows of the stacked table
            d = g.shape[-1]
            table = g.new_zeros((n * layer.num_embeddings, d)).index_add_(
                0, inp.reshape(-1), (g * w.to(g.dtype)[:, :, None, None]).reshape(-1, d)
            )
            grads[layer.param_key(lname, "weight")] = table.reshape(n, layer.num_embeddings, d)
        elif isinstance(layer, LayerNorm):  # inp, g hold the per-sample weight, bias grads
            scale = w.to(inp.dtype).reshape(n, b, *([1] * (inp.dim() - 2)))
            grads[layer.param_key(lname, "weight")] = (inp * scale).sum(1)
            if g is not None:
                grads[layer.param_key(lname, "bias")] = (g * scale).sum(1)
        elif isinstance(layer, AddParameter):  # inp: the per-sample gradients of P
            flat = torch.einsum("nbk,nb->nk", inp.reshape(n, b, -1), w.to(inp.dtype))
            grads[layer.param_key(lname, "weight")] = flat.reshape(n, *layer.shape)
        elif isinstance(layer, GroupNorm):  # inp, g hold the per-sample weight, bias grads
            grads[layer.param_key(lname, "weight")] = torch.einsum(
                "nbc,nb->nc", inp, w.to(inp.dtype)
            )
            grads[layer.param_key(lname, "bias")] = torch.einsum("nbc,nb->nc", g, w.to(g.dtype))
        else:
            assert isinstance(layer, Conv2d)
            if psg is not None:  # sum_b w[n, b] psg[r, (n, b)], one bmm over (r, n)
                r, o, f = psg.shape[0], psg.shape[2], psg.shape[3]
                lhs = w.to(psg.dtype).reshape(1, n, 1, b).expand(r, n, 1, b).reshape(r * n, 1, b)
                out = torch.bmm(lhs, psg.view(r * n, b, o * f)).view(r, n, o, f)
                if r == 1:
                    gw_flat = out[0]
                else:  # (kh, n, O, C, kw) -> (n, O, C, kh, kw)
                    gw_flat = out.view(r, n, o, -1, r).permute(1, 2, 3, 0, 4).reshape(n, o, -1)
            else:
                gw_flat = torch.einsum("nbol,nbkl->nok", g * w[:, :, None, None], inp)
            grads[layer.param_key(lname, "weight")] = gw_flat.reshape(
                n, *params[layer.param_key(lname, "weight")].shape[1:]
            )
            if layer.bias:
                grads[layer.param_key(lname, "bias")] = torch.einsum("nbol,nb->no", g, w)
    ordered = {k: grads[k] for k in params}
    return ordered, losses.detach(), norms
