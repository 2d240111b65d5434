"""``privdl audit``: text, --json, --plot, and its exit codes (0 within the accounted epsilon,
1 above it, 2 for bad input)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from privdl.cli.main import cli, main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "audit"))
import planted_bugs  # noqa: E402

ISSUE_EXAMPLE = ["audit", "decor", "--graph", "ring:8", "--epsilon", "4", "--delta", "1e-5",
                 "--steps", "10", "--trials", "2000", "--threat-model", "eavesdropper"]  # fmt: skip


def test_json_carries_both_bounds_with_labels():
    out = CliRunner().invoke(cli, [*ISSUE_EXAMPLE, "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["trials"] == 2000 and got["confidence"] == 0.95
    assert 0 <= got["epsilon_lower"] <= got["epsilon_accounted"] == pytest.approx(4.0, rel=1e-5)
    assert got["accounted"]["accountant"] == "secrdp+gaussian"
    assert got["accounted"]["threat_model"] == "eavesdropper"
    assert got["within_accounted"] is True


def test_text_and_plot(tmp_path):
    png = tmp_path / "audit.png"
    out = CliRunner().invoke(cli, [*ISSUE_EXAMPLE, "--plot", str(png)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "accounted  epsilon 4" in out.output and "clopper-pearson" in out.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seed_option_seeds_the_audit():
    args = ["audit", "ldp", "--graph", "ring:4", "--epsilon", "2", "--steps", "3", "--trials",
            "400", "--json"]  # fmt: skip
    runs = [json.loads(CliRunner().invoke(cli, [*args, "--seed", s]).output) for s in "112"]
    for r in runs:
        r.pop("seconds")
    assert runs[0] == runs[1] != runs[2]


def test_exit_code_1_when_the_lower_bound_exceeds_the_claim(capsys):
    with planted_bugs.accountant_without_composition(), pytest.raises(SystemExit) as exc:
        main(["audit", "dpsgd", "--epsilon", "4", "--steps", "50", "--trials", "20000"])
    assert exc.value.code == 1
    assert "NO: the implementation exceeds its accountant" in capsys.readouterr().out


def test_one_run_json_and_black_box_text():
    args = ["audit", "dpsgd", "--sampling", "poisson", "--sigma", "0.002", "--steps", "3",
            "--sampling-rate", "0.5", "--accountant", "rdp", "--one-run", "--canaries", "400"]  # fmt: skip
    out = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["trials"] == got["one_run"]["canaries"] == 400
    assert 0 < got["epsilon_lower"] <= got["epsilon_accounted"]
    assert got["accounted"]["accountant"] == "secrdp+rdp-subsampled"
    text = CliRunner().invoke(cli, [*args, "--black-box"], catch_exceptions=False)
    assert text.exit_code == 0, text.output
    assert "one run, 400 canaries" in text.output and "final model only" in text.output


def test_one_run_gossip_json():
    """The gossip family in one run: half the canaries fit the test, half are guessed."""
    args = ["audit", "ldp", "--graph", "ring:4", "--epsilon", "8", "--steps", "3", "--one-run",
            "--canaries", "2000", "--json"]  # fmt: skip
    out = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["trials"] == 2000 and got["one_run"]["canaries"] == got["one_run"]["reference"]
    assert 0 < got["epsilon_lower"] <= got["epsilon_accounted"]
    assert got["accounted"]["unit"] == "user" and got["threat_model"] == "ldp"


def test_privsgp_input_canaries_json():
    """PrivSGP with a canary example at node 0 (through the run's sample oracle): node 0's
    messages, under the accounted (not nominal) epsilon, labelled."""
    args = ["audit", "privsgp", "--input-canaries", "--graph", "ring:4", "--sigma", "0.1",
            "--steps", "3", "--trials", "400", "--json"]  # fmt: skip
    out = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["trials"] == 400 and got["canary"]["kind"].startswith("example (input canary")
    assert got["canary"]["entries"] == 4 and got["canary"]["block_size"] == 16
    assert got["accounted"]["unit"] == "example" and got["accounted"]["threat_model"] == "ldp"
    assert "nominal" not in got["accounted"]["accountant"]
    assert 0 <= got["epsilon_lower"] <= got["epsilon_accounted"]


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "privsgp-vr", "--epsilon", "1", "--one-run"],
        ["audit", "ldp", "--epsilon", "1", "--known-position"],
        ["audit", "--suite", "--known-position", "--out", "x"],
        ["audit", "dpsgd", "--epsilon", "1", "--one-run", "--canaries", "5"],
        ["audit", "--suite", "--one-run", "--out", "x"],
        ["audit", "dpsgd", "--sampling", "poisson", "--epsilon", "1", "--canary-model", "cnn"],
        ["audit", "ldp", "--epsilon", "1", "--black-box"],
        ["audit", "dpsgd", "--sampling", "poisson", "--epsilon", "1", "--canaries", "100"],
        ["audit", "porter-gc", "--epsilon", "1"],
        ["audit", "ldp", "--epsilon", "1", "--threat-model", "curious"],
        ["audit", "decor", "--epsilon", "1", "--threat-model", "spy"],
        ["audit", "ldp", "--epsilon", "1", "--input-canaries"],
        ["audit", "privsgp", "--sigma", "1", "--input-canaries", "--one-run"],
        ["audit", "--suite", "--input-canaries", "--out", "x"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


def test_suite_writes_a_report_and_refuses_to_overwrite_it(tmp_path, capsys):
    out = tmp_path / "audits"
    multi = ["--suite-kinds", "multi-run"]
    assert main(["audit", "--suite", "--trials", "400", "--out", str(out), *multi]) == 0
    report = (out / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 10 and all("| yes |" in row for row in rows)
    assert len(json.loads((out / "summary.json").read_text())) == 10
    assert len(list(out.glob("*.png"))) == 10
    capsys.readouterr()
    assert main(["audit", "--suite", "--trials", "400", "--out", str(out), *multi]) == 2
    assert "already holds an audit report" in capsys.readouterr().err


def test_suite_kinds_choose_its_audits_and_label_each(tmp_path, capsys):
    """--suite-kinds known-position: the one known-position audit, its row and JSON entry with
    its kind, label, confidence and both epsilons."""
    out = tmp_path / "audits"
    args = ["audit", "--suite", "--trials", "400", "--suite-kinds", "known-position"]
    assert main([*args, "--out", str(out)]) == 0
    assert "| known-position | dpsgd | central |" in capsys.readouterr().out
    (entry,) = json.loads((out / "summary.json").read_text())
    assert entry["kind"] == "known-position" and entry["confidence"] == 0.95
    assert entry["label"].startswith(entry["accounted"]["accountant"] + ", example, add_remove")
    assert entry["epsilon_lower"] <= entry["epsilon_accounted"] == pytest.approx(0.5, abs=1e-3)
    assert entry["canary"]["position"].startswith("the first rows")
    assert main([*args[:-1], "one-run,spy", "--out", str(tmp_path / "b")]) == 2
    assert "suite kinds are" in capsys.readouterr().err
    assert main(["audit", "ldp", "--suite-kinds", "one-run"]) == 2


@pytest.mark.slow
def test_suite_runs_every_kind_by_default(tmp_path, capsys):
    """The default kinds at a small scale: multi-run, example (input canaries of the gossip
    family), one-run and known-position audits, each under its accounted epsilon."""
    out = tmp_path / "audits"
    assert main(["audit", "--suite", "--trials", "400", "--out", str(out)]) == 0
    kinds = [e["kind"] for e in json.loads((out / "summary.json").read_text())]
    assert set(kinds) == {"multi-run", "example", "one-run", "known-position", "privsgp"}
    assert len(kinds) == 25
