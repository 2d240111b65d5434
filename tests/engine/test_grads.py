"""node_gradients / evaluate against a one-sample-at-a-time loop oracle.

The oracle runs, for each node and each sample, a torch.nn module holding that node's parameters
(an implementation independent of the stacked forward), one backward per sample, clips with the
closed forms min(1, C/||g||) and C/(C + ||g||), and accumulates — the DP-SGD microbatch oracle.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from privdl.engine import ClipSpec, evaluate, node_gradients
from privdl.engine.ghost import prefers_ghost
from privdl.errors import ConfigError, DataError, PrivacyError
from privdl.models import Activation, Conv2d, Flatten, Linear, MaxPool2d, build_model

F64 = torch.float64


def torch_reference(model, params, node):
    ref = nn.Sequential()
    for lname, layer in model.layers:
        if isinstance(layer, Linear):
            mod = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        elif isinstance(layer, Conv2d):
            mod = nn.Conv2d(
                layer.in_channels,
                layer.out_channels,
                layer.kernel_size,
                stride=layer.stride,
                padding=layer.padding,
                bias=layer.bias,
            )
        elif isinstance(layer, Activation):
            mod = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}[layer.name]()
        elif isinstance(layer, MaxPool2d):
            mod = nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding)
        else:
            assert isinstance(layer, Flatten)
            mod = nn.Flatten()
        ref.add_module(lname, mod)
    ref = ref.to(device=params[next(iter(params))].device, dtype=params[next(iter(params))].dtype)
    ref.load_state_dict({k: v[node] for k, v in params.items()})
    return ref


def ref_loss(out, y, loss):
    if loss == "cross_entropy":
        return F.cross_entropy(out, y.long())
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(out.reshape(-1), y.to(out.dtype).reshape(-1))
    return ((out.reshape(-1) - y.to(out.dtype)) ** 2).mean()


def oracle(
    model, params, x, y, *, loss, clip, mask=None, denominator=None, reduction="mean", single=None
):
    """Loop over nodes and samples. ``single(i, xs)`` overrides the per-sample forward."""
    n, b = x.shape[:2]
    keys = list(params)
    grads = {k: torch.zeros_like(v) for k, v in params.items()}
    norms = torch.zeros(n, b, dtype=x.dtype, device=x.device)
    losses = torch.zeros(n, dtype=x.dtype, device=x.device)
    for i in range(n):
        if single is None:
            ref = torch_reference(model, params, i)
            plist = [dict(ref.named_parameters())[k] for k in keys]
            fwd = ref
        else:
            plist = [params[k][i].detach().clone().requires_grad_(True) for k in keys]
            fwd = single(plist)
        idx = [s for s in range(b) if mask is None or mask[i, s] > 0]
        den = len(idx) if reduction == "mean" else 1.0
        if denominator is not None:
            den = float(denominator[i]) if torch.is_tensor(denominator) else denominator
        batch_sum = [torch.zeros_like(p) for p in plist]
        for s in idx:
            lo = ref_loss(fwd(x[i, s : s + 1]), y[i, s : s + 1], loss)
            losses[i] += lo.detach() / len(idx)
            g = torch.autograd.grad(lo, plist)
            nrm = torch.sqrt(sum((gg**2).sum() for gg in g))
            norms[i, s] = nrm
            if clip.mode == "per_sample":
                c = (
                    min(1.0, clip.threshold / nrm)
                    if clip.kind == "hard"
                    else (clip.threshold / (clip.threshold + nrm))
                )
            else:
                c = 1.0
            for acc, gg in zip(batch_sum, g, strict=True):
                acc += c * gg / den
        if clip.mode == "batch_mean":
            tot = torch.sqrt(sum((a**2).sum() for a in batch_sum))
            c = (
                min(1.0, clip.threshold / tot)
                if clip.kind == "hard"
                else (clip.threshold / (clip.threshold + tot))
            )
            batch_sum = [c * a for a in batch_sum]
        for k, a in zip(keys, batch_sum, strict=True):
            grads[k][i] = a
    return grads, losses, norms


def labels(loss, n, b, k, gen, device="cpu"):
    if loss == "cross_entropy":
        return torch.randint(0, k, (n, b), generator=gen).to(device)
    if loss == "bce":
        return torch.randint(0, 2, (n, b), generator=gen).to(device)
    return torch.randn(n, b, generator=gen, dtype=F64).to(device)


def assert_close_dict(a, b, tol=1e-10):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=tol, atol=tol, msg=k)


clip_specs = st.sampled_from(
    [
        ClipSpec(),
        ClipSpec("per_sample", 0.3),
        ClipSpec("per_sample", 0.05, "smooth"),
        ClipSpec("per_sample", 100.0),
        ClipSpec("batch_mean", 0.2),
        ClipSpec("batch_mean", 0.2, "smooth"),
    ]
)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 3),
    b=st.integers(1, 5),
    d=st.integers(1, 6),
    hidden=st.lists(st.integers(1, 5), max_size=2),
    loss=st.sampled_from(["cross_entropy", "bce", "mse"]),
    clip=clip_specs,
    use_mask=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_mlp_gradients_equal_loop_oracle(n, b, d, hidden, loss, clip, use_mask, seed):
    gen = torch.Generator().manual_seed(seed)
    k = 4 if loss == "cross_entropy" else 1
    name = "mlp" if hidden else "linear"
    kw = {"hidden": tuple(hidden), "activation": "tanh"} if hidden else {}
    m = build_model(name, in_shape=(d,), n_classes=k, **kw)
    p = m.init(n_nodes=n, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(n, b, d, generator=gen, dtype=F64)
    y = labels(loss, n, b, k, gen)
    mask = (torch.rand(n, b, generator=gen) < 0.7).to(F64) if use_mask else None
    if mask is not None:
        mask[:, 0] = 1
    want, want_loss, want_norms = oracle(m, p, x, y, loss=loss, clip=clip, mask=mask)
    for method in ("ghost", "vmap"):
        r = node_gradients(m, p, x, y, loss=loss, clip=clip, mask=mask, method=method)
        assert_close_dict(r.grads, want)
        torch.testing.assert_close(r.loss, want_loss, rtol=1e-10, atol=1e-12)
        if clip.mode == "per_sample":
            torch.testing.assert_close(r.per_sample_norms, want_norms, rtol=1e-10, atol=1e-12)
        else:
            assert r.per_sample_norms is None


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(1, 2),
    b=st.integers(1, 3),
    c=st.integers(1, 2),
    hw=st.sampled_from([4, 8]),
    clip=clip_specs,
    seed=st.integers(0, 2**16),
)
def test_cnn_gradients_equal_loop_oracle(n, b, c, hw, clip, seed):
    gen = torch.Generator().manual_seed(seed)
    m = build_model("cnn-mnist", in_shape=(c, hw, hw), n_classes=10)
    p = m.init(n_nodes=n, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(n, b, c, hw, hw, generator=gen, dtype=F64)
    y = labels("cross_entropy", n, b, 10, gen)
    want, want_loss, want_norms = oracle(m, p, x, y, loss="cross_entropy", clip=clip)
    r = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, method="vmap")
    assert_close_dict(r.grads, want)
    torch.testing.assert_close(r.loss, want_loss, rtol=1e-10, atol=1e-12)
    if clip.mode == "per_sample":
        from privdl.engine.ghost import ghost_clipped_sum
        from privdl.engine.losses import per_sample_loss

        w = torch.ones(n, b, dtype=F64) / b
        for conv_mode in ("direct", "ghost"):
            g, _, nrm = ghost_clipped_sum(
                m,
                p,
                x,
                y,
                loss_fn=lambda o, t: per_sample_loss(o, t, "cross_entropy"),
                mask=None,
                weights=w,
                threshold=clip.threshold,
                kind=clip.kind,
                conv_mode=conv_mode,
            )
            assert_close_dict(g, want)
            torch.testing.assert_close(nrm, want_norms, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stride", [1, 2])
def test_strided_convnet_ghost_equals_loop_oracle(stride):
    """Conv layers with stride 1 (column-only patches) and 2 (full unfold), no padding and
    padding, both conv modes, with masks and a per-node denominator."""
    from privdl.models import SequentialModel

    m = SequentialModel(
        "strided",
        (2, 9, 9),
        [
            ("conv1", Conv2d(2, 3, 3, stride=stride, padding=1)),
            ("act1", Activation("tanh")),
            ("conv2", Conv2d(3, 4, 2, stride=stride, padding=0, bias=False)),
            ("flat", Flatten()),
            ("fc", Linear(4 * (8 if stride == 1 else 2) ** 2, 3)),
        ],
    )
    gen = torch.Generator().manual_seed(stride)
    n, b = 3, 5
    p = m.init(n_nodes=n, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(n, b, 2, 9, 9, generator=gen, dtype=F64)
    y = labels("cross_entropy", n, b, 3, gen)
    mask = torch.rand(n, b, generator=gen) < 0.7
    den = torch.tensor([2.0, 3.0, 4.0], dtype=F64)
    clip = ClipSpec("per_sample", 0.5)
    want, _, want_norms = oracle(
        m, p, x, y, loss="cross_entropy", clip=clip, mask=mask, denominator=den
    )
    r = node_gradients(
        m, p, x, y, loss="cross_entropy", clip=clip, mask=mask, denominator=den, method="ghost"
    )
    assert_close_dict(r.grads, want)
    torch.testing.assert_close(r.per_sample_norms, want_norms, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "name, kw",
    [("resnet18-gn", {"width": 2}), ("resnet34-nonorm", {"width": 2})],
)
def test_resnet_ghost_and_vmap_equal_loop_oracle(name, kw):
    """The ResNets' ghost path (layer by layer: strided convs, GroupNorm, padded max-pool,
    residual sums) and the vmap path both equal the one-sample loop."""
    gen = torch.Generator().manual_seed(0)
    m = build_model(name, in_shape=(3, 16, 16), n_classes=3, **kw)
    p = m.init(n_nodes=2, generator=gen, dtype=F64, same_init=False)
    p = {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in p.items()}
    x = torch.randn(2, 3, 3, 16, 16, generator=gen, dtype=F64)
    y = labels("cross_entropy", 2, 3, 3, gen)
    keys = list(p)

    def single(plist):
        return lambda xs: m.forward(
            {k: v[None] for k, v in zip(keys, plist, strict=True)}, xs[None]
        )[0]

    assert prefers_ghost(m, torch.device("cpu"))  # auto takes the ghost path
    for clip in (ClipSpec("per_sample", 0.5), ClipSpec("per_sample", 0.5, "smooth")):
        want, _, want_norms = oracle(m, p, x, y, loss="cross_entropy", clip=clip, single=single)
        for method in ("auto", "vmap"):
            r = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, method=method)
            assert_close_dict(r.grads, want)
            torch.testing.assert_close(r.per_sample_norms, want_norms, rtol=1e-10, atol=1e-12)


def test_vmap_sample_chunking_gives_same_result(monkeypatch):
    import privdl.engine.grads as grads_mod

    gen = torch.Generator().manual_seed(1)
    m = build_model("mlp", in_shape=(5,), n_classes=3, hidden=(4,))
    p = m.init(n_nodes=2, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(2, 7, 5, generator=gen, dtype=F64)
    y = labels("cross_entropy", 2, 7, 3, gen)
    clip = ClipSpec("per_sample", 0.3)
    whole = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, method="vmap")
    monkeypatch.setattr(grads_mod, "_VMAP_CHUNK_ELEMENTS", 2 * m.num_parameters() * 3)
    chunked = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, method="vmap")
    assert_close_dict(chunked.grads, whole.grads, tol=1e-13)
    torch.testing.assert_close(chunked.per_sample_norms, whole.per_sample_norms)


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_heterogeneous_batches_by_mask_equal_separate_runs(method):
    """A node with 3 real samples padded to 5 gives the gradient of its 3-sample batch."""
    gen = torch.Generator().manual_seed(2)
    m = build_model("mlp", in_shape=(4,), n_classes=3, hidden=(6,))
    p = m.init(n_nodes=2, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(2, 5, 4, generator=gen, dtype=F64)
    y = labels("cross_entropy", 2, 5, 3, gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=F64)
    clip = ClipSpec("per_sample", 0.2)
    r = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, mask=mask, method=method)
    p0 = {k: v[:1] for k, v in p.items()}
    r0 = node_gradients(m, p0, x[:1, :3], y[:1, :3], loss="cross_entropy", clip=clip)
    for k in p:
        torch.testing.assert_close(r.grads[k][0], r0.grads[k][0], rtol=1e-12, atol=1e-14)
    assert torch.all(r.per_sample_norms[0, 3:] == 0)
    # a boolean mask and a scalar denominator (Poisson sampling: divide by the expected size)
    rb = node_gradients(
        m,
        p,
        x,
        y,
        loss="cross_entropy",
        clip=clip,
        mask=mask.bool(),
        denominator=3.0,
        method=method,
    )
    for k in p:
        torch.testing.assert_close(rb.grads[k][0], r0.grads[k][0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(rb.grads[k][1], r.grads[k][1] * 5 / 3, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_sum_reduction_and_denominator(method):
    gen = torch.Generator().manual_seed(3)
    m = build_model("linear", in_shape=(5,), n_classes=1)
    p = m.init(n_nodes=3, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(3, 4, 5, generator=gen, dtype=F64)
    y = labels("bce", 3, 4, 1, gen)
    clip = ClipSpec("per_sample", 0.1)
    den = torch.tensor([2.0, 3.5, 8.0], dtype=F64)
    want, _, _ = oracle(m, p, x, y, loss="bce", clip=clip, denominator=den)
    r = node_gradients(m, p, x, y, loss="bce", clip=clip, denominator=den, method=method)
    assert_close_dict(r.grads, want)
    want, _, _ = oracle(m, p, x, y, loss="bce", clip=clip, denominator=2.5)
    r = node_gradients(m, p, x, y, loss="bce", clip=clip, denominator=2.5, method=method)
    assert_close_dict(r.grads, want)
    want_sum, _, _ = oracle(m, p, x, y, loss="bce", clip=clip, reduction="sum")
    r = node_gradients(m, p, x, y, loss="bce", clip=clip, reduction="sum", method=method)
    assert_close_dict(r.grads, want_sum)
    # with every sample clipped (hard), the summed gradient's norm is at most B * C
    total = torch.sqrt(
        sum(g.pow(2).sum((1,) if g.dim() == 2 else (1, 2)) for g in r.grads.values())
    )
    assert torch.all(total <= 4 * 0.1 + 1e-12)


def test_float32_default_close_to_float64():
    gen = torch.Generator().manual_seed(4)
    m = build_model("mlp", in_shape=(1, 8, 8), n_classes=10, hidden=(16,))
    p32 = m.init(n_nodes=3, generator=gen)
    assert p32["fc1.weight"].dtype == torch.float32
    x = torch.randn(3, 6, 1, 8, 8, generator=gen)
    y = labels("cross_entropy", 3, 6, 10, gen)
    clip = ClipSpec("per_sample", 0.5)
    r32 = node_gradients(m, p32, x, y, loss="cross_entropy", clip=clip)
    p64 = {k: v.double() for k, v in p32.items()}
    want, _, _ = oracle(m, p64, x.double(), y, loss="cross_entropy", clip=clip)
    for k in want:
        assert r32.grads[k].dtype == torch.float32
        torch.testing.assert_close(r32.grads[k].double(), want[k], rtol=1e-4, atol=1e-6)


def test_evaluate_equals_loop_and_is_chunk_invariant():
    gen = torch.Generator().manual_seed(5)
    m = build_model("mlp", in_shape=(6,), n_classes=4, hidden=(5,))
    p = m.init(n_nodes=3, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(11, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 4, (11,), generator=gen)
    loss, acc = evaluate(m, p, x, y, loss="cross_entropy", batch_size=6)  # chunks of 2
    for i in range(3):
        out = torch_reference(m, p, i)(x)
        torch.testing.assert_close(loss[i], F.cross_entropy(out, y), rtol=1e-12, atol=1e-12)
        assert acc[i].item() == pytest.approx((out.argmax(1) == y).double().mean().item())
    loss1, acc1 = evaluate(m, {k: v[1] for k, v in p.items()}, x, y, loss="cross_entropy")
    torch.testing.assert_close(loss1, loss[1:2])
    # BCE accuracy: sign of the logit
    mb = build_model("linear", in_shape=(6,), n_classes=1)
    pb = mb.init(n_nodes=2, generator=gen, dtype=F64, same_init=False)
    yb = torch.randint(0, 2, (11,), generator=gen)
    _, accb = evaluate(mb, pb, x, yb, loss="bce")
    for i in range(2):
        logit = x @ pb["fc.weight"][i, 0] + pb["fc.bias"][i, 0]
        assert accb[i].item() == pytest.approx(((logit > 0).long() == yb).double().mean().item())


def test_bad_inputs_raise_privdl_errors():
    m = build_model("linear", in_shape=(3,), n_classes=2)
    p = m.init(n_nodes=2, generator=torch.Generator().manual_seed(0))
    x, y = torch.randn(2, 4, 3), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(PrivacyError):
        ClipSpec("per_sample")
    with pytest.raises(PrivacyError):
        ClipSpec("batch_mean", 0.0)
    with pytest.raises(ConfigError):
        ClipSpec("per_example", 1.0)
    with pytest.raises(ConfigError):
        node_gradients(m, p, x, y, loss="hinge")
    with pytest.raises(DataError):
        node_gradients(m, p, torch.randn(2, 4, 5), y, loss="cross_entropy")
    with pytest.raises(DataError):
        node_gradients(m, p, x, torch.zeros(2, 3, dtype=torch.long), loss="cross_entropy")
    with pytest.raises(DataError):
        node_gradients(m, p, x, y, loss="cross_entropy", mask=torch.ones(2, 5))
    with pytest.raises(ConfigError):
        node_gradients(m, p, x, y, loss="cross_entropy", reduction="max")
    with pytest.raises(ConfigError):
        node_gradients(m, p, x, y, loss="cross_entropy", denominator=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["mlp", "cnn-mnist", "resnet18-gn"])
def test_cuda_equals_loop_oracle(name):
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    shape = (3, 16, 16) if name == "resnet18-gn" else (1, 8, 8)
    kw = {"width": 2} if name == "resnet18-gn" else {}
    m = build_model(name, in_shape=shape, n_classes=10, **kw)
    p = m.init(n_nodes=2, generator=gen, dtype=F64, device=dev, same_init=False)
    assert p[next(iter(p))].device.type == "cuda"
    x = torch.randn(2, 4, *shape, generator=gen, dtype=F64, device=dev)
    y = torch.randint(0, 10, (2, 4), generator=gen, device=dev)
    keys = list(p)
    single = None
    if name == "resnet18-gn":

        def single(plist):
            return lambda xs: m.forward(
                {k: v[None] for k, v in zip(keys, plist, strict=True)}, xs[None]
            )[0]

    for clip in (
        ClipSpec("per_sample", 0.3),
        ClipSpec("per_sample", 0.3, "smooth"),
        ClipSpec("batch_mean", 0.3),
    ):
        want, _, _ = oracle(m, p, x, y, loss="cross_entropy", clip=clip, single=single)
        r = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip)
        assert_close_dict(r.grads, want, tol=1e-9)


@pytest.mark.parametrize("biases", [(False, True), (False, False), (True, False)])
def test_custom_chain_with_and_without_biases(biases):
    from privdl.models import SequentialModel

    gen = torch.Generator().manual_seed(6)
    m = SequentialModel(
        "custom",
        (4,),
        [
            ("fc1", Linear(4, 3, bias=biases[0])),
            ("act", Activation("sigmoid")),
            ("fc2", Linear(3, 2, bias=biases[1])),
        ],
    )
    p = m.init(n_nodes=2, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(2, 5, 4, generator=gen, dtype=F64)
    y = labels("cross_entropy", 2, 5, 2, gen)
    clip = ClipSpec("per_sample", 0.1)
    want, _, want_norms = oracle(m, p, x, y, loss="cross_entropy", clip=clip)
    r = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip)
    assert_close_dict(r.grads, want)
    torch.testing.assert_close(r.per_sample_norms, want_norms, rtol=1e-10, atol=1e-12)


def test_evaluate_cnn_equals_torch_modules():
    gen = torch.Generator().manual_seed(7)
    m = build_model("cnn-fmnist", in_shape=(1, 8, 8), n_classes=10)
    p = m.init(n_nodes=2, generator=gen, dtype=F64, same_init=False)
    x = torch.randn(9, 1, 8, 8, generator=gen, dtype=F64)
    y = torch.randint(0, 10, (9,), generator=gen)
    loss, acc = evaluate(m, p, x, y, loss="cross_entropy", batch_size=8)
    for i in range(2):
        out = torch_reference(m, p, i)(x)
        torch.testing.assert_close(loss[i], F.cross_entropy(out, y), rtol=1e-12, atol=1e-12)
        assert acc[i].item() == pytest.approx((out.argmax(1) == y).double().mean().item())


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 5),
    c=st.integers(1, 4),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    k=st.integers(1, 5),
    padding=st.integers(0, 3),
    stride=st.integers(1, 3),
    transposed=st.booleans(),
)
def test_strided_unfold_equals_torch_unfold(b, c, h, w, k, padding, stride, transposed):
    """The ghost path's patches: a strided copy, bit-identical to F.unfold (torch's im2col)."""
    from privdl.engine.ghost import unfold

    if h + 2 * padding < k or w + 2 * padding < k:
        return
    gen = torch.Generator().manual_seed(b * 1000 + c * 100 + h * 10 + w)
    x = torch.randn(b, c, w, h, generator=gen).transpose(2, 3) if transposed else None
    x = x if x is not None else torch.randn(b, c, h, w, generator=gen)
    expected = torch.nn.functional.unfold(x, k, padding=padding, stride=stride)
    assert torch.equal(unfold(x, k, padding=padding, stride=stride), expected)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    c=st.integers(1, 3),
    o=st.integers(1, 4),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    k=st.integers(1, 4),
    padding=st.integers(0, 2),
    stride=st.integers(1, 3),
    transposed=st.booleans(),
)
def test_per_sample_conv_grads_equal_unfold_bmm_and_autograd(
    b, c, o, h, w, k, padding, stride, transposed
):
    """Column-only unfolding (stride 1) gives bmm(G, unfold(x)^T) up to rounding, and both are
    the per-sample weight gradients autograd gives sample by sample (float64)."""
    from privdl.engine.ghost import per_sample_conv_weight_grads, unfold

    if h + 2 * padding < k or w + 2 * padding < k:
        return
    gen = torch.Generator().manual_seed(b * 1000 + c * 100 + h * 10 + w + o)
    x = torch.randn(b, c, w, h, generator=gen, dtype=torch.float64)
    x = x.transpose(2, 3) if transposed else x.reshape(b, c, h, w)
    weight = torch.randn(o, c, k, k, generator=gen, dtype=torch.float64)
    out = torch.nn.functional.conv2d(x, weight, padding=padding, stride=stride)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = per_sample_conv_weight_grads(x, g, k, padding=padding, stride=stride)
    u = unfold(x, k, padding=padding, stride=stride)
    want = torch.bmm(g.reshape(b, o, -1), u.transpose(1, 2))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for s in range(b):
        wt = weight.clone().requires_grad_(True)
        z = torch.nn.functional.conv2d(x[s : s + 1], wt, padding=padding, stride=stride)
        (gw,) = torch.autograd.grad((z * g[s : s + 1]).sum(), [wt])
        torch.testing.assert_close(got[s], gw.reshape(o, -1), rtol=1e-12, atol=1e-12)


@settings(max_examples=12, deadline=None)
@given(
    b=st.integers(1, 4),
    c=st.integers(1, 3),
    o=st.integers(1, 4),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    k=st.integers(1, 4),
    padding=st.integers(0, 2),
    stride=st.integers(1, 3),
)
def test_grouped_conv_grads_equal_kernel_rows_and_autograd(b, c, o, h, w, k, padding, stride):
    """The grouped weight-gradient call (float32 CPU) gives the kernel-row path's per-sample
    conv gradients in its layout, and each is what autograd gives for that sample alone."""
    from privdl.engine.ghost import (
        _conv_grads_by_kernel_row,
        _conv_grads_grouped,
        _grouped_backward_applies,
    )

    if h + 2 * padding < k or w + 2 * padding < k:
        return
    gen = torch.Generator().manual_seed(b * 1000 + c * 100 + h * 10 + w + o + 7 * stride)
    x = torch.randn(b, c, h, w, generator=gen)
    weight = torch.randn(o, c, k, k, generator=gen)
    out = torch.nn.functional.conv2d(x, weight, padding=padding, stride=stride)
    g = torch.randn(out.shape, generator=gen)
    assert _grouped_backward_applies(x, 5) == torch.backends.mkldnn.is_available()
    assert not _grouped_backward_applies(x, 3) and not _grouped_backward_applies(x.double(), 5)
    got = _conv_grads_grouped(x, g, k, padding=padding, stride=stride)
    rows = _conv_grads_by_kernel_row(x, g.reshape(b, o, -1), k, padding=padding, stride=stride)
    assert got.shape == rows.shape and got.is_contiguous()
    torch.testing.assert_close(got, rows, rtol=1e-5, atol=1e-5)
    r = got.shape[0]  # (kh, B, O, C kw) -> (B, O, kh, C, kw) for stride 1
    per_sample = got.permute(1, 2, 0, 3).reshape(b, o, r, c, -1) if r > 1 else got[0]
    for s in range(b):
        wt = weight.double().requires_grad_(True)
        z = torch.nn.functional.conv2d(x[s : s + 1].double(), wt, padding=padding, stride=stride)
        (gw,) = torch.autograd.grad((z * g[s : s + 1].double()).sum(), [wt])
        want = gw.permute(0, 2, 1, 3) if r > 1 else gw  # (O, kh, C, kw) when by rows
        torch.testing.assert_close(
            per_sample[s].double().reshape(-1), want.reshape(-1), rtol=1e-5, atol=1e-5
        )


def test_cnn_clipped_grads_by_grouped_call_equal_kernel_rows(monkeypatch):
    """The Robust-HDP CNN's clipped sums and norms (float32, 3 nodes x 24 samples, masked)
    are the same with the grouped per-sample conv gradients as with the kernel-row bmm s."""
    from privdl.engine import ghost

    gen = torch.Generator().manual_seed(5)
    model = build_model("cnn-mnist", in_shape=(1, 28, 28), n_classes=10)
    params = model.init(n_nodes=3, generator=gen)
    x = torch.randn(3, 24, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (3, 24), generator=gen)
    mask = torch.rand(3, 24, generator=gen) < 0.7
    clip = ClipSpec("per_sample", 0.5)

    def run():
        return node_gradients(
            model, params, x, y, loss="cross_entropy", clip=clip, mask=mask, method="ghost"
        )

    grouped = run()
    monkeypatch.setattr(ghost, "_grouped_backward_applies", lambda x, k: False)
    rows = run()
    for k in rows.grads:
        torch.testing.assert_close(grouped.grads[k], rows.grads[k], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(grouped.per_sample_norms, rows.per_sample_norms)


def test_auto_picks_vmap_for_patch_heavy_convnets_on_cpu_only():
    """The CPU cost rule: conv patches per sample against p, from the architecture."""
    from privdl.engine.ghost import patch_elements, prefers_ghost

    cnn = build_model("cnn-mnist", in_shape=(1, 28, 28), n_classes=10)
    # column-only unfolding (stride 1, direct form): C k (H + 2 pad) W' per conv;
    # conv1: 1 x 5 x 32 x 28; conv2 (after a 2x2 pool): 16 x 5 x 18 x 14
    assert patch_elements(cnn) == 1 * 5 * 32 * 28 + 16 * 5 * 18 * 14 == 24_640
    params = cnn.init(n_nodes=1, generator=torch.Generator().manual_seed(0))
    assert sum(v.numel() for v in params.values()) == 28_938
    assert prefers_ghost(cnn, torch.device("cpu"))
    assert prefers_ghost(cnn, torch.device("cuda"))  # a device object; no GPU needed
    mlp = build_model("mlp", in_shape=(784,), n_classes=10)
    assert patch_elements(mlp) == 0 and prefers_ghost(mlp, torch.device("cpu"))
    # at 96 x 96 the patches (1 x 5 x 100 x 96 + 16 x 5 x 52 x 48) are 1.25 p: still ghost
    # (measured 1.25x faster than vmap on one CPU thread, 16 nodes x 16 samples)
    big = build_model("cnn-mnist", in_shape=(1, 96, 96), n_classes=10)
    p_big = sum(v.numel() for v in big.init(n_nodes=1, generator=torch.Generator()).values())
    assert patch_elements(big) == 48_000 + 199_680 > p_big
    assert prefers_ghost(big, torch.device("cpu"))
    # two 32-channel 3x3 convs at full 28 x 28 resolution: patches 8.4 p, vmap on a CPU
    # (measured 0.74x: ghost slower), ghost on a GPU
    from torch import nn

    from privdl.models import from_module

    wide = from_module(
        nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        ),  # fmt: skip
        in_shape=(1, 28, 28),
    )
    assert patch_elements(wide) == 1 * 3 * 30 * 28 + 32 * 3 * 30 * 28 > 8 * wide.num_parameters()
    assert not prefers_ghost(wide, torch.device("cpu"))
    assert prefers_ghost(wide, torch.device("cuda"))
    # a conv whose Gram form is cheaper (few output positions) counts the full unfold C k^2 L
    small = build_model("cnn-mnist", in_shape=(1, 4, 4), n_classes=10)
    assert patch_elements(small) == 1 * 5 * 8 * 4 + 16 * 25 * 4
    assert prefers_ghost(small, torch.device("cpu"))


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_per_sample_clipping_runs_without_tf32_and_restores_the_flags(method, monkeypatch):
    """TF32 convolutions/matmuls would let the clipped sum drift from the norms it was clipped
    by (docs/gpu.md): the per-sample path runs in full float32 and puts the user's flags back."""
    import privdl.engine.grads as grads_mod

    seen, boom = [], []
    target = "ghost_clipped_sum" if method == "ghost" else "_vmap_clipped_sum"
    inner = getattr(grads_mod, target)

    def spy(*a, **k):
        seen.append((torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()))
        if boom:
            raise RuntimeError("inside the clipped path")
        return inner(*a, **k)

    monkeypatch.setattr(grads_mod, target, spy)
    before = (torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        m = build_model("mlp", in_shape=(5,), n_classes=3)
        p = m.init(n_nodes=2, generator=torch.Generator().manual_seed(0))
        x = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(1))
        y = torch.randint(0, 3, (2, 4), generator=torch.Generator().manual_seed(2))
        clip = ClipSpec("per_sample", 0.5)
        node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, method=method)
        assert seen == [(False, "highest")]
        assert torch.backends.cudnn.allow_tf32 is True
        assert torch.get_float32_matmul_precision() == "high"
        boom.append(True)
        with pytest.raises(RuntimeError):  # restored on the way out of an error too
            node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, method=method)
        assert seen[-1] == (False, "highest")
        assert torch.backends.cudnn.allow_tf32 is True
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.backends.cudnn.allow_tf32 = before[0]
        torch.set_float32_matmul_precision(before[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_float32_resnet_clipping_stays_near_float64_with_tf32_allowed():
    """On an H200 the float32 clipped gradients of ResNet-18 GN were 29% off float64 in their
    worst layer under cuDNN's default TF32, 0.4% without it (docs/gpu.md)."""
    dev = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default: the engine must override it
    gen = torch.Generator(device=dev).manual_seed(0)
    m = build_model("resnet18-gn", in_shape=(3, 32, 32), n_classes=10)
    p = m.init(n_nodes=8, generator=gen, device=dev)
    x = torch.randn(8, 8, 3, 32, 32, generator=gen, device=dev)
    y = torch.randint(0, 10, (8, 8), generator=gen, device=dev)
    clip = ClipSpec("per_sample", 1.0)
    p64 = {k: v.double() for k, v in p.items()}
    want = node_gradients(m, p64, x.double(), y, loss="cross_entropy", clip=clip).grads
    for method in ("ghost", "vmap"):
        got = node_gradients(m, p, x, y, loss="cross_entropy", clip=clip, method=method).grads
        worst = max(
            float((got[k].double() - want[k]).abs().max() / want[k].abs().max()) for k in want
        )
        assert worst < 2e-2, (method, worst)
    assert torch.backends.cudnn.allow_tf32 is True
