"""Quick PORTER reproductions (paper Section 5; docs/porter.md): outputs written and their checks hold."""

from __future__ import annotations

import json

import pytest

from privdl.experiments import get, load_preset


def _check_outputs(out, summary, which):
    assert (out / "report.md").is_file() and (out / "summary.json").is_file()
    for group in ("dp", "gc"):
        assert (out / f"{which}_{group}.png").stat().st_size > 0
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["checks"] == summary["checks"]
    failed = [k for k, v in summary["checks"].items() if not v]
    assert not failed, f"checks failed: {failed}"
    assert summary["passed"]
    report = (out / "report.md").read_text()
    assert "accounted eps" in report and "Paper orderings" in report
    assert "NOMINAL epsilon" in report.split("## Results")[1]  # the eps=E run labels
    majority = summary["facts"]["majority_class_test_accuracy"]
    assert f"Always predicting the most frequent test label scores {majority:.4f}" in report
    # replace-one accounting (the paper's Definition 4) certifies more than add/remove
    for row in summary["privacy"]:
        assert row["epsilon_accounted"] > row["epsilon_add_remove_poisson"]
    # the report names the accountants the rows were accounted with (not a fixed text)
    accounted = sorted(
        {r["accounted_label"].split(") ", 1)[1].split(",")[0] for r in summary["privacy"]}
    )
    add_remove = sorted({r["add_remove_accountant"] for r in summary["privacy"]})
    assert f"(accountant {', '.join(accounted)};" in report
    assert f"accountant {', '.join(add_remove)}, privdl's default" in report


def _check_privacy_rows(summary, pre):
    """Theorem 1: sigma_p = tau sqrt(T ln(1/delta)) / (m eps), recomputed here."""
    import math

    m, T = summary["facts"]["local_samples"], summary["facts"]["rounds"]
    for row in summary["privacy"]:
        expected = (
            pre["tau"] * math.sqrt(T * math.log(1 / pre["delta"])) / (m * row["epsilon_nominal"])
        )
        assert row["sigma_p"] == pytest.approx(expected, rel=1e-12)
        assert row["epsilon_accounted"] > 0


def test_porter_a9a_quick(tmp_path, shared_datasets):
    if not (shared_datasets / "adult" / "adult.data.gz").exists():
        pytest.skip("Adult files not in the shared datasets folder")
    out = tmp_path / "a9a"
    summary = get("porter-a9a").run(out, quick=True, data_dir=str(shared_datasets / "adult"))
    _check_outputs(out, summary, "a9a")
    facts = summary["facts"]
    assert (facts["dim"], facts["k"], facts["local_samples"]) == (124, 6, 3256)  # Sec. 5.1
    # UCI Adult's test file: 12,435 of its 16,281 rows earn <= 50K
    assert facts["majority_class_test_accuracy"] == pytest.approx(12435 / 16281, rel=1e-12)
    _check_privacy_rows(summary, load_preset("porter-a9a"))


@pytest.mark.slow
def test_porter_mnist_quick(tmp_path, shared_datasets):
    if not (shared_datasets / "mnist" / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("MNIST files not in the shared datasets folder")
    out = tmp_path / "mnist"
    summary = get("porter-mnist").run(out, quick=True, data_dir=str(shared_datasets / "mnist"))
    _check_outputs(out, summary, "mnist")
    assert (summary["facts"]["dim"], summary["facts"]["k"]) == (50890, 2544)  # Sec. 5.2
    _check_privacy_rows(summary, load_preset("porter-mnist"))


def test_full_mode_step_sizes_override_the_quick_ones(shared_datasets):
    """A mode's ``[full.step_sizes]`` wins over the top-level table and reaches the algorithms;
    quick mode keeps the top-level values."""
    if not (shared_datasets / "adult" / "adult.data.gz").exists():
        pytest.skip("Adult files not in the shared datasets folder")
    from privdl.experiments.porter import algorithms, setup

    pre = load_preset("porter-a9a")
    data = str(shared_datasets / "adult")
    full = setup("a9a", quick=False, data_dir=data, calibrate=False)
    quick = setup("a9a", quick=True, data_dir=data)
    assert full.facts["step_sizes"] == {**pre["step_sizes"], **pre["full"]["step_sizes"]}
    assert quick.facts["step_sizes"] == pre["step_sizes"]
    assert full.facts["step_sizes"]["gc_gamma"] != quick.facts["step_sizes"]["gc_gamma"]
    gc = algorithms(full)["PORTER-GC"]
    assert (gc.step_size.lr, gc.gamma) == (
        pre["full"]["step_sizes"]["gc_eta"],
        pre["full"]["step_sizes"]["gc_gamma"],
    )
