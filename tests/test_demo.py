"""The README's main job (``privdl demo``) end to end at a small T."""

from __future__ import annotations

import json

import pytest

from privdl.cli.main import main


def test_demo_runs_four_methods_at_one_budget_and_reports(tmp_path, capsys):
    out = tmp_path / "demo"
    assert (
        main(["demo", "--steps", "10", "--epsilon", "5", "--out", str(out), "--no-progress"]) == 0
    )
    text = capsys.readouterr().out
    for name in ("dsgd", "cdp", "decor", "ldp"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["completed"] and summary["config"]["graph"] == "ring:16"
        priv = summary["final"].get("privacy")
        if name == "dsgd":
            assert priv is None
        else:  # the same accounted (epsilon, delta), user level, each with its threat model
            assert priv["epsilon"] <= 5.0 + 1e-9 and priv["epsilon"] > 4.9
            assert priv["delta"] == 1e-5 and priv["unit"] == "user" and not priv["nominal"]
    assert {"central", "eavesdropper", "ldp"} == {
        json.loads((out / n / "summary.json").read_text())["final"]["privacy"]["threat_model"]
        for n in ("cdp", "decor", "ldp")
    }
    assert "DECOR (ring:16)" in text and (out / "report.md").exists()
    assert (out / "accuracy.png").stat().st_size > 0
    # a second demo into the same --out is refused (records are never replaced silently) ...
    before = (out / "ldp" / "metrics.jsonl").read_bytes()
    argv = ["demo", "--steps", "4", "--epsilon", "5", "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert (out / "ldp" / "metrics.jsonl").read_bytes() == before
    # ... unless asked for
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads((out / "ldp" / "summary.json").read_text())["config"]["steps"] == 4


def test_demo_repeats_over_seeds_on_another_graph(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--steps", "4", "--seeds", "2", "--graph", "torus:3x3", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert (out / "decor" / "seed-2" / "summary.json").exists()
    assert text.count(" ± ") >= 4 and "DECOR (torus:3x3)" in text


@pytest.mark.parametrize(("flag", "value"), [("--seeds", "0"), ("--graph", "ring:1")])
def test_demo_bad_input_is_one_line(tmp_path, capsys, flag, value):
    assert main(["demo", flag, value, "--steps", "5", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
