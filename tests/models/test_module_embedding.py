"""Your own text model: an ``nn.Embedding`` read at integer indices, as privdl's layers (the ghost
path) where it converts, by ``vmap`` where it does not, and end to end through ``privdl.train``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from per_sample_loop import clipped_mean_loop
from torch import nn

import privdl
from privdl.engine import ClipSpec, node_gradients
from privdl.engine.ghost import supports_ghost
from privdl.errors import ConfigError, DataError
from privdl.models import ModuleModel, SequentialModuleModel, from_module
from privdl.models.module import GraphModuleModel

F64 = torch.float64


class MeanText(nn.Module):  # a bag-of-embeddings classifier (fastText-like)
    def __init__(self, vocabulary: int = 30, dim: int = 6, classes: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocabulary, dim)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x):
        return self.fc(torch.tanh(self.emb(x).mean(1)))


class SumText(MeanText):
    def forward(self, x):
        return self.fc(torch.sum(self.emb(x), dim=-2))


class ResidualText(MeanText):  # a residual sum after the pooling: the graph form
    def __init__(self) -> None:
        super().__init__(classes=6)
        self.mix = nn.Linear(6, 6)

    def forward(self, x):
        h = self.emb(x).mean(dim=1)
        return self.fc(h + torch.relu(self.mix(h)))


class PaddedText(MeanText):  # padding_idx: torch zeroes that row's gradient
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 6, padding_idx=0)


class TokenwiseText(MeanText):  # a linear map at every token, then the mean: positional norms
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Linear(6, 6)

    def forward(self, x):
        return self.fc(F.relu(self.tok(self.emb(x))).mean(dim=1))


class NormedText(nn.Module):  # layer norm over each sample's (tokens, features), no bias
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 6)
        self.norm = nn.LayerNorm([7, 6], bias=False)
        self.fc = nn.Linear(42, 3)

    def forward(self, x):
        return self.fc(self.norm(self.emb(x)).flatten(1))


class LogSumExpText(MeanText):  # logsumexp over the tokens is no layer of privdl's: generic
    def forward(self, x):
        return self.fc(torch.logsumexp(self.emb(x), 1))


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (MeanText, SequentialModuleModel),
        (SumText, SequentialModuleModel),
        (ResidualText, GraphModuleModel),
        (PaddedText, SequentialModuleModel),
        (TokenwiseText, SequentialModuleModel),
        (NormedText, SequentialModuleModel),
        (LogSumExpText, ModuleModel),
    ],
)
def test_text_modules_equal_the_per_sampleclipped_mean_loop(cls, kind):
    torch.manual_seed(0)
    module = cls().double()
    model = from_module(module, in_shape=(7,))
    assert type(model) is kind
    assert model.takes_indices and model.input_vocabulary == 30
    assert supports_ghost(model) == (kind is not ModuleModel)
    gen = torch.Generator().manual_seed(1)
    base = model.init(n_nodes=2, generator=gen, dtype=F64)
    params = {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in base.items()}
    x = torch.randint(0, 30, (2, 4, 7), generator=gen)
    x[0, 0] = 0  # the padding row, repeated
    x[1, 1, :3] = 5
    y = torch.randint(0, module.fc.out_features, (2, 4), generator=gen)
    want = clipped_mean_loop(cls().double(), params, x, y, 0.3)
    got = node_gradients(model, params, x, y, loss="cross_entropy",
                         clip=ClipSpec("per_sample", 0.3))  # fmt: skip
    for k in want:
        torch.testing.assert_close(got.grads[k], want[k], rtol=1e-10, atol=1e-12, msg=k)


def test_a_float_model_is_not_an_index_model():
    model = from_module(nn.Sequential(nn.Linear(4, 2)), in_shape=(4,))
    assert not model.takes_indices and model.input_vocabulary is None


def _text_data(n: int, length: int, seed: int):
    """Class c puts token c at four random positions among random tokens 2 .. 29."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, 30, (n, length), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    x.scatter_(1, torch.randint(0, length, (n, 4), generator=g), y[:, None].expand(-1, 4).clone())
    return x, y


