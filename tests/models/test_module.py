"""Your own nn.Module as a privdl model: vmap over nodes against loops and the built-in layers."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import privdl
from privdl.engine import ClipSpec, node_gradients
from privdl.engine.ghost import supports_ghost
from privdl.errors import ConfigError
from privdl.models import ModuleModel, SequentialModuleModel, build_model, from_module
from privdl.models.module import load_module

F64 = torch.float64


class GroupNormNet(nn.Module):  # a conv net with GroupNorm and functional calls
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.head = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.norm(self.conv(x))).flatten(1))


def _stacked(model: ModuleModel, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Different parameters on every node (module weights plus node-specific noise)."""
    base = model.init(n_nodes=n, generator=gen, dtype=F64)
    return {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=F64) for k, v in base.items()}


def _loop_oracle(module, params, x, y, threshold):
    """One module per node, one sample at a time: autograd, hard clip, mean over the batch."""
    n, b = x.shape[:2]
    out = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(n):
        net = type(module)().to(F64)
        net.load_state_dict({k: v[i] for k, v in params.items()})
        plist = list(net.parameters())
        for s in range(b):
            loss = F.cross_entropy(net(x[i, s : s + 1]), y[i, s : s + 1])
            g = torch.autograd.grad(loss, plist)
            norm = torch.sqrt(sum((gg**2).sum() for gg in g))
            c = min(1.0, threshold / float(norm))
            for (k, _), gg in zip(net.named_parameters(), g, strict=True):
                out[k][i] += c * gg / b
    return out


def test_module_per_sample_clipped_gradients_equal_a_loop():
    gen = torch.Generator().manual_seed(3)
    model = ModuleModel(GroupNormNet(), in_shape=(2, 5, 5))
    assert model.out_shape == (3,) and model.num_parameters() == 76 + 8 + 303
    params = _stacked(model, 3, gen)
    x = torch.randn(3, 4, 2, 5, 5, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (3, 4), generator=gen)
    res = node_gradients(
        model, params, x, y, loss="cross_entropy", clip=ClipSpec("per_sample", threshold=0.3)
    )
    ref = _loop_oracle(GroupNormNet(), params, x, y, 0.3)
    for k in ref:
        torch.testing.assert_close(res.grads[k], ref[k], rtol=1e-10, atol=1e-12)
    assert (res.per_sample_norms > 0.3).any()  # the clip was active


def test_module_equals_the_built_in_mlp_and_its_ghost_gradients():
    gen = torch.Generator().manual_seed(5)
    mlp = build_model("mlp", in_shape=(6,), n_classes=3, hidden=(5,))
    seq = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    model = ModuleModel(seq, in_shape=(6,))
    theirs = _stacked(model, 4, gen)
    ours = dict(zip(mlp.param_shapes(), theirs.values(), strict=True))  # same order, our names
    x = torch.randn(4, 7, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (4, 7), generator=gen)
    torch.testing.assert_close(model.forward(theirs, x), mlp.forward(ours, x))
    clip = ClipSpec("per_sample", threshold=0.5)
    a = node_gradients(model, theirs, x, y, loss="cross_entropy", clip=clip)
    b = node_gradients(mlp, ours, x, y, loss="cross_entropy", clip=clip, method="ghost")
    for ka, kb in zip(a.grads, b.grads, strict=True):
        torch.testing.assert_close(a.grads[ka], b.grads[kb], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("module", "msg"),
    [
        (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)), "BatchNorm1d"),
        (nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)), "Dropout"),
        (nn.Sequential(nn.ReLU()), "no parameters"),
        (nn.Sequential(nn.Linear(5, 2)), "failed on a batch of shape"),
    ],
)
def test_unsuitable_modules_are_refused(module, msg):
    with pytest.raises(ConfigError, match=msg):
        ModuleModel(module, in_shape=(4,))


