"""Records that tools read (issue 32): JSON null for non-finite numbers, ``schema_version`` and
UTC timestamps in every record, pandas reads every file with numeric dtypes, ``report --csv``,
the epsilon-vs-step plot, and runs written before schema version 2 still resume and report."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import pytest

from privdl.cli.main import main
from privdl.loop import train
from privdl.records import SCHEMA_VERSION, RunRecords
from privdl.registry import make_config

pd = pytest.importorskip("pandas")

DECOR = {"algorithm": "decor", "task": "least-squares", "graph": "ring:4", "steps": 12,
         "eval_every": 4, "clip": 1.0, "clip_mode": "batch_mean", "epsilon": 5.0,
         "delta": 1e-5, "dtype": "float64"}  # fmt: skip
#: Values the records hold as text (everything else a number is written as must read as one).
TEXT_COLUMNS = {"timestamp", "run", "label"}


def _numeric_columns_are_numeric(frame, where: str) -> int:
    """Every column holding a number (not a bool) has a numeric dtype; returns how many."""
    checked = 0
    for name in frame.columns:
        values = [v for v in frame[name].tolist() if v is not None and v == v]  # not NaN
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if not numbers:
            continue
        assert pd.api.types.is_numeric_dtype(frame[name]), (
            f"{where}: column {name!r} has dtype {frame[name].dtype}: {values[:5]}"
        )
        checked += 1
    return checked


def _check_every_record_file(run: Path) -> None:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    frame = pd.read_json(run / "metrics.jsonl", lines=True)
    assert (frame["schema_version"] == SCHEMA_VERSION).all()
    assert pd.to_datetime(frame["timestamp"], utc=True).notna().all()
    assert _numeric_columns_are_numeric(frame, "metrics.jsonl") >= 4
    flat = pd.json_normalize(rows)
    assert pd.api.types.is_float_dtype(flat["privacy.epsilon"])
    assert _numeric_columns_are_numeric(flat, "metrics.jsonl, flattened") >= 6
    for name in ("config.json", "summary.json", "calibration.json", "environment.json"):
        if name == "calibration.json" and not (run / name).exists():
            continue  # written by the recipes with a paper formula beside the accounted noise
        record = json.loads((run / name).read_text())
        assert record["schema_version"] == SCHEMA_VERSION
        stamp = datetime.fromisoformat(record["timestamp"])
        assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0
        _numeric_columns_are_numeric(pd.json_normalize(record), name)


@pytest.fixture(scope="module")
def decor_run(tmp_path_factory) -> tuple[Path, dict]:
    """One complete DECOR run (its directory and summary), shared by the tests here."""
    run = tmp_path_factory.mktemp("records") / "decor"
    return run, train(make_config(DECOR), run, progress=False)


def test_every_record_file_reads_in_pandas_with_numeric_dtypes(tmp_path, decor_run):
    run = decor_run[0]
    _check_every_record_file(run)
    sgp = {"algorithm": "privsgp-vr", "task": "least-squares", "graph": "expo:4", "ls_dim": 5,
           "steps": 8, "eval_every": 4, "clip": 1.0, "epsilon": 4.0, "dtype": "float64"}  # fmt: skip
    train(make_config(sgp), tmp_path / "sgp", progress=False)
    assert (tmp_path / "sgp" / "calibration.json").is_file()
    _check_every_record_file(tmp_path / "sgp")
    assert main(["report", str(run), "--out", str(tmp_path / "rep"), "--csv"]) == 0
    csv = pd.read_csv(tmp_path / "rep" / "metrics.csv")
    assert list(csv["step"]) == [0, 4, 8, 12] and (csv["run"] == str(run)).all()
    for column in ("step", "loss", "optimality_gap", "privacy.epsilon", "privacy.delta"):
        assert pd.api.types.is_numeric_dtype(csv[column]), column
    assert (tmp_path / "rep" / "epsilon.png").is_file()
    assert csv["privacy.epsilon"].is_monotonic_increasing and csv["privacy.epsilon"].iloc[-1] > 4


def test_non_finite_numbers_are_null_and_a_diverged_run_reads_as_nan(tmp_path, capsys):
    records = RunRecords(tmp_path / "r")
    records.dir.mkdir()
    records.append({"step": 0, "loss": float("nan"), "privacy": {"epsilon": float("inf")},
                    "client_epsilons": [1.0, float("-inf")]})  # fmt: skip
    line = (tmp_path / "r" / "metrics.jsonl").read_text()
    assert '"loss": null' in line and '"epsilon": null' in line and "NaN" not in line
    assert json.loads(line)["client_epsilons"] == [1.0, None]
    # a run that diverges: its non-finite loss is null, read by pandas as NaN in a float column
    bad = {**DECOR, "lr": 1e12, "epsilon": None, "delta": None, "clip": None,
           "clip_mode": "none", "steps": 8, "dtype": "float32"}  # fmt: skip
    del bad["algorithm"]
    argv = ["run", "dsgd", *_flags(bad), "--out", str(tmp_path / "div"), "--no-progress"]
    assert main(argv) == 2
    assert "diverged" in capsys.readouterr().err
    frame = pd.read_json(tmp_path / "div" / "metrics.jsonl", lines=True)
    assert pd.api.types.is_float_dtype(frame["loss"]) and frame["loss"].isna().iloc[-1]
    assert bool(frame["diverged"].iloc[-1])
    summary = json.loads((tmp_path / "div" / "summary.json").read_text())
    assert summary["final"]["loss"] is None and summary["schema_version"] == SCHEMA_VERSION


def _flags(values: dict) -> list[str]:
    out = []
    for key, value in values.items():
        if value is not None:
            out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def _make_legacy(run: Path) -> str:
    """Rewrite a run's records as schema version 1 wrote them: no schema_version or
    timestamps, non-finite numbers as strings. Returns the metrics file's text."""
    for name in ("config.json", "environment.json"):
        record = json.loads((run / name).read_text())
        for key in ("schema_version", "timestamp"):
            record.pop(key)
        (run / name).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    lines = []
    for i, line in enumerate((run / "metrics.jsonl").read_text().splitlines()):
        row = json.loads(line)
        row.pop("schema_version")
        row.pop("timestamp")
        if i == 1:  # what privdl 0.1 wrote for a non-finite metric
            row["consensus_distance"] = "nan"
            row["loss_gap"] = "inf"
        lines.append(json.dumps(row, sort_keys=True))
    text = "\n".join(lines) + "\n"
    (run / "metrics.jsonl").write_text(text)
    return text


