"""The open core: one protocol honoured by every registered algorithm, a test-file algorithm that
trains, resumes and launches, and the Python API on your own model and data.

Oracles: the single-process run (for two processes, bit for bit in float64), an uninterrupted
run (for resume), the recorded checkpoint (for the returned models), torch.optim on each node
with a dense mixing product (for the optimizer), dp-accounting (for central DP-SGD).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import privdl
import toy_algorithm
from privdl.algorithms.base import Algorithm, AlgorithmState
from privdl.cli.main import main as cli_main
from privdl.data.custom import user_data
from privdl.errors import ConfigError
from privdl.loop import build_run, fit
from privdl.recipes.federated import FederatedRecipe
from privdl.recipes.gossip import GossipRecipe
from privdl.recipes.porter import PorterRecipe
from privdl.recipes.privsgp import PrivSGPRecipe
from privdl.records import RunRecords, merged_shards
from privdl.registry import algorithms, make_config
from privdl.tasks import UserObjects


def _load_run_ranks():
    """The forked gloo ranks of tests/comm (its conftest is not importable by name here)."""
    spec = importlib.util.spec_from_file_location(
        "comm_ranks", Path(__file__).parent / "comm" / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_ranks


run_ranks = _load_run_ranks()

D64 = "float64"


def _tiny_data(n: int = 240, d: int = 5, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def _tiny(name: str) -> tuple[dict, UserObjects | None]:
    """A few-step config for any registered algorithm, from its recipe's kind and attributes."""
    recipe = algorithms()[name].recipe
    ls = dict(task="least-squares", graph="ring:6", steps=3, eval_every=1, dtype=D64, lr=0.05)
    if isinstance(recipe, FederatedRecipe):
        x, y = _tiny_data()
        opts = dict(task="user", model="linear", clients=4, steps=2, eval_every=1, dtype=D64,
                    lr=0.1, batch_size=8)  # fmt: skip
        if recipe.private:
            opts.update(budgets="1,2,4,8", clip=1.0)
        return opts, UserObjects(data=user_data((x, y)))
    if isinstance(recipe, PrivSGPRecipe):
        return {**ls, "clip": 1.0, "sigma": 0.3}, None
    if isinstance(recipe, PorterRecipe):
        extra = {"sigma": 0.3} if recipe.noise else {}
        return {**ls, "clip": 1.0, "compressor": "randk:0.5", **extra}, None
    if isinstance(recipe, GossipRecipe):
        noise = {None: {}, "local": {"sigma": 0.3}, "central": {"sigma": 0.3},
                 "correlated": {"sigma": 0.3, "sigma_cor": 1.0}}[recipe.noise]  # fmt: skip
        graph = {"graph": "ring:6"} if recipe.default_graph is None else {}
        mode = {"clip": 1.0, "clip_mode": "batch_mean"} if recipe.noise else {}
        return {**ls, **graph, **mode, **noise}, None
    # an algorithm registered elsewhere (the toy one): a decentralized least-squares run
    return {**ls, "clip": 1.0, "clip_mode": "batch_mean", "sigma": 0.3}, None


NAMES = list(algorithms())


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_algorithm_honours_the_protocol(name, tmp_path):
    opts, user = _tiny(name)
    cfg = make_config({"algorithm": name, **opts})
    run = build_run(cfg, user=user)
    assert isinstance(run.algorithm, Algorithm)
    state = run.init_state()
    assert isinstance(state, AlgorithmState) and state.t == 0
    rows = {v.shape[0] for v in state.params.values()}
    assert rows <= {len(run.comm.owned_list), 1}  # every owned node, or a server's one model
    before = {k: v.clone() for k, v in state.params.items()}
    new, info = run.algorithm.step(state, run.oracle, run.comm)
    assert new.t == 1 and isinstance(info, dict)
    assert any(not torch.equal(before[k], new.params[k]) for k in before), "the step moved nothing"
    # and the loop runs it: records, labelled privacy (or none) at every row
    summary = fit(cfg, tmp_path / "run", progress=False, user=user).summary
    assert summary["completed"] and summary["steps_done"] == cfg.steps
    priv = summary["final"].get("privacy")
    if priv is not None:
        assert {
            "epsilon",
            "delta",
            "accountant",
            "neighbouring",
            "unit",
            "threat_model",
        } <= priv.keys()


