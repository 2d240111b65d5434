"""privdl.models.export: trained stacked models back as plain torch modules, same outputs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from privdl.errors import ConfigError
from privdl.models import (
    Activation,
    AvgPool2d,
    Conv2d,
    Flatten,
    GroupNorm,
    Linear,
    MaxPool2d,
    ModuleModel,
    SequentialModel,
    SequentialModuleModel,
    StackedModel,
    build_model,
    from_module,
)
from privdl.models.export import StackedRow, average_module, node_modules, to_module
from privdl.models.module import GraphModuleModel

F64 = torch.float64
N = 3


def _stacked(model: StackedModel, dtype: torch.dtype = F64) -> dict[str, torch.Tensor]:
    """Stacked parameters for N nodes, every row different (init plus row-specific noise)."""
    gen = torch.Generator().manual_seed(0)
    params = model.init(n_nodes=N, generator=gen, dtype=dtype)
    return {
        k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=dtype) for k, v in params.items()
    }


def _reference(model: StackedModel, params: dict[str, torch.Tensor], x: torch.Tensor):
    with torch.no_grad():
        return model.forward({k: v.unsqueeze(0) for k, v in params.items()}, x.unsqueeze(0))[0]


def _check(model, stacked, dtype, tol) -> list[nn.Module]:
    """Row 1, the average and every node module give model.forward's outputs."""
    x = torch.randn(4, *model.in_shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    row1 = {k: v[1] for k, v in stacked.items()}
    mean = {k: v.mean(dim=0) for k, v in stacked.items()}
    exported = [to_module(model, row1), average_module(model, stacked)]
    for module, params in zip(exported, (row1, mean), strict=True):
        assert not module.training
        with torch.no_grad():
            out = module(x)
        assert out.dtype == dtype
        torch.testing.assert_close(out, _reference(model, params, x), rtol=0, atol=tol)
    nodes = node_modules(model, stacked)
    assert len(nodes) == N
    for i, module in enumerate(nodes):
        with torch.no_grad():
            out = module(x)
        ref = _reference(model, {k: v[i] for k, v in stacked.items()}, x)
        torch.testing.assert_close(out, ref, rtol=0, atol=tol)
    # the rows differ, so the comparisons above tell the rows apart
    assert not torch.allclose(_reference(model, row1, x), _reference(model, mean, x))
    return exported


def _with_groupnorm() -> SequentialModel:
    """Every privdl layer kind, GroupNorm included, in one chain."""
    return SequentialModel(
        "all-layers",
        (2, 16, 16),
        [
            ("conv1", Conv2d(2, 4, 3, stride=1, padding=1)),
            ("norm1", GroupNorm(2, 4, eps=1e-3)),
            ("act1", Activation("tanh")),
            ("pool1", MaxPool2d(3, stride=2, padding=1)),
            ("conv2", Conv2d(4, 6, 3, stride=2, padding=1, bias=False)),
            ("norm2", GroupNorm(3, 6, affine=False)),
            ("act2", Activation("sigmoid")),
            ("pool2", AvgPool2d(2)),
            ("pool3", AvgPool2d(None)),
            ("flatten", Flatten()),
            ("fc", Linear(6, 3)),
        ],
    )


BUILTIN = {
    "linear": lambda: build_model("linear", in_shape=(5,), n_classes=2),
    "mlp": lambda: build_model("mlp", in_shape=(1, 28, 28), n_classes=10),
    "cnn-mnist": lambda: build_model("cnn-mnist", in_shape=(1, 28, 28), n_classes=10),
    "resnet18-gn": lambda: build_model("resnet18-gn", in_shape=(3, 16, 16), n_classes=10, width=8),
    "resnet34-nonorm": lambda: build_model(
        "resnet34-nonorm", in_shape=(3, 16, 16), n_classes=10, width=4
    ),
    "groupnorm-chain": _with_groupnorm,
}


@pytest.mark.parametrize("name", list(BUILTIN))
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-10), (torch.float32, 1e-5)])
def test_builtin_models_export_to_native_torch_layers(name, dtype, tol):
    model = BUILTIN[name]()
    stacked = _stacked(model, dtype)
    for module in _check(model, stacked, dtype, tol):
        assert not isinstance(module, StackedRow)
        leaves = {type(m) for m in module.modules() if not list(m.children())}
        assert leaves <= {
            nn.Linear, nn.Conv2d, nn.GroupNorm, nn.ReLU, nn.Sigmoid, nn.Tanh, nn.MaxPool2d,
            nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Identity,
        }  # fmt: skip
        # privdl's parameter names, in privdl's order: state_dict keys are the stacked tree's
        assert list(module.state_dict()) == list(model.param_shapes())


