"""``privdl design-noise`` and ``privdl run decor --noise-design`` through the CLI entry point."""

from __future__ import annotations

import json

import pytest

from privdl.accounting.design import account_design
from privdl.cli.main import main
from privdl.mechanisms.noise_design import load_design
from privdl.topology import parse_graph

BASE = ["design-noise", "--graph", "er:10:0.6:1", "--epsilon", "3", "--delta", "1e-5",
        "--steps", "50"]  # fmt: skip


def test_json_carries_ratio_and_labelled_epsilon(tmp_path, capsys) -> None:
    path = tmp_path / "d.json"
    code = main([*BASE, "--adversary", "curious", "--out", str(path), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(out)
    assert 0 < data["residual_ratio_vs_decor"] <= 1.0 + 1e-9
    budget = data["budget"]
    assert budget["threat_model"] == "curious" and budget["unit"] == "user"
    assert budget["neighbouring"] == "replace_one" and budget["delta"] == 1e-5
    assert data["epsilon_accounted"] <= 3.0
    assert "curious" in data["epsilon_label"]
    # the written design is what was certified: the accountant agrees from the file alone
    design = load_design(path)
    again = account_design(
        parse_graph("er:10:0.6:1"), design, steps=50, delta=1e-5, adversary="curious"
    )
    assert again.epsilon == pytest.approx(data["epsilon_accounted"], rel=1e-12)


@pytest.mark.parametrize(
    "extra",
    [["--adversary", "ldp"], ["--epsilon", "-1"], ["--adversary", "spy"],
     ["--out", "/no/such/dir/d.json"], ["--solver", "magic"]],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2(capsys, extra) -> None:
    argv = list(BASE)
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) <= 3


@pytest.mark.slow
def test_run_decor_uses_the_design_file_and_accounts_it(tmp_path, capsys) -> None:
    path = tmp_path / "d.json"
    assert main([*BASE, "--out", str(path), "--json"]) == 0
    eps = json.loads(capsys.readouterr().out)["epsilon_accounted"]
    run = ["run", "decor", "--graph", "er:10:0.6:1", "--steps", "50", "--clip", "1",
           "--set", "clip_mode=batch_mean", "--set", "eval_every=50", "--out", str(tmp_path / "r")]  # fmt: skip
    assert main([*run, "--noise-design", str(path)]) == 0
    capsys.readouterr()
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().strip().splitlines()
    privacy = json.loads(lines[-1])["privacy"]
    assert privacy["epsilon"] == pytest.approx(eps, rel=1e-9)
    assert privacy["threat_model"] == "eavesdropper"
    assert main([*run, "--noise-design", str(path), "--sigma", "1", "--overwrite"]) == 2
    assert "not both" in capsys.readouterr().err


def test_whisper_covariance_file_runs_with_a_dealer_label(tmp_path, capsys) -> None:
    """--whisper-out writes the certified free covariance; a run accounts it against the
    eavesdropper with the trusted dealer in its label and refuses curious users (exit 2)."""
    pytest.importorskip("cvxpy")
    path = tmp_path / "w.json"
    assert main([*BASE, "--whisper", "--whisper-out", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "trusted-dealer" in data["whisper_epsilon_label"]
    run = ["run", "decor", "--task", "least-squares", "--graph", "er:10:0.6:1", "--steps", "50",
           "--clip", "1", "--set", "clip_mode=batch_mean", "--set", "eval_every=50",
           "--noise-design", str(path), "--out", str(tmp_path / "r")]  # fmt: skip
    assert main(run) == 0
    capsys.readouterr()
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().strip().splitlines()
    privacy = json.loads(lines[-1])["privacy"]
    assert privacy["threat_model"] == "eavesdropper+trusted-dealer"
    assert privacy["epsilon"] <= 3.0 and privacy["epsilon"] == pytest.approx(3.0, rel=1e-6)
    assert main([*run, "--adversary", "curious", "--overwrite"]) == 2
    assert "eavesdropper only" in capsys.readouterr().err
    assert main([*BASE, "--whisper-out", str(path)]) == 2
    assert "needs --whisper" in capsys.readouterr().err
