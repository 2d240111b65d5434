"""Nothing leaks and nothing is silently lost (issue 38): orphan checkpoint temp files, gaps in
the metrics, resumes of an edited config or an unreadable checkpoint, sweeps of mixed configs,
path errors, graphs too large to build."""

from __future__ import annotations

import json
import shutil
import stat
import warnings

import pytest

from privdl.cli.main import main as cli_main
from privdl.errors import ConfigError, GraphError, PrivdlError
from privdl.loop import resume, train
from privdl.records import RecordsWarning, RunRecords, save_torch_atomic
from privdl.registry import make_config

LS = {"algorithm": "ldp", "task": "least-squares", "graph": "ring:4", "sigma": 0.5, "clip": 1.0,
      "steps": 40, "eval_every": 5, "dtype": "float64"}  # fmt: skip


# -- item 2: temporary checkpoint files ------------------------------------------------------
def test_a_killed_writers_temp_files_are_removed_on_resume_and_overwrite(tmp_path):
    cfg = make_config({**LS, "key_source": "os"})
    run = tmp_path / "r"
    assert train(cfg, run, progress=False, stop_after=10) == {"stopped_at": 10}
    assert stat.S_IMODE((run / "checkpoint.pt").stat().st_mode) == 0o600
    # what a SIGKILL during the write leaves: the checkpoint (keys included) under a temp name
    orphans = [run / ".checkpoint.pt.k1ll3d00", run / ".config.json.abcd_123"]
    shutil.copy(run / "checkpoint.pt", orphans[0])
    orphans[1].write_text("{")
    keep = run / ".checkpoint.pt.notours"  # not mkstemp's name: not privdl's to delete
    keep.write_text("x")
    assert resume(run, progress=False)["steps_done"] == 40
    assert not any(p.exists() for p in orphans) and keep.exists()
    shutil.copy(run / "checkpoint.pt", orphans[0])
    train(cfg, run, progress=False, overwrite=True)
    assert not orphans[0].exists()


def test_the_temp_file_of_a_checkpoint_is_private_and_removed_when_the_write_fails(
    tmp_path, monkeypatch
):
    import torch

    modes = []
    real_save = torch.save

    def save(obj, f, *a, **k):
        modes.append(stat.S_IMODE(__import__("os").fstat(f.fileno()).st_mode))
        real_save(obj, f, *a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError):
        save_torch_atomic(tmp_path / "checkpoint.pt", {"keys": [b"\x01" * 32]})
    assert modes == [0o600]
    assert list(tmp_path.iterdir()) == []


# -- item 3: metrics rows lost before the checkpoint -----------------------------------------
def _cut_metrics(run, keep_upto: int) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if json.loads(ln)["step"] <= keep_upto]
    (run / "metrics.jsonl").write_text("".join(kept) + '{"step": 1')  # and a torn line


def test_resume_says_which_rows_were_lost_and_report_flags_the_gap(tmp_path):
    from privdl.report import load_runs, write_report

    run = tmp_path / "r"
    assert train(make_config(LS), run, progress=False, stop_after=30) == {"stopped_at": 30}
    _cut_metrics(run, 10)
    with pytest.warns(RecordsWarning, match=r"lacks the rows of step\(s\) 15, 20, 25, before the "
                      r"checkpoint at step 30"):  # fmt: skip
        resume(run, progress=False)
    steps = [r["step"] for r in RunRecords(run).rows()]
    assert steps == [0, 5, 10, 30, 35, 40]
    with pytest.warns(RecordsWarning, match=r"lacks the rows of step\(s\) 15, 20, 25"):
        runs = load_runs([run])
    assert runs[0]["gaps"] == [15, 20, 25]
    text = write_report(runs, tmp_path / "rep").read_text()
    assert "**Gap**" in text and "15, 20, 25" in text
    # a whole run: no warning at all
    train(make_config(LS), tmp_path / "whole", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordsWarning)
        assert load_runs([tmp_path / "whole"])[0]["gaps"] == []