@pytest.fixture(name="user_dir")
def _user_dir(tmp_path, monkeypatch):
    (tmp_path / "usernet_a9a.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(123, 2)

                def forward(self, x):
                    return self.fc(x)

            wrong = nn.Linear(123, 5)
            not_a_module = 3
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("usernet_a9a", None)


def test_a_module_named_in_the_config_trains_records_and_resumes(user_dir):
    opts = dict(algorithm="ldp", task="a9a", model="usernet_a9a:Net", graph="ring:4", clip=1.0,
                sigma=0.5, steps=30, eval_every=10, lr=0.5)  # fmt: skip
    full = privdl.train(out=user_dir / "full", progress=False, **opts)
    assert full["config"]["model"] == "usernet_a9a:Net"
    assert full["final"]["accuracy"] > 0.7  # a9a's majority class is 0.76; it learns
    from privdl.loop import train as train_config
    from privdl.registry import make_config

    train_config(make_config(opts), user_dir / "part", progress=False, stop_after=10)
    resumed = privdl.resume(user_dir / "part", progress=False)
    assert resumed["final"]["loss"] == full["final"]["loss"]


@pytest.mark.parametrize(
    ("spec", "msg"),
    [
        ("usernet_a9a:wrong", r"outputs shape \(5,\)"),
        ("usernet_a9a:not_a_module", "neither an nn.Module nor callable"),
        ("usernet_a9a:Nope", "has no attribute 'Nope'"),
        ("no_such_module_xyz:Net", "cannot import 'no_such_module_xyz'"),
    ],
)
def test_bad_module_specs_are_config_errors(user_dir, spec, msg):
    with pytest.raises(ConfigError, match=msg):
        build_model(spec, in_shape=(123,), n_classes=2)


def test_load_module_leaves_sys_path_as_it_was(user_dir):
    before = list(sys.path)
    assert issubclass(load_module("usernet_a9a:Net"), nn.Module)  # a factory
    assert isinstance(load_module("usernet_a9a:wrong"), nn.Module)  # made at import
    assert sys.path == before


def test_a_factory_is_seeded_by_the_generator(user_dir):
    model = build_model("usernet_a9a:Net", in_shape=(123,), n_classes=2)

    def x0(seed, same=True):
        g = torch.Generator().manual_seed(seed)
        return model.init(n_nodes=3, generator=g, same_init=same)["fc.weight"]

    torch.manual_seed(1)
    a = x0(7)
    torch.manual_seed(2)  # the global torch seed does not matter, privdl's seed does
    assert torch.equal(a, x0(7)) and not torch.equal(a, x0(8))
    assert torch.equal(a[0], a[1])  # every node starts at one x^0
    distinct = x0(7, same=False)
    assert not torch.equal(distinct[0], distinct[1])


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2)),
        nn.Identity(),
        nn.Flatten(),
        nn.Linear(3 * 3 * 3, 4),
        nn.Tanh(),
        nn.Linear(4, 3, bias=False),
    )


def test_a_sequential_of_known_layers_takes_the_ghost_path_and_agrees_with_vmap():
    fast = from_module(_cnn(), in_shape=(1, 6, 6))
    slow = ModuleModel(_cnn(), in_shape=(1, 6, 6))
    assert isinstance(fast, SequentialModuleModel) and supports_ghost(fast)
    assert fast.param_shapes() == slow.param_shapes()  # the module's own names
    assert "0.0.weight" in fast.param_shapes() and "5.weight" in fast.param_shapes()
    _assert_ghost_equals_vmap(fast, slow, nodes=3, batch=5, threshold=0.2, seed=11)


def _assert_ghost_equals_vmap(fast, slow, *, nodes, batch, threshold, seed):
    """Forward and per-sample clipped gradients of the converted model (ghost path) equal the
    generic model's (vmap path) on random per-node parameters and a (1, 6, 6) batch."""
    gen = torch.Generator().manual_seed(seed)
    params = _stacked(slow, nodes, gen)
    x = torch.randn(nodes, batch, 1, 6, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (nodes, batch), generator=gen)
    torch.testing.assert_close(fast.forward(params, x), slow.forward(params, x))
    clip = ClipSpec("per_sample", threshold=threshold)
    a = node_gradients(fast, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    b = node_gradients(slow, params, x, y, loss="cross_entropy", clip=clip)
    assert list(a.grads) == list(params)
    for k in a.grads:
        torch.testing.assert_close(a.grads[k], b.grads[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "module",
    [
        nn.Sequential(nn.Conv2d(1, 2, 3, dilation=2), nn.Flatten(), nn.Linear(8, 3)),
        nn.Sequential(nn.AvgPool2d(2, stride=1), nn.Flatten(), nn.Linear(25, 3)),
        nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4, 3)),
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.PReLU(), nn.Flatten(), nn.Linear(32, 3)),
    ],
)
def test_other_modules_keep_the_generic_vmap_path(module):
    model = from_module(module, in_shape=(1, 6, 6))
    assert type(model) is ModuleModel and not supports_ghost(model)


def _gn_cnn() -> nn.Module:  # GroupNorm, average pooling (both kinds), as Opacus asks for
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1), nn.GroupNorm(3, 6, affine=False), nn.Tanh(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5), nn.GroupNorm(1, 5),
        nn.Linear(5, 3),
    )  # fmt: skip


