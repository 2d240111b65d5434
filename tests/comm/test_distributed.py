"""DistributedCommunicator, key transport, distributed runner, launcher: equivalence, resume, faults.

Ranks run in forked children of the test process (gloo over loopback; fork avoids re-importing
torch in each, which dominates start-up); the launcher test starts real subprocesses. The oracle
is always the single-process simulator (LocalCommunicator / privdl.runner).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from launched_runs import metric_rows, resume_rank

from privdl.algorithms.base import Keys, StepSize
from privdl.algorithms.decor import Decor
from privdl.algorithms.dsgd import DSGD
from privdl.cli.main import main as cli_main
from privdl.comm.distributed import DistributedError, shard_ranges
from privdl.comm.local import LocalCommunicator
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError
from privdl.loop import resume as sp_resume
from privdl.loop import train as sp_train
from privdl.records import RunRecords, merged_shards
from privdl.tasks import LeastSquaresTask
from privdl.topology import mixing_matrix, parse_graph
from privdl.topology.mixing import MixingMatrix
from privdl.topology.timevarying import ExponentialGraph

GRAPH = "er:7:0.5:3"  # 7 nodes: shards of sizes 4/3 (2 ranks) and 2/2/2/1 (4 ranks)


# ----------------------------------------------------------------------------- communicator
def _random_column_stochastic(n: int, t: int) -> MixingMatrix:
    rng = np.random.default_rng(100 + t)
    m = rng.random((n, n)) * (rng.random((n, n)) < 0.4) + np.eye(n)
    return MixingMatrix("push-sum", sp.csr_matrix(m / m.sum(axis=0, keepdims=True)))


def _comm_worker(rank: int, out: str) -> None:
    from privdl.comm.distributed import (
        DistributedCommunicator,
        DistributedKeyTransport,
        init_from_env,
    )
    from privdl.mechanisms.secrets import agree_edge_secrets

    init_from_env(timeout_s=30)
    dt = torch.float64
    topo = parse_graph(GRAPH)
    n = topo.n
    w = mixing_matrix(topo, "metropolis")
    g = torch.Generator().manual_seed(0)
    tree = {
        "a": torch.randn(n, 3, 2, generator=g, dtype=dt),
        "b": torch.randn(n, 4, generator=g, dtype=dt),
    }
    res: dict = {}

    def diff(dist_tree, full_tree, comm) -> float:
        return max(float((dist_tree[k] - comm.shard(full_tree)[k]).abs().max()) for k in full_tree)

    comm = DistributedCommunicator(w, dtype=dt)
    local = LocalCommunicator(w, dtype=dt)
    res["mix"] = diff(comm.mix(comm.shard(tree), 0), local.mix(tree, 0), comm)
    res["gather"] = max(
        float((comm.all_gather_nodes(comm.shard(tree))[k] - tree[k]).abs().max()) for k in tree
    )
    res["average"] = max(
        float((comm.average(comm.shard(tree))[k] - local.average(tree)[k]).abs().max())
        for k in tree
    )
    weights = torch.rand(n, generator=g, dtype=dt)
    ws, lws = comm.weighted_sum(comm.shard(tree), weights), local.weighted_sum(tree, weights)
    res["weighted_sum"] = max(float((ws[k] - lws[k]).abs().max()) for k in tree)
    server = {"s": torch.full((3,), float(rank + 1), dtype=dt)}  # only rank 0's value counts
    res["broadcast"] = float((comm.broadcast(server)["s"] - 1.0).abs().max())
    # push-sum: exponential graph (5 steps: two periods) and random column-stochastic P_t
    for name, sched in (("expo", ExponentialGraph(n)), ("directed", None)):
        kw = {"n_nodes": n} if sched is None else {}
        s = sched or (lambda t: _random_column_stochastic(n, t))
        dc, lc = DistributedCommunicator(s, dtype=dt, **kw), LocalCommunicator(s, dtype=dt, **kw)
        x, wt = dict(tree), torch.ones(n, dtype=dt)
        xs, ws_ = dc.shard(tree), torch.ones(dc.owned.numel(), dtype=dt)
        for t in range(5):
            x, wt = lc.push_sum(x, wt, t)
            xs, ws_ = dc.push_sum(xs, ws_, t)
        res[f"push_sum_{name}"] = max(diff(xs, x, dc), float((ws_ - wt[dc.owned]).abs().max()))
    # key transport: secrets equal the simulator's, only public keys cross
    transport = DistributedKeyTransport(comm, topo.edges)
    mine = agree_edge_secrets(topo.edges, n, transport=transport, nodes=comm.owned.tolist(), seed=5)
    full = agree_edge_secrets(topo.edges, n, seed=5)
    res["edge_keys"] = mine.edge_keys()
    res["all_edge_keys"] = full.edge_keys()
    res["carried"] = transport.carried
    res["public"] = full.public_keys
    # D-SGD (LDP: clipped, noisy) and DECOR: 6 steps on least squares, shard vs simulator
    task = LeastSquaresTask(n, dim=5, seed=2, dtype=dt)
    clip = ClipSpec(mode="batch_mean", threshold=1.0)
    algos = {
        "dsgd": DSGD(StepSize(0.05), clip=clip, sigma=0.3),
        "decor": Decor(
            StepSize(0.05), edges=topo.edges, n_nodes=n, clip=clip, sigma_cdp=0.2, sigma_cor=0.7
        ),
    }
    for name, algo in algos.items():
        ref = algo.init(task.init_params(seed=1), task.oracle, local, keys=Keys.from_seed(9))
        oracle = task.oracle_for(comm.owned_list)
        st = algo.init(comm.shard(task.init_params(seed=1)), oracle, comm, keys=Keys.from_seed(9))
        for _ in range(6):
            ref, _ = algo.step(ref, task.oracle, local)
            st, _ = algo.step(st, oracle, comm)
        res[name] = diff(st.params, ref.params, comm)
        res[name + "_moved"] = float((ref.params["x"] - 1.0).abs().max())
    torch.save(res, Path(out) / f"rank{rank}.pt")


@pytest.mark.parametrize("world", [2, 4])
def test_communicator_and_algorithms_match_simulator(tmp_path, world, run_ranks):
    codes = run_ranks(world, _comm_worker, (str(tmp_path),))
    assert codes == [0] * world
    n = parse_graph(GRAPH).n
    edges = parse_graph(GRAPH).edges
    for rank in range(world):
        res = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for key in ("mix", "gather", "average", "weighted_sum", "broadcast", "push_sum_expo",
                    "push_sum_directed", "dsgd", "decor"):  # fmt: skip
            assert res[key] <= 1e-12, (rank, key, res[key])
        assert res["dsgd_moved"] > 1e-3 and res["decor_moved"] > 1e-3  # the runs did something
        # secrets: incident edges get the simulator's secret, others none
        owned = set(shard_ranges(n, world)[rank])
        for e, (u, v) in enumerate(edges.tolist()):
            if u in owned or v in owned:
                assert res["edge_keys"][e] == res["all_edge_keys"][e]
            else:
                assert res["edge_keys"][e] is None
        # payloads: concatenations of published public keys; no secret in any of them
        public = set(res["public"].values())
        secrets = [k for k in res["all_edge_keys"] if k is not None]
        assert res["carried"], "a sharded connected graph must exchange keys"
        for _, _, _, payload in res["carried"]:
            assert len(payload) % 32 == 0
            chunks = {payload[i : i + 32] for i in range(0, len(payload), 32)}
            assert chunks <= public
            assert not any(s in payload for s in secrets)
        # delivery sets: rank r sends rank q exactly the keys of r's nodes with a neighbour on
        # q, in increasing node order, and receives exactly q's nodes with a neighbour on r
        shards = [set(sh) for sh in shard_ranges(n, world)]
        adj = {i: set() for i in range(n)}
        for u, v in edges.tolist():
            adj[u].add(v), adj[v].add(u)

        def keys(src, dst, public=res["public"], adj=adj):
            return b"".join(public[i] for i in sorted(src) if adj[i] & dst)

        expect = {}
        for q in set(range(world)) - {rank}:
            expect["send", rank, q] = keys(shards[rank], shards[q])
            expect["recv", q, rank] = keys(shards[q], shards[rank])
        expect = {k: v for k, v in expect.items() if v}
        assert expect  # the graph crosses every shard boundary somewhere
        got = {(d, a, b): payload for d, a, b, payload in res["carried"]}
        assert len(got) == len(res["carried"]) and got == expect


def test_shard_oracle_rows_equal_full_oracle():
    from privdl.tasks import SupervisedTask

    task = SupervisedTask("a9a", 5, model_name="linear", batch_size=8, dtype=torch.float64)
    params = task.init_params(seed=3)
    owned = torch.tensor([1, 2, 4])
    clip = ClipSpec(mode="per_sample", threshold=0.5)
    full = task.oracle(params, 7, clip=clip)
    part = task.oracle_for(owned.tolist())({k: v[owned] for k, v in params.items()}, 7, clip=clip)
    for k in full.grads:
        torch.testing.assert_close(part.grads[k], full.grads[k][owned], rtol=0, atol=1e-12)
    torch.testing.assert_close(part.loss, full.loss[owned], rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- faults
def _hang_worker(rank: int, out: str) -> None:
    from privdl.comm.distributed import DistributedCommunicator, init_from_env

    init_from_env(timeout_s=3)
    w = mixing_matrix(parse_graph("ring:4"), "metropolis")
    comm = DistributedCommunicator(w, dtype=torch.float64, timeout_s=3)
    x = {"x": torch.zeros(comm.owned.numel(), 2, dtype=torch.float64)}
    for t in range(5):
        if rank == 1 and t == 2:
            time.sleep(6)  # alive but silent: the peer must time out, not hang
        start = time.monotonic()
        try:
            x = comm.mix(x, t)
        except DistributedError as exc:
            Path(out, f"error{rank}.txt").write_text(f"{time.monotonic() - start:.3f}\n{exc}")
            os._exit(2)


def test_silent_peer_times_out_with_clear_error(tmp_path, run_ranks):
    codes = run_ranks(2, _hang_worker, (str(tmp_path),), timeout=40)
    assert codes[0] == 2
    waited, message = (tmp_path / "error0.txt").read_text().split("\n", 1)
    assert 2.0 <= float(waited) < 20.0
    assert "rank 0" in message and "peer process" in message and "step 2" in message


def test_misconfiguration_is_exit_2(capsys):
    assert (
        cli_main(["launch", "--nproc", "5", "dsgd", "--task", "least-squares", "--graph", "ring:4"])
        == 2
    )
    assert "exceeds the 4 nodes" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = [
            "launch",
            "--nproc",
            "2",
            "--master-port",
            str(port),
            "dsgd",
            "--task",
            "least-squares",
        ]
        assert cli_main([*args, "--graph", "ring:4"]) == 2
    assert f"port {port}" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="at most 3"):
        shard_ranges(3, 4)


def _busy_port_rank(rank: int, out: str) -> None:
    from privdl.comm.distributed import init_from_env

    try:
        init_from_env(timeout_s=5)
    except ConfigError as exc:
        Path(out, "error.txt").write_text(str(exc))


def _too_many_ranks(rank: int, out: str) -> None:  # torchrun path: 4 ranks for 3 nodes
    cli_main(["launch", "dsgd", "--task", "least-squares", "--graph", "ring:3", "--out", out])


def test_misconfiguration_under_torchrun_env(tmp_path, capfd, run_ranks):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        codes = run_ranks(1, _busy_port_rank, (str(tmp_path),), env={"MASTER_PORT": str(port)})
    assert codes == [0]
    assert f"port {port} on 127.0.0.1 is already in use" in (tmp_path / "error.txt").read_text()
    assert run_ranks(4, _too_many_ranks, (str(tmp_path / "run"),), timeout=60) == [2] * 4
    err = capfd.readouterr().err
    assert err.count("world size 4 exceeds the 3 nodes") == 1  # rank 0 says it, once
    assert err.strip().count("\n") == 0


# ----------------------------------------------------------------------------- runs
RUN = {
    "algorithm": "decor",
    "task": "least-squares",
    "graph": "ring:6",
    "steps": 60,
    "eval_every": 5,
    "clip": 1.0,
    "sigma": 0.4,
    "sigma_cor": 1.0,
    "lr": 0.05,
    "dtype": "float64",
    "seed": 4,
}
_FLAGS = ["decor", "--task", "least-squares", "--graph", "ring:6", "--steps", "60",
          "--eval-every", "5", "--clip", "1", "--sigma", "0.4", "--sigma-cor", "1", "--lr", "0.05",
          "--dtype", "float64", "--seed", "4", "--no-progress"]  # fmt: skip


def _torchrun_rank(rank: int, out: str) -> None:  # the `torchrun ... privdl launch` path
    code = cli_main(["launch", *_FLAGS, "--out", out])
    if code:
        raise SystemExit(code)


def test_distributed_kill_and_resume_is_bit_identical(tmp_path, monkeypatch, capfd, run_ranks):
    k = int(np.random.default_rng().integers(7, 55))  # a random step to die at
    killed = tmp_path / "killed"
    monkeypatch.setenv("PRIVDL_DEBUG_KILL", f"1:{k}")  # rank 1 SIGKILLs itself before step k
    start = time.monotonic()
    code = cli_main(["launch", "--nproc", "2", "--timeout", "20", *_FLAGS, "--out", str(killed)])
    elapsed = time.monotonic() - start
    monkeypatch.delenv("PRIVDL_DEBUG_KILL")
    err = capfd.readouterr().err
    # faults: the launcher reports the dead rank, rank 0 stops with its own clear error
    assert code == 2, err
    assert "rank 1 was killed by SIGKILL" in err
    assert "error: rank 0: gossip at step" in err and "peer process" in err
    assert elapsed < 120
    assert not (killed / "summary.json").exists()
    saved = merged_shards(killed)["t"]  # each rank's own file of the same step
    assert saved == (k // 5) * 5
    assert not (killed / "checkpoint.pt").exists()  # nothing gathered to rank 0
    # a crash between the checkpoint and its row: the resume writes the checkpoint's row
    metrics = killed / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["step"] == saved
    metrics.write_text("".join(lines[:-1]))
    assert run_ranks(2, resume_rank, (str(killed),)) == [0, 0]
    ref = tmp_path / "ref"
    assert run_ranks(2, _torchrun_rank, (str(ref),)) == [0, 0]
    a, b = merged_shards(killed), merged_shards(ref)
    assert a["t"] == b["t"] == RUN["steps"]
    assert torch.equal(a["params"]["x"], b["params"]["x"])  # bit-identical
    # epsilon neither reset nor counted twice: every row (incl. privacy) equals the reference's
    rows_killed, rows_ref = metric_rows(killed), metric_rows(ref)
    assert [r["step"] for r in rows_killed] == list(range(0, RUN["steps"] + 1, 5))
    assert rows_killed == rows_ref
    summary = json.loads((killed / "summary.json").read_text())
    eps = summary["final"]["privacy"]["epsilon"]
    assert eps == rows_ref[-1]["privacy"]["epsilon"] > rows_ref[-2]["privacy"]["epsilon"]
    # and the same models as the single-process simulator
    sp_train(RUN, tmp_path / "single", progress=False)
    c = torch.load(tmp_path / "single" / "checkpoint.pt", weights_only=False)
    torch.testing.assert_close(a["params"]["x"], c["params"]["x"], rtol=0, atol=1e-12)
    assert json.loads((tmp_path / "single" / "summary.json").read_text())["final"]["privacy"][
        "epsilon"
    ] == pytest.approx(eps, rel=1e-12)


def test_distributed_resume_is_refused_while_another_process_writes_the_run(tmp_path, run_ranks):
    run_dir = tmp_path / "run"
    sp_train(RUN, run_dir, progress=False, stop_after=10)
    before = (run_dir / "metrics.jsonl").read_bytes()
    with RunRecords(run_dir).exclusive():  # as if a single-process resume were still going
        codes = run_ranks(2, resume_rank, (str(run_dir),), timeout=60)
    assert codes[0] not in (0, None) and codes[1] not in (0, None), codes
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert not (run_dir / "summary.json").exists()


def _single_killed(out: str, k: int) -> None:
    import privdl.tasks as tasks

    original = tasks.LeastSquaresTask.oracle

    def dying(self, params, t, *, clip):
        if t == k:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, params, t, clip=clip)

    tasks.LeastSquaresTask.oracle = dying
    sp_train(RUN, out, progress=False)


def test_single_process_kill_and_resume_is_bit_identical(tmp_path):
    k = int(np.random.default_rng().integers(7, 55))
    p = mp.get_context("fork").Process(target=_single_killed, args=(str(tmp_path / "killed"), k))
    p.start()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "summary.json").exists()
    resumed = sp_resume(tmp_path / "killed", progress=False)
    full = sp_train(RUN, tmp_path / "full", progress=False)
    a = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)
    assert torch.equal(a["params"]["x"], b["params"]["x"])
    assert metric_rows(tmp_path / "killed") == metric_rows(tmp_path / "full")
    assert resumed["final"]["privacy"] == full["final"]["privacy"]


def test_launch_resume_of_a_corrupt_or_seeds_directory_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{bad")
    assert cli_main(["launch", "--nproc", "2", "--resume", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "config.json is corrupt" in err and "Traceback" not in err
    seeds = tmp_path / "seeds"
    sp_train({**RUN, "steps": 5}, seeds / "seed-1", progress=False)
    assert cli_main(["launch", "--nproc", "2", "--resume", str(seeds)]) == 2
    assert "privdl run --resume" in capsys.readouterr().err


def _os_rank(rank: int, out: str, stop_after: int | None = None) -> None:
    from privdl.distributed_runner import run_worker

    cfg = {**RUN, "steps": 20, "key_source": "os"}
    run_worker(cfg, out, timeout_s=30, progress=False, stop_after=stop_after)


def test_os_keys_under_launch_stay_with_their_rank_and_resume(tmp_path, capfd, run_ranks):
    """key_source=os on 2 ranks: DECOR's X25519 pairs and the noise keys come from the OS (two
    runs with one seed differ), the secret of an edge cut by the split is agreed by both ranks,
    each rank keeps its keys in its own 0600 file (its checkpoint holds none), a resumed
    run reads them back (two resumptions of one checkpoint agree to the bit), and resuming on
    another number of processes is refused."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_ranks(2, _os_rank, (str(a),)) == [0, 0]
    assert run_ranks(2, _os_rank, (str(b),)) == [0, 0]
    ca, cb = merged_shards(a), merged_shards(b)
    assert not torch.equal(ca["params"]["x"], cb["params"]["x"])
    for f in RunRecords(a).shard_files().values():  # each rank's checkpoint holds no key
        shard = torch.load(f, weights_only=True)
        assert "keys" not in shard and not any("key" in k for k in shard.get("state", {}))
    files = [torch.load(a / "keys" / f"rank-{r}.pt", weights_only=False) for r in range(2)]
    for r in range(2):
        assert (a / "keys" / f"rank-{r}.pt").stat().st_mode & 0o777 == 0o600
        own = files[r]["keys"]["noise_keys"]  # one key per node the rank owns, in its order
        assert len(own) == len(files[r]["owned"]) and all(len(k) == 32 for k in own)
    e0, e1 = files[0]["keys"]["edge_keys"], files[1]["keys"]["edge_keys"]
    shared = [e for e in range(len(e0)) if e0[e] is not None and e1[e] is not None]
    assert shared and all(e0[e] == e1[e] for e in shared)  # the cut edges' secrets agree
    from privdl.mechanisms.secrets import agree_edge_secrets
    from privdl.topology import parse_graph

    seeded = agree_edge_secrets(parse_graph("ring:6").edges, 6, seed=RUN["seed"]).edge_keys()
    assert all(e0[e] != seeded[e] for e in shared)
    summary = json.loads((a / "summary.json").read_text())
    assert "noise keys and data sampling from OS randomness" in summary["final"]["privacy"]["notes"]

    p1, p2, p3 = tmp_path / "p1", tmp_path / "p2", tmp_path / "p3"
    assert run_ranks(2, _os_rank, (str(p1), 12)) == [0, 0]
    p4 = tmp_path / "p4"  # the same checkpoint resumed with the seed's keys: another run
    p5, p6 = tmp_path / "p5", tmp_path / "p6"  # a corrupt key file; another run's key file
    p7, p8 = tmp_path / "p7", tmp_path / "p8"  # malformed values; another rank's file
    for copy in (p2, p3, p4, p5, p6, p7, p8):
        shutil.copytree(p1, copy)
    bad = torch.load(p7 / "keys" / "rank-1.pt", weights_only=True)
    bad["keys"]["noise_keys"] = bad["keys"]["noise_keys"][:1]
    torch.save(bad, p7 / "keys" / "rank-1.pt")
    shutil.copy(p8 / "keys" / "rank-0.pt", p8 / "keys" / "rank-1.pt")
    assert (p1 / "keys").stat().st_mode & 0o777 == 0o700
    (p5 / "keys" / "rank-1.pt").write_bytes(os.urandom(500))
    shutil.copy(a / "keys" / "rank-1.pt", p6 / "keys" / "rank-1.pt")  # same nproc and nodes
    cfg4 = json.loads((p4 / "config.json").read_text())
    (p4 / "config.json").write_text(json.dumps({**cfg4, "key_source": "seed"}))
    for run in (p1, p2, p4):
        assert run_ranks(2, resume_rank, (str(run),)) == [0, 0]
    x1, x2, x4 = (merged_shards(r) for r in (p1, p2, p4))
    assert x1["t"] == x2["t"] == 20 and torch.equal(x1["params"]["x"], x2["params"]["x"])
    assert not torch.equal(x1["params"]["x"], x4["params"]["x"])  # the kept keys were used
    capfd.readouterr()
    assert 0 not in run_ranks(3, resume_rank, (str(p3),))
    assert "resume it with --nproc 2" in capfd.readouterr().err
    for run, message in (
        (p5, "rank-1.pt is unreadable"),
        (p6, "belongs to another run"),
        (p7, "rank-1.pt holds malformed keys"),
        (p8, "rank-1.pt holds another rank's keys"),
    ):
        assert 0 not in run_ranks(2, resume_rank, (str(run),))
        assert message in capfd.readouterr().err  # PrivdlError: one line under the CLI


