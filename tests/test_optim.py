"""privdl.optim against an independent oracle: torch.optim run on each node separately."""

from __future__ import annotations

import json

import pytest
import torch

from privdl.errors import ConfigError
from privdl.optim import (
    Adam,
    OptState,
    adam,
    load_state_tensors,
    parse_optimizer,
    sgd,
    state_tensors,
)

N, STEPS = 3, 5
SHAPES = {"layer.weight": (4, 5), "bias": (7,)}
LRS = [0.1, 0.05, 0.2, 0.01, 0.07]  # a schedule eta_t that changes every step


def make_problem(seed: int) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    params = {
        k: torch.randn((N, *s), generator=gen, dtype=torch.float64) for k, s in SHAPES.items()
    }
    grads = [
        {k: torch.randn((N, *s), generator=gen, dtype=torch.float64) for k, s in SHAPES.items()}
        for _ in range(STEPS)
    ]
    return params, grads


def run_privdl(opt, params, grads, lrs=LRS):
    params = {k: v.clone() for k, v in params.items()}
    state = opt.init(params)
    for g, lr in zip(grads, lrs, strict=True):
        delta, state = opt.update(g, state, params, lr=lr)
        params = {k: params[k] + delta[k] for k in params}
    return params, state


def run_oracle(torch_cls, kwargs, params, grads, lrs=LRS):
    """Node by node: torch.nn.Parameters updated by a torch.optim optimizer."""
    out = {k: torch.empty_like(v) for k, v in params.items()}
    for i in range(N):
        ps = {k: torch.nn.Parameter(v[i].clone()) for k, v in params.items()}
        opt = torch_cls(list(ps.values()), lr=lrs[0], **kwargs)
        for g, lr in zip(grads, lrs, strict=True):
            for group in opt.param_groups:
                group["lr"] = lr
            for k, p in ps.items():
                p.grad = g[k][i].clone()
            opt.step()
        for k, p in ps.items():
            out[k][i] = p.detach()
    return out


def assert_trees_close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-13)


