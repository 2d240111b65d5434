"""Your own recurrent model: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` converted to privdl's
``Recurrent`` layer, clipped per sample on the ghost path (two token-wise Linear maps a layer);
checked against the module itself, a per-sample loop (the oracle) and the ``vmap`` path."""

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
from privdl.models import from_module
from privdl.models.export import to_module
from privdl.models.module import GraphModuleModel, SequentialModuleModel
from privdl.models.recurrent import Recurrent

F64 = torch.float64
V, T, D, H = 20, 6, 5, 7


class Tagger(nn.Module):
    """Tokens -> embedding -> recurrent layers -> the last step's hidden state -> classes."""

    def __init__(self, cls=nn.LSTM, classes: int = 3, **options) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.rnn = cls(D, H, batch_first=True, **options)
        self.fc = nn.Linear(H, classes)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.fc(out[:, -1])


class Bidirectional(Tagger):
    def __init__(self, cls=nn.LSTM, num_layers: int = 2) -> None:
        super().__init__(cls, bidirectional=True, num_layers=num_layers)
        self.fc = nn.Linear(2 * H, 3)


class MeanOverSteps(Tagger):
    def forward(self, x):
        return self.fc(self.rnn(self.emb(x))[0].mean(1))


CASES = [
    pytest.param(lambda: Tagger(), id="lstm"),
    pytest.param(lambda: Tagger(num_layers=2), id="lstm-two-layers"),
    pytest.param(lambda: Tagger(nn.GRU), id="gru"),
    pytest.param(lambda: Tagger(nn.GRU, bias=False, num_layers=2), id="gru-no-bias"),
    pytest.param(lambda: Tagger(nn.RNN), id="rnn-tanh"),
    pytest.param(lambda: MeanOverSteps(nn.RNN, nonlinearity="relu"), id="rnn-relu-mean"),
    pytest.param(lambda: Bidirectional(), id="lstm-bidirectional-two-layers"),
    pytest.param(lambda: Bidirectional(nn.GRU, num_layers=1), id="gru-bidirectional"),
    pytest.param(lambda: FinalState(num_layers=2), id="lstm-final-state"),
    pytest.param(lambda: GruFinalState(nn.GRU), id="gru-final-state-squeezed"),
]


def _params(model, seed: int):
    gen = torch.Generator().manual_seed(seed)
    base = model.init(n_nodes=2, generator=gen, dtype=F64)
    return {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in base.items()}


