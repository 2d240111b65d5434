"""Quick PrivSGP-VR reproductions: each runs, writes its outputs and passes its own checks."""

from __future__ import annotations

import json
import math

import pytest
import torch

from privdl.experiments import get, load_preset


def _check(out, summary):
    assert (out / "report.md").is_file() and (out / "summary.json").is_file()
    assert json.loads((out / "summary.json").read_text())["checks"] == summary["checks"]
    failed = [name for name, ok in summary["checks"].items() if not ok]
    assert not failed, failed


@pytest.mark.parametrize(
    "name",
    ["privsgp-mnist-speedup", "privsgp-mnist-ksweep", "privsgp-mnist-eps", "privsgp-mnist-vr"],
)
def test_quick_mnist_reproductions(name, tmp_path, shared_datasets):
    mnist = shared_datasets / "mnist"
    if not mnist.is_dir():
        pytest.skip(f"MNIST not found under {mnist}")
    summary = get(name).run(tmp_path, quick=True, data_dir=str(mnist))
    _check(tmp_path, summary)
    assert list(tmp_path.glob("*.png"))
    if name in ("privsgp-mnist-ksweep", "privsgp-mnist-eps"):  # the accountant is named as run
        res = summary["results"]
        runs = (
            res.values()
            if name.endswith("ksweep")
            else [r for e in res.values() for r in e["runs"].values()]
        )
        (accountant,) = {r["accounted"]["accountant"] for r in runs}
        assert (
            f"threat model ldp, accountant {accountant})." in (tmp_path / "report.md").read_text()
        )


def test_vr_reproduction_over_seeds_reports_means_and_paired_differences(tmp_path, shared_datasets):
    mnist = shared_datasets / "mnist"
    if not mnist.is_dir():
        pytest.skip(f"MNIST not found under {mnist}")
    summary = get("privsgp-mnist-vr").run(
        tmp_path, quick=True, data_dir=str(mnist), overrides={"seeds": "2"}
    )
    res = summary["results"]
    vr, sgp = res["PrivSGP-VR (expo)"], res["PrivSGP (expo)"]
    per_seed = vr["final_loss_per_seed"]
    assert len(per_seed) == 2 and per_seed[0] != per_seed[1]  # two different noise draws
    assert vr["final"]["loss"] == pytest.approx(sum(per_seed) / 2, rel=1e-12)
    diffs = [a - b for a, b in zip(per_seed, sgp["final_loss_per_seed"], strict=True)]
    assert ", ".join(f"{d:+.4f}" for d in diffs) in (tmp_path / "report.md").read_text()
    # every seed's curve is kept: the mean curve is their mean, the figure's band their spread
    curves = vr["curve_per_seed"]
    assert len(curves) == 2 and curves[0][-1]["loss"] == per_seed[0]
    for i, p in enumerate(vr["curve"]):
        assert p["loss"] == pytest.approx((curves[0][i]["loss"] + curves[1][i]["loss"]) / 2)


def test_quick_cifar_reproduction(tmp_path, capsys):
    summary = get("privsgp-cifar").run(tmp_path, quick=True, device="cpu")
    _check(tmp_path, summary)
    assert summary["device"] == "cpu" and summary["results"]["complete"]
    # the SAGA table's memory is printed (16 nodes x 64/4 blocks x d floats) with progress lines
    d = summary["results"]["training"]["PrivSGP-VR"]["table"]
    assert d.startswith("16 nodes x 4 entries x ")
    assert d in (tmp_path / "report.md").read_text()
    err = capsys.readouterr().err
    assert "PrivSGP-VR: k=8/8" in err and "s] " in err
    plan = summary["results"]["planning"]
    # independent closed forms (Theorem 2's eq. (11), Corollary 1's eq. (12)): c2 = 1 gives K* = 432.695; sigma(K*) = 0.225857
    assert abs(plan["K_star_c2_1"] - 432.695) < 1e-2
    assert abs(plan["sigma_nominal"] - 0.225857) < 1e-5
    assert 60 < plan["ratio_poisson_approximation_over_nominal"] < 80  # docs/privsgp-vr.md: ~70x
    # the certified sigma at K* (the run's accountant) is far above both
    assert plan["ratio_accounted_over_nominal"] > 100 * 60
    assert plan["K_star_accounted"] >= 1 and plan["U_star_accounted"] > plan["U_star_nominal"]
    assert (tmp_path / "cifar_loss.png").is_file()


