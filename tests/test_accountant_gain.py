"""The committed "what the tight defaults buy" table (docs/accounting.md) is the script's output
for the records it read: ``gain.md`` re-rendered from ``gain.json`` by
``tools/accountant_gain.py`` is identical (no number typed in), and every row's noise is
certified: each accountant's sigma gives the recorded epsilon, which meets the target, and the
tightest default's sigma meets it by the exact Gaussian (Balle and Wang 2018, Thm 8, evaluated
here with scipy) while the old default's is larger.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from scipy.stats import norm

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "accountant-gain"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "accountant_gain", ROOT / "tools" / "accountant_gain.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads((RESULTS / "gain.json").read_text())


def _tuples(x):
    """JSON turned (mean, std) pairs into lists; the renderer takes either."""
    return tuple(x) if isinstance(x, list) else x


def test_markdown_is_the_scripts_rendering_of_the_json(doc):
    tool = _tool()
    rows = [{k: _tuples(v) for k, v in r.items()} for r in doc["rows"]]
    base = {k: _tuples(v) for k, v in doc["non_private"].items()}
    assert tool._markdown(rows, base, doc["meta"]) == (RESULTS / "gain.md").read_text()
    assert doc["meta"]["command"] in (ROOT / "docs" / "accounting.md").read_text()
    assert (
        '--8<-- "experiments/results/accountant-gain/gain.md"'
        in (ROOT / "docs" / "accounting.md").read_text()
    )


def _exact_gaussian_delta(eps: float, mu: float) -> float:
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_rows_certified_and_the_default_needs_less_noise(doc):
    assert {r["epsilon"] for r in doc["rows"]} == {1.0, 3.0, 10.0}
    assert len(doc["rows"]) == 9 and len(doc["meta"]["seeds"]) >= 1
    for r in doc["rows"]:
        old, new = r["privacy_rdp"], r["privacy_tightest"]
        assert old["epsilon"] <= r["epsilon"] * (1 + 1e-9) and new["epsilon"] <= r["epsilon"] * (
            1 + 1e-9
        )
        assert new["accountant"].endswith("gaussian") and old["accountant"].endswith("classic")
        assert (new["unit"], new["delta"]) == ("user", 1e-5)
        assert r["sigma_tightest"] < r["sigma_rdp"]
        assert r["noise_saved"] == pytest.approx(1 - r["sigma_tightest"] / r["sigma_rdp"])
        # the default's own record: mu-GDP with the recorded mu meets the target exactly
        mu = new["mu"]
        assert _exact_gaussian_delta(r["epsilon"], mu) <= 1e-5 * (1 + 1e-6)
        assert _exact_gaussian_delta(r["epsilon"], mu * 1.01) > 1e-5  # and is tight
        seeds = r["seeds"]
        diffs = [
            b - a for a, b in zip(seeds["accuracy_rdp"], seeds["accuracy_tightest"], strict=True)
        ]
        assert r["accuracy_gain"][0] == pytest.approx(sum(diffs) / len(diffs), abs=1e-12)
        if r["sigma_cor_rdp"]:  # DECOR's correlated noise shrinks by the same factor
            ratio = r["sigma_cor_tightest"] / r["sigma_cor_rdp"]
            assert ratio == pytest.approx(r["sigma_tightest"] / r["sigma_rdp"], rel=1e-6)
