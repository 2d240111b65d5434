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


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "garbage",
    [
        b"42\n",
        b"[1, 2]\n",
        b'{"loss": 1.0}\n',
        b'{"step": "x", "loss": 1}\n',
        bytes(range(128, 256)) + b"\n",
    ],  # fmt: skip
)
def test_unreadable_metric_lines_are_skipped_with_one_warning(tmp_path, capsys, garbage):
    """Each of these lines was a traceback (AttributeError, KeyError, TypeError,
    UnicodeDecodeError) from ``privdl report``."""
    run = _fake_run(tmp_path / "r", seed=1, accuracy=0.7)
    with (run / "metrics.jsonl").open("ab") as f:
        f.write(garbage)
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    err = _error_line(capsys)
    assert "warning:" in err and "1 unreadable line(s) skipped" in err
    from privdl.records import RecordsWarning

    with pytest.warns(RecordsWarning, match="1 unreadable line"):  # the API warns too
        runs = load_runs([run])
    assert _cell(markdown_table(runs), 0, "test accuracy") == "0.7"


def test_corrupt_summary_and_uncreatable_out_are_one_line_errors(tmp_path, capsys):
    run = _fake_run(tmp_path / "r", seed=1, accuracy=0.7)
    (run / "summary.json").write_text("[1]")
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 2
    assert "summary.json is corrupt (not a JSON object)" in _error_line(capsys)
    ok = _fake_run(tmp_path / "ok", seed=1, accuracy=0.7)
    (tmp_path / "afile").write_text("x")
    assert main(["report", str(ok), "--out", str(tmp_path / "afile" / "sub")]) == 2
    assert "cannot create the directory" in _error_line(capsys)
    assert main(["report", str(tmp_path / "afile")]) == 2
    assert "afile is a file, not a run directory" in (err := _error_line(capsys))
    assert "--out" not in err  # it was an input, not --out


def test_metrics_cut_short_of_their_summary_warn(tmp_path, capsys):
    run = _fake_run(tmp_path / "r", seed=1, accuracy=0.7)
    RunRecords(run).finish({"completed": True, "steps_done": 40})
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert "ends at step 20 but its summary.json at step 40" in _error_line(capsys)


def test_labels_tell_runs_apart_and_stay_in_their_cells(tmp_path, capsys):
    a = _fake_run(tmp_path / "a", seed=1, accuracy=0.7)
    b = _fake_run(tmp_path / "b", seed=2, accuracy=0.8)
    per_run = markdown_table(load_runs([a, b]), group=False)
    assert _cell(per_run, 0, "run").endswith("(seed=1, data_seed=11)")
    assert _cell(per_run, 1, "run").endswith("(seed=2, data_seed=12)")
    c = RunRecords(tmp_path / "c")
    c.start({"algorithm": "ldp", "graph": "ring:8", "seed": 1, "sigma": 0.9,
             "label": "lr|0.1\nrun"})  # fmt: skip
    c.append({"step": 0, "accuracy": 0.5})
    table = markdown_table(load_runs([a, tmp_path / "c"]))
    assert _cell(table, 0, "run") == "ldp / ring:8"  # no other run shares its label
    row = table.splitlines()[3]
    assert r"lr\|0.1 run" in row and row.count(" | ") == table.splitlines()[0].count(" | ")
    # runs sharing a label are told apart by the values they differ in
    d = RunRecords(tmp_path / "d")
    d.start({"algorithm": "ldp", "graph": "ring:8", "seed": 1, "data_seed": 11, "sigma": 0.9})
    d.append({"step": 0, "accuracy": 0.5})
    table = markdown_table(load_runs([a, tmp_path / "d"]))
    assert [_cell(table, i, "run") for i in (0, 1)] == ["ldp / ring:8 (sigma=0.5)",
                                                       "ldp / ring:8 (sigma=0.9)"]  # fmt: skip
    # the same run given twice is reported once, with a warning
    assert main(["report", str(a), str(a) + "/", "--out", str(tmp_path / "rep")]) == 0
    out, err = capsys.readouterr()
    assert "is given twice; reported once" in err
    assert sum(line.startswith("| ldp") for line in out.splitlines()) == 1