def test_presets_have_quick_and_full():
    for name in (
        "privsgp-mnist-speedup",
        "privsgp-mnist-ksweep",
        "privsgp-mnist-eps",
        "privsgp-mnist-vr",
        "privsgp-cifar",
    ):
        preset = load_preset(name)
        assert set(preset["quick"]) <= set(preset["full"]) | {"table_budget_gib"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_quick_cifar_reproduction_cuda(tmp_path):
    summary = get("privsgp-cifar").run(tmp_path, quick=True, device="cuda")
    _check(tmp_path, summary)
    assert summary["device"].startswith("cuda")


def test_overrides_are_typed_and_unknown_keys_refused(tmp_path):
    from privdl.cli.main import main as cli_main
    from privdl.errors import ConfigError
    from privdl.experiments.privsgp import _cfg

    top, cfg = _cfg("privsgp-cifar", True, {"steps": "3", "sigma2": "0.5", "n": "8"})
    assert (cfg["steps"], top["sigma2"], cfg["n"]) == (3, 0.5, 8)
    assert _cfg("privsgp-mnist-speedup", True, {"n": "2,4"})[1]["n"] == [2, 4]
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        _cfg("privsgp-cifar", True, {"bogus": "1"})
    with pytest.raises(ConfigError, match="expected a int"):
        _cfg("privsgp-cifar", True, {"steps": "many"})
    args = ["reproduce", "privsgp-cifar", "--quick", "--out", str(tmp_path), "--set", "bogus=1"]
    assert cli_main(args) == 2


def test_time_limit_stops_early_and_reports_it(tmp_path):
    """A run past its deadline stops, evaluates there, and the partial outputs say so."""
    from privdl.experiments.privsgp import run_cifar

    summary = run_cifar(tmp_path, quick=True, overrides={"time_limit_s": "0.001", "steps": "50"})
    for r in summary["results"]["training"].values():
        assert r["stopped_early"] and r["steps_done"] == 1 < r["steps_planned"] == 50
    assert "1 of 50 (time limit)" in (tmp_path / "report.md").read_text()


def test_fig8_grid_is_the_specs_derived_k_star_and_eq11_noise():
    """Fig 8 (App. E), eq. (12): K* = 92, 207, 368, 575, 828, 1127, 1472 for eps = 0.4, ..., 1.6;
    at K*(eps) the eq. (11) noise is the anchor's for every eps, and sigma ~ sqrt(K)."""
    from privdl.experiments.privsgp import eps_grid

    preset = load_preset("privsgp-mnist-eps")
    full = preset["full"]
    stars = []
    for eps in full["epsilons"]:
        k_star, grid = eps_grid(eps, full["k_star_at_eps1"], preset["k_ratios"], 0.01)
        stars.append(k_star)
        (k_lo, s_lo), (k_mid, s_mid), (k_hi, s_hi) = grid
        assert k_mid == k_star and abs(s_mid - 0.1) < 2e-3  # rounding of K* only
        assert abs(k_lo - k_star / 2) <= 0.5 and k_hi == 2 * k_star
        assert abs(s_hi / s_lo - (k_hi / k_lo) ** 0.5) < 1e-12
    assert stars == [92, 207, 368, 575, 828, 1127, 1472]


def test_the_sweeps_report_the_budget_they_were_given(tmp_path, shared_datasets):
    """``--set epsilon=2 --set delta=1e-3`` changed the sigma columns while the report still
    said (1, 1e-5), and summary.json kept no budget."""
    from privdl.accounting.conversion import step_rdp_for_epsilon
    from privdl.experiments.privsgp import _cfg as privsgp_cfg

    mnist = shared_datasets / "mnist"
    if not mnist.is_dir():
        pytest.skip(f"MNIST not found under {mnist}")
    overrides = {"epsilon": "2", "delta": "1e-3", "k_ratios": "1"}
    summary = get("privsgp-mnist-ksweep").run(
        tmp_path, quick=True, data_dir=str(mnist), overrides=overrides
    )
    report = (tmp_path / "report.md").read_text()
    assert "budget (2, 0.001) per node" in report and "is NOMINAL" in report
    budget = summary["budget"]
    assert (budget["epsilon"], budget["delta"], budget["nominal"]) == (2.0, 1e-3, True)
    assert budget["neighbouring"] == "replace_one" and budget["threat_model"] == "ldp"
    (run,) = summary["results"].values()
    # the certified sigma meets (2, 1e-3) at K Gaussian steps of sensitivity (4 - 2/J_b) C / B
    _, cfg = privsgp_cfg("privsgp-mnist-ksweep", True, overrides)
    j_b = cfg["n_train"] // cfg["n"] // cfg["block_size"]
    sens = (4 - 2 / j_b) * cfg["clip"] / cfg["block_size"]
    rho = sens**2 / (2 * run["sigma_certified"] ** 2)
    assert rho == pytest.approx(step_rdp_for_epsilon(2.0, steps=run["K"], delta=1e-3), rel=1e-8)
    # (step_rdp_for_epsilon's default is the exact conversion, the runs' default accountant)
    assert run["sigma_certified"] > run["sigma_poisson_approximation"] > run["sigma"]
    # and what the run's own (nominal) sigma certifies: K Gaussian steps, exactly mu-GDP with
    # mu = sqrt(2 K rho): Balle and Wang's delta(eps) meets 1e-3 at the recorded epsilon, which
    # is below the classic conversion's closed form K rho + 2 sqrt(K rho log(1/delta))
    from scipy.stats import norm

    spent = run["accounted"]
    k_rho = run["K"] * sens**2 / (2 * run["sigma"] ** 2)
    closed = k_rho + 2 * math.sqrt(k_rho * math.log(1 / 1e-3))
    mu, e = math.sqrt(2 * k_rho), spent["epsilon"]
    exact_delta = norm.cdf(-e / mu + mu / 2) - math.exp(e + norm.logcdf(-e / mu - mu / 2))
    assert exact_delta <= 1e-3 and math.isclose(exact_delta, 1e-3, rel_tol=1e-4)
    assert 2.0 < spent["epsilon"] < closed and spent["mu"] == pytest.approx(mu)
    assert (spent["delta"], spent["nominal"], spent["unit"]) == (1e-3, False, "example")
    assert spent["neighbouring"] == "replace_one" and spent["threat_model"] == "ldp"
    assert f"{spent['epsilon']:.4g}" in report and "eps accounted (run's sigma)" in report


@pytest.mark.parametrize(
    "setting, message",
    [("n=0", "n must be at least 2"), ("k_star=0", "k_star must be > 0"),
     ("hidden=0", "hidden must be > 0"), ("block_size=0", "block_size must be > 0"),
     ("sigma2_at_kstar=-1", "sigma2_at_kstar must be >= 0"), ("delta=2", "delta must be in (0, 1)"),
     ("epsilon=nan", "epsilon must be > 0"), ("k_ratios=", "k_ratios needs at least one value"),
     ("k_ratios=[]", "expected comma-separated float values")],
)  # fmt: skip
def test_bad_preset_values_are_one_line_and_leave_no_directory(tmp_path, capsys, setting, message):
    """Each was a ZeroDivisionError / RuntimeError / ValueError traceback, or (delta=2,
    epsilon=nan) a finished report with a wrong budget; each left an OUT holding a .lock."""
    from privdl.cli.main import main

    out = tmp_path / "o"
    assert main(["reproduce", "privsgp-mnist-ksweep", "--quick", "--set", setting,
                 "--out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()