def _sparse_block_worker(rank: int, out: str) -> None:
    """Above SPARSE_ABOVE nodes each rank's block of W is sparse (as the simulator's W): a dense
    block of a random graph's shard is (n / ranks) x n (37 GiB at 10^5 nodes on 2 ranks)."""
    from privdl.comm.distributed import DistributedCommunicator, init_from_env
    from privdl.comm.local import SPARSE_ABOVE

    init_from_env(timeout_s=30)
    dt = torch.float64
    n = SPARSE_ABOVE + 44
    topo = parse_graph(f"regular:{n}:6:2")
    w = mixing_matrix(topo, "metropolis")
    tree = {"x": torch.randn(n, 3, generator=torch.Generator().manual_seed(1), dtype=dt)}
    res: dict = {}
    comm, local = DistributedCommunicator(w, dtype=dt), LocalCommunicator(w, dtype=dt)
    x, xs = dict(tree), comm.shard(tree)
    for t in range(3):
        x, xs = local.mix(x, t), comm.mix(xs, t)
    res["mix"] = float((xs["x"] - comm.shard(x)["x"]).abs().max())
    block = comm._plan(0).block
    res["layout"] = str(block.layout)
    res["nnz"] = int(block.values().numel())
    owned = comm.owned.numpy()
    res["expected_nnz"] = int(w.matrix.tocsr()[owned.min() : owned.max() + 1].nnz)
    # a time-varying column-stochastic schedule (push-sum), planned every step
    dc = DistributedCommunicator(lambda t: _random_column_stochastic(n, t), n_nodes=n, dtype=dt)
    lc = LocalCommunicator(lambda t: _random_column_stochastic(n, t), n_nodes=n, dtype=dt)
    y, wt = dict(tree), torch.ones(n, dtype=dt)
    ys, wts = dc.shard(tree), torch.ones(dc.owned.numel(), dtype=dt)
    for t in range(3):
        y, wt = lc.push_sum(y, wt, t)
        ys, wts = dc.push_sum(ys, wts, t)
    res["push_sum"] = max(
        float((ys["x"] - dc.shard(y)["x"]).abs().max()), float((wts - wt[dc.owned]).abs().max())
    )
    torch.save(res, Path(out) / f"rank{rank}.pt")


def test_large_graphs_mix_with_sparse_blocks(tmp_path, run_ranks):
    assert run_ranks(2, _sparse_block_worker, (str(tmp_path),)) == [0, 0]
    for rank in range(2):
        res = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert res["mix"] <= 1e-12 and res["push_sum"] <= 1e-12, res
        assert res["layout"] == "torch.sparse_csr" and res["nnz"] == res["expected_nnz"], res
