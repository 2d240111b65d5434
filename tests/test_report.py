"""``privdl report``: repeats over seeds become mean ± sample std; everything else a row each."""

from __future__ import annotations

import re

import numpy as np
import pytest

from privdl.cli.main import main
from privdl.errors import PrivdlError
from privdl.records import RunRecords
from privdl.report import load_runs, make_report, markdown_table


def _fake_run(path, *, seed, accuracy, eps=None, algorithm="ldp", completed=True):
    rec = RunRecords(path)
    rec.start({"algorithm": algorithm, "graph": "ring:8", "seed": seed, "data_seed": seed + 10,
               "sigma": 0.5})  # fmt: skip
    priv = None if eps is None else {"epsilon": eps, "delta": 1e-5, "accountant": "rdp",
                                     "threat_model": "ldp", "unit": "example",
                                     "neighbouring": "replace_one", "nominal": False}  # fmt: skip
    for step, acc in ((0, 0.5), (10, (0.5 + accuracy) / 2), (20, accuracy)):
        row = {"step": step, "accuracy": acc, "loss": 1.0 - acc}
        if priv:
            row["privacy"] = priv
        rec.append(row)
    if completed:
        rec.finish({"completed": True})
    return path


def _cell(table: str, row: int, column: str) -> str:
    lines = table.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [c.strip() for c in lines[2 + row].strip("|").split("|")][head.index(column)]


def test_repeats_are_merged_into_mean_and_sample_std(tmp_path):
    accs = [0.71, 0.74, 0.80]
    dirs = [_fake_run(tmp_path / f"s{i}", seed=i, accuracy=a, eps=1.0) for i, a in enumerate(accs)]
    dirs.append(_fake_run(tmp_path / "np", seed=0, accuracy=0.9, algorithm="dsgd"))
    table = markdown_table(load_runs(dirs))
    assert len(table.splitlines()) == 2 + 2  # header, rule, two groups
    mean, std = np.mean(accs), np.std(accs, ddof=1)
    assert _cell(table, 0, "test accuracy") == f"{mean:.4g} ± {std:.2g}"
    assert _cell(table, 0, "seeds") == "3" and _cell(table, 1, "seeds") == "1"
    assert _cell(table, 1, "test accuracy") == "0.9" and _cell(table, 1, "privacy") == "non-private"
    per_run = markdown_table(load_runs(dirs), group=False)
    assert len(per_run.splitlines()) == 2 + 4 and "±" not in per_run


def test_runs_sharing_a_seed_are_not_averaged_as_repeats(tmp_path):
    """The same seed twice (one run launched on 2 processes and once on one, say) is not two
    independent draws: the second run with that seed starts its own row."""
    dirs = [
        _fake_run(tmp_path / "a", seed=1, accuracy=0.70),
        _fake_run(tmp_path / "b", seed=2, accuracy=0.80),
        _fake_run(tmp_path / "a-again", seed=1, accuracy=0.70),
    ]
    table = markdown_table(load_runs(dirs))
    assert len(table.splitlines()) == 2 + 2
    assert _cell(table, 0, "seeds") == "2" and _cell(table, 1, "seeds") == "1"
    assert _cell(table, 0, "test accuracy") == f"{0.75:.4g} ± {np.std([0.7, 0.8], ddof=1):.2g}"


def test_repeats_report_the_largest_budget_and_partial_completion(tmp_path):
    dirs = [
        _fake_run(tmp_path / "a", seed=1, accuracy=0.7, eps=1.0),
        _fake_run(tmp_path / "b", seed=2, accuracy=0.7, eps=2.5, completed=False),
    ]
    table = markdown_table(load_runs(dirs))
    assert re.search(r"eps=2\.5 ", _cell(table, 0, "privacy"))
    assert _cell(table, 0, "complete") == "1/2"


def test_cli_report_writes_plots_with_bands(tmp_path, capsys):
    dirs = [str(_fake_run(tmp_path / f"s{i}", seed=i, accuracy=0.6 + 0.1 * i)) for i in range(3)]
    assert main(["report", *dirs, "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "± " in out and (tmp_path / "rep" / "accuracy.png").stat().st_size > 0
    assert main(["report", *dirs, "--per-run", "--out", str(tmp_path / "rep2")]) == 0
    assert "±" not in capsys.readouterr().out


def test_a_run_without_metrics_is_an_error(tmp_path):
    RunRecords(tmp_path / "empty").start({"algorithm": "ldp"})
    with pytest.raises(PrivdlError, match="no metrics yet"):
        make_report([tmp_path / "empty"], tmp_path / "rep")