def test_groupnorm_and_average_pooling_take_the_ghost_path_and_agree_with_vmap():
    fast = from_module(_gn_cnn(), in_shape=(1, 6, 6))
    slow = ModuleModel(_gn_cnn(), in_shape=(1, 6, 6))
    assert isinstance(fast, SequentialModuleModel) and supports_ghost(fast)
    assert "1.weight" in fast.param_shapes() and "5.weight" not in fast.param_shapes()
    _assert_ghost_equals_vmap(fast, slow, nodes=3, batch=5, threshold=0.2, seed=13)


def test_a_traced_groupnorm_net_equals_the_per_sample_loop():
    """GroupNormNet's forward traces to a chain; its ghost gradients against one module per
    node and one sample at a time (an oracle that shares no code with either path)."""
    gen = torch.Generator().manual_seed(3)
    fast = from_module(GroupNormNet(), in_shape=(2, 5, 5))
    assert isinstance(fast, SequentialModuleModel) and supports_ghost(fast)
    params = _stacked(fast.source, 3, gen)
    x = torch.randn(3, 4, 2, 5, 5, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (3, 4), generator=gen)
    _assert_ghost_equals_loop(GroupNormNet, fast, params, x, y, threshold=6.0)


class StemNet(nn.Module):  # a torchvision ResNet stem: 7x7 stride-2 conv, padded 3x3/2 max-pool
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.GroupNorm(2, 4)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        return self.fc(self.pool(torch.relu(self.bn1(self.conv1(x)))).flatten(1))


def test_a_resnet_stem_with_a_padded_strided_pool_equals_the_per_sample_loop():
    gen = torch.Generator().manual_seed(5)
    fast = from_module(StemNet(), in_shape=(2, 11, 11))
    assert isinstance(fast, SequentialModuleModel) and supports_ghost(fast)
    params = _stacked(fast.source, 2, gen)
    x = torch.randn(2, 5, 2, 11, 11, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (2, 5), generator=gen)
    norms = node_gradients(
        fast, params, x, y, loss="cross_entropy", clip=ClipSpec("per_sample", 1e9), method="ghost"
    ).per_sample_norms
    _assert_ghost_equals_loop(StemNet, fast, params, x, y, threshold=float(norms.median()))