def test_diverged_and_uneven_repeats_are_marked(tmp_path):
    a = _fake_run(tmp_path / "a", seed=1, accuracy=0.7)
    b = _fake_run(tmp_path / "b", seed=2, accuracy=0.8, completed=False)
    lines = (b / "metrics.jsonl").read_text().splitlines()
    (b / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")  # b stopped at step 10
    table = markdown_table(load_runs([a, b]))
    assert _cell(table, 0, "steps") == "10/20 *"
    assert "stopped at different steps" in table.splitlines()[-1]
    d = RunRecords(tmp_path / "d")
    d.start({"algorithm": "dsgd", "graph": "ring:4", "seed": 0})
    d.append({"step": 0, "loss": 1.0})
    d.append({"step": 20, "loss": float("nan"), "diverged": True})
    d.finish({"completed": False, "steps_done": 20, "final": {"diverged": True}})
    assert _cell(markdown_table(load_runs([tmp_path / "d"])), 0, "complete") == "diverged"


def test_copies_of_one_run_are_named_by_their_directories(tmp_path):
    import shutil

    a = _fake_run(tmp_path / "first", seed=1, accuracy=0.7)
    shutil.copytree(a, tmp_path / "copy")
    table = markdown_table(load_runs([a, tmp_path / "copy"]))
    assert [_cell(table, i, "run") for i in (0, 1)] == [
        "ldp / ring:8 [first]",
        "ldp / ring:8 [copy]",
    ]


def test_report_says_when_a_runs_keys_came_from_the_seed(tmp_path):
    """The records' key notes reach the table's readers: a footnote names the seeded runs, and
    none appears when every run drew its keys from the OS."""
    from privdl.loop import train
    from privdl.registry import make_config
    from privdl.report import load_runs, markdown_table

    base = {"algorithm": "ldp", "task": "least-squares", "graph": "ring:4", "steps": 4,
            "eval_every": 2, "clip": 1.0, "sigma": 1.0}  # fmt: skip
    train(make_config(base), tmp_path / "seeded", progress=False)
    train(make_config({**base, "key_source": "os"}), tmp_path / "os", progress=False)
    both = markdown_table(load_runs([tmp_path / "seeded", tmp_path / "os"]))
    assert "derived from the seed" in both and "key_source=seed" in both.split("derived")[0][-400:]
    assert "derived from the seed" not in markdown_table(load_runs([tmp_path / "os"]))


def test_nominal_budgets_keep_their_label_and_tables_keep_their_shape(tmp_path):
    """A paper formula's (eps, delta) is printed NOMINAL in the privacy column, single runs and
    seed groups alike, and every row of a table has the header's number of cells."""
    nominal = _fake_run(tmp_path / "nom", seed=1, accuracy=0.8, eps=2.0)
    rows = [line for line in (nominal / "metrics.jsonl").read_text().splitlines()]
    patched = [line.replace('"nominal": false', '"nominal": true') for line in rows]
    (nominal / "metrics.jsonl").write_text("\n".join(patched) + "\n")
    plain = _fake_run(tmp_path / "acc", seed=2, accuracy=0.7, eps=2.0, algorithm="decor")
    repeats = [_fake_run(tmp_path / f"r{i}", seed=i, accuracy=0.6, eps=1.0) for i in (3, 4)]
    for group in (False, True):
        table = markdown_table(load_runs([nominal, plain, *repeats]), group=group)
        lines = table.splitlines()
        assert all(line.count("|") == lines[0].count("|") for line in lines)
        privacy = [_cell(table, r, "privacy") for r in range(len(lines) - 2)]
        assert sum("NOMINAL" in p for p in privacy) == 1, privacy


def test_uneven_repeats_are_plotted_on_their_common_steps_with_a_one_sd_band(tmp_path, monkeypatch):
    """Repeats cut at different steps are averaged where all have a value (mean and sample std
    in closed form), and the plot's band is mean +- 1 sample std."""
    import matplotlib.axes

    from privdl.report import _curve, plot_runs

    a = _fake_run(tmp_path / "a", seed=1, accuracy=0.8, eps=1.0)
    b = _fake_run(tmp_path / "b", seed=2, accuracy=0.6, eps=1.0)
    kept = (b / "metrics.jsonl").read_text().splitlines()[:2]  # steps 0 and 10 only
    (b / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    runs = load_runs([a, b])
    steps, mean, std = _curve(runs, "accuracy")
    assert steps == [0, 10]
    assert mean == pytest.approx([0.5, (0.65 + 0.55) / 2])
    assert std == pytest.approx([0.0, np.std([0.65, 0.55], ddof=1)])
    bands = []
    monkeypatch.setattr(
        matplotlib.axes.Axes, "fill_between", lambda self, x, lo, hi, **kw: bands.append((lo, hi))
    )
    (tmp_path / "plots").mkdir()
    plot_runs(runs, tmp_path / "plots")
    want = (list(np.subtract(mean, std)), list(np.add(mean, std)))  # the accuracy plot's band
    assert any(
        len(lo) == 2 and np.allclose(lo, want[0]) and np.allclose(hi, want[1]) for lo, hi in bands
    )
