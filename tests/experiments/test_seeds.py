"""Mean +- std over seeds in the reproductions (issue 34): the pieces against ``statistics``
(an independent oracle), and PORTER and the PrivSGP-VR K sweep over several seeds, resumed per
seed, with seed 0 unchanged by the seeds added beside it."""

from __future__ import annotations

import json
import statistics

import pytest

from privdl.errors import ConfigError
from privdl.experiments import get
from privdl.experiments.seeds import mean_curve, mean_std, pm


def test_mean_std_is_the_sample_std_and_one_seed_is_left_as_it_is() -> None:
    values = [0.81, 0.79, 0.86, 0.8]
    mean, std = mean_std(values)
    assert mean == pytest.approx(statistics.fmean(values), rel=1e-15)
    assert std == pytest.approx(statistics.stdev(values), rel=1e-12)  # ddof 1, not 0
    assert std != pytest.approx(statistics.pstdev(values), rel=1e-3)
    assert mean_std([0.1 + 0.2]) == (0.1 + 0.2, None)  # no arithmetic on one value
    with pytest.raises(ValueError):
        mean_std([])
    assert pm(0.5, None) == "0.5000" and pm(0.5, 0.01234, ".3f") == "0.500 +- 0.012"


def test_mean_curve_point_by_point_and_refuses_curves_at_other_iterations() -> None:
    a = [{"k": 0, "loss": 2.0, "acc": 0.1}, {"k": 5, "loss": 1.0, "acc": 0.5}]
    b = [{"k": 0, "loss": 2.5, "acc": 0.2}, {"k": 5, "loss": 0.5, "acc": 0.7}]
    mean, std = mean_curve([a, b], ("loss", "acc"), x="k")
    assert [p["k"] for p in mean] == [0, 5]
    assert mean[1]["loss"] == pytest.approx(0.75) and mean[1]["acc"] == pytest.approx(0.6)
    assert std is not None and std[0]["loss"] == pytest.approx(statistics.stdev([2.0, 2.5]))
    one, none = mean_curve([a], ("loss",), x="k")
    assert none is None and one == [{"k": 0, "loss": 2.0}, {"k": 5, "loss": 1.0}]
    with pytest.raises(ValueError, match="different 'k'"):
        mean_curve([a, [{**b[0]}, {**b[1], "k": 6}]], ("loss",), x="k")


def _porter(tmp, data, seeds: str, *, resume: bool = False, rounds: str = "20") -> dict:
    return get("porter-a9a").run(
        tmp, quick=True, data_dir=data, resume=resume, overrides={"seeds": seeds, "rounds": rounds}
    )


@pytest.mark.slow  # ~15 s of CPU: five small a9a reproductions
def test_porter_over_seeds_means_bands_and_resume(tmp_path, shared_datasets) -> None:
    if not (shared_datasets / "adult" / "adult.data.gz").exists():
        pytest.skip("Adult files not in the shared datasets folder")
    data = str(shared_datasets / "adult")
    one = _porter(tmp_path / "one", data, "0")
    assert "curves_std" not in one and "curves_per_seed" not in one
    two = _porter(tmp_path / "two", data, "0,2")
    label = "PORTER-DP eps=0.1"
    per = two["curves_per_seed"]
    # seed 0 is the same run whatever seeds stand beside it
    for key in ("utility", "accuracy", "loss", "bits"):
        assert per["0"][label][key] == one["curves"][label][key]
    assert per["0"][label]["utility"] != per["2"][label]["utility"]
    # the curves are the seeds' means, the band their sample std, point by point
    for i, u in enumerate(two["curves"][label]["utility"]):
        pair = [per[s][label]["utility"][i] for s in ("0", "2")]
        assert u == pytest.approx(statistics.fmean(pair), rel=1e-12)
        assert two["curves_std"][label]["utility"][i] == pytest.approx(statistics.stdev(pair))
    fin = two["finals"][label]
    assert fin["accuracy_final_per_seed"][0] == one["finals"][label]["accuracy_final"]
    assert fin["accuracy_final_std"] == pytest.approx(
        statistics.stdev(fin["accuracy_final_per_seed"])
    )
    report = (tmp_path / "two" / "report.md").read_text()
    assert "mean +- std (sample std, ddof 1) over 2 seeds (0, 2" in report
    assert f"{fin['accuracy_final']:.4f} +- {fin['accuracy_final_std']:.4f}" in report
    # a folder holding cells is refused without --resume; with it only the new seed trains
    with pytest.raises(ConfigError, match="--resume"):
        _porter(tmp_path / "two", data, "0,2,3")
    three = _porter(tmp_path / "two", data, "0,2,3", resume=True)
    assert three["cells_kept"] == 2 * len(two["finals"])
    assert three["curves_per_seed"]["2"] == json.loads(json.dumps(per["2"]))
    assert len(list((tmp_path / "two" / "cells").glob("*.json"))) == 3 * len(two["finals"])


def _ksweep(tmp, data, seeds: int, *, resume: bool = False) -> dict:
    tiny = {"n": "4", "n_train": "256", "n_test": "100", "hidden": "8", "block_size": "8"}
    tiny |= {"k_star": "8", "k_ratios": "0.5,1,2", "curve_points": "2", "seeds": str(seeds)}
    return get("privsgp-mnist-ksweep").run(
        tmp, quick=True, data_dir=data, overrides=tiny, resume=resume
    )


@pytest.mark.slow  # ~10 s of CPU: three tiny K sweeps
def test_privsgp_ksweep_over_seeds_and_resume(tmp_path, shared_datasets) -> None:
    mnist = shared_datasets / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("MNIST files not in the shared datasets folder")
    one = _ksweep(tmp_path / "one", str(mnist), 1)["results"]
    two = _ksweep(tmp_path / "two", str(mnist), 2)["results"]
    for k, run in two.items():
        assert "final_std" not in one[k]
        assert run["curve_per_seed"][0] == one[k]["curve"]  # seed 0 unchanged
        losses = [f["loss"] for f in run["final_per_seed"]]
        assert run["final"]["loss"] == pytest.approx(statistics.fmean(losses), rel=1e-12)
        assert run["final_std"]["loss"] == pytest.approx(statistics.stdev(losses))
        assert run["curve_std"][-1]["loss"] == pytest.approx(run["final_std"]["loss"])
    assert "+- " in (tmp_path / "two" / "report.md").read_text()
    three = _ksweep(tmp_path / "two", str(mnist), 3, resume=True)
    assert (
        "6 runs kept from an earlier run (--resume)" in (tmp_path / "two" / "report.md").read_text()
    )
    for k, run in three["results"].items():
        assert run["curve_per_seed"][:2] == json.loads(json.dumps(two[k]["curve_per_seed"]))