def _assert_ghost_equals_loop(cls, fast, params, x, y, *, threshold):
    """The ghost path's clipped gradients equal the per-sample loop over ``cls`` modules, with
    ``threshold`` chosen so that some samples are clipped and some are not."""
    clip = ClipSpec("per_sample", threshold=threshold)
    res = node_gradients(fast, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    ref = _loop_oracle(cls(), params, x, y, threshold)
    for k in ref:
        torch.testing.assert_close(res.grads[k], ref[k], rtol=1e-10, atol=1e-12)
    norms = res.per_sample_norms
    assert (norms > threshold).any() and (norms < threshold).any()


def test_a_sequential_factory_starts_where_the_generic_path_would(user_dir):
    (user_dir / "seqnet.py").write_text(
        "from torch import nn\n\n"
        "def make():\n"
        "    return nn.Sequential(nn.Linear(123, 8), nn.ReLU(), nn.Linear(8, 2))\n"
    )
    fast = build_model("seqnet:make", in_shape=(123,), n_classes=2)
    slow = ModuleModel(in_shape=(123,), factory=load_module("seqnet:make"))
    assert isinstance(fast, SequentialModuleModel)
    a = fast.init(n_nodes=2, generator=torch.Generator().manual_seed(4))
    b = slow.init(n_nodes=2, generator=torch.Generator().manual_seed(4))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sys.modules.pop("seqnet", None)


class ChainNet(nn.Module):  # registered out of forward order, functional activations and pooling
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4 * 2 * 2, 3)
        self.conv1 = nn.Conv2d(1, 2, 3, padding=1)
        self.conv2 = nn.Conv2d(2, 4, 3)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(torch.tanh(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(x + torch.relu(self.fc1(x)))


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.out(self.fc(torch.relu(self.fc(x))))


class ViewNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x.view(x.size(0), -1))


def test_a_forward_that_traces_to_a_chain_takes_the_ghost_path():
    fast = from_module(ChainNet(), in_shape=(1, 6, 6))
    slow = ModuleModel(ChainNet(), in_shape=(1, 6, 6))
    assert isinstance(fast, SequentialModuleModel)
    assert list(fast.param_shapes()) == list(slow.param_shapes())  # parameters() order kept
    assert list(fast.param_shapes())[0] == "fc.weight"
    _assert_ghost_equals_vmap(fast, slow, nodes=2, batch=4, threshold=0.1, seed=2)


class InPlaceShared(nn.Module):  # h.add_(...) mutates a tensor that fc2 reads afterwards
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.fc1(x)
        h.add_(torch.relu(h))
        return self.fc2(h)


class DeadBranch(nn.Module):  # fc_unused's output is computed and dropped
    def __init__(self):
        super().__init__()
        self.fc, self.fc_unused = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        self.fc_unused(x)
        return self.fc(x)


class Block(nn.Module):  # torchvision's BasicBlock layout, GroupNorm in place of BatchNorm
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.conv1 = nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(2, 6)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(3, 6)
        self.down = nn.Sequential(nn.Conv2d(4, 6, 1, stride=2, bias=False), nn.GroupNorm(1, 6))
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        x = self.stem(x)
        identity = self.down(x)
        out = self.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        out += identity
        out = self.relu(out)
        return self.fc(torch.flatten(self.pool(out), 1))


def test_a_residual_block_takes_the_ghost_path_and_equals_the_per_sample_loop():
    """A traced graph with a residual sum, a strided 1x1 downsample, GroupNorm and in-place
    ReLU: ghost gradients against one module per node and one sample at a time."""
    from privdl.models.module import GraphModuleModel

    fast = from_module(Block(), in_shape=(1, 6, 6))
    assert isinstance(fast, GraphModuleModel) and supports_ghost(fast)
    assert list(fast.param_shapes()) == list(
        ModuleModel(Block(), in_shape=(1, 6, 6)).param_shapes()
    )
    gen = torch.Generator().manual_seed(7)
    params = _stacked(fast.source, 2, gen)
    x = torch.randn(2, 5, 1, 6, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (2, 5), generator=gen)
    with torch.no_grad():
        net = Block().to(F64)
        net.load_state_dict({k: v[1] for k, v in params.items()})
        torch.testing.assert_close(fast.forward(params, x)[1], net(x[1]))
    _assert_ghost_equals_loop(Block, fast, params, x, y, threshold=2.2)


def test_a_residual_mlp_takes_the_ghost_path_and_agrees_with_vmap():
    from privdl.models.module import GraphModuleModel

    fast = from_module(Residual(), in_shape=(6,))
    assert isinstance(fast, GraphModuleModel)
    slow = ModuleModel(Residual(), in_shape=(6,))
    gen = torch.Generator().manual_seed(4)
    params = _stacked(slow, 3, gen)
    x = torch.randn(3, 5, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (3, 5), generator=gen)
    clip = ClipSpec("per_sample", threshold=0.5)
    a = node_gradients(fast, params, x, y, loss="cross_entropy", clip=clip, method="ghost")
    b = node_gradients(slow, params, x, y, loss="cross_entropy", clip=clip)
    for k in b.grads:
        torch.testing.assert_close(a.grads[k], b.grads[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [Twice, ViewNet, InPlaceShared, DeadBranch])
def test_forwards_that_are_not_plain_chains_keep_the_vmap_path(cls):
    model = from_module(cls(), in_shape=(6,))
    assert type(model) is ModuleModel
    x = torch.randn(1, 3, 6)
    params = model.init(n_nodes=1, generator=torch.Generator())
    with torch.no_grad():
        torch.testing.assert_close(model.forward(params, x)[0], model.module(x[0]))


class InstanceNormNet(nn.Module):  # InstanceNorm = GroupNorm with one group a channel
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.norm = nn.InstanceNorm2d(4, affine=True)
        self.head = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.norm(self.conv(x))).flatten(1))


def test_instance_norm_takes_the_ghost_path_and_equals_the_per_sample_loop():
    gen = torch.Generator().manual_seed(8)
    model = from_module(InstanceNormNet(), in_shape=(2, 5, 5))
    assert isinstance(model, SequentialModuleModel) and supports_ghost(model)
    params = _stacked(model.source, 2, gen)
    x = torch.randn(2, 4, 2, 5, 5, generator=gen, dtype=F64)
    y = torch.randint(0, 3, (2, 4), generator=gen)
    res = node_gradients(model, params, x, y, loss="cross_entropy",
                         clip=ClipSpec("per_sample", threshold=0.3), method="ghost")  # fmt: skip
    ref = _loop_oracle(InstanceNormNet(), params, x, y, 0.3)
    for k in ref:
        torch.testing.assert_close(res.grads[k], ref[k], rtol=1e-10, atol=1e-12, msg=k)


def test_instance_norm_with_running_statistics_is_refused():
    module = nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2, track_running_stats=True),
                           nn.Flatten(), nn.Linear(32, 3))  # fmt: skip
    with pytest.raises(ConfigError, match=r"InstanceNorm2d \(1\): track_running_stats keeps"):
        from_module(module, in_shape=(1, 6, 6))