def _two_node_opts(name: str) -> tuple[dict, UserObjects | None]:
    opts, user = _tiny(name)
    if algorithms()[name].recipe.n_nodes(make_config({"algorithm": name, **opts})) < 2:
        opts = {**opts, "graph": "complete:4"}  # one node by default (plain DP-SGD): give four
    return opts, user


def _launched(rank: int, name: str, out: str) -> None:
    from privdl.distributed_runner import DistributedWorld

    opts, user = _two_node_opts(name)
    fit(make_config({"algorithm": name, **opts}), out, world=DistributedWorld(timeout_s=60),
        progress=False, user=user)  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_algorithm_on_two_processes_equals_one(name, tmp_path):
    """Two gloo ranks (each owning half the nodes) end where one process does, bit for bit."""
    opts, user = _two_node_opts(name)
    one = fit(make_config({"algorithm": name, **opts}), tmp_path / "one", progress=False, user=user)
    codes = run_ranks(2, _launched, (name, str(tmp_path / "two")), timeout=180)
    assert codes == [0, 0]
    exact = not algorithms()[name].recipe.replicated
    a = RunRecords(tmp_path / "one").load_checkpoint()
    # node rows: each rank keeps its own checkpoint (merged here); a server's model: rank 0's
    b = merged_shards(tmp_path / "two") if exact else RunRecords(tmp_path / "two").load_checkpoint()
    assert a["t"] == b["t"] == one.summary["steps_done"]
    for k in a["params"]:
        if exact:  # gossip: every row is computed by the same ops in either layout
            assert torch.equal(a["params"][k], b["params"][k]), k
        else:  # a server's all-reduce sums the clients' updates in another order
            torch.testing.assert_close(a["params"][k], b["params"][k], rtol=1e-12, atol=1e-12)
    rows = [
        [
            {k: v for k, v in r.items() if k not in ("wall_time", "timestamp")}
            for r in RunRecords(d).rows()
        ]
        for d in (tmp_path / "one", tmp_path / "two")
    ]
    for r in rows[1]:  # every rank knows the seed: no insider's threat model is claimed
        if r.get("privacy"):
            assert r["privacy"]["threat_model"] in ("eavesdropper", "central"), r["privacy"]
    rows = [[_numbers(r) for r in run] for run in rows]
    assert rows[0] == rows[1] if exact else _close(rows[0], rows[1])


def _numbers(row: dict) -> dict:
    """A row without its privacy label (threat model, notes, who can rebuild the noise), which
    a launched seeded run states for an outsider; its numbers stay."""
    if not row.get("privacy"):
        return row
    label = ("threat_model", "notes", "rebuild")
    return {**row, "privacy": {k: v for k, v in row["privacy"].items() if k not in label}}


