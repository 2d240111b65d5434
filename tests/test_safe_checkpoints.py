"""Issue 29, item 2: nothing read from a run directory can run code (weights-only loads)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from privdl.cli.main import main
from privdl.errors import PrivdlError
from privdl.loop import train
from privdl.records import RunRecords, load_torch_safe, plain_data

ROOT = Path(__file__).resolve().parents[1]
CFG = {"algorithm": "ldp", "task": "least-squares", "graph": "ring:4", "steps": 4,
       "eval_every": 2, "clip": 1.0, "sigma": 0.5, "dtype": "float64"}  # fmt: skip


class _WritesAFile:
    """A pickle whose loading would write ``path`` (what a crafted checkpoint does)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "pwned"))


def test_every_torch_load_is_weights_only():
    """No ``torch.load`` in the package (or the tools that read run directories) may unpickle
    arbitrary objects: each call says ``weights_only=True``."""
    calls = []
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]:
        text = path.read_text()
        assert "weights_only=False" not in text, path
        for m in re.finditer(r"torch\.load\(", text):
            depth, i = 1, m.end()
            while depth:  # the call's arguments, to its closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            calls.append((path, text[m.start() : i]))
    assert calls, "the grep found no torch.load at all"
    bad = [f"{p}: {c}" for p, c in calls if "weights_only=True" not in c]
    assert not bad, bad


def test_no_unrestricted_pickle_or_numpy_pickle_loads():
    for path in (ROOT / "src").rglob("*.py"):
        text = path.read_text()
        assert "allow_pickle=True" not in text, path
        assert not re.search(r"pickle\.loads?\(", text), path  # cifar: a restricted Unpickler


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    train(CFG, run, progress=False, stop_after=2)
    marker = tmp_path / "written-by-the-checkpoint"
    torch.save({"t": 2, "params": {}, "x": _WritesAFile(marker)}, run / "checkpoint.pt")
    before = sorted(p.name for p in run.iterdir())
    assert main(["run", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not loaded" in err and "checkpoint.pt" in err, err
    assert not marker.exists()
    assert sorted(p.name for p in run.iterdir()) == before
    with pytest.raises(PrivdlError, match="other than tensors and plain data"):
        RunRecords(run).load_checkpoint()
    assert not marker.exists()


def test_a_crafted_rank_key_file_and_reproduce_checkpoint_run_nothing(tmp_path):
    marker = tmp_path / "written"
    path = tmp_path / "evil.pt"
    torch.save({"key": "k", "x": _WritesAFile(marker)}, path)
    from privdl.distributed_runner import _read_key_file

    saved, problem = _read_key_file(path, {"key_run_id": "r"}, 2)
    assert saved is None and "unreadable" in problem
    from privdl.experiments.robust_hdp import _load_checkpoint

    with pytest.raises(PrivdlError, match="not loaded"):
        _load_checkpoint(path, "k", None, None, torch.device("cpu"))
    assert not marker.exists()


def test_a_run_checkpoint_holds_only_tensors_and_plain_data(tmp_path):
    """What privdl saves loads with torch's weights-only unpickler as it is (no allow-list)."""
    train(CFG, tmp_path / "run", progress=False, stop_after=2)
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["t"] == 2 and isinstance(ckpt["params"]["x"], torch.Tensor)


def test_plain_data_converts_what_weights_only_refuses(tmp_path):
    state = {"t": np.int64(3), "wall_time": np.float64(1.25), "lr": np.float32(0.5),
             "table": np.arange(6.0).reshape(2, 3), "where": tmp_path,
             "keys": [b"k" * 32, None], "pair": (1, "a")}  # fmt: skip
    path = tmp_path / "c.pt"
    torch.save(plain_data(state), path)
    back = torch.load(path, weights_only=True)
    assert back["t"] == 3 and type(back["t"]) is int
    assert back["wall_time"] == 1.25 and type(back["wall_time"]) is float
    assert back["lr"] == 0.5 and torch.equal(back["table"], torch.arange(6.0).reshape(2, 3))
    assert back["table"].dtype == torch.float64 and back["where"] == str(tmp_path)
    assert back["keys"] == [b"k" * 32, None] and back["pair"] == (1, "a")
    with pytest.raises(TypeError, match="plain data only"):
        plain_data({"x": object()})


def test_an_earlier_checkpoint_with_numpy_values_still_loads(tmp_path):
    """Numpy arrays and scalars (an earlier privdl's, or a user's) are read through the
    allow-list of numpy's array reconstruction; nothing else is allowed."""
    path = tmp_path / "old.pt"
    torch.save({"t": np.int64(2), "a": np.ones(3, dtype=np.float32)}, path)
    back = load_torch_safe(path, fix="x")
    assert back["t"] == 2 and np.array_equal(back["a"], np.ones(3, dtype=np.float32))


def test_resume_is_bit_identical_through_the_safe_checkpoint(tmp_path):
    from privdl.loop import resume

    full = train(CFG, tmp_path / "full", progress=False)
    train(CFG, tmp_path / "part", progress=False, stop_after=2)
    resumed = resume(tmp_path / "part", progress=False)
    assert resumed["final"] == {**full["final"], "wall_time": resumed["final"]["wall_time"]}
    a = RunRecords(tmp_path / "full").load_checkpoint()
    b = RunRecords(tmp_path / "part").load_checkpoint()
    assert torch.equal(a["params"]["x"], b["params"]["x"])
    rows = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4]
