"""``privdl account dpsgd|decor --compare / --curve / --curve-out`` and ``calibrate dpsgd``'s new
options, through click's CliRunner on the main group (and ``main`` for the exit codes)."""

from __future__ import annotations

import csv
import json
import math

import pytest
from click.testing import CliRunner

from privdl.accounting.compare import tradeoff_curve
from privdl.accounting.conversion import gaussian_epsilon
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.tightest import tightest_epsilon
from privdl.cli.main import cli, main

#: Poisson + replace-one: PLD only (fast), z = 1, q = 0.01, T = 200.
DPSGD = ["account", "dpsgd", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps",
         "200", "--delta", "1e-5", "--neighbouring", "replace_one"]  # fmt: skip
#: No sampling: exact mu-GDP with mu = sqrt(100) / 2 = 5.
UNSAMPLED = ["account", "dpsgd", "--noise-multiplier", "2", "--sampling-rate", "1", "--sampling",
             "none", "--steps", "100", "--delta", "1e-5"]  # fmt: skip
DECOR = ["account", "decor", "--graph", "ring:8", "--sigma-cdp", "1", "--sigma-cor", "10",
         "--steps", "100", "--delta", "1e-5"]  # fmt: skip


def invoke_json(args):
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_account_dpsgd_compare_json():
    out = invoke_json([*DPSGD, "--compare"])
    rows = out["compare"]
    assert [r["accountant"] for r in rows] == ["gaussian", "pld", "rdp", "rdp-classic"]
    marked = [r for r in rows if r["tightest"]]
    assert len(marked) == 1 and marked[0]["accountant"] == "pld" == out["accountant"]
    assert marked[0]["epsilon"] == out["epsilon"]  # the default is the marked row
    event = SubsampledGaussianEvent(1.0, 0.01, 200, neighbouring="replace_one")
    assert out["epsilon"] == pytest.approx(tightest_epsilon(event, delta=1e-5).epsilon, rel=1e-9)
    no_rdp = next(r for r in rows if r["accountant"] == "rdp")
    assert no_rdp["epsilon"] is None and "replace" in no_rdp["note"]
    assert "curves" not in out


def test_account_dpsgd_unsampled_curve_json():
    out = invoke_json([*UNSAMPLED, "--curve", "--compare"])
    assert out["accountant"] == "gaussian" and out["mu"] == pytest.approx(5.0)
    assert out["epsilon"] == gaussian_epsilon(100 / 8, 1e-5)
    curves = out["curves"]
    assert curves["mu"] == pytest.approx(5.0)
    t = curves["tradeoff"]
    assert t["betas"] == pytest.approx(tradeoff_curve(5.0, t["alphas"]).tolist(), abs=1e-15)
    ed = curves["epsilon_delta"]
    assert len(ed["deltas"]) == 17 and ed["accountants"] == ["gaussian"] * 17
    i = ed["deltas"].index(pytest.approx(1e-5))
    assert ed["epsilons"][i] == out["epsilon"]


def test_account_dpsgd_accountant_choices_and_default():
    result = CliRunner().invoke(cli, ["account", "dpsgd", "--help"])
    assert "tightest|gaussian|pld|rdp" in result.output and "default: tightest" in result.output
    out = invoke_json([*UNSAMPLED, "--accountant", "rdp"])
    assert out["accountant"] == "rdp" and out["epsilon"] > gaussian_epsilon(100 / 8, 1e-5)


@pytest.mark.parametrize("ext", ["csv", "json"])
def test_curve_out_written(tmp_path, ext):
    path = tmp_path / f"curves.{ext}"
    out = invoke_json([*UNSAMPLED, "--curve-out", str(path)])
    assert out["curve_file"] == str(path) and "curves" not in out  # written, not printed
    if ext == "json":
        data = json.loads(path.read_text())
        assert data["mu"] == pytest.approx(5.0) and len(data["tradeoff"]["alphas"]) > 100
        return
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    ed = [r for r in rows if r["curve"] == "epsilon_delta"]
    to = [r for r in rows if r["curve"] == "tradeoff"]
    assert len(ed) == 17 and float(ed[0]["x"]) == pytest.approx(1e-10)
    assert float(ed[-1]["x"]) == pytest.approx(1e-2)
    eps = [float(r["y"]) for r in ed]
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))
    at_half = next(r for r in to if math.isclose(float(r["x"]), 0.5))
    assert float(at_half["y"]) == pytest.approx(float(tradeoff_curve(5.0, [0.5])[0]), rel=1e-12)


def test_table_output_marks_tightest_and_prints_curves():
    result = CliRunner().invoke(cli, [*DPSGD, "--compare", "--curve"], catch_exceptions=False)
    assert result.exit_code == 0
    text = result.output
    assert "tightest certified" in text and "not applicable" in text
    assert "(epsilon, delta) curve" in text and "trade-off curve (conservative" in text


def test_account_decor_compare_and_mu(tmp_path):
    out = invoke_json([*DECOR, "--compare", "--curve"])
    assert out["conversion"] == "gaussian" and out["mu"] == out["budget"]["mu"] > 0
    rows = {r["accountant"]: r for r in out["compare"]}
    assert list(rows) == ["gaussian", "improved", "classic"]
    assert rows["gaussian"]["tightest"] and rows["gaussian"]["epsilon"] == out["epsilon"]
    assert out["curves"]["mu"] == pytest.approx(out["mu"])
    result = CliRunner().invoke(cli, ["account", "decor", "--help"])
    assert "gaussian (default, exact)" in " ".join(result.output.split())


def test_calibrate_dpsgd_names_the_certifying_accountant():
    out = invoke_json(["calibrate", "dpsgd", "--epsilon", "2", "--delta", "1e-5",
                       "--sampling-rate", "1", "--sampling", "none", "--steps", "200"])  # fmt: skip
    assert out["calibrated_with"] == "tightest" and out["accountant"] == "gaussian"
    assert out["epsilon_achieved"] <= 2.0 and out["epsilon_achieved"] == pytest.approx(2.0)
    assert out["mu"] == pytest.approx(math.sqrt(200) / out["noise_multiplier"])
    assert "gaussian" in out["label"]


def test_calibrate_decor_default_conversion_is_gaussian():
    result = CliRunner().invoke(cli, ["calibrate", "decor", "--help"])
    assert "default: gaussian" in result.output


@pytest.mark.parametrize(
    "argv, words",
    [
        ([*DPSGD[:-4], "--delta", "-1e-5", "--compare"], "delta"),
        ([*UNSAMPLED, "--curve-out", "curves.txt"], ".json or .csv"),
        ([*DPSGD, "--accountant", "gaussian"], "unsampled"),
        (
            [
                "calibrate",
                "dpsgd",
                "--epsilon",
                "2",
                "--delta",
                "1e-5",
                "--sampling-rate",
                "0.1",
                "--steps",
                "10",
                "--sampling",
                "fixed_size",
            ],
            "dataset size",
        ),  # fmt: skip
        ([*DECOR, "--compare", "--delta", "2"], "delta"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and words in err
