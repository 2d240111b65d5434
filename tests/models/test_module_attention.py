"""Your own transformer: ``nn.MultiheadAttention`` (self-attention), ``nn.TransformerEncoderLayer``
and ``nn.TransformerEncoder`` converted to privdl's layers, so that per-sample clipping takes the
ghost path; checked against the module itself and against a per-sample loop (the oracle)."""

from __future__ import annotations

import pytest
import torch
from per_sample_loop import (
    assert_cuda_matches_cpu,
    clipped_mean_loop,
    marked_tokens,
    train_dpsgd,
)
from torch import nn

from privdl.engine import ClipSpec, node_gradients
from privdl.engine.ghost import supports_ghost
from privdl.errors import ConfigError
from privdl.models import ModuleModel, from_module
from privdl.models.attention import SelfAttention
from privdl.models.export import to_module
from privdl.models.module import GraphModuleModel

F64 = torch.float64
V, T, D = 20, 5, 8


class Encoder(nn.Module):
    """Tokens -> embedding -> TransformerEncoder -> mean over tokens -> classes."""

    def __init__(self, *, norm_first=False, activation="relu", layers=2, final_norm=False,
                 bias=True) -> None:  # fmt: skip
        super().__init__()
        self.emb = nn.Embedding(V, D)
        layer = nn.TransformerEncoderLayer(D, 2, dim_feedforward=12, dropout=0.0,
                                           activation=activation, batch_first=True,
                                           norm_first=norm_first, bias=bias)  # fmt: skip
        self.enc = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(D) if final_norm else None,
                                         enable_nested_tensor=False)  # fmt: skip
        self.fc = nn.Linear(D, 3)

    def forward(self, x):
        return self.fc(self.enc(self.emb(x)).mean(1))


class Block(nn.Module):
    """A pre-norm block written by hand around nn.MultiheadAttention, GELU feed-forward."""

    def __init__(self, *, need_weights=False) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.emb = nn.Embedding(V, D)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.ff1, self.ff2 = nn.Linear(D, 16), nn.Linear(16, D)
        self.act = nn.GELU()
        self.fc = nn.Linear(D, 3)

    def forward(self, x):
        h = self.emb(x)
        a = self.ln1(h)
        if self.need_weights:
            h = h + self.attn(a, a, a)[0]
        else:
            h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.ff2(self.act(self.ff1(self.ln2(h))))
        return self.fc(h.amax(1))


class Positional(Block):
    """Learned positions ``(1, T, D)`` added after the embedding (a ViT/BERT-style parameter),
    a fixed sinusoidal table (a buffer) added in place, and a learned ``(D,)`` shift."""

    def __init__(self) -> None:
        super().__init__()
        del self.ff1, self.ff2, self.ln2  # not used here
        self.pos = nn.Parameter(0.1 * torch.randn(1, T, D))
        self.shift = nn.Parameter(0.1 * torch.randn(D))
        angle = torch.arange(T)[:, None] / 100.0 ** (torch.arange(D)[None, :] / D)
        self.register_buffer("table", torch.sin(angle).float(), persistent=False)

    def forward(self, x):
        h = self.emb(x) + self.pos
        h += self.table
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        return self.fc(self.shift + h.mean(1))


class PaddedEncoder(Encoder):
    """Token 0 is padding: the encoder's key padding mask ``x == 0``, the first token pooled."""

    def forward(self, x):
        return self.fc(self.enc(self.emb(x), src_key_padding_mask=x == 0)[:, 0])


class PaddedBlock(Block):
    """nn.MultiheadAttention with ``key_padding_mask=x.eq(0)``, the last position pooled."""

    def forward(self, x):
        h = self.emb(x)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, key_padding_mask=x.eq(0), need_weights=False)[0]
        h = h + self.ff2(self.act(self.ff1(self.ln2(h))))
        return self.fc(h[:, -1, :])


def _params(model, seed: int):
    gen = torch.Generator().manual_seed(seed)
    base = model.init(n_nodes=2, generator=gen, dtype=F64)
    return {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in base.items()}