def test_native_layers_keep_the_layer_settings():
    module = to_module(_with_groupnorm(), {k: v[0] for k, v in _stacked(_with_groupnorm()).items()})
    assert isinstance(module, nn.Sequential)
    assert (module.conv2.stride, module.conv2.padding, module.conv2.bias) == ((2, 2), (1, 1), None)
    assert (module.norm1.num_groups, module.norm1.eps, module.norm1.affine) == (2, 1e-3, True)
    assert module.norm2.affine is False
    assert (module.pool1.kernel_size, module.pool1.stride, module.pool1.padding) == (3, 2, 1)


class TwoBranch(nn.Module):  # a forward that is not a chain: concatenated branches
    def __init__(self):
        super().__init__()
        self.left = nn.Linear(4, 3)
        self.right = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.cat([torch.relu(self.left(x)), self.right(x)], dim=1))


class Residual(nn.Module):  # traces to a graph with a residual sum
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)) + x)


def _user_models():
    seq = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.GroupNorm(1, 3), nn.ReLU())
    seq.append(nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 2)))
    return {  # name -> (stacked model, the kind from_module / ModuleModel makes)
        "custom": (ModuleModel(TwoBranch().double(), in_shape=(4,)), ModuleModel),
        "sequential": (from_module(seq.double(), in_shape=(1, 4, 4)), SequentialModuleModel),
        "residual": (from_module(Residual().double(), in_shape=(4,)), GraphModuleModel),
    }


@pytest.mark.parametrize("name", ["custom", "sequential", "residual"])
def test_user_module_comes_back_as_a_copy_of_itself(name):
    model, kind = _user_models()[name]
    assert type(model) is kind
    original = model.module if isinstance(model, ModuleModel) else model.source.module
    before = copy.deepcopy(original.state_dict())
    stacked = _stacked(model)
    for module in _check(model, stacked, F64, 1e-10):
        assert type(module) is type(original) and module is not original
        assert list(module.state_dict()) == list(original.state_dict())
    # the model's own module is untouched (names, values, frozen)
    assert all(torch.equal(before[k], v) for k, v in original.state_dict().items())
    assert not any(p.requires_grad for p in original.parameters())


def test_user_module_float32_and_state_dict_round_trip():
    model = ModuleModel(TwoBranch(), in_shape=(4,))
    stacked = _stacked(model, torch.float32)
    _check(model, stacked, torch.float32, 1e-5)
    fresh = TwoBranch()
    fresh.load_state_dict(to_module(model, {k: v[2] for k, v in stacked.items()}).state_dict())
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, stacked[k][2])


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(3, 3, bias=False)
        self.dec = nn.Linear(3, 3)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x)))


def test_tied_weights_stay_tied():
    model = ModuleModel(Tied().double(), in_shape=(3,))
    stacked = _stacked(model)
    assert "dec.weight" not in stacked  # one parameter, two places
    (module,) = _check(model, stacked, F64, 1e-10)[:1]
    assert module.enc.weight is module.dec.weight
    torch.testing.assert_close(module.dec.weight.detach(), stacked["enc.weight"][1])


class Shifted(SequentialModel):
    """A model this module does not convert (a subclass with its own forward)."""

    def forward(self, params, x):
        return super().forward(params, x) + 1.0