# -- item 5: an edited config.json, an unreadable checkpoint ---------------------------------
def test_resume_of_an_edited_config_names_the_mismatch(tmp_path, capsys):
    run = tmp_path / "r"
    assert train(make_config(LS), run, progress=False, stop_after=10) == {"stopped_at": 10}
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    path = run / "config.json"
    path.write_text(path.read_text().replace('"ring:4"', '"ring:6"'))
    assert cli_main(["run", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (
        "config.json says graph='ring:6' but the checkpoint was written with graph='ring:4'" in err
    )
    after = {p.name: p.read_bytes() for p in run.iterdir()}
    assert after.keys() == before.keys() and after["checkpoint.pt"] == before["checkpoint.pt"]
    assert after["metrics.jsonl"] == before["metrics.jsonl"]


def test_a_checkpoint_of_an_earlier_version_that_does_not_fit_is_one_line(tmp_path):
    import torch

    run = tmp_path / "r"
    assert train(make_config(LS), run, progress=False, stop_after=10) == {"stopped_at": 10}
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    del ckpt["config"]  # written before checkpoints carried their config
    torch.save(ckpt, run / "checkpoint.pt")
    path = run / "config.json"
    path.write_text(path.read_text().replace('"ring:4"', '"ring:6"'))
    with pytest.raises(PrivdlError, match="does not fit the run in .*was config.json edited"):
        resume(run, progress=False)


def test_an_unreadable_checkpoint_is_not_called_corrupt_nor_deleted(tmp_path):
    run = tmp_path / "r"
    assert train(make_config(LS), run, progress=False, stop_after=10) == {"stopped_at": 10}
    (run / "checkpoint.pt").unlink()
    (run / "checkpoint.pt").mkdir()  # the OS refuses to read it (as a permission would)
    with pytest.raises(PrivdlError) as info:
        resume(run, progress=False)
    msg = str(info.value)
    assert "cannot read" in msg and "corrupt" not in msg and "delete" not in msg
    (run / "checkpoint.pt").rmdir()
    (run / "checkpoint.pt").write_bytes(b"garbage")
    with pytest.raises(PrivdlError, match="is unreadable") as info:
        resume(run, progress=False)
    assert "delete" not in str(info.value)


# -- item 4: sweeps ---------------------------------------------------------------------------
SWEEP = ["run", "ldp", "--task", "least-squares", "--graph", "ring:4", "--clip", "1",
         "--steps", "10", "--eval-every", "5", "--no-progress"]  # fmt: skip


def _sweep(out, sigma: float, seeds: list[int], *, run: bool = True) -> None:
    """The records ``privdl run --seeds`` leaves (its plan, one run per seed), without the
    report at its end."""
    from privdl.records import write_seeds_plan

    cfg = make_config({**LS, "sigma": sigma, "steps": 10})
    write_seeds_plan(out, seeds, cfg.model_dump(), ["sigma", "steps"])
    for seed in seeds if run else ():
        train(cfg.with_updates(seed=seed), out / f"seed-{seed}", progress=False)


def test_a_sweep_is_refused_before_it_touches_a_sweep_being_written(tmp_path, capsys):
    out = tmp_path / "S"
    _sweep(out, 1.0, [1, 2], run=False)
    plan = (out / "seeds.json").read_bytes()
    with RunRecords(out).exclusive():  # another sweep writes S
        code = cli_main([*SWEEP, "--sigma", "7", "--seeds", "1-2", "--overwrite", "--out",
                         str(out)])  # fmt: skip
    assert code == 2 and "being written by another privdl process" in capsys.readouterr().err
    assert (out / "seeds.json").read_bytes() == plan
    assert sorted(p.name for p in out.iterdir()) == [".lock", "seeds.json"]


def test_resume_refuses_a_sweep_of_mixed_configurations(tmp_path, capsys):
    out = tmp_path / "S"
    _sweep(out, 1.0, [1, 2, 3], run=False)
    train(make_config({**LS, "sigma": 1.0, "steps": 10, "seed": 1}), out / "seed-1",
          progress=False)  # fmt: skip
    _sweep(
        tmp_path / "other", 7.0, [1, 2, 3], run=False
    )  # what the race left: another sweep's plan over seed-1
    shutil.copy(tmp_path / "other" / "seeds.json", out / "seeds.json")
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "seed-1 was run with sigma=1.0 but the sweep" in err and "sigma=7.0" in err, err
    assert err.count("\n") == 1 and not (out / "seed-2").exists()  # nothing started
    # seed runs that disagree with each other (a plan-less sweep of an earlier privdl)
    _sweep(tmp_path / "T", 1.0, [1])
    train(make_config({**LS, "sigma": 7.0, "steps": 10, "seed": 2}), tmp_path / "T" / "seed-2",
          progress=False, stop_after=5)  # fmt: skip
    (tmp_path / "T" / "seeds.json").unlink()
    assert cli_main(["run", "--resume", str(tmp_path / "T"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "seed-2 was run with sigma=7.0 but" in err and "mix configurations" in err, err
    assert not (tmp_path / "T" / "seed-2" / "summary.json").exists()


# -- item 6: path errors ------------------------------------------------------------------------
LONG = "n" * 300


@pytest.mark.parametrize(
    "args",
    [
        ["run", "ldp", "--config", f"{LONG}.toml"],
        ["run", "--resume", LONG],
        ["launch", "--resume", LONG],
        ["report", LONG],
        ["graph", LONG],
        ["run", *SWEEP[1:], "--sigma", "1", "--out", f"x/{LONG}"],
    ],
    ids=["config", "resume", "launch-resume", "report", "graph", "out"],
)
def test_a_name_too_long_for_any_path_option_is_one_line(tmp_path, monkeypatch, capsys, args):
    monkeypatch.chdir(tmp_path)
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and len(err) < 300, err
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_unreadable_records_and_a_read_only_out_are_one_line(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    train(make_config({**LS, "steps": 10}), run, progress=False, stop_after=5)
    # metrics.jsonl: the OS refuses to read it (a directory in its place)
    shutil.move(run / "metrics.jsonl", tmp_path / "metrics.jsonl")
    (run / "metrics.jsonl").mkdir()
    capsys.readouterr()
    assert cli_main(["report", str(run), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot read {run / 'metrics.jsonl'}") and err.count("\n") == 1
    (run / "metrics.jsonl").rmdir()
    shutil.move(tmp_path / "metrics.jsonl", run / "metrics.jsonl")
    # config.json: a permission the OS enforces (the tests may run as root, whom permissions
    # do not stop: its answer is given here)
    from pathlib import Path

    real_read = Path.read_text

    def unreadable(self, *a, **k):
        if self == run / "config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", unreadable)
    assert cli_main(["run", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot read {run / 'config.json'} (Permission denied)\n"
    monkeypatch.undo()
    # a read-only --out (tests may run as root, whom permissions do not stop: the OS's
    # answer to a read-only directory is given here)
    import os

    real_open = os.open

    def read_only(path, flags, *a, **k):
        if str(path).startswith(str(tmp_path / "ro")) and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "open", read_only)
    assert cli_main([*SWEEP, "--sigma", "1", "--out", str(tmp_path / "ro")]) == 2
    err = capsys.readouterr().err
    assert "cannot write in" in err and "Permission denied" in err and err.count("\n") == 1
    assert list((tmp_path / "ro").iterdir()) == []


# -- item 7: sizes refused before anything is allocated ----------------------------------------
@pytest.mark.parametrize(
    "spec",
    [
        "ring:10000000",
        "torus:3000x3000",
        "complete:5000",
        "regular:2000000:6:1",
        "er:100000:0.01:1",
        "expo:100000000",
        "path:100000000000000000000",
    ],  # fmt: skip
)
def test_graphs_too_large_are_refused_from_their_spec(spec):
    import tracemalloc

    from privdl.topology import parse_topology

    tracemalloc.start()
    with pytest.raises(GraphError, match="privdl builds graphs of at most"):
        parse_topology(spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000  # nothing of the graph was built


def test_steps_seeds_and_graph_limits_are_one_line_before_anything_is_made(tmp_path, capsys):
    cases = [["--steps", "100000000000000000000000"], ["--seeds", "0-10000000"],
             ["--graph", "ring:10000000"]]  # fmt: skip
    for extra in cases:
        out = tmp_path / "o"
        args = ["run", "ldp", "--task", "least-squares", "--clip", "1", "--sigma", "1",
                "--no-progress", "--out", str(out), *extra]  # fmt: skip
        if "--graph" not in extra:
            args += ["--graph", "ring:4"]
        assert cli_main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("at most" in err or "limit of" in err), err
        assert not out.exists()


def test_config_errors_are_config_errors():
    assert issubclass(ConfigError, PrivdlError)
