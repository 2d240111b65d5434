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
    # spot-check the paper column was copied, and ours is the closed form (docs/robust-hdp.md, Table 3; unrounded)
    assert s["paper"]["Oracle"][0] == 0.27
    assert s["ours"]["WeiAvg"][0] == pytest.approx(1.0254, abs=2e-3)


@pytest.mark.slow
def test_mnist_quick(tmp_path, shared_datasets) -> None:
    mnist = shared_datasets / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST files not found in {mnist}")
    s = _run("robust-hdp-mnist", tmp_path, str(mnist))
    # the Dist budgets are labelled: nominal targets, and the largest certified ratio
    ratio = max(
        r["max_accounted_over_target"]
        for d in s["results"].values()
        for r in d.values()
        if "max_accounted_over_target" in r  # FedAvg is not private
    )
    report = (tmp_path / "report.md").read_text()
    assert "eps_i is NOMINAL" in report and "add/remove, example level" in report
    assert f"at most {ratio:.3f} x eps_i" in report


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


# --------------------------------------------------------------------------- overrides, partial
def test_overrides_parsed_and_unknown_keys_refused() -> None:
    from privdl.errors import ConfigError
    from privdl.experiments.robust_hdp import METHODS, TABLE_OVERRIDES, parse_overrides

    got = parse_overrides(
        {"dists": "Dist9, Dist1", "methods": "WeiAvg,robust-hdp", "rounds": "3", "seeds": "2"},
        accepted=TABLE_OVERRIDES,
        methods=METHODS,
    )
    assert got == {
        "dists": ["Dist9", "Dist1"],
        "methods": ["weiavg", "robust-hdp"],
        "rounds": 3,
        "seeds": 2,
    }
    with pytest.raises(ConfigError, match="accepted: dists, methods, rounds, seeds"):
        parse_overrides({"lr": "1"}, accepted=TABLE_OVERRIDES, methods=METHODS)
    for bad in ({"dists": "Dist10"}, {"methods": "fedprox"}, {"rounds": "0"}, {"seeds": "x"}):
        with pytest.raises(ConfigError):
            parse_overrides(bad, accepted=TABLE_OVERRIDES, methods=METHODS)
    with pytest.raises(ConfigError, match="accepted: none"):
        get("robust-hdp-table3").run(None, quick=True, overrides={"rounds": "2"})


def test_paper_check_counts_only_the_dists_run() -> None:
    from privdl.experiments import load_preset
    from privdl.experiments.robust_hdp import table_checks

    paper = load_preset("robust-hdp-mnist")["paper"]

    def cells(offsets):
        return {
            "robust-hdp": {
                f"Dist{d}": {
                    "accuracy": paper["robust-hdp"][d - 1] + off,
                    "weights": [0.5, 0.5],
                    "oracle_weights": [0.5, 0.5],
                    "noise": 1.0,
                    "oracle_noise": 1.0,
                    "max_accounted_over_target": 1.0,
                }
                for d, off in offsets.items()
            }
        }

    def verdict(offsets):
        res = cells(offsets)
        checks = table_checks(res, paper, [f"Dist{d}" for d in range(1, 10)], quick=False)
        return {k: v for k, v in checks.items() if "points of paper" in k}

    assert verdict({1: 0.5, 2: -1.9, 3: 3.0, 4: -5.0}) == {
        "RHDP within 2 points of paper for >= 3 of the 4 dists run": False
    }
    assert verdict({1: 0.5, 2: -1.9, 3: 1.0, 4: -5.0}) == {
        "RHDP within 2 points of paper for >= 3 of the 4 dists run": True
    }
    assert verdict({6: 1.5, 9: -0.1}) == {
        "RHDP within 2 points of paper for >= 2 of the 2 dists run": True
    }
    assert (
        table_checks(cells({6: 0.0}), paper, ["Dist6"], quick=True).get(
            "RHDP within 2 points of paper for >= 1 of the 1 dists run"
        )
        is None
    )  # quick accuracies are not compared with the paper


def test_partial_report_after_each_cell(tmp_path, monkeypatch) -> None:
    """A run cut off after its first (method, dist) leaves a readable report of that cell."""
    import privdl.experiments.robust_hdp as rh

    real, calls = rh.train_and_evaluate, []

    def cut_after_first(**kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(rh, "train_and_evaluate", cut_after_first)
    with pytest.raises(KeyboardInterrupt):
        get("robust-hdp-cifar10").run(
            tmp_path,
            quick=True,
            device="cpu",
            overrides={"methods": "weiavg,fedavg", "rounds": "1"},
        )
    assert calls[0]["rounds"] == 1 and calls[0]["method"] == "weiavg"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] is False and summary["methods"] == ["weiavg", "fedavg"]
    assert list(summary["results"]) == ["weiavg"]
    report = (tmp_path / "report.md").read_text()
    assert "PARTIAL" in report and "not run (73.55)" in report
    assert "| weiavg | " in report and "(29.65, " in report  # paper Table 14, Dist3, WeiAvg