def test_other_models_use_the_exact_stackedrow_fallback():
    model = Shifted("shifted", (2, 4, 4), [("conv", Conv2d(2, 2, 3)), ("f.flat", Flatten())])
    stacked = _stacked(model)
    x = torch.randn(5, 2, 4, 4, dtype=F64)
    for module in _check(model, stacked, F64, 0.0):
        assert isinstance(module, StackedRow)
        assert [k for k, _ in module.named_parameters()] == list(model.param_shapes())
    module = to_module(model, {k: v[0] for k, v in stacked.items()})
    assert torch.equal(module(x), _reference(model, {k: v[0] for k, v in stacked.items()}, x))
    # a plain SequentialModel whose layer name has a dot also falls back, keeping the names
    dotted = SequentialModel("dotted", (3,), [("a.fc", Linear(3, 2))])
    row = to_module(dotted, {"a.fc.weight": torch.ones(2, 3), "a.fc.bias": torch.zeros(2)})
    assert isinstance(row, StackedRow) and set(row.state_dict()) == {"a.fc.weight", "a.fc.bias"}


@pytest.mark.parametrize("name", ["groupnorm-chain", "resnet18-gn", "custom", "fallback"])
def test_exported_module_is_trainable(name):
    if name == "custom":
        model = _user_models()["custom"][0]
    elif name == "fallback":
        model = Shifted("shifted", (5,), [("fc", Linear(5, 3))])
    else:
        model = BUILTIN[name]()
    stacked = _stacked(model)
    kept = {k: v.clone() for k, v in stacked.items()}
    module = to_module(model, {k: v[1] for k, v in stacked.items()}).train()
    params = list(module.parameters())
    assert params and all(p.is_leaf and p.requires_grad for p in params)
    x = torch.randn(6, *model.in_shape, dtype=F64)
    y = torch.randint(0, model.out_shape[0], (6,))
    with torch.no_grad():
        before = module(x).clone()
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        nn.functional.cross_entropy(module(x), y).backward()
        opt.step()
    with torch.no_grad():
        assert not torch.allclose(module(x), before)
    # training the export leaves the stacked tree alone (no shared storage)
    assert all(torch.equal(stacked[k], kept[k]) for k in stacked)


def test_bad_params_raise_config_error():
    model = build_model("mlp", in_shape=(6,), n_classes=3, hidden=(4,))
    stacked = _stacked(model)
    row = {k: v[0] for k, v in stacked.items()}
    with pytest.raises(ConfigError, match=r"'fc1.weight'.*shape \(4, 5\), expected \(4, 6\)"):
        to_module(model, {**row, "fc1.weight": torch.zeros(4, 5, dtype=F64)})
    with pytest.raises(ConfigError, match="node-stacked: pass one row"):
        to_module(model, stacked)
    with pytest.raises(ConfigError, match=r"missing \['fc2.bias'\], unknown \['extra'\]"):
        to_module(model, {**{k: v for k, v in row.items() if k != "fc2.bias"}, "extra": row["fc2.bias"]})  # fmt: skip
    with pytest.raises(ConfigError, match="floating-point"):
        to_module(model, {**row, "fc2.bias": torch.zeros(3, dtype=torch.long)})
    with pytest.raises(ConfigError, match="common leading node dimension"):
        node_modules(model, {**stacked, "fc2.bias": stacked["fc2.bias"][:2]})
    with pytest.raises(ConfigError, match=r"shape \(3, 3\), expected \(3,\)"):
        average_module(model, {**stacked, "fc2.bias": torch.zeros(N, 3, 3, dtype=F64)})
    user = ModuleModel(TwoBranch(), in_shape=(4,))
    weights = {k: v.detach() for k, v in TwoBranch().named_parameters()}
    with pytest.raises(ConfigError, match=r"'head.weight'.*shape \(6, 2\), expected \(2, 6\)"):
        to_module(user, {**weights, "head.weight": weights["head.weight"].T})
