"""Committed results regenerate from their presets with the same seeds (issue 34): the cheapest
committed reproduction of each paper is re-run and compared with the ``summary.json`` in
``experiments/results``. Slow (seconds to minutes each, beside the data they need); run with
``pytest -m slow tests/experiments/test_committed_results.py``.

Robust-HDP's cheapest committed result is one 40-round cell of ``robust-hdp-falsified`` (Fig. 5
right): 1,319 s on one CPU thread (2026-11-29, `nice -n 5` on the shared 2-core machine beside
two other reproductions; it passed). A Table 12 cell is 200 rounds, about an hour or more; ``experiments/results/robust-hdp-mnist/README.md`` gives the command that re-runs or
extends those with ``--resume``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privdl.experiments import get

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


def _committed(name: str) -> dict:
    return json.loads((RESULTS / name / "summary.json").read_text())


@pytest.mark.slow
def test_decor_fig2_regenerates_exactly(tmp_path) -> None:
    ours = get("decor-fig2").run(tmp_path, quick=False)
    committed = _committed("decor-fig2")
    assert ours["points"] == pytest.approx(committed["points"], rel=1e-12)
    assert ours["limit"] == pytest.approx(committed["limit"], rel=1e-12)
    assert ours["label"] == committed["label"]


@pytest.mark.slow
def test_porter_a9a_regenerates(tmp_path, shared_datasets) -> None:
    if not (shared_datasets / "adult" / "adult.data.gz").exists():
        pytest.skip("Adult files not in the shared datasets folder")
    # the first seed of the preset's list (the committed means rest on it and two more)
    data = str(shared_datasets / "adult")
    ours = get("porter-a9a").run(tmp_path, quick=False, data_dir=data, overrides={"seeds": "0"})
    committed = _committed("porter-a9a")
    assert committed["facts"]["seeds"][0] == 0
    assert set(ours["finals"]) == set(committed["finals"])
    for run, finals in committed["finals"].items():
        for key, value in finals.items():  # the FDLA mixing solve agrees to ~1e-8 across scipy
            if key.endswith(("_std", "_per_seed")):
                continue
            first = finals.get(f"{key}_per_seed", [value])[0]  # seed 0's own value
            assert ours["finals"][run][key] == pytest.approx(first, rel=1e-4, abs=1e-9), (run, key)


@pytest.mark.slow
def test_privsgp_ksweep_regenerates(tmp_path, shared_datasets) -> None:
    mnist = shared_datasets / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("MNIST files not in the shared datasets folder")
    # seed 0 alone (the committed means rest on seeds 0, 1, 2; seed 0's finals are kept)
    ours = get("privsgp-mnist-ksweep").run(
        tmp_path, quick=False, data_dir=str(mnist), overrides={"seeds": "1"}
    )
    committed = _committed("privsgp-mnist-ksweep")
    assert set(ours["results"]) == set(committed["results"])
    for k, run in committed["results"].items():  # float32 rounding moves single runs a little:
        new = ours["results"][k]["final"]  # 7e-6 in the loss, 2 test images (2026-11-27)
        first = run.get("final_per_seed", [run["final"]])[0]
        assert new["loss"] == pytest.approx(first["loss"], rel=1e-4), k
        assert new["accuracy"] == pytest.approx(first["accuracy"], abs=5e-4), k


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 22 min on one loaded thread; the suite's 600 s limit is too short
def test_robust_hdp_falsified_cell_regenerates(tmp_path, shared_datasets) -> None:
    """The Robust-HDP cell of ``robust-hdp-falsified`` with a truthful client 0 (eps' = 0.95):
    40 rounds of the paper's CNN on 20 clients, seed 1, weights by robust PCA after round 1. The
    committed cell is ``cells/robust-hdp_reported0.95.json``; the command is the folder README's,
    cut to this one cell (``--set methods=robust-hdp --set reported=0.95``)."""
    mnist = shared_datasets / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("MNIST files not in the shared datasets folder")
    cell = json.loads(
        (RESULTS / "robust-hdp-falsified" / "cells" / "robust-hdp_reported0.95.json").read_text()
    )
    assert cell["key"]["rounds"] == 40
    ours = get("robust-hdp-falsified").run(
        tmp_path,
        quick=False,
        data_dir=str(mnist),
        overrides={"methods": "robust-hdp", "reported": "0.95", "rounds": "40"},
    )
    new, old = ours["results"]["robust-hdp"][0], cell["result"]
    # The same tolerance policy as the PrivSGP-VR test above: float32 rounding (thread count,
    # library versions) may move single runs a little. Accuracy is the mean over the clients'
    # 20 x 600 test images, so 0.05 points is 6 images; the weights and the aggregate noise are
    # continuous (rel 1e-4, as the losses above); the accountant is deterministic.
    assert new["accuracy"] == pytest.approx(old["accuracy"], abs=0.05)
    assert new["weights"] == pytest.approx(old["weights"], rel=1e-4, abs=1e-7)
    assert new["noise"] == pytest.approx(old["noise"], rel=1e-4)
    assert new["oracle_noise"] == pytest.approx(old["oracle_noise"], rel=1e-9)
    assert new["max_accounted_over_target"] == pytest.approx(
        old["max_accounted_over_target"], rel=1e-6
    )
    assert new["accountant"] == old["accountant"]
