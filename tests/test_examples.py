"""The scripts in examples/ run (``--quick``), exit 0 and print what their docstrings promise:
the accounted epsilon with its labels, within the target, and an accuracy.

Each printed epsilon is also checked against the run's own records (``summary.json``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(\d+(?:\.\d+)?|inf)"


def _run(script: str, out: Path, *extra: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--quick", "--out", str(out), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _recorded(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())["final"]["privacy"]


def _epsilon_line(out: str) -> re.Match[str]:
    """The printed ``epsilon = E (target T; accountant A, delta D, unit U, threat model M)``."""
    m = re.search(
        rf"epsilon = {NUMBER} \(target {NUMBER}; accountant (\S+), delta (\S+), unit (\w+), "
        r"threat model (\w+)\)",
        out,
    )
    assert m, out
    return m


def test_own_cnn_decor_torus(tmp_path):
    out = _run("own_cnn_decor_torus.py", tmp_path)
    m = _epsilon_line(out)
    eps, target = float(m[1]), float(m[2])
    assert 0 < eps <= target == 4.0
    assert (m[3], float(m[4]), m[5], m[6]) == ("secrdp+pld", 1e-5, "example",
                                               "eavesdropper")  # fmt: skip
    recorded = _recorded(tmp_path)
    assert recorded["epsilon"] <= target and round(recorded["epsilon"], 4) == eps
    acc = re.search(rf"test accuracy of result\.model: {NUMBER} .*torus:2x2", out)
    assert acc and 0.0 <= float(acc[1]) <= 1.0, out


def test_dpsgd_equal_budget(tmp_path):
    out = _run("dpsgd_equal_budget.py", tmp_path)
    lines = out.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("method"))) + 1 :]
    rows = {}
    for line in table:  # method (22 characters), epsilon, threat model, accuracy
        eps, model, acc = line[22:].split()
        rows[line[:22].strip()] = (float(eps), model, float(acc))
    threat = {name.split(",")[0]: row[1] for name, row in rows.items()}
    assert threat == {"DP-SGD": "central", "LDP": "ldp", "DECOR": "eavesdropper",
                      "D-SGD": "non-private"}, out  # fmt: skip
    for name, (eps, model, acc) in rows.items():
        assert 0.0 <= acc <= 1.0
        if model != "non-private":
            assert 0 < eps <= 0.5, (name, eps)
    for algorithm in ("dpsgd", "ldp", "decor"):
        assert _recorded(tmp_path / algorithm)["epsilon"] <= 0.5
    config = json.loads((tmp_path / "dpsgd" / "config.json").read_text())
    assert config["optimizer"]["momentum"] == 0.9  # the optimizer option reached the run


def test_robust_hdp_own_clients(tmp_path):
    out = _run("robust_hdp_own_clients.py", tmp_path)
    cells = rf"\|\s+{NUMBER}\s+{NUMBER}\s*"  # one algorithm's epsilon and weight
    rows = re.findall(rf"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+{cells}{cells}$", out + "\n", re.M)
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3], out
    recorded = {  # the last metrics row of each run: every client's epsilon and weight
        a: json.loads((tmp_path / a / "metrics.jsonl").read_text().splitlines()[-1])
        for a in ("robust-hdp", "dpfedavg")
    }
    for i, (_, _, budget, eps_rhdp, w_rhdp, eps_avg, w_avg) in enumerate(rows):
        assert 0 < float(eps_rhdp) <= float(budget) and 0 < float(eps_avg) <= float(budget)
        assert recorded["robust-hdp"]["client_epsilons"][i] <= float(budget)
        assert float(w_rhdp) == round(recorded["robust-hdp"]["weights"][i], 3)
        assert float(w_avg) == round(recorded["dpfedavg"]["weights"][i], 3)
    for algorithm in ("robust-hdp", "dpfedavg"):
        m = re.search(
            rf"^{algorithm}: test accuracy of result\.model {NUMBER}; epsilon {NUMBER} "
            r"\(largest client's; accountant pld, delta 1e-05, unit example, threat model server\)",
            out,
            re.M,
        )
        assert m, out
        assert 0.0 <= float(m[1]) <= 1.0 and float(m[2]) <= 8.0
        assert _recorded(tmp_path / algorithm)["epsilon"] <= 8.0


@pytest.mark.parametrize("model", ["mean", "transformer"])
def test_text_classifier_dpsgd(tmp_path, model):
    out = _run("text_classifier_dpsgd.py", tmp_path, "--model", model)
    m = _epsilon_line(out)
    eps, target = float(m[1]), float(m[2])
    assert 0 < eps <= target == 3.0
    assert (float(m[4]), m[5], m[6]) == (1e-5, "example", "central")
    assert _recorded(tmp_path)["epsilon"] <= target
    acc = re.search(rf"test accuracy of result\.model: {NUMBER} \(chance 0\.50", out)
    assert acc and 0.0 <= float(acc[1]) <= 1.0, out