def test_your_text_model_trains_privately_end_to_end(tmp_path):
    x, y = _text_data(1200, 12, seed=0)
    torch.manual_seed(0)
    result = privdl.train(algorithm="decor", model=MeanText(classes=2), data=(x, y),
                          graph="ring:4", clip=1.0, epsilon=8.0, delta=1e-5, steps=120,
                          eval_every=120, batch_size=16, lr=1.0, out=tmp_path / "run",
                          progress=False)  # fmt: skip
    assert result.privacy["epsilon"] <= 8.0 and result.privacy["unit"] == "example"
    assert result.metrics[-1]["accuracy"] > 0.9  # chance is 0.5
    with torch.no_grad():  # the returned module is the user's class and reads the indices
        assert float((result.model(x).argmax(1) == y).double().mean()) > 0.9


def test_data_outside_the_vocabulary_is_refused_before_training(tmp_path):
    x, y = _text_data(200, 12, seed=1)
    x[3, 4] = 30
    with pytest.raises(DataError, match=r"indices must lie in 0 \.\. 29, got 0 \.\. 30"):
        privdl.train(algorithm="decor", model=MeanText(classes=2), data=(x, y), graph="ring:4",
                     clip=1.0, epsilon=8.0, delta=1e-5, steps=2, batch_size=8,
                     out=tmp_path / "run", progress=False)  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_norm": 1.0}, "max_norm rescales the table"),
        ({"scale_grad_by_freq": True}, "scale_grad_by_freq scales by counts"),
    ],  # fmt: skip
)
def test_embedding_options_that_break_per_sample_clipping_are_refused(options, message):
    module = nn.Sequential(nn.Embedding(30, 6, **options), nn.Flatten(), nn.Linear(42, 2))
    with pytest.raises(ConfigError, match=rf"Embedding \(0\): {message}"):
        from_module(module, in_shape=(7,))


@pytest.mark.parametrize("shape", [[2, 4, 4], [4]])
def test_layer_norm_on_a_conv_net_takes_the_ghost_path_and_agrees_with_vmap(shape):
    """LayerNorm over a sample's whole map, or over its last dimension at every position."""
    torch.manual_seed(3)
    module = nn.Sequential(nn.Conv2d(1, 2, 3), nn.LayerNorm(shape), nn.Tanh(), nn.Flatten(),
                           nn.Linear(32, 3)).double()  # fmt: skip
    model = from_module(module, in_shape=(1, 6, 6))
    assert type(model) is SequentialModuleModel and supports_ghost(model)
    gen = torch.Generator().manual_seed(4)
    base = model.init(n_nodes=2, generator=gen, dtype=F64)
    params = {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in base.items()}
    x = torch.randn(2, 5, 1, 6, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (2, 5), generator=gen)
    clip = ClipSpec("per_sample", 0.2)
    ghost = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    vmap = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method="vmap")
    for k in ghost.grads:
        torch.testing.assert_close(ghost.grads[k], vmap.grads[k], rtol=1e-10, atol=1e-12, msg=k)
    torch.testing.assert_close(ghost.per_sample_norms, vmap.per_sample_norms, rtol=1e-10, atol=0)


def test_a_cut_off_text_run_resumes_to_the_uninterrupted_end(tmp_path):
    from privdl.data.custom import user_data
    from privdl.loop import fit
    from privdl.registry import make_config
    from privdl.tasks import UserObjects

    x, y = _text_data(300, 12, seed=2)
    opts = dict(algorithm="decor", graph="ring:4", clip=1.0, epsilon=8.0, delta=1e-5, steps=8,
                eval_every=4, batch_size=8, lr=0.5, task="user")  # fmt: skip
    torch.manual_seed(0)
    module = MeanText(classes=2)
    full = privdl.train(model=module, data=(x, y), out=tmp_path / "full", progress=False, **opts)
    fit(make_config(opts), tmp_path / "cut", progress=False, stop_after=4,
        user=UserObjects(model=module, data=user_data((x, y))))  # fmt: skip
    resumed = privdl.resume(tmp_path / "cut", model=module, data=(x, y), progress=False)
    for k in full.params:
        assert torch.equal(full.params[k], resumed.params[k]), k


