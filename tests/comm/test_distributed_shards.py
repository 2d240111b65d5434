"""Each rank of a launched run checkpoints its own nodes and resumes from its own file.

Issue 29: rank 0 used to gather every shard's state into one checkpoint, PrivSGP-VR's SAGA
tables of un-noised per-sample gradients included (a data leak to rank 0). Now every rank keeps
``checkpoints/rank-R-of-W-step-T.pt``. Oracles: the same launch run without interruption (a
resumed run ends bit for bit where it ends, every metrics row equal) and the one-process
simulator (the same final models within 1e-12); what rank 0 writes holds no byte of rank 1's
SAGA table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from launched_runs import metric_rows, resume_rank

import privdl.distributed_runner  # noqa: F401 - imported once here; the forked ranks inherit it
from privdl.cli.main import main as cli_main
from privdl.loop import train as sp_train
from privdl.records import RunRecords

RUN = {
    "algorithm": "privsgp-vr",
    "task": "least-squares",
    "graph": "expo:5",  # 5 nodes: shards 3/2
    "ls_dim": 4,
    "steps": 12,
    "eval_every": 4,
    "lr": 0.05,
    "clip": 1.0,
    "sigma": 0.2,
    "dtype": "float64",
    "seed": 3,
}


def _rank(rank: int, out: str, stop_after: int | None = None) -> None:
    from privdl.distributed_runner import run_worker

    run_worker(RUN, out, timeout_s=30, progress=False, stop_after=stop_after)


def _shards(run_dir: Path) -> dict[tuple[int, int, int], dict]:
    """Every rank's checkpoint (a test reads them all; no rank of the run does)."""
    files = RunRecords(run_dir).shard_files()
    return {k: torch.load(p, weights_only=True) for k, p in files.items()}


def test_each_rank_checkpoints_its_own_nodes_and_resumes_to_the_same_end(
    tmp_path, run_ranks, capsys
):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert run_ranks(2, _rank, (str(ref),)) == [0, 0]
    assert run_ranks(2, _rank, (str(cut), 6)) == [0, 0]  # stops after step 6: checkpoint 4
    assert not (cut / "checkpoint.pt").exists() and not (ref / "checkpoint.pt").exists()
    assert set(RunRecords(cut).shard_files()) == {(0, 2, 4), (1, 2, 4)}
    assert run_ranks(2, resume_rank, (str(cut),)) == [0, 0]

    a, b = _shards(cut), _shards(ref)
    assert set(a) == set(b) == {(0, 2, 12), (1, 2, 12)}  # older steps dropped
    for key in a:
        assert a[key]["owned"] == [[0, 1, 2], [3, 4]][key[0]]
        assert a[key]["params"].keys() == b[key]["params"].keys()
        for name in ("params", "state"):
            for leaf, v in b[key][name].items():
                assert torch.equal(a[key][name][leaf], v), (key, name, leaf)  # bit for bit
    assert metric_rows(cut) == metric_rows(ref)
    for p in RunRecords(cut).shard_files().values():
        assert p.stat().st_mode & 0o777 == 0o600

    # rank 0's files hold only its own rows: no byte of rank 1's SAGA table (raw gradients)
    theirs = a[(1, 2, 12)]["state"]["table"]
    assert theirs.shape[0] == 2 and theirs.abs().sum() > 0
    assert a[(0, 2, 12)]["state"]["table"].shape[0] == 3
    raw = theirs.contiguous().numpy().tobytes()
    for f in cut.rglob("*"):
        if f.is_file() and "rank-1-" not in f.name:
            assert raw not in f.read_bytes(), f
    assert raw in RunRecords(cut).shard_files()[(1, 2, 12)].read_bytes()  # the check can fail

    # the simulator's models, within rounding of the sharded sums
    sp_train(RUN, tmp_path / "single", progress=False)
    single = torch.load(tmp_path / "single" / "checkpoint.pt", weights_only=True)
    x = torch.cat([a[(r, 2, 12)]["params"]["x"] for r in range(2)])
    torch.testing.assert_close(x, single["params"]["x"], rtol=0, atol=1e-12)

    # one process, or another number of processes, cannot resume it: one line each
    other = tmp_path / "other"
    shutil.copytree(cut, other)
    (other / "summary.json").unlink()
    assert cli_main(["run", "--resume", str(other), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "launched on 2 processes" in err and "launch --nproc 2 --resume" in err


@pytest.mark.slow  # 3 more launches; the resume itself is tested above
def test_a_gathered_checkpoint_resumes_sharded_and_another_nproc_is_refused(
    tmp_path, run_ranks, capfd
):
    """A one-process run's checkpoint.pt (the format of earlier privdl launches too) resumes
    under 2 ranks to the uninterrupted launched run's end and is then replaced by the ranks'
    own files; resuming a 2-rank run with 3 processes is refused in one line."""
    ref, old = tmp_path / "ref", tmp_path / "old"
    assert run_ranks(2, _rank, (str(ref),)) == [0, 0]
    sp_train(RUN, old, progress=False, stop_after=6)
    assert (old / "checkpoint.pt").exists()
    assert run_ranks(2, resume_rank, (str(old),)) == [0, 0]
    assert not (old / "checkpoint.pt").exists()
    a, b = _shards(old), _shards(ref)
    assert set(a) == set(b)
    for key in a:
        torch.testing.assert_close(a[key]["params"]["x"], b[key]["params"]["x"], rtol=0, atol=1e-12)
    three = tmp_path / "three"
    assert run_ranks(2, _rank, (str(three), 6)) == [0, 0]
    capfd.readouterr()
    assert 0 not in run_ranks(3, resume_rank, (str(three),))
    assert "resume it with --nproc 2" in capfd.readouterr().err
