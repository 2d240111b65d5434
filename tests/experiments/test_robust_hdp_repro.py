"""Quick Robust-HDP reproductions: each runs and its checks hold."""

from __future__ import annotations

import json

import pytest

from privdl.experiments import get, registry


def _run(name, tmp_path, data_dir=None):
    summary = get(name).run(tmp_path, quick=True, data_dir=data_dir)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["checks"] == summary["checks"]
    assert (tmp_path / "report.md").read_text().startswith("# Robust-HDP")
    assert list(tmp_path.glob("*.png"))
    failed = [k for k, v in summary["checks"].items() if not v]
    assert summary["checks"] and not failed, failed
    return summary


def test_registered() -> None:
    names = set(registry())
    assert {
        "robust-hdp-table3",
        "robust-hdp-mnist",
        "robust-hdp-fmnist",
        "robust-hdp-cifar10",
        "robust-hdp-falsified",
    } <= names


def test_table3_quick(tmp_path) -> None:
    s = _run("robust-hdp-table3", tmp_path)
    # spot-check the paper column was copied, and ours is the closed form (spec O5, unrounded)
    assert s["paper"]["Oracle"][0] == 0.27
    assert s["ours"]["WeiAvg"][0] == pytest.approx(1.0254, abs=2e-3)


@pytest.mark.slow
def test_mnist_quick(tmp_path, shared_datasets) -> None:
    mnist = shared_datasets / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST files not found in {mnist}")
    _run("robust-hdp-mnist", tmp_path, str(mnist))


@pytest.mark.slow
def test_fmnist_quick(tmp_path, shared_datasets) -> None:
    fm = shared_datasets / "fashion-mnist"
    if not (fm / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"Fashion-MNIST files not found in {fm}")
    _run("robust-hdp-fmnist", tmp_path, str(fm))


@pytest.mark.slow
def test_cifar10_synthetic_quick(tmp_path) -> None:
    s = _run("robust-hdp-cifar10", tmp_path)
    assert s["mode"] == "quick"


@pytest.mark.slow
def test_falsified_quick(tmp_path, shared_datasets) -> None:
    mnist = shared_datasets / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST files not found in {mnist}")
    s = _run("robust-hdp-falsified", tmp_path, str(mnist))
    wei = s["results"]["weiavg"]
    # WeiAvg gives the falsifier eps'/(eps' + sum of the others): closed form
    others = sum([1.5, 0.2, 0.74, 0.46, 0.37])
    assert wei[-1]["weights"][0] == pytest.approx(50 / (50 + others), rel=1e-6)