def test_resume_continues_a_cut_off_run_bit_for_bit(tmp_path, monkeypatch) -> None:
    """Cut a run mid-cell, resume it: the same numbers as an uninterrupted run, with the
    finished work kept (the checkpoint holds Robust-HDP's frozen RPCA estimates too)."""
    import privdl.experiments.robust_hdp as rh
    from privdl.errors import ConfigError
    from privdl.robust.trainer import FederatedDPSGD

    rep = get("robust-hdp-cifar10")
    opts = dict(quick=True, device="cpu", overrides={"methods": "robust-hdp,weiavg", "rounds": "4"})
    whole = rep.run(tmp_path / "whole", **opts)

    monkeypatch.setattr(rh, "CHECKPOINT_EVERY_S", 0.0)  # a checkpoint after every round
    real_step, seen = FederatedDPSGD.step, []

    def counting(self, state):
        if len(seen) == limit[0]:
            raise KeyboardInterrupt
        seen.append(state.round)
        return real_step(self, state)

    limit = [2]  # robust-hdp's rounds 0 and 1, then cut
    monkeypatch.setattr(FederatedDPSGD, "step", counting)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        rep.run(cut, **opts)
    assert (cut / "cells" / "robust-hdp_Dist3_seed1.pt").exists()
    with pytest.raises(ConfigError, match="--resume"):  # nothing is overwritten silently
        rep.run(cut, **opts)

    seen.clear()
    limit[0] = 99
    resumed = rep.run(cut, **opts, resume=True)
    assert seen == [2, 3, 0, 1, 2, 3]  # robust-hdp continued at round 2, then weiavg
    assert resumed["results"] == whole["results"]  # accuracy, weights, noise: bit for bit
    assert sorted(p.name for p in (cut / "cells").iterdir()) == [
        "robust-hdp_Dist3_seed1.json",
        "weiavg_Dist3_seed1.json",
    ]

    seen.clear()
    again = rep.run(cut, **opts, resume=True)  # every cell kept: nothing trains
    assert seen == [] and again["results"] == whole["results"]
    other = dict(opts, overrides={"methods": "robust-hdp", "rounds": "5"})
    with pytest.raises(ConfigError, match="other settings"):
        rep.run(cut, **other, resume=True)