@pytest.mark.parametrize("make", CASES)
def test_recurrent_modules_convert_and_equal_the_module(make):
    torch.manual_seed(0)
    module = make().double()
    model = from_module(module, in_shape=(T,))
    assert type(model) in (SequentialModuleModel, GraphModuleModel) and supports_ghost(model)
    assert model.param_shapes() == {k: tuple(v.shape) for k, v in module.named_parameters()}
    assert any(isinstance(layer, Recurrent) for _, layer, _ in model.layer_inputs())
    params = _params(model, 1)
    x = torch.randint(0, V, (2, 4, T), generator=torch.Generator().manual_seed(2))
    out = model.forward(params, x)
    for i in range(2):  # torch's fused kernels with node i's weights
        module.load_state_dict({k: v[i] for k, v in params.items()})
        with torch.no_grad():
            torch.testing.assert_close(out[i], module(x[i]), rtol=1e-10, atol=1e-12)
    again = to_module(model, {k: v[0] for k, v in params.items()})
    with torch.no_grad():
        torch.testing.assert_close(again(x[0]), out[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make", CASES)
def test_recurrent_clipped_gradients_equal_the_loop_and_vmap(make):
    torch.manual_seed(0)
    module = make().double()
    model = from_module(module, in_shape=(T,))
    params = _params(model, 3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randint(0, V, (2, 4, T), generator=gen)
    x[1, 2] = 3  # one token at every step
    y = torch.randint(0, 3, (2, 4), generator=gen)
    clip = ClipSpec("per_sample", 0.05)
    want = clipped_mean_loop(make().double(), params, x, y, 0.05)
    ghost = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    vmap = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method="vmap")
    assert set(ghost.grads) == set(want)
    for k in want:
        torch.testing.assert_close(ghost.grads[k], want[k], rtol=1e-9, atol=1e-12, msg=k)
        torch.testing.assert_close(vmap.grads[k], want[k], rtol=1e-9, atol=1e-12, msg=k)
    torch.testing.assert_close(ghost.per_sample_norms, vmap.per_sample_norms, rtol=1e-10, atol=0)
    assert float(ghost.per_sample_norms.min()) > 0.05  # the clip binds


def test_a_float_sequence_model_starts_with_the_recurrent_layer():
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(D, H, batch_first=True)
            self.fc = nn.Linear(H, 2)

        def forward(self, x):
            return self.fc(self.rnn(x)[0][:, -1])

    module = Net().double()
    model = from_module(module, in_shape=(T, D))
    params = _params(model, 5)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, T, D, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (2, 3), generator=gen)
    want = clipped_mean_loop(Net().double(), params, x, y, 0.1)
    got = node_gradients(model, params, x, y, loss="cross_entropy",
                         clip=ClipSpec("per_sample", 0.1), method="ghost")  # fmt: skip
    for k in want:
        torch.testing.assert_close(got.grads[k], want[k], rtol=1e-9, atol=1e-12, msg=k)


class InitialState(Tagger):
    def forward(self, x):
        h0 = torch.zeros(1, x.shape[0], H, dtype=self.fc.weight.dtype)
        return self.fc(self.rnn(self.emb(x), (h0, h0))[0][:, -1])


class FinalState(Tagger):  # h_n[-1]: the last layer's state after the last step
    def forward(self, x):
        _, (h, _) = self.rnn(self.emb(x))
        return self.fc(h[-1])


class GruFinalState(Tagger):
    def forward(self, x):
        _, h = self.rnn(self.emb(x))
        return self.fc(h.squeeze(0))


class BidirectionalFinalState(Bidirectional):
    def forward(self, x):
        _, (h, _) = self.rnn(self.emb(x))
        return self.fc(torch.cat([h[-2], h[-1]], -1))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Tagger(dropout=0.2, num_layers=2), r"LSTM \(rnn\): dropout=0.2 between its"),
        (lambda: InitialState(), r"LSTM \(rnn\): privdl clips recurrent layers called as"),
        (lambda: BidirectionalFinalState(), r"LSTM \(rnn\): privdl clips recurrent layers"),
        (lambda: _seq_first(), r"GRU \(rnn\): privdl clips recurrent layers"),
    ],
)
def test_recurrent_forms_privdl_cannot_clip_are_refused_in_one_line(make, message):
    with pytest.raises(ConfigError, match=message):
        from_module(make(), in_shape=(T,))


def _seq_first() -> nn.Module:
    net = Tagger(nn.GRU)
    net.rnn = nn.GRU(D, H)  # (T, B, D) inputs
    return net


def test_an_lstm_trains_privately_end_to_end(tmp_path):
    x, y = marked_tokens(600, V, position=5)
    torch.manual_seed(0)
    result = train_dpsgd(Tagger(classes=2), x, y, lr=1.0, out=tmp_path / "run")
    assert result.privacy["epsilon"] <= 8.0
    assert result.metrics[-1]["accuracy"] > 0.9  # chance is 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("make", CASES)
def test_cuda_recurrent_models_equal_the_cpu_clipped_gradients(make):
    torch.manual_seed(0)
    model = from_module(make().double(), in_shape=(T,))
    params = _params(model, 7)
    gen = torch.Generator().manual_seed(8)
    x, y = torch.randint(0, V, (2, 4, T), generator=gen), torch.randint(0, 3, (2, 4), generator=gen)
    assert_cuda_matches_cpu(model, params, x, y, 0.05)