def _close(a, b, rel: float = 1e-9) -> bool:
    """Equal structure, floats within ``rel`` (recursively)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=rel, abs=1e-12)
    return a == b


TOY = dict(algorithm=toy_algorithm.NAME, task="least-squares", graph="ring:6", steps=12,
           eval_every=4, clip=1.0, clip_mode="batch_mean", epsilon=5.0, dtype=D64, beta=0.7,
           lr=0.05)  # fmt: skip


def test_a_toy_algorithm_from_a_test_file_trains_resumes_and_launches(tmp_path):
    assert algorithms()[toy_algorithm.NAME].origin == toy_algorithm.__file__
    full = privdl.train(out=tmp_path / "full", progress=False, **TOY)
    assert full.privacy["epsilon"] <= 5.0 and full.privacy["threat_model"] == "ldp"
    # cut off after 4 steps, resumed: the same end as the uninterrupted run
    fit(make_config(TOY), tmp_path / "cut", progress=False, stop_after=4)
    resumed = privdl.resume(tmp_path / "cut", progress=False)
    assert resumed["final"] == {**full["final"], "wall_time": resumed["final"]["wall_time"]}
    for k in full.params:
        assert torch.equal(full.params[k], resumed.params[k])
    # two processes through the CLI: workers import this test's module to find the algorithm
    args = ["launch", "--nproc", "2", toy_algorithm.NAME, "--task", "least-squares", "--graph",
            "ring:6", "--steps", "12", "--eval-every", "4", "--clip", "1", "--clip-mode",
            "batch_mean", "--epsilon", "5", "--dtype", "float64", "--set", "beta=0.7", "--lr",
            "0.05", "--out", str(tmp_path / "launched"), "--no-progress"]  # fmt: skip
    assert cli_main(args) == 0
    ckpt = merged_shards(tmp_path / "launched")
    for k in full.params:
        assert torch.equal(ckpt["params"][k], full.params[k])
    # the registry lists it, with where it came from
    listed = {r["name"]: r for r in _algorithms_json()}
    assert listed[toy_algorithm.NAME]["origin"] == toy_algorithm.__file__
    assert "beta" in listed[toy_algorithm.NAME]["options"]


def _algorithms_json() -> list[dict]:
    from click.testing import CliRunner

    from privdl.cli.run import list_algorithms

    out = CliRunner().invoke(list_algorithms, ["--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def test_your_module_on_your_tensors_trains_and_returns_the_recorded_model(tmp_path):
    torch.manual_seed(0)
    net = Net().double()
    x, y = _tiny_data()
    rows = []
    result = privdl.train(algorithm="decor", model=net, data=(x, y), graph="ring:4", clip=1.0,
                          epsilon=5.0, delta=1e-5, steps=6, eval_every=3, batch_size=16,
                          dtype=D64, out=tmp_path / "run", progress=False,
                          callbacks=[rows.append])  # fmt: skip
    assert [r["step"] for r in rows] == [0, 3, 6] == [r["step"] for r in result.metrics]
    assert result.privacy["unit"] == "example" and result.privacy["epsilon"] <= 5.0
    # the returned model predicts what the recorded parameters predict
    ckpt = RunRecords(tmp_path / "run").load_checkpoint()
    stacked = ckpt["params"]
    assert set(stacked) == {name for name, _ in net.named_parameters()}
    reference = Net().double()
    reference.load_state_dict({k: v.mean(0) for k, v in stacked.items()})
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), reference(x), rtol=0, atol=1e-12)
        for i, node in enumerate(result.node_models):
            reference.load_state_dict({k: v[i] for k, v in stacked.items()})
            torch.testing.assert_close(node(x), reference(x), rtol=0, atol=1e-12)
    assert isinstance(result.model, Net)  # a copy of the user's own module class
    # training moved the nodes away from the module's weights
    assert not torch.equal(stacked["fc1.weight"][0], net.fc1.weight)


def test_datasets_and_per_node_data_train_and_a_resume_checks_the_data(tmp_path):
    x, y = _tiny_data(seed=1)
    ds = torch.utils.data.TensorDataset(x, y)
    common = dict(algorithm="ldp", model="linear", graph="ring:3", clip=1.0, sigma=0.5,
                  steps=4, eval_every=2, batch_size=8, dtype=D64, progress=False)  # fmt: skip
    a = privdl.train(data=(x, y), out=tmp_path / "a", **common)
    b = privdl.train(data=ds, out=tmp_path / "b", **common)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)  # as an Opacus user has
    no_batch = {k: v for k, v in common.items() if k != "batch_size"}
    c0 = privdl.train(data=loader, out=tmp_path / "c0", **no_batch)
    assert c0.config.batch_size == 8
    for k in a.params:
        assert torch.equal(a.params[k], b.params[k]) and torch.equal(a.params[k], c0.params[k])
    parts = [(x[i::3], y[i::3]) for i in range(3)]  # each node's own data
    c = privdl.train(data=parts, out=tmp_path / "c", partition="iid", **common)
    assert c.summary["completed"]
    with pytest.raises(ConfigError, match="3 per-node datasets but the run has 4 nodes"):
        privdl.train(data=parts, out=tmp_path / "d", **{**common, "graph": "ring:4"})
    # a cut-off run resumes only with the same data
    fit(make_config({k: v for k, v in common.items() if k != "progress"} | {"task": "user"}),
        tmp_path / "e", stop_after=2, progress=False,
        user=UserObjects(data=user_data((x, y))))  # fmt: skip
    with pytest.raises(ConfigError, match="pass data"):
        privdl.resume(tmp_path / "e", progress=False)
    with pytest.raises(ConfigError, match="data differs"):
        privdl.resume(tmp_path / "a", data=(x + 1.0, y), progress=False)  # a finished run too


def test_sgd_momentum_per_node_equals_torch_optim_and_gossip(tmp_path):
    """D-SGD with momentum (no noise, no clipping) against torch.optim.SGD on each node's least
    squares gradient followed by the dense product with W."""
    from privdl.topology import mixing_matrix, parse_graph

    cfg = dict(algorithm="dsgd", task="least-squares", graph="ring:5", steps=5, eval_every=5,
               dtype=D64, lr=0.05, optimizer="sgd:momentum=0.9,nesterov=true")  # fmt: skip
    result = privdl.train(out=tmp_path / "m", progress=False, **cfg)
    run = build_run(make_config(cfg))
    task = run.task
    a, b = task._a.double(), task._b.double()
    w = torch.as_tensor(mixing_matrix(parse_graph("ring:5"), "metropolis").dense())
    x = [p.detach().clone().requires_grad_(True) for p in task.init_params(seed=0)["x"]]
    opts = [torch.optim.SGD([p], lr=0.05, momentum=0.9, nesterov=True) for p in x]
    for _ in range(5):
        for i, (p, opt) in enumerate(zip(x, opts, strict=True)):
            opt.zero_grad()
            (0.5 * (a[i] * p - b[i]).pow(2).sum()).backward()
            opt.step()
        with torch.no_grad():
            mixed = w @ torch.stack(x)
            for i, p in enumerate(x):
                p.copy_(mixed[i])
    torch.testing.assert_close(result.params["x"], torch.stack(x).detach(), rtol=1e-12, atol=1e-12)


def test_central_dp_sgd_is_one_node_labelled_central_and_certified_by_dp_accounting(tmp_path):
    import dp_accounting as dpa

    x, y = _tiny_data(n=400)
    result = privdl.train(algorithm="dpsgd", model="linear", data=(x, y), clip=1.0, epsilon=2.0,
                          delta=1e-5, steps=30, eval_every=30, batch_size=20, dtype=D64,
                          out=tmp_path / "c", progress=False)  # fmt: skip
    priv = result.privacy
    assert result.summary["topology"]["n"] == 1 and priv["threat_model"] == "central"
    # the mean of 20 clipped gradients moves by 2C/20 when one example is replaced
    z = result.config.sigma / (2 * result.config.clip / 20)
    acc = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(400, 20, dpa.GaussianDpEvent(z)), 30)
    assert priv["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    assert priv["epsilon"] <= 2.0


def test_keyword_only_and_unknown_keys(tmp_path):
    with pytest.raises(TypeError):
        privdl.train(tmp_path / "x")  # type: ignore[misc]
    with pytest.raises(ConfigError, match="give task='a9a' or data"):
        privdl.train(out=tmp_path / "x", task="a9a", data=_tiny_data())
    with pytest.raises(ConfigError, match="optimizer applies to"):
        privdl.train(out=tmp_path / "x", algorithm="porter-dp", optimizer="adam")
    assert not (tmp_path / "x").exists()
    np.testing.assert_equal(len(NAMES), len(set(NAMES)))


def test_an_entry_point_registers_for_every_process_and_launch(tmp_path, monkeypatch):
    """A package's ``privdl.algorithms`` entry point: a fresh process lists the algorithm, and
    ``privdl launch`` (whose ranks import the registering file too) runs it to the launcher's
    result."""
    import subprocess

    dist = tmp_path / "site" / "toy_ep-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-ep\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[privdl.algorithms]\ntoy = toy_algorithm\n")
    path = f"{tmp_path / 'site'}:{Path(toy_algorithm.__file__).parent}"
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    listed = subprocess.run(
        [sys.executable, "-m", "privdl", "algorithms", "--json"],
        capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
    )  # fmt: skip
    origin = {r["name"]: r["origin"] for r in json.loads(listed.stdout)}[toy_algorithm.NAME]
    assert Path(origin).resolve() == Path(toy_algorithm.__file__).resolve()
    monkeypatch.setenv("PYTHONPATH", path)
    args = ["launch", "--nproc", "2", toy_algorithm.NAME, "--task", "least-squares", "--graph",
            "ring:6", "--steps", "4", "--eval-every", "2", "--clip", "1", "--clip-mode",
            "batch_mean", "--sigma", "0.3", "--dtype", "float64", "--lr", "0.05", "--out",
            str(tmp_path / "launched"), "--no-progress"]  # fmt: skip
    assert cli_main(args) == 0
    single = privdl.train(out=tmp_path / "single", progress=False, **{
        **{k: v for k, v in TOY.items() if k != "epsilon"}, "steps": 4, "eval_every": 2,
        "sigma": 0.3, "beta": 0.5})  # fmt: skip
    ckpt = merged_shards(tmp_path / "launched")  # each rank saved its own nodes
    for k in single.params:
        assert torch.equal(ckpt["params"][k], single.params[k])
