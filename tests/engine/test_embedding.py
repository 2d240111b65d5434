"""Per-sample clipping of models that read integer indices with an Embedding (issue 37, item 1).

The oracle is a loop over nodes and samples: for each one a ``torch.nn`` module (``nn.Embedding``
and the rest of the chain, holding that node's weights), one backward per sample, the closed-form
clip factor, and the sum. The ghost path (segment sums over the distinct indices of a sample) and
the ``vmap`` path must both equal it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from privdl.engine import ClipSpec, evaluate, node_gradients
from privdl.engine.ghost import embedding_norms, supports_ghost
from privdl.errors import DataError
from privdl.models import (
    Activation,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    Reduce,
    SequentialModel,
)

F64 = torch.float64


def text_model(
    vocabulary: int, dim: int, length: int, classes: int, pool: str, padding: int | None = None
) -> SequentialModel:
    """Embedding, then the tokens flattened or averaged, then one (or two) linear layers."""
    layers: list = [("emb", Embedding(vocabulary, dim, padding_idx=padding))]
    if pool == "flatten":
        layers += [("flat", Flatten()), ("fc", Linear(length * dim, classes))]
    elif pool == "tokenwise":  # layer norm and a linear map at every position
        layers += [("norm", LayerNorm((dim,))), ("tok", Linear(dim, 3)),
                   ("act", Activation("tanh")), ("pool", Reduce("mean", -2)),
                   ("out", Linear(3, classes))]  # fmt: skip
    else:
        layers += [("pool", Reduce(pool, 1)), ("act", Activation("tanh")),
                   ("fc", Linear(dim, 3)), ("act2", Activation("relu")),
                   ("out", Linear(3, classes))]  # fmt: skip
    return SequentialModel("text", (length,), layers)


class _Reference(nn.Module):
    """The same network from torch's own modules, for one node."""

    def __init__(self, model: SequentialModel) -> None:
        super().__init__()
        self.steps = nn.ModuleDict()
        self.kinds: list[tuple[str, object]] = []
        for name, layer in model.layers:
            if isinstance(layer, Embedding):
                self.steps[name] = nn.Embedding(
                    layer.num_embeddings, layer.embedding_dim, padding_idx=layer.padding_idx
                )
            elif isinstance(layer, Linear):
                self.steps[name] = nn.Linear(layer.in_features, layer.out_features)
            elif isinstance(layer, LayerNorm):
                self.steps[name] = nn.LayerNorm(layer.normalized_shape, bias=layer.bias)
            self.kinds.append((name, layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, layer in self.kinds:
            if name in self.steps:
                x = self.steps[name](x)
            elif isinstance(layer, Flatten):
                x = x.flatten(1)
            elif isinstance(layer, Reduce):
                x = x.mean(layer.dim) if layer.op == "mean" else x.sum(layer.dim)
            else:
                x = {"tanh": torch.tanh, "relu": torch.relu}[layer.name](x)
        return x


def loop_oracle(model, params, x, y, clip: ClipSpec, mask=None):
    n, b = x.shape[:2]
    grads = {k: torch.zeros_like(v) for k, v in params.items()}
    norms = torch.zeros(n, b, dtype=F64)
    for i in range(n):
        ref = _Reference(model).double()
        ref.load_state_dict({k: v[i] for k, v in _ref_names(params).items()})
        plist = dict(ref.named_parameters())
        keep = [s for s in range(b) if mask is None or mask[i, s] > 0]
        for s in keep:
            loss = F.cross_entropy(ref(x[i, s : s + 1]), y[i, s : s + 1])
            g = torch.autograd.grad(loss, list(plist.values()))
            norm = torch.sqrt(sum((gg**2).sum() for gg in g))
            norms[i, s] = norm
            c = (
                min(1.0, clip.threshold / norm)
                if clip.kind == "hard"
                else clip.threshold / (clip.threshold + norm)
            )
            for name, gg in zip(plist, g, strict=True):
                grads[_our_name(name)][i] += c * gg / len(keep)
    return grads, norms


def _ref_names(params):
    return {f"steps.{k}": v for k, v in params.items()}


def _our_name(ref_name: str) -> str:
    return ref_name.removeprefix("steps.")


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3),
    b=st.integers(1, 5),
    length=st.integers(1, 6),
    vocabulary=st.integers(1, 7),  # few rows: many repeated indices in a sample
    dim=st.integers(1, 4),
    pool=st.sampled_from(["flatten", "mean", "sum", "tokenwise"]),
    clip=st.sampled_from(
        [
            ClipSpec("per_sample", 0.05),
            ClipSpec("per_sample", 0.2, "smooth"),
            ClipSpec("per_sample", 100.0),
        ]  # fmt: skip
    ),
    use_mask=st.booleans(),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_embedding_chains_equal_the_loop_oracle(
    n, b, length, vocabulary, dim, pool, clip, use_mask, padded, seed
):
    gen = torch.Generator().manual_seed(seed)
    model = text_model(vocabulary, dim, length, 3, pool, padding=0 if padded else None)
    assert supports_ghost(model) and model.takes_indices and model.input_vocabulary == vocabulary
    params = model.init(n_nodes=n, generator=gen, dtype=F64, same_init=False)
    x = torch.randint(0, vocabulary, (n, b, length), generator=gen)
    y = torch.randint(0, 3, (n, b), generator=gen)
    mask = (torch.rand(n, b, generator=gen) > 0.3).to(F64) if use_mask else None
    if mask is not None:
        mask[:, 0] = 1.0
    want, want_norms = loop_oracle(model, params, x, y, clip, mask)
    for method in ("ghost", "vmap"):
        got = node_gradients(
            model, params, x, y, loss="cross_entropy", clip=clip, mask=mask, method=method
        )
        for k in want:
            torch.testing.assert_close(got.grads[k], want[k], rtol=1e-10, atol=1e-12, msg=k)
        torch.testing.assert_close(got.per_sample_norms, want_norms, rtol=1e-10, atol=1e-12)


def test_embedding_norms_equal_the_dense_per_sample_gradients():
    """The segment-sum norms against per-sample gradients scattered into full (V, D) tables."""
    gen = torch.Generator().manual_seed(3)
    n, b, length, vocabulary, d = 2, 7, 9, 5, 3
    tokens = torch.randint(0, vocabulary, (n, b, length), generator=gen)
    tokens[0, 0] = 4  # one index repeated over the whole sample
    g = torch.randn(n, b, length, d, generator=gen, dtype=F64)
    dense = torch.zeros(n, b, vocabulary, d, dtype=F64)
    for i in range(n):
        for s in range(b):
            for pos in range(length):
                dense[i, s, tokens[i, s, pos]] += g[i, s, pos]
    want = dense.flatten(2).norm(dim=2)
    torch.testing.assert_close(embedding_norms(tokens, g, vocabulary), want, rtol=1e-12, atol=0)
    assert embedding_norms(tokens, g, vocabulary)[0, 0] == pytest.approx(
        float(g[0, 0].sum(0).norm()), rel=1e-12
    )


def test_float_indices_are_read_as_integers_and_evaluate_takes_indices():
    gen = torch.Generator().manual_seed(0)
    model = text_model(6, 2, 4, 3, "mean")
    params = model.init(n_nodes=2, generator=gen, dtype=F64)
    x = torch.randint(0, 6, (2, 5, 4), generator=gen)
    y = torch.randint(0, 3, (2, 5), generator=gen)
    clip = ClipSpec("per_sample", 0.1)
    as_int = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip)
    as_float = node_gradients(model, params, x.to(F64), y, loss="cross_entropy", clip=clip)
    for k in as_int.grads:
        assert torch.equal(as_int.grads[k], as_float.grads[k])
    one = {k: v[:1] for k, v in params.items()}
    loss, acc = evaluate(model, one, x[0], y[0], loss="cross_entropy")
    ref = _Reference(model).double()
    ref.load_state_dict({f"steps.{k}": v[0] for k, v in params.items()})
    with torch.no_grad():
        out = ref(x[0])
    assert float(loss[0]) == pytest.approx(float(F.cross_entropy(out, y[0])), rel=1e-12)
    assert float(acc[0]) == pytest.approx(float((out.argmax(1) == y[0]).double().mean()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x: x + 6, "indices must lie in 0 .. 5, got"),
        (lambda x: x - 1, "indices must lie in 0 .. 5, got -1"),
        (lambda x: x.to(F64) + 0.5, "must be integer indices"),
    ],
)
def test_bad_indices_are_one_line_data_errors(change, message):
    gen = torch.Generator().manual_seed(0)
    model = text_model(6, 2, 4, 3, "flatten")
    params = model.init(n_nodes=1, generator=gen, dtype=F64)
    x = torch.randint(0, 6, (1, 3, 4), generator=gen)
    x[0, 0, 0] = 0
    y = torch.randint(0, 3, (1, 3), generator=gen)
    for clip in (ClipSpec(), ClipSpec("per_sample", 1.0)):
        with pytest.raises(DataError, match=message) as err:
            node_gradients(model, params, change(x), y, loss="cross_entropy", clip=clip)
        assert "\n" not in str(err.value)