SGD_CASES = [
    {"momentum": 0.9},
    {"momentum": 0.9, "dampening": 0.3},
    {"momentum": 0.8, "nesterov": True},
    {"weight_decay": 0.05},
    {"momentum": 0.9, "weight_decay": 5e-2},
    {"momentum": 0.7, "nesterov": True, "weight_decay": 1e-1},
    {"momentum": 0.5, "dampening": 0.5, "weight_decay": 1e-2},
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kwargs", SGD_CASES, ids=str)
def test_sgd_matches_torch(seed, kwargs):
    params, grads = make_problem(seed)
    got, state = run_privdl(sgd(**kwargs), params, grads)
    assert_trees_close(got, run_oracle(torch.optim.SGD, kwargs, params, grads))
    for tree in state.buffers.values():  # one state per node: node dimension first
        assert all(t.shape == params[k].shape for k, t in tree.items())


ADAM_CASES = [
    (torch.optim.Adam, {}, {}),
    (torch.optim.Adam, {"betas": (0.8, 0.99), "eps": 1e-6}, {"betas": (0.8, 0.99), "eps": 1e-6}),
    (torch.optim.Adam, {"weight_decay": 0.1}, {"weight_decay": 0.1}),
    (torch.optim.AdamW, {"weight_decay": 0.1}, {"weight_decay": 0.1, "decoupled": True}),
    (torch.optim.AdamW, {"weight_decay": 0.0}, {"decoupled": True}),
    (
        torch.optim.AdamW,
        {"betas": (0.5, 0.9)},
        {"betas": (0.5, 0.9), "weight_decay": 0.01, "decoupled": True},
    ),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", ADAM_CASES, ids=lambda c: f"{c[0].__name__}-{c[1]}")
def test_adam_matches_torch(seed, case):
    torch_cls, torch_kwargs, kwargs = case
    params, grads = make_problem(seed)
    got, _ = run_privdl(adam(**kwargs), params, grads)
    assert_trees_close(got, run_oracle(torch_cls, torch_kwargs, params, grads))


def test_adamw_spec_uses_torch_default_weight_decay():
    params, grads = make_problem(3)
    got, _ = run_privdl(parse_optimizer("adamw"), params, grads)
    assert_trees_close(got, run_oracle(torch.optim.AdamW, {}, params, grads))


def test_oracle_tells_optimizers_apart():
    """The comparison is sharp enough to fail: Adam is not AdamW, nesterov is not plain."""
    params, grads = make_problem(0)
    got, _ = run_privdl(adam(weight_decay=0.1), params, grads)
    with pytest.raises(AssertionError):
        assert_trees_close(got, run_oracle(torch.optim.AdamW, {"weight_decay": 0.1}, params, grads))
    got, _ = run_privdl(sgd(momentum=0.9, nesterov=True), params, grads)
    with pytest.raises(AssertionError):
        assert_trees_close(got, run_oracle(torch.optim.SGD, {"momentum": 0.9}, params, grads))


@pytest.mark.parametrize("seed", [0, 1])
def test_plain_sgd_is_stateless_and_bit_exact(seed):
    params, grads = make_problem(seed)
    params32 = {k: v.float() for k, v in params.items()}
    for p0 in (params, params32):
        opt, p = sgd(), dict(p0)
        state = opt.init(p)
        assert state == OptState() and state_tensors(state) == {}
        for g, lr in zip(grads, LRS, strict=True):
            g = {k: v.to(p0[k].dtype) for k, v in g.items()}
            delta, new_state = opt.update(g, state, p, lr=lr)
            assert new_state is state
            for k in p:
                assert torch.equal(delta[k], -lr * g[k])
                expected = p[k] - lr * g[k]
                p[k] = p[k] + delta[k]
                assert torch.equal(p[k], expected)


def test_update_is_pure():
    params, grads = make_problem(4)
    opt = adam(weight_decay=0.1)
    state = opt.init(params)
    _, state = opt.update(grads[0], state, params, lr=0.1)
    before = {k: v.clone() for k, v in state_tensors(state).items()}
    snapshot = [{k: v.clone() for k, v in t.items()} for t in (params, grads[1])]
    opt.update(grads[1], state, params, lr=0.1)
    assert all(torch.equal(v, state_tensors(state)[k]) for k, v in before.items())
    assert all(
        torch.equal(v, t[k])
        for s, t in zip(snapshot, (params, grads[1]), strict=True)
        for k, v in s.items()
    )


@pytest.mark.parametrize(
    "opt",
    [
        sgd(momentum=0.9, dampening=0.2, weight_decay=0.01),
        sgd(momentum=0.9, nesterov=True),
        adam(weight_decay=0.1),
        adam(weight_decay=0.1, decoupled=True),
    ],
    ids=lambda o: o.describe(),
)
def test_checkpoint_round_trip(opt, tmp_path):
    params, grads = make_problem(5)
    full, full_state = run_privdl(opt, params, grads)

    p, state = run_privdl(opt, params, grads[:2], LRS[:2])
    saved = state_tensors(state)
    assert saved["step"].item() == 2
    for name, t in saved.items():
        if name != "step":
            assert "/" in name and t.shape[0] == N
    torch.save({"params": p, "opt": saved}, tmp_path / "ckpt.pt")
    del state, saved

    ckpt = torch.load(tmp_path / "ckpt.pt")
    p = ckpt["params"]
    state = load_state_tensors(opt.init(p), ckpt["opt"])
    for g, lr in zip(grads[2:], LRS[2:], strict=True):
        delta, state = opt.update(g, state, p, lr=lr)
        p = {k: p[k] + delta[k] for k in p}
    for k in p:
        assert torch.equal(p[k], full[k])
    assert state.step == full_state.step == STEPS
    assert state_tensors(state).keys() == state_tensors(full_state).keys()
    for k, v in state_tensors(full_state).items():
        assert torch.equal(v, state_tensors(state)[k])


def test_load_state_tensors_rejects_mismatch():
    params, _ = make_problem(0)
    opt = sgd(momentum=0.9)
    saved = state_tensors(opt.init(params))
    with pytest.raises(ConfigError, match="missing \\['momentum/bias'\\]"):
        load_state_tensors(opt.init(params), {k: v for k, v in saved.items() if "bias" not in k})
    with pytest.raises(ConfigError, match="unexpected \\['exp_avg/bias'"):
        load_state_tensors(opt.init(params), state_tensors(adam().init(params)))
    bad = dict(saved, **{"momentum/bias": torch.zeros(N + 1, 7, dtype=torch.float64)})
    with pytest.raises(ConfigError, match="has shape \\(4, 7\\), expected \\(3, 7\\)"):
        load_state_tensors(opt.init(params), bad)


@pytest.mark.parametrize(
    "opt",
    [
        sgd(),
        sgd(momentum=0.9, weight_decay=5e-4),
        sgd(momentum=0.9, nesterov=True),
        adam(),
        adam(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        adam(weight_decay=0.02, decoupled=True),
        adam(decoupled=True),
    ],
    ids=str,
)
def test_parse_round_trip(opt):
    spec = json.loads(json.dumps(opt.to_dict()))
    assert parse_optimizer(spec) == opt
    assert parse_optimizer(opt) is opt
    assert opt.describe().startswith(spec["name"] + "(")


def test_parse_names_and_mappings():
    assert parse_optimizer("sgd") == sgd()
    assert parse_optimizer(" Adam ") == adam()
    assert parse_optimizer("adamw") == adam(weight_decay=0.01, decoupled=True)
    spec = {"name": "sgd", "momentum": 0.9, "weight_decay": 5e-4}
    assert parse_optimizer(spec) == sgd(momentum=0.9, weight_decay=5e-4)
    assert parse_optimizer({"name": "adam", "betas": [0.5, 0.9], "weight_decay": 0}) == Adam(
        betas=(0.5, 0.9)
    )
    assert parse_optimizer({"name": "adam", "decoupled": True}) == adam(decoupled=True)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("rmsprop", r"unknown optimizer 'rmsprop'; choose one of: sgd, adam, adamw"),
        ({"momentum": 0.9}, r"unknown optimizer None; choose one of: sgd, adam, adamw"),
        (
            {"name": "sgd", "betas": (0.9, 0.99)},
            r"unknown option 'betas' for optimizer 'sgd'; "
            r"accepted: momentum, dampening, nesterov",
        ),
        ({"name": "adamw", "decoupled": False}, r"unknown option 'decoupled' .* 'adamw'"),
        ({"name": "sgd", "momentum": "0.9"}, r"option 'momentum' must be a number"),
        ({"name": "sgd", "nesterov": 1}, r"option 'nesterov' must be true or false"),
        ({"name": "adam", "betas": [0.9]}, r"option 'betas' must be a pair of numbers"),
        ({"name": "sgd", "momentum": -0.1}, r"sgd needs momentum, dampening, weight_decay >= 0"),
        ({"name": "sgd", "nesterov": True}, r"nesterov=True needs momentum > 0 and dampening = 0"),
        ({"name": "adam", "betas": [0.9, 1.0]}, r"adam needs 0 <= betas < 1"),
        (3, r"optimizer must be a name or a mapping"),
    ],
)
def test_parse_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        parse_optimizer(spec)


def test_nested_leaf_names_survive_checkpoint():
    params = {"a/b.weight": torch.ones(N, 2), "c": torch.zeros(N)}
    opt = sgd(momentum=0.5)
    _, state = opt.update(
        {k: torch.ones_like(v) for k, v in params.items()}, opt.init(params), params, lr=1.0
    )
    saved = state_tensors(state)
    assert set(saved) == {"step", "momentum/a/b.weight", "momentum/c"}
    restored = load_state_tensors(opt.init(params), saved)
    assert restored.step == 1 and restored.buffers["momentum"].keys() == params.keys()
