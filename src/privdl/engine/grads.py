"""Per-node (clipped) gradients for all nodes at once.

``node_gradients`` computes, for every node ``i`` with parameters ``x_i`` and batch
``xi_i = {(x_s, y_s)}``, one of

* ``none``: ``(1/B) sum_s grad l(x_i; xi_s)`` (the stochastic gradient of D-SGD / FedAvg);
* ``per_sample``: ``(1/B) sum_s Clip(grad l(x_i; xi_s); C)`` — DP-SGD's per-example clipping
  (DECOR example-level MNIST, Sec. 6.4 / Alg. 1 line 2; Robust-HDP Alg. 1; PrivSGP-VR Alg. 1);
* ``batch_mean``: ``Clip((1/B) sum_s grad l(x_i; xi_s); C)`` — DECOR user-level clipping
  (Alg. 1 line 2 on the batch mean, a9a Sec. 6.3).

``Clip`` is hard ``min(1, C/||g||) g`` or smooth ``C g / (C + ||g||)`` (PORTER Definition 2).
Per-sample clipping uses the ghost-norm fast path for Linear/Conv2d chains
(:mod:`privdl.engine.ghost`) and ``torch.func`` ``vmap(grad)`` over nodes and samples otherwise.
No Python loop runs over nodes or samples; the fallback loops only over sample *chunks* to bound
memory (ResNet-18: 11M parameters per sample).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor
from torch.func import grad_and_value, vmap

from privdl.engine.clipping import clip_by_global_norm, clip_factor
from privdl.engine.ghost import ghost_clipped_sum, prefers_ghost, supports_ghost
from privdl.engine.losses import check_loss, correct, per_sample_loss
from privdl.errors import ConfigError, DataError, PrivacyError
from privdl.models.base import StackedModel

__all__ = ["ClipSpec", "GradResult", "evaluate", "node_gradients"]

_VMAP_CHUNK_ELEMENTS = 2**25  # per-sample gradient entries held at once by the vmap fallback (CPU)
_VMAP_CHUNK_ELEMENTS_CUDA = 2**28  # same on CUDA (1 GiB of float32)


@dataclass(frozen=True)
class ClipSpec:
    """What to clip and how. ``threshold`` is ``C`` (DECOR, Robust-HDP) or ``tau`` (PORTER)."""

    mode: Literal["none", "per_sample", "batch_mean"] = "none"
    threshold: float | None = None
    kind: Literal["hard", "smooth"] = "hard"

    def __post_init__(self) -> None:
        if self.mode not in ("none", "per_sample", "batch_mean"):
            raise ConfigError(
                f"clip mode must be none, per_sample or batch_mean, got {self.mode!r}"
            )
        if self.kind not in ("hard", "smooth"):
            raise ConfigError(f"clip kind must be hard or smooth, got {self.kind!r}")
        if self.mode != "none" and (self.threshold is None or not self.threshold > 0):
            raise PrivacyError(
                f"clip mode {self.mode!r} needs a threshold > 0, got {self.threshold}"
            )


@dataclass
class GradResult:
    """Stacked gradients, per-node mean loss ``(n,)`` and, for per-sample clipping, the
    unclipped per-sample gradient norms ``(n, B)`` (0 for masked samples)."""

    grads: dict[str, Tensor]
    loss: Tensor
    per_sample_norms: Tensor | None = None


def _check_inputs(model: StackedModel, params: dict[str, Tensor], x: Tensor, y: Tensor) -> None:
    shapes = model.param_shapes()
    if set(params) != set(shapes):
        raise ConfigError(f"params keys {sorted(params)} do not match model {model.name}")
    n = x.shape[0]
    for k, s in shapes.items():
        if tuple(params[k].shape) != (n, *s):
            raise DataError(f"param {k} has shape {tuple(params[k].shape)}, expected {(n, *s)}")
    if x.dim() < 2 or tuple(x.shape[2:]) != tuple(model.in_shape):
        raise DataError(
            f"x must have shape (n, B, {model.in_shape}), got {tuple(x.shape)} for {model.name}"
        )
    if tuple(y.shape[:2]) != tuple(x.shape[:2]):
        raise DataError(f"y shape {tuple(y.shape)} does not match x {tuple(x.shape[:2])}")
    if model.takes_indices:
        check_indices(x, model.input_vocabulary, what=f"the input of {model.name}")


def check_indices(x: Tensor, vocabulary: int | None, *, what: str) -> None:
    """``DataError`` unless ``x`` holds integers in ``0 .. vocabulary - 1`` (an embedding's rows)."""
    if x.is_floating_point() and bool((x != x.round()).any()):
        raise DataError(f"{what} must be integer indices (it reads an embedding); got fractions")
    if x.dtype == torch.bool or x.is_complex():
        raise DataError(f"{what} must be integer indices, got dtype {x.dtype}")
    if x.numel() == 0:
        return
    low, high = int(x.min()), int(x.max())
    if low < 0 or (vocabulary is not None and high >= vocabulary):
        bound = "" if vocabulary is None else f" .. {vocabulary - 1}"
        raise DataError(f"{what}: indices must lie in 0{bound}, got {low} .. {high}")


def _float_dtype(x: Tensor, params: dict[str, Tensor]) -> torch.dtype:
    """The dtype of the sample weights: the input's, or the parameters' for integer inputs."""
    return x.dtype if x.is_floating_point() else next(iter(params.values())).dtype


def _sample_weights(
    x: Tensor,
    mask: Tensor | None,
    reduction: str,
    denominator: float | Tensor | None,
    dtype: torch.dtype,
) -> Tensor | float:
    """Weight of each (node, sample) in the sum: ``mask / denominator``, shape ``(n, B)``; a
    plain float when it is the same for all (saves kernel launches on GPU)."""
    if reduction not in ("mean", "sum"):
        raise ConfigError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    b = x.shape[1]
    if denominator is not None and not torch.is_tensor(denominator):
        if not denominator > 0:
            raise ConfigError(f"denominator must be > 0, got {denominator}")
        if mask is None:
            return 1.0 / float(denominator)
        return mask.to(dtype) / float(denominator)
    if mask is None and denominator is None:
        return 1.0 / b if reduction == "mean" else 1.0
    n = x.shape[0]
    m = torch.ones(n, b, dtype=dtype, device=x.device) if mask is None else mask.to(dtype)
    if denominator is not None:
        den = torch.as_tensor(denominator, dtype=dtype, device=x.device)
        if bool((den <= 0).any()):
            raise ConfigError("denominator must be > 0")
        return m / (den.reshape(-1, 1) if den.dim() else den)
    if reduction == "sum":
        return m
    return m / m.sum(1, keepdim=True).clamp_min(1.0)


def _mean_loss(losses: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return losses.detach().mean(1)
    m = mask.to(losses.dtype)
    return (losses.detach() * m).sum(1) / m.sum(1).clamp_min(1.0)


def _vmap_clipped_sum(
    model: StackedModel,
    params: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    loss: str,
    mask: Tensor | None,
    weights: Tensor | float,
    clip: ClipSpec,
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Generic path: per-sample gradients by ``vmap`` over nodes of ``vmap(grad)`` over samples,
    in sample chunks; returns the weighted sum of clipped gradients, losses and norms."""

    def one_sample(p: dict[str, Tensor], xs: Tensor, ys: Tensor) -> Tensor:
        out = model.forward({k: v.unsqueeze(0) for k, v in p.items()}, xs[None, None])
        return per_sample_loss(out, ys[None, None], loss)[0, 0]

    psg = vmap(vmap(grad_and_value(one_sample), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
    n, b = x.shape[:2]
    if not torch.is_tensor(weights):
        weights = torch.full((n, b), weights, dtype=_float_dtype(x, params), device=x.device)
    budget = _VMAP_CHUNK_ELEMENTS_CUDA if x.is_cuda else _VMAP_CHUNK_ELEMENTS
    chunk = max(1, min(b, budget // max(1, n * model.num_parameters())))
    detached = {k: v.detach() for k, v in params.items()}
    total = {k: torch.zeros_like(v) for k, v in detached.items()}
    losses, norms = [], []
    for s in range(0, b, chunk):
        g, ls = psg(detached, x[:, s : s + chunk], y[:, s : s + chunk])
        sq = sum(v.reshape(*v.shape[:2], -1).pow(2).sum(-1) for v in g.values())
        nrm = sq.sqrt()
        if mask is not None:
            nrm = nrm * mask[:, s : s + chunk].to(nrm.dtype)
        # ClipSpec checked that a clipping mode has its threshold
        w = clip_factor(
            nrm, cast(float, clip.threshold), kind=clip.kind, scale=weights[:, s : s + chunk]
        )
        for k, v in g.items():
            total[k] += torch.einsum("nb...,nb->n...", v, w)
        losses.append(ls)
        norms.append(nrm)
    return total, torch.cat(losses, 1), torch.cat(norms, 1)


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """Float32 convolutions and matrix products in full precision (no TF32) inside the block.

    PyTorch lets cuDNN run float32 convolutions in TF32 by default (10 bits of mantissa), and
    ``torch.set_float32_matmul_precision("high")`` does the same for matrix products. Per-sample
    clipping needs the per-sample norms and the clipped sum to agree: on one H200 (docs/gpu.md),
    ResNet-18 GN's clipped gradients in TF32 were 29% off the float64 ones in their worst layer
    (the ghost and vmap paths 29% apart), and 1.4e-6 apart in full float32, at the same speed.
    The flags are restored on exit; the per-sample path of :func:`node_gradients` runs in here.
    """
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    matmul = torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.set_float32_matmul_precision(matmul)


def node_gradients(
    model: StackedModel,
    params: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    loss: str,
    clip: ClipSpec = ClipSpec(),
    mask: Tensor | None = None,
    reduction: Literal["mean", "sum"] = "mean",
    denominator: float | Tensor | None = None,
    method: Literal["auto", "ghost", "vmap"] = "auto",
) -> GradResult:
    """Gradients of every node on its own batch, clipped as ``clip`` says.

    ``x (n, B, *in_shape)``, ``y (n, B)``; ``mask (n, B)`` of 0/1 drops padded samples. The sum
    over the batch is divided by the number of unmasked samples (``reduction="mean"``), by
    nothing (``"sum"``), or by ``denominator`` (scalar or ``(n,)``; e.g. the expected batch size
    ``qN`` under Poisson sampling). ``method`` forces the per-sample path; ``"auto"`` takes the
    ghost path where it applies, except for conv nets on a CPU whose patches outweigh their
    parameters (:func:`privdl.engine.ghost.prefers_ghost`).
    """
    check_loss(loss)
    _check_inputs(model, params, x, y)
    if mask is not None and tuple(mask.shape) != tuple(x.shape[:2]):
        raise DataError(f"mask shape {tuple(mask.shape)} does not match x {tuple(x.shape[:2])}")
    weights = _sample_weights(x, mask, reduction, denominator, _float_dtype(x, params))

    if clip.mode != "per_sample":
        with torch.enable_grad():
            leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            losses = per_sample_loss(model.forward(leaves, x), y, loss)
            g = torch.autograd.grad((losses * weights).sum(), list(leaves.values()))
        grads = dict(zip(leaves, g, strict=True))
        if clip.mode == "batch_mean":
            # ClipSpec checked that a clipping mode has its threshold
            grads = clip_by_global_norm(grads, cast(float, clip.threshold), kind=clip.kind)
        return GradResult(grads=grads, loss=_mean_loss(losses, mask))

    if method == "ghost" and not supports_ghost(model):
        raise ConfigError(f"model {model.name} has layers the ghost path cannot clip")
    if method not in ("auto", "ghost", "vmap"):
        raise ConfigError(f"method must be auto, ghost or vmap, got {method!r}")
    with full_float32():  # the clipping bound holds for the sum that is returned
        return _per_sample_clipped(model, params, x, y, loss, clip, mask, weights, method)


def _per_sample_clipped(
    model: StackedModel,
    params: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    loss: str,
    clip: ClipSpec,
    mask: Tensor | None,
    weights: Tensor | float,
    method: str,
) -> GradResult:
    """Per-sample clipping of :func:`node_gradients`: the ghost path or ``vmap(grad)``."""
    if method == "ghost" or (method == "auto" and prefers_ghost(model, x.device)):
        grads, losses, norms = ghost_clipped_sum(
            model,  # type: ignore[arg-type]
            params,
            x,
            y,
            loss_fn=lambda out, yy: per_sample_loss(out, yy, loss),
            mask=mask,
            weights=weights,
            threshold=clip.threshold,  # type: ignore[arg-type]
            kind=clip.kind,
        )
    else:
        grads, losses, norms = _vmap_clipped_sum(
            model, params, x, y, loss=loss, mask=mask, weights=weights, clip=clip
        )
    return GradResult(grads=grads, loss=_mean_loss(losses, mask), per_sample_norms=norms)


@torch.no_grad()
def evaluate(
    model: StackedModel,
    params: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    loss: str,
    batch_size: int = 4096,
) -> tuple[Tensor, Tensor]:
    """Mean loss and accuracy ``(n,)`` of every node's model on the same data ``x (N, ...)``.

    ``params`` may be stacked ``(n, ...)`` or one model's (no node dimension, giving ``n = 1``).
    About ``batch_size`` samples (over all nodes) are evaluated per forward pass. Accuracy is NaN
    for ``mse``.
    """
    check_loss(loss)
    shapes = model.param_shapes()
    first = next(iter(shapes))
    if params[first].dim() == len(shapes[first]):
        params = {k: v.unsqueeze(0) for k, v in params.items()}
    n = params[first].shape[0]
    if tuple(x.shape[1:]) != tuple(model.in_shape) or y.shape[0] != x.shape[0]:
        raise DataError(
            f"evaluate needs x (N, {model.in_shape}) and y (N,), got {tuple(x.shape)}, "
            f"{tuple(y.shape)}"
        )
    if x.shape[0] == 0:
        raise DataError("evaluate needs at least one sample")
    if model.takes_indices:
        check_indices(x, model.input_vocabulary, what=f"the input of {model.name}")
    chunk = max(1, batch_size // n)
    dtype = params[first].dtype
    loss_sum = torch.zeros(n, dtype=dtype, device=x.device)
    correct_sum = torch.zeros(n, dtype=dtype, device=x.device)
    for s in range(0, x.shape[0], chunk):
        xb = x[s : s + chunk]
        xb = xb.to(dtype) if xb.is_floating_point() else xb
        xb = xb.unsqueeze(0).expand(n, *xb.shape)
        yb = y[s : s + chunk].unsqueeze(0).expand(n, -1)
        out = model.forward(params, xb)
        loss_sum += per_sample_loss(out, yb, loss).sum(1)
        correct_sum += correct(out, yb, loss).sum(1)
    total = float(x.shape[0])
    return loss_sum / total, correct_sum / total