def test_the_padding_row_starts_at_zero_and_never_learns():
    gen = torch.Generator().manual_seed(0)
    model = text_model(6, 3, 4, 3, "mean", padding=-1)  # torch's negative index: row 5
    params = model.init(n_nodes=2, generator=gen, dtype=F64)
    assert model.layers[0][1].padding_idx == 5
    assert torch.equal(params["emb.weight"][:, 5], torch.zeros(2, 3, dtype=F64))
    x = torch.randint(0, 6, (2, 5, 4), generator=gen)
    x[:, :, :2] = 5
    y = torch.randint(0, 3, (2, 5), generator=gen)
    for method in ("ghost", "vmap"):
        for clip in (ClipSpec(), ClipSpec("per_sample", 0.1)):
            got = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip,
                                 method=method)  # fmt: skip
            assert torch.equal(got.grads["emb.weight"][:, 5], torch.zeros(2, 3, dtype=F64))
            assert got.grads["emb.weight"].abs().sum() > 0


@pytest.mark.parametrize("pool", ["flatten", "mean"])
def test_a_text_model_exports_to_torch_modules_that_predict_the_same(pool):
    """``to_module``: nn.Embedding (with its padding row) where every layer has a torch twin, the
    exact fallback where one (Reduce) has none; both read the indices as the stacked model."""
    from privdl.models.export import to_module

    gen = torch.Generator().manual_seed(2)
    model = text_model(9, 3, 5, 3, pool, padding=0)
    params = model.init(n_nodes=1, generator=gen, dtype=F64)
    one = {k: v[0] for k, v in params.items()}
    module = to_module(model, one)
    if pool == "flatten":
        assert isinstance(module[0], nn.Embedding) and module[0].padding_idx == 0
    x = torch.randint(0, 9, (6, 5), generator=gen)
    with torch.no_grad():
        want = model.forward(params, x[None])[0]
        torch.testing.assert_close(module(x), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("positions", "d_in", "d_out"),
    [(8, 64, 64), (3, 16, 16), (64, 4, 3), (1, 5, 7)],  # Gram, Gram, direct, Gram
)
def test_positional_linear_norms_equal_the_per_sample_gradients(positions, d_in, d_out):
    """Both forms of a Linear at T positions against ``||G_s^T A_s||`` formed sample by sample."""
    from privdl.engine.ghost import _direct_is_cheaper, _positional_linear_norms

    gen = torch.Generator().manual_seed(positions)
    a = torch.randn(2, 3, positions, d_in, generator=gen, dtype=F64)
    g = torch.randn(2, 3, positions, d_out, generator=gen, dtype=F64)
    weight, bias = _positional_linear_norms(a, g, bias=True)
    for i in range(2):
        for s in range(3):
            assert float(weight[i, s]) == pytest.approx(
                float((g[i, s].T @ a[i, s]).norm()), rel=1e-12
            )
            assert float(bias[i, s]) == pytest.approx(float(g[i, s].sum(0).norm()), rel=1e-12)
    assert _direct_is_cheaper(d_out, d_in, positions) == (positions == 64)


