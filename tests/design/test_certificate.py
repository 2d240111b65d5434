"""The accountant's low-rank certificate for curious users, DECOR's coarse scalar search at large
n and the accuracy grid of ``privdl reproduce noise-design`` (issue 33)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import privdl.accounting.design as acc
from privdl.accounting.design import design_step_rdp
from privdl.design import objective
from privdl.design.objective import best_scalar, make_problem
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.topology.graphs import erdos_renyi, random_regular
from privdl.topology.mixing import mixing_matrix

pytestmark = pytest.mark.filterwarnings("ignore::privdl.accounting.secrdp.PrivacyWarning")


def _random_design(topo, rng: np.random.Generator, ratio: float = 5.0) -> NoiseDesign:
    m = topo.num_edges
    edge = rng.uniform(0.0, ratio, m) * (rng.random(m) > 0.2)  # some edges without noise
    return NoiseDesign(rng.uniform(0.05, 2.0, topo.n), edge, topo.edges)


@pytest.mark.parametrize("seed", range(8))
def test_lowrank_certificate_matches_one_plain_inverse_per_deleted_vertex(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 26))
    topo = erdos_renyi(n, float(rng.uniform(0.15, 0.6)), seed + 1, require_connected=False)
    design = _random_design(topo, rng)
    low = design_step_rdp(topo, design, adversary="curious", method="lowrank")
    naive = design_step_rdp(topo, design, adversary="curious", method="naive")
    assert low.method == "design-lowrank"
    assert low.step_rdp == pytest.approx(naive.step_rdp, rel=1e-10)
    assert (low.worst_colluders, low.worst_node) == (naive.worst_colluders, naive.worst_node)
    assert low.disconnected == naive.disconnected


def test_auto_takes_the_lowrank_certificate_on_large_graphs(monkeypatch) -> None:
    monkeypatch.setattr(acc, "LOWRANK_FROM", 20)  # "large" made small: the same code path
    topo = random_regular(30, 4, 3)
    design = _random_design(topo, np.random.default_rng(0))
    auto = design_step_rdp(topo, design, adversary="curious")
    grounded = design_step_rdp(topo, design, adversary="curious", method="grounded")
    assert auto.method == "design-lowrank"
    assert auto.step_rdp == pytest.approx(grounded.step_rdp, rel=1e-10)


def test_ill_conditioned_designs_are_grounded_instead() -> None:
    topo = erdos_renyi(12, 0.4, 2, require_connected=False)
    rng = np.random.default_rng(1)
    design = NoiseDesign(np.full(12, 1e-4), rng.uniform(1e3, 2e3, topo.num_edges), topo.edges)
    step = design_step_rdp(topo, design, adversary="curious", method="lowrank")
    naive = design_step_rdp(topo, design, adversary="curious", method="grounded")
    assert step.method == "design-grounded"
    assert step.step_rdp == naive.step_rdp


def test_coarse_scalar_search_on_large_graphs_is_as_good_as_the_fine_one(monkeypatch) -> None:
    monkeypatch.setattr(objective, "COARSE_SCALAR_FROM", 20)  # "large" made small
    topo = random_regular(30, 4, 2)
    mix = mixing_matrix(topo, "metropolis").dense()
    problem = make_problem(topo, mix, horizon=5, adversary="curious")
    coarse = best_scalar(topo, problem)
    monkeypatch.setattr(objective, "COARSE_SCALAR_FROM", 10**9)  # the fine search
    fine = best_scalar(topo, problem)
    assert coarse[2] == pytest.approx(fine[2], rel=1e-6)
    assert coarse[2] >= fine[2] * (1 - 1e-9)  # both feasible pairs: the fine one is no worse


@pytest.mark.slow
def test_accuracy_grid_is_at_equal_accounted_epsilon_and_resumes(tmp_path: Path) -> None:
    from privdl.experiments.noise_design import GRID_METHODS, run_accuracy_grid

    kwargs = {"cells": tmp_path / "cells", "seeds": (1,), "ps": (0.6,), "steps": 5}
    first = run_accuracy_grid(tmp_path, **kwargs)
    assert [r["method"] for r in first["rows"]] == list(GRID_METHODS)
    for row in first["rows"]:
        assert 9.99 <= row["epsilon_accounted"] <= 10.0 + 1e-9, row
        assert ("trusted-dealer" in row["label"]) == (row["method"] == "whisper"), row
    again = run_accuracy_grid(tmp_path, **kwargs)
    assert again["cells_reused"] == len(GRID_METHODS)
    assert [r["accuracy"] for r in again["rows"]] == [r["accuracy"] for r in first["rows"]]
    curious = run_accuracy_grid(tmp_path, adversary="curious", **kwargs)
    assert [r["method"] for r in curious["rows"]] == [m for m in GRID_METHODS if m != "whisper"]
    for row in curious["rows"]:
        assert 9.99 <= row["epsilon_accounted"] <= 10.0 + 1e-9, row
    with pytest.raises(ValueError, match="whisper"):
        run_accuracy_grid(tmp_path, adversary="curious", methods=("whisper",), **kwargs)


def test_merged_grid_keeps_old_rows_and_borrows_only_threat_free_methods() -> None:
    from privdl.experiments.noise_design import merge_grid

    def row(method: str, seed: int, acc: float) -> dict:
        return {"p": 0.2, "graph": "g", "method": method, "seed": seed, "accuracy": acc}

    def grid(*rows: dict) -> dict:
        return {"setting": {}, "rows": list(rows), "seconds": 1.0, "train_seconds": 1.0,
                "cells_reused": 0}  # fmt: skip

    old = grid(row("design", 1, 0.5), row("cdp", 1, 0.8))
    new = grid(row("design", 1, 0.6), row("whisper", 1, 0.7))
    merged = merge_grid(old, new)
    assert [(r["method"], r["accuracy"]) for r in merged["rows"]] == [
        ("design", 0.6), ("whisper", 0.7), ("cdp", 0.8)
    ]  # fmt: skip
    assert len(merged["runs"]) == 2
    eaves = [row("ldp", 1, 0.1), row("design", 1, 0.9), row("cdp", 1, 0.8)]
    curious = merge_grid(None, grid(row("design", 1, 0.4)), borrowed=eaves)
    assert [(r["method"], r["accuracy"]) for r in curious["rows"]] == [
        ("ldp", 0.1), ("design", 0.4), ("cdp", 0.8)
    ]  # fmt: skip
    assert curious["borrowed"] == ["cdp", "ldp"]
    assert curious["rows"][0]["borrowed_from"] == "eavesdropper"