CASES = [
    pytest.param(lambda: Encoder(), id="post-norm"),
    pytest.param(
        lambda: Encoder(norm_first=True, activation="gelu", final_norm=True),
        id="pre-norm-gelu-final-norm",
    ),  # fmt: skip
    pytest.param(lambda: Encoder(layers=1, bias=False), id="no-bias"),
    pytest.param(lambda: Block(), id="hand-written-block"),
    pytest.param(lambda: Block(need_weights=True), id="block-weights-dropped"),
    pytest.param(lambda: Positional(), id="positions-parameter-and-buffer"),
    pytest.param(lambda: PaddedEncoder(), id="encoder-padding-mask-first-token"),
    pytest.param(lambda: PaddedBlock(), id="attention-padding-mask-last-token"),
]


def _tokens(gen: torch.Generator):
    """``(2, 4, T)`` tokens with padding (0) at the ends of some samples, never at positions 0
    and T - 1 (a query with every key masked has no softmax, in torch too)."""
    x = torch.randint(1, V, (2, 4, T), generator=gen)
    x[0, 0, 2:4] = 0
    x[1, 2, 1] = 0
    return x


@pytest.mark.parametrize("make", CASES)
def test_transformers_convert_and_equal_the_module(make):
    torch.manual_seed(0)
    module = make().double()
    model = from_module(module, in_shape=(T,))
    assert type(model) is GraphModuleModel and supports_ghost(model)
    assert model.param_shapes() == {k: tuple(v.shape) for k, v in module.named_parameters()}
    assert any(isinstance(layer, SelfAttention) for _, layer, _ in model.layer_inputs())
    params = _params(model, 1)
    x = _tokens(torch.Generator().manual_seed(2))
    out = model.forward(params, x)
    for i in range(2):  # the user's module with node i's weights, as in training and in eval
        module.load_state_dict({k: v[i] for k, v in params.items()})
        with torch.no_grad():
            torch.testing.assert_close(out[i], module.train()(x[i]), rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(out[i], module.eval()(x[i]), rtol=1e-9, atol=1e-10)
    again = to_module(model, {k: v[1] for k, v in params.items()})  # export: the user's class
    with torch.no_grad():
        torch.testing.assert_close(again(x[1]), out[1], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("make", CASES)
def test_transformer_clipped_gradients_equal_the_per_sampleclipped_mean_loop(make):
    torch.manual_seed(0)
    module = make().double()
    model = from_module(module, in_shape=(T,))
    params = _params(model, 3)
    gen = torch.Generator().manual_seed(4)
    x = _tokens(gen)
    x[0, 1] = 7  # one token repeated at every position
    y = torch.randint(0, 3, (2, 4), generator=gen)
    want = clipped_mean_loop(make().double(), params, x, y, 0.05)
    got = node_gradients(model, params, x, y, loss="cross_entropy",
                         clip=ClipSpec("per_sample", 0.05), method="ghost")  # fmt: skip
    assert set(got.grads) == set(want)
    for k in want:
        torch.testing.assert_close(got.grads[k], want[k], rtol=1e-9, atol=1e-12, msg=k)
    # the clip binds: these are clipped gradients, not the plain ones
    assert float(got.per_sample_norms.min()) > 0.05


def test_causal_self_attention_masks_the_later_positions():
    layer = SelfAttention(4, 2, causal=True)
    a = torch.randn(1, 2, 3, 12, dtype=F64, requires_grad=True)
    out = layer.forward({}, a)
    out[..., 0, :].sum().backward()  # position 0 reads only itself
    assert torch.all(a.grad[..., 1:, :] == 0) and torch.any(a.grad[..., 0, :] != 0)
    mha = nn.MultiheadAttention(4, 2, batch_first=True, bias=False).double()
    with torch.no_grad():  # the same maths as torch's, with identity projections
        mha.in_proj_weight.copy_(torch.eye(4, dtype=F64).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(4, dtype=F64))
        h = torch.randn(2, 3, 4, dtype=F64)
        want = mha(h, h, h, need_weights=False, is_causal=True,
                   attn_mask=nn.Transformer.generate_square_subsequent_mask(3, dtype=F64))[0]  # fmt: skip
        got = layer.forward({}, h.repeat(1, 1, 3)[None])[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


class CrossAttention(Block):
    def forward(self, x):
        h = self.emb(x)
        return self.fc(self.attn(h, self.ln1(h), self.ln1(h), need_weights=False)[0].mean(1))


class Masked(Block):  # a mask other than x == pad: the generic path
    def forward(self, x):
        h = self.emb(x)
        return self.fc(self.attn(h, h, h, key_padding_mask=x > 15)[0].mean(1))


class SeqFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.attn = nn.MultiheadAttention(D, 2)  # (T, B, D) inputs
        self.fc = nn.Linear(D, 3)

    def forward(self, x):
        h = self.emb(x).transpose(0, 1)
        return self.fc(self.attn(h, h, h)[0].mean(0))


class Weights(Block):  # the attention weights are used: no conversion
    def forward(self, x):
        h = self.emb(x)
        r = self.attn(h, h, h)
        return self.fc((r[0] * r[1].sum(-1, keepdim=True)).mean(1))


class TwicePositional(Positional):  # one parameter added twice: its gradient sums two uses
    def forward(self, x):
        h = self.emb(x) + self.pos
        return self.fc((self.ln1(h) + self.pos).mean(1))


@pytest.mark.parametrize("cls", [CrossAttention, Masked, SeqFirst, Weights, TwicePositional])
def test_other_attention_uses_keep_the_generic_path(cls):
    torch.manual_seed(0)
    model = from_module(cls(), in_shape=(T,))
    assert type(model) is ModuleModel and not supports_ghost(model)


class _WithAttention(nn.Module):
    def __init__(self, attn: nn.MultiheadAttention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x):
        return self.attn(x, x, x)[0]


def test_dropout_zero_is_the_identity_and_other_dropout_is_refused():
    layer = nn.TransformerEncoderLayer(D, 2, 16, dropout=0.1, batch_first=True)
    with pytest.raises(ConfigError, match=r"\(0\.self_attn\): dropout=0.1 draws a random"):
        from_module(nn.Sequential(layer), in_shape=(T, D))
    with pytest.raises(ConfigError, match=r"Dropout \(1\) draws a random .* set p=0"):
        from_module(nn.Sequential(nn.Linear(D, D), nn.Dropout(0.1)), in_shape=(D,))
    attention = nn.MultiheadAttention(D, 2, dropout=0.1, batch_first=True)
    with pytest.raises(ConfigError, match=r"MultiheadAttention \(attn\): dropout=0.1 draws"):
        ModuleModel(_WithAttention(attention), in_shape=(T, D))
    model = from_module(nn.Sequential(nn.Linear(D, D), nn.Dropout(0.0)), in_shape=(D,))
    assert supports_ghost(model)


def test_a_transformer_trains_privately_end_to_end(tmp_path):
    x, y = marked_tokens(800, V, position=3)
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(V, 16)
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.fc = nn.Linear(16, 2)

        def forward(self, x):
            return self.fc(self.enc(self.emb(x)).amax(1))

    result = train_dpsgd(Net(), x, y, lr=0.5, out=tmp_path / "run")
    assert result.privacy["epsilon"] <= 8.0
    assert result.metrics[-1]["accuracy"] > 0.9  # chance is 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("make", CASES)
def test_cuda_transformers_equal_the_cpu_clipped_gradients(make):
    torch.manual_seed(0)
    model = from_module(make().double(), in_shape=(T,))
    params = _params(model, 7)
    gen = torch.Generator().manual_seed(8)
    x, y = _tokens(gen), torch.randint(0, 3, (2, 4), generator=gen)
    assert_cuda_matches_cpu(model, params, x, y, 0.05)