def test_a_wide_tokenwise_text_model_equals_the_loop_oracle():
    """Embedding(40, 16) then Linear(16, 16) at 3 positions: the Gram form is chosen."""
    gen = torch.Generator().manual_seed(5)
    model = SequentialModel(
        "wide", (3,),
        [("emb", Embedding(40, 16)), ("tok", Linear(16, 16)), ("act", Activation("relu")),
         ("pool", Reduce("sum", 1)), ("out", Linear(16, 3))],
    )  # fmt: skip
    params = model.init(n_nodes=2, generator=gen, dtype=F64, same_init=False)
    x = torch.randint(0, 40, (2, 4, 3), generator=gen)
    y = torch.randint(0, 3, (2, 4), generator=gen)
    clip = ClipSpec("per_sample", 0.5)
    want, want_norms = loop_oracle(model, params, x, y, clip)
    got = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    for k in want:
        torch.testing.assert_close(got.grads[k], want[k], rtol=1e-10, atol=1e-12, msg=k)
    torch.testing.assert_close(got.per_sample_norms, want_norms, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pool", ["mean", "tokenwise"])
def test_cuda_text_models_equal_the_cpu_clipped_gradients(pool):
    """Embedding (padding row), LayerNorm and token-wise Linear on the device, float64."""
    gen = torch.Generator().manual_seed(7)
    model = text_model(50, 8, 10, 3, pool, padding=0)
    params = model.init(n_nodes=3, generator=gen, dtype=F64, same_init=False)
    x = torch.randint(0, 50, (3, 6, 10), generator=gen)
    x[:, :, -3:] = 0
    y = torch.randint(0, 3, (3, 6), generator=gen)
    clip = ClipSpec("per_sample", 0.2)
    cpu = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    on = {k: v.cuda() for k, v in params.items()}
    gpu = node_gradients(model, on, x.cuda(), y.cuda(), loss="cross_entropy", clip=clip,
                         method="ghost")  # fmt: skip
    for k in cpu.grads:
        torch.testing.assert_close(gpu.grads[k].cpu(), cpu.grads[k], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gpu.per_sample_norms.cpu(), cpu.per_sample_norms, rtol=1e-10, atol=0)