@pytest.mark.parametrize(
    ("algorithm", "options"),
    [
        ("dpsgd", {"batch_size": 8}),
        ("ldp", {"graph": "ring:4", "batch_size": 8}),
        ("dpfedavg", {"clients": 4, "batch_size": 8}),
        ("robust-hdp", {"clients": 4, "batch_size": 8}),
        ("porter-dp", {"graph": "ring:4", "batch_size": 8}),
        ("privsgp-vr", {"graph": "ring:4"}),
    ],
)
def test_a_text_model_trains_in_every_family(algorithm, options, tmp_path):
    """Gossip, federated, PORTER and PrivSGP-VR runs read the indices too, within the budget."""
    x, y = _text_data(400, 12, seed=3)
    torch.manual_seed(0)
    result = privdl.train(algorithm=algorithm, model=MeanText(classes=2), data=(x, y), clip=1.0,
                          epsilon=8.0, delta=1e-5, steps=3, eval_every=3, lr=0.5,
                          out=tmp_path / "run", progress=False, **options)  # fmt: skip
    assert result.summary["completed"] and result.privacy["epsilon"] <= 8.0
    assert 0.0 <= result.metrics[-1]["accuracy"] <= 1.0


class TextCNN(nn.Module):  # Kim-style: embedding, transpose, Conv1d, ReLU, max over time
    def __init__(self, kernel: int = 3, stride: int = 1, padding: int = 1) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 6, padding_idx=0)
        self.conv = nn.Conv1d(6, 5, kernel, stride=stride, padding=padding)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        h = torch.relu(self.conv(self.emb(x).transpose(1, 2)))
        return self.fc(h.amax(dim=-1))


class WideTextCNN(TextCNN):  # a wide kernel over 7 tokens: two positions, the Gram form
    def __init__(self) -> None:
        super().__init__(kernel=5, stride=2, padding=0)

    def forward(self, x):  # the mean over time: every position gets a gradient
        return self.fc(torch.tanh(self.conv(self.emb(x).transpose(1, 2))).mean(dim=-1))


@pytest.mark.parametrize("cls", [TextCNN, WideTextCNN])
def test_a_text_cnn_takes_the_ghost_path_and_equals_the_per_sampleclipped_mean_loop(cls):
    from privdl.engine.ghost import _direct_is_cheaper

    torch.manual_seed(0)
    module = cls().double()
    model = from_module(module, in_shape=(7,))
    assert type(model) is SequentialModuleModel and supports_ghost(model)
    conv = module.conv
    out_len = (7 + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
    direct = _direct_is_cheaper(5, 6 * conv.kernel_size[0], out_len)
    assert direct == (cls is TextCNN)  # both forms of the per-sample conv norm are exercised
    gen = torch.Generator().manual_seed(1)
    base = model.init(n_nodes=2, generator=gen, dtype=F64)
    params = {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in base.items()}
    x = torch.randint(0, 30, (2, 4, 7), generator=gen)
    x[0, 1, 4:] = 0
    y = torch.randint(0, 3, (2, 4), generator=gen)
    want = clipped_mean_loop(cls().double(), params, x, y, 0.3)
    got = {}
    for method in ("ghost", "vmap"):
        got[method] = node_gradients(model, params, x, y, loss="cross_entropy",
                                     clip=ClipSpec("per_sample", 0.3), method=method)  # fmt: skip
        for k in want:
            torch.testing.assert_close(got[method].grads[k], want[k], rtol=1e-10, atol=1e-12)
    # the norms themselves, against vmap's from the formed per-sample gradients
    ghost, vmap = got["ghost"].per_sample_norms, got["vmap"].per_sample_norms
    torch.testing.assert_close(ghost, vmap, rtol=1e-10, atol=0)


class TwoTables(nn.Module):  # two embeddings: privdl cannot tell which one reads the input
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 4)
        self.other = nn.Embedding(5, 4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.emb(x).mean(1) + self.other.weight.sum(0))


def test_an_index_past_an_unknown_table_is_a_one_line_data_error():
    model = from_module(TwoTables(), in_shape=(3,))
    assert model.takes_indices and model.input_vocabulary is None
    gen = torch.Generator().manual_seed(0)
    params = model.init(n_nodes=1, generator=gen)
    x = torch.tensor([[[1, 2, 30]]])
    with pytest.raises(DataError, match="an index outside an embedding's table") as err:
        node_gradients(model, params, x, torch.tensor([[0]]), loss="cross_entropy",
                       clip=ClipSpec("per_sample", 1.0))  # fmt: skip
    assert "\n" not in str(err.value)
