"""Quick PrivSGP-VR reproductions: each runs, writes its outputs and passes its own checks."""

from __future__ import annotations

import json

import pytest

from privdl.experiments import get, load_preset


def _check(out, summary):
    assert (out / "report.md").is_file() and (out / "summary.json").is_file()
    assert json.loads((out / "summary.json").read_text())["checks"] == summary["checks"]
    failed = [name for name, ok in summary["checks"].items() if not ok]
    assert not failed, failed


@pytest.mark.parametrize(
    "name", ["privsgp-mnist-speedup", "privsgp-mnist-ksweep", "privsgp-mnist-vr"]
)
def test_quick_mnist_reproductions(name, tmp_path, shared_datasets):
    mnist = shared_datasets / "mnist"
    if not mnist.is_dir():
        pytest.skip(f"MNIST not found under {mnist}")
    summary = get(name).run(tmp_path, quick=True, data_dir=str(mnist))
    _check(tmp_path, summary)
    assert list(tmp_path.glob("*.png"))


def test_quick_cifar_reproduction(tmp_path):
    summary = get("privsgp-cifar").run(tmp_path, quick=True)
    _check(tmp_path, summary)
    plan = summary["results"]["planning"]
    # independent closed forms (spec §9 T16): c2 = 1 gives K* = 432.695; sigma(K*) = 0.225857
    assert abs(plan["K_star_c2_1"] - 432.695) < 1e-2
    assert abs(plan["sigma_nominal"] - 0.225857) < 1e-5
    assert 60 < plan["ratio_accounted_over_nominal"] < 80  # spec §10: ~70x
    assert (tmp_path / "cifar_loss.png").is_file()


def test_presets_have_quick_and_full():
    for name in (
        "privsgp-mnist-speedup",
        "privsgp-mnist-ksweep",
        "privsgp-mnist-vr",
        "privsgp-cifar",
    ):
        preset = load_preset(name)
        assert set(preset["quick"]) <= set(preset["full"]) | {"table_budget_gib"}