def test_a_run_written_before_schema_version_2_resumes_and_reports(tmp_path, capsys, decor_run):
    run = tmp_path / "old"
    train(make_config(DECOR), run, progress=False, stop_after=8)
    old_text = _make_legacy(run)
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    text = (run / "metrics.jsonl").read_text()
    assert text.startswith(old_text)  # append-only: the old rows are kept byte for byte
    new_rows = [json.loads(x) for x in text[len(old_text) :].splitlines()]
    assert [r["step"] for r in new_rows] == [12]
    assert new_rows[0]["schema_version"] == SCHEMA_VERSION and "timestamp" in new_rows[0]
    config = json.loads((run / "config.json").read_text())
    assert "schema_version" not in config  # never rewritten by a resume
    rows = list(RunRecords(run).rows())  # old strings read as the null a new row has
    assert rows[1]["consensus_distance"] is None and rows[1]["loss_gap"] is None
    full = decor_run[1]
    assert new_rows[0]["privacy"] == full["final"]["privacy"]
    assert new_rows[0]["optimality_gap"] == full["final"]["optimality_gap"]
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "rep"), "--csv"]) == 0
    csv = pd.read_csv(tmp_path / "rep" / "metrics.csv")
    assert math.isnan(csv["consensus_distance"].iloc[1]) and csv["step"].tolist() == [0, 4, 8, 12]
    assert pd.api.types.is_float_dtype(csv["loss_gap"])
    assert csv["schema_version"].isna().tolist() == [True, True, True, False]