def test_resume_flag_is_refused_where_a_reproduction_cannot_resume(capsys) -> None:
    from privdl.cli.main import main

    assert main(["reproduce", "robust-hdp-table3", "--quick", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot resume" in err[0]


# --------------------------------------------------------------------------- falsification
def test_falsified_overrides_parsed_and_bad_ones_refused() -> None:
    from privdl.errors import ConfigError
    from privdl.experiments.robust_hdp import FALSIFIED_METHODS, parse_overrides

    accepted = ("methods", "reported", "rounds")
    got = parse_overrides(
        {"reported": "50, 0.95,5,5", "methods": "PFA,weiavg", "rounds": "20"},
        accepted=accepted,
        methods=FALSIFIED_METHODS,
    )
    assert got == {"reported": [0.95, 5.0, 50.0], "methods": ["pfa", "weiavg"], "rounds": 20}
    for bad in (
        {"reported": "0.5,50"},  # below the falsifier's true eps: not a falsification
        {"reported": "x"},
        {"reported": "inf"},
        {"reported": ""},
        {"methods": "mineps"},  # not part of Fig. 5 (right)
    ):
        with pytest.raises(ConfigError):
            parse_overrides(bad, accepted=accepted, methods=FALSIFIED_METHODS)
    with pytest.raises(ConfigError, match="accepted: methods, reported, rounds"):
        get("robust-hdp-falsified").run(None, quick=True, overrides={"dists": "Dist1"})


def _falsified_cells(grid, eps, *, drop):
    """Cells consistent with the paper's Fig 5 right (WeiAvg's closed-form weight), WeiAvg/PFA losing ``drop``
    points per grid step, RHDP and DPFedAvg unchanged."""
    others = sum(eps[1:])
    flat = {"accuracy": 85.0, "weights": [0.1, 0.9], "noise": 0.5}
    return {
        "robust-hdp": [dict(flat) for _ in grid],
        "dpfedavg": [dict(flat, noise=1.0) for _ in grid],
        "weiavg": [
            {"accuracy": 85.0 - drop * k, "weights": [g / (g + others), 0.0], "noise": 1.0 + g}
            for k, g in enumerate(grid)
        ],
        "pfa": [
            {"accuracy": 84.0 - drop * k, "weights": [0.0], "noise": 0.0} for k in range(len(grid))
        ],
    }


def test_falsified_checks_pass_on_the_papers_pattern_and_fail_otherwise() -> None:
    from privdl.experiments.robust_hdp import EPS_LISTS_20, falsified_checks

    eps, grid = list(EPS_LISTS_20["Dist5"]), [0.95, 5.0, 50.0]
    good = falsified_checks(_falsified_cells(grid, eps, drop=2.0), grid, eps=eps, quick=False)
    assert len(good) == 10 and all(good.values()), good

    flat = falsified_checks(_falsified_cells(grid, eps, drop=0.2), grid, eps=eps, quick=False)
    assert {k for k, v in flat.items() if not v} == {
        "WeiAvg loses >= 1 accuracy points at the largest eps'",
        "PFA loses >= 1 accuracy points at the largest eps'",
    }
    assert not any(
        "accuracy points" in k
        for k in falsified_checks(_falsified_cells(grid, eps, drop=0.2), grid, eps=eps, quick=True)
    )  # quick runs (2 rounds of a linear model) say nothing about accuracy

    moved = _falsified_cells(grid, eps, drop=2.0)
    moved["robust-hdp"][-1]["weights"] = [0.2, 0.8]  # RHDP must not read the reported eps
    moved["weiavg"][1]["weights"][0] += 1e-3  # nor WeiAvg leave its closed form
    moved["weiavg"][-1]["noise"] = 0.5  # below the truthful run's 1.95
    bad = falsified_checks(moved, grid, eps=eps, quick=False)
    assert not bad["RHDP weights unchanged by the falsified eps"]
    assert not bad["WeiAvg falsifier weight = eps'/(eps' + sum of the others)"]
    assert not bad["WeiAvg aggregate noise larger at the largest eps' than at the smallest"]
    assert not bad["WeiAvg at largest eps' noisier than RHDP"]
    # 2-means on Dist5's reported eps: 10 public clients, client 0 among them, at eps' = 0.95
    # and 1.2; 7 at eps' = 2; the falsifier alone from eps' = 5
    assert not falsified_checks(
        _falsified_cells([0.95, 1.2], eps, drop=2.0), [0.95, 1.2], eps=eps, quick=False
    )["PFA's public cluster narrows to the falsifier as eps' grows"]
    only = falsified_checks(
        {"weiavg": _falsified_cells(grid, eps, drop=2.0)["weiavg"]}, grid, eps=eps, quick=False
    )
    assert set(only) == {  # the checks follow the methods that ran
        "WeiAvg falsifier weight = eps'/(eps' + sum of the others)",
        "WeiAvg aggregate noise larger at the largest eps' than at the smallest",
        "WeiAvg loses >= 1 accuracy points at the largest eps'",
    }


def test_fedavg_runs_once_for_every_dist(tmp_path, monkeypatch) -> None:
    """Non-private FedAvg ignores the Dist's budgets: one cell (named by its lr) serves every
    Dist, and training it under two Dists' budgets gives the same numbers."""
    import privdl.experiments.robust_hdp as rh

    real, calls = rh.train_and_evaluate, []

    def counting(**kw):
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(rh, "train_and_evaluate", counting)
    rep = get("robust-hdp-cifar10")
    opts = dict(quick=True, device="cpu")
    s = rep.run(
        tmp_path, **opts, overrides={"methods": "fedavg", "dists": "Dist1,Dist2", "rounds": "1"}
    )
    assert len(calls) == 1
    assert s["results"]["fedavg"]["Dist1"] == s["results"]["fedavg"]["Dist2"]
    assert [p.name for p in (tmp_path / "cells").glob("*.json")] == ["fedavg_lr0.002_seed1.json"]
    # the sharing is sound: a fresh run under Dist2's budgets is the same, bit for bit
    kw = dict(calls[0], eps=list(rh.EPS_LISTS_20["Dist2"][: len(calls[0]["eps"])]))
    assert kw["eps"] != calls[0]["eps"]
    kw.pop("checkpoint"), kw.pop("key")
    again, shared = real(**kw), s["results"]["fedavg"]["Dist1"]
    assert again == {k: shared[k] for k in again}


def test_resume_reaccounts_a_cell_made_before_the_default_accountant(tmp_path, monkeypatch) -> None:
    """A kept private cell without a recorded accountant (made when RDP alone accounted it) is
    re-accounted on --resume by today's default, without training, to exactly what a fresh run
    records; a cell that has one is kept as is."""
    from privdl.robust.trainer import FederatedDPSGD

    rep = get("robust-hdp-cifar10")
    opts = dict(quick=True, device="cpu", overrides={"methods": "weiavg", "rounds": "2"})
    whole = rep.run(tmp_path, **opts)
    cell_path = tmp_path / "cells" / "weiavg_Dist3_seed1.json"
    fresh = json.loads(cell_path.read_text())
    assert fresh["result"]["accountant"]  # recorded by a run made today

    stale = json.loads(cell_path.read_text())
    del stale["result"]["accountant"]
    stale["result"]["max_accounted_over_target"] = 123.0  # what an older accountant said
    cell_path.write_text(json.dumps(stale))

    def no_training(self, state):
        raise AssertionError("a kept cell must not train")

    monkeypatch.setattr(FederatedDPSGD, "step", no_training)
    again = rep.run(tmp_path, **opts, resume=True)
    assert json.loads(cell_path.read_text()) == fresh
    assert again["results"] == whole["results"]
