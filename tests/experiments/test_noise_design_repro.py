"""``privdl reproduce noise-design --quick``: the table's orderings hold at equal epsilon."""

from __future__ import annotations

import json

import pytest

from privdl.experiments import get


@pytest.mark.slow
def test_quick_reproduction_orders_the_methods(tmp_path) -> None:
    get("noise-design").run(tmp_path, quick=True)
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert rows
    for row in rows:
        assert row["epsilon_accounted"] <= 10.0
        assert row["cdp"] <= row["design"] * (1 + 1e-6)
        assert row["design"] <= row["decor_scalar"] * (1 + 1e-9) <= row["ldp"] * (1 + 1e-9)
        if row["p"] <= 0.6:
            assert row["ratio_vs_decor"] <= 0.9
    assert "| 0.4 |" in (tmp_path / "report.md").read_text()
    accuracy = json.loads((tmp_path / "summary.json").read_text())["accuracy"]
    assert {r["method"] for r in accuracy} == {"decor_scalar", "design"}
    for row in accuracy:  # equal accounted epsilon: each noise scaled to the target, not past it
        assert 10.0 * (1 - 1e-5) <= row["epsilon_accounted"] <= 10.0
        assert 0.5 < row["accuracy"] <= 1.0
    assert (tmp_path / "accuracy.png").stat().st_size > 0
