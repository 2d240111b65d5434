"""The replay attack on the decentralized launch path (issue 29, item 1; docs/security.md s.1).

Two gloo ranks run DECOR (``sigma_cor > 0`` and ``sigma_cdp > 0``) on ``ring:4``: rank 0 owns
nodes 0 and 1, rank 1 owns nodes 2 and 3. Rank 0 is the attacker; it records everything that
reaches it: the rows its peer sends in each gossip round (node 3's half step
``x_3^t - eta (g_3 + N_3)``, since node 3 neighbours node 0), every node's model ``x^t``
(gathered to every rank for the metrics), every checkpoint it writes (its own nodes' rows: each
rank keeps its own), every object broadcast or gathered to it, its own key file, and the
records. From ``x_3^t`` and the message it recovers ``g_3 + N_3``; it then replays
``N_3`` as the documented DECOR step draws it (``sum_j v_3j + vbar_3``, docs/secrets.md), with the
keys derived from the run's seed (the only secret-looking number it received) and its *own*
secret for the edge (0, 3), which it legitimately shares with node 3.

Oracle: the clipping bound ``C`` (``g_3`` is a clipped gradient) and the norm of the replayed part
that the attacker cannot know (``vbar_3`` and the edge (2, 3), both held by rank 1 only).

* Control, ``key_source = "seed"``: the attack must succeed (residual = ``g_3``, within ``C``),
  or the test proves nothing.
* ``key_source = "os"``: the residual is at the noise level, about sqrt 2 times the unknown
  part's norm (the replayed and the true noise are independent), far above ``C``; and no byte
  of rank 1's keys is in any file rank 0 writes or in any object it received.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from privdl.algorithms.base import Keys
from privdl.mechanisms.correlated import correlated_noise, decor_noise
from privdl.mechanisms.secrets import agree_edge_secrets
from privdl.records import merged_shards
from privdl.topology import parse_graph

RUN = {
    "algorithm": "decor",
    "task": "least-squares",
    "graph": "ring:4",
    "steps": 24,
    "eval_every": 1,  # every node's x^t reaches rank 0 (the metrics) at every step
    "clip": 1.0,
    "sigma": 0.4,
    "sigma_cor": 1.0,
    "lr": 0.05,
    "dtype": "float64",
    "seed": 4,
    "accountant": "rdp",
}
VICTIM, ATTACKER_NODE = 3, 0  # node 3 (rank 1) neighbours node 0 (rank 0)


def _attacker_rank(rank: int, out: str, key_source: str) -> None:
    """A launched rank; rank 0 logs what reaches it into OUT/../attacker-view.pkl."""
    import privdl.distributed_runner as runner
    from privdl.comm.distributed import DistributedCommunicator

    view: dict = {"messages": [], "models": [], "checkpoints": [], "received": []}
    if rank == 0:
        exchange = DistributedCommunicator._exchange

        def logged_exchange(self, flat, plan, t):
            ext = exchange(self, flat, plan, t)
            view["messages"].append((t, plan.cols.copy(), ext.detach().clone()))
            return ext

        gather_nodes = DistributedCommunicator.all_gather_nodes

        def logged_gather_nodes(self, tree):
            got = gather_nodes(self, tree)
            view["models"].append(got["x"].detach().clone())  # at t = 0, 1, ... (eval_every 1)
            return got

        save = runner.DistributedWorld.save_shard

        def logged_save(self, records, ckpt):
            view["checkpoints"].append(ckpt)
            return save(self, records, ckpt)

        bcast, gather = runner.DistributedWorld.broadcast, runner.DistributedWorld.all_gather

        def logged_bcast(self, obj):
            got = bcast(self, obj)
            view["received"].append(got)
            return got

        def logged_gather(self, obj):
            got = gather(self, obj)
            view["received"].append(got)
            return got

        DistributedCommunicator._exchange = logged_exchange  # type: ignore[method-assign]
        DistributedCommunicator.all_gather_nodes = logged_gather_nodes  # type: ignore[method-assign]
        runner.DistributedWorld.save_shard = logged_save  # type: ignore[method-assign]
        runner.DistributedWorld.broadcast = logged_bcast  # type: ignore[method-assign]
        runner.DistributedWorld.all_gather = logged_gather  # type: ignore[method-assign]
    runner.run_worker({**RUN, "key_source": key_source}, out, timeout_s=30, progress=False)
    if rank == 0:
        Path(out).with_name(Path(out).name + "-view.pkl").write_bytes(pickle.dumps(view))


def _attack(out: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step: the residual ``g_3 + N_3 - N_3'``, the replayed noise the attacker cannot know
    (vbar_3 and v_32) and the whole replayed noise."""
    view = pickle.loads(out.with_name(out.name + "-view.pkl").read_bytes())
    assert len(view["models"]) == RUN["steps"] + 1
    assert all(c["owned"] == [0, 1] for c in view["checkpoints"])  # its own rows only
    models = dict(enumerate(view["models"]))  # t -> every node's x^t
    eta = RUN["lr"]
    graph = parse_graph(RUN["graph"])
    edges = np.asarray(graph.edges)
    seed = RUN["seed"]
    # the attacker's replay: every key from the seed, except the edge it shares with node 3
    replay_edges = list(agree_edge_secrets(edges, 4, seed=seed).edge_keys())
    shared = [e for e, (u, v) in enumerate(edges.tolist()) if {u, v} == {ATTACKER_NODE, VICTIM}]
    assert len(shared) == 1
    key_file = out / "keys" / "rank-0.pt"  # key_source = os: rank 0's own keys
    if key_file.exists():
        own = torch.load(key_file, weights_only=True)["keys"]["edge_keys"][shared[0]]
        assert own is not None
        replay_edges[shared[0]] = own
    (node_key,) = Keys.from_seed(seed).node_noise_keys([VICTIM])
    residual, unknown, replayed = [], [], []
    for t, cols, ext in view["messages"]:
        if t not in models:
            continue
        row = int(np.searchsorted(cols, VICTIM))
        assert cols[row] == VICTIM  # node 3's half step reached rank 0
        noisy = (models[t][VICTIM] - ext[row]) / eta  # g_3 + N_3
        common = dict(sigma_cor=RUN["sigma_cor"], dtype=torch.float64, nodes=[VICTIM])
        full = decor_noise(
            replay_edges, edges, 4, [node_key], t, 10, sigma_cdp=RUN["sigma"], **common
        )
        # the part rank 0 knows: the edge (0, 3) (a stream is a function of its key and t)
        known = correlated_noise([replay_edges[shared[0]]], edges[shared], 4, t, 10, **common)
        assert full is not None
        residual.append((noisy - full[0]).numpy())
        unknown.append((full[0] - known[0]).numpy())
        replayed.append(full[0].numpy())
    assert len(residual) >= RUN["steps"] - 1  # every step after the first checkpoint
    return np.asarray(residual), np.asarray(unknown), np.asarray(replayed)


def _run_ranks():
    """tests/comm/conftest.py's ``run_ranks``, loaded by its path: a bare ``import conftest``
    finds whichever conftest module another folder's tests imported first."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "comm_conftest", Path(__file__).with_name("conftest.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_ranks


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, Path]:
    """The run under 2 gloo ranks with each key source (about 1 s each once privdl is imported:
    the first one in a fresh interpreter pays the imports, about 11 s on a loaded machine)."""
    run_ranks = _run_ranks()

    base = tmp_path_factory.mktemp("replay")
    for source in ("seed", "os"):
        assert run_ranks(2, _attacker_rank, (str(base / source), source)) == [0, 0]
    return {source: base / source for source in ("seed", "os")}


def _assert_attack_succeeds(out: Path) -> np.ndarray:
    control, _, noise = _attack(out)
    c = np.linalg.norm(control, axis=1)
    assert np.all(c <= RUN["clip"] * (1 + 1e-9)), c
    assert np.all(c < 0.5 * np.linalg.norm(noise, axis=1))
    return c


def test_replaying_what_reaches_rank_0_rebuilds_seeded_noise_but_not_os_keyed(launched):
    # control: keys from the seed, the replay is exact, a clipped gradient is left
    c = _assert_attack_succeeds(launched["seed"])
    # OS keys: what is left is noise, about sqrt 2 times the part rank 0 cannot know
    residual, unknown, _ = _attack(launched["os"])
    r = np.linalg.norm(residual, axis=1)
    assert np.all(r > RUN["clip"]), r
    ratio = np.linalg.norm(residual) / np.linalg.norm(unknown)
    np.testing.assert_allclose(ratio, np.sqrt(2), rtol=0.2)
    print(f"seeded residual {c.mean():.3f} (clip {RUN['clip']}), os residual {r.mean():.3f}, "
          f"unknown noise {np.linalg.norm(unknown, axis=1).mean():.3f}, ratio {ratio:.3f}")  # fmt: skip


def test_nothing_rank_0_holds_or_received_carries_rank_1s_keys(launched):
    out = launched["os"]
    k0, k1 = (torch.load(out / "keys" / f"rank-{r}.pt", weights_only=True) for r in (0, 1))
    assert (k0["owned"], k1["owned"]) == ([0, 1], [2, 3])
    edges = np.asarray(parse_graph(RUN["graph"]).edges).tolist()
    inner = [e for e, (u, v) in enumerate(edges) if {u, v} <= {2, 3}]  # rank 1's own edge
    theirs = [*k1["keys"]["noise_keys"], *(k1["keys"]["edge_keys"][e] for e in inner)]
    assert len(theirs) == 3 and all(isinstance(k, bytes) and len(k) == 32 for k in theirs)
    blobs = [f.read_bytes() for f in out.rglob("*") if f.is_file() and "rank-1" not in f.name]
    blobs.append(out.with_name(out.name + "-view.pkl").read_bytes())  # broadcasts, messages
    for data in blobs:
        assert not any(key in data or key.hex().encode() in data for key in theirs)
    notes = json.loads((out / "summary.json").read_text())["final"]["privacy"]
    seeded = json.loads((launched["seed"] / "summary.json").read_text())["final"]["privacy"]
    assert "every rank" in seeded["rebuild"]["every node's noise"]
    assert notes["threat_model"] == seeded["threat_model"] == "eavesdropper"
    assert "noise keys and data sampling from OS randomness" in notes["notes"]
    assert notes["rebuild"] == {
        "independent noise of node i": "only the rank that owns node i",
        "correlated noise of edge (i, j)": "the ranks that own i and j",
    }


def _secure_cfg() -> dict:
    """The secure-mode DECOR run both sides of the comparison make (keys from the seed, so the
    launched and the one-process runs draw the same noise)."""
    return {**RUN, "steps": 3, "eval_every": 3, "noise_mode": "secure",
            "clip_mode": "batch_mean", "key_source": "seed"}  # fmt: skip


def _secure_rank(rank: int, out: str) -> None:
    from privdl.distributed_runner import run_worker

    run_worker(_secure_cfg(), out, timeout_s=30, progress=False)


@pytest.mark.slow  # 2 launches' worth of time on a loaded box; the mechanism's rows: test_discrete_gaussian
def test_launched_secure_decor_equals_the_one_process_run(tmp_path):
    """The secure mode's lattice noise (independent and per edge) drawn per rank: the launched
    run's models equal the simulator's bit for bit."""
    run_ranks = _run_ranks()
    from privdl.loop import train

    assert run_ranks(2, _secure_rank, (str(tmp_path / "launched"),)) == [0, 0]
    train(_secure_cfg(), tmp_path / "single", progress=False)
    a = merged_shards(tmp_path / "launched")["params"]["x"]
    b = torch.load(tmp_path / "single" / "checkpoint.pt", weights_only=True)["params"]["x"]
    assert torch.equal(a, b)
