"""privdl.accounting.compare: the side-by-side rows, the trade-off and (epsilon, delta) curves.

Oracles: mpmath's normal cdf and erfinv at 40 digits (G_mu and the Balle-Wang delta(eps)), the
classic conversion evaluated by hand on the RDP orders, closed forms of a single (eps, delta)
pair's trade-off, and the lead's ``tightest_epsilon``.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from privdl.accounting.compare import (
    DEFAULT_DELTAS,
    TRADEOFF_DELTAS,
    compare_decor,
    compare_event,
    epsilon_delta_curve,
    privacy_curves,
    tradeoff_curve,
    tradeoff_from_pairs,
)
from privdl.accounting.conversion import compose_convert, gaussian_delta, gaussian_epsilon
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.rdp_pld import RDP_ORDERS
from privdl.accounting.tightest import tightest_epsilon
from privdl.errors import PrivacyError
from privdl.topology import parse_graph

mpmath.mp.dps = 40


def mp_tradeoff(mu: float, alpha: float) -> float:
    """Phi(Phi^-1(1 - alpha) - mu), Phi^-1(p) = sqrt(2) erfinv(2p - 1)."""
    a = mpmath.mpf(alpha)
    return float(mpmath.ncdf(mpmath.sqrt(2) * mpmath.erfinv(2 * (1 - a) - 1) - mu))


def mp_delta(mu: float, eps: float) -> float:
    """Balle-Wang: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    m, e = mpmath.mpf(mu), mpmath.mpf(eps)
    return float(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))


UNSAMPLED = SubsampledGaussianEvent(2.0, 1.0, 100, sampling="none")
POISSON_REPLACE = SubsampledGaussianEvent(1.0, 0.01, 200, neighbouring="replace_one")
POISSON_ADD = SubsampledGaussianEvent(1.0, 0.02, 100)
FIXED = SubsampledGaussianEvent(
    1.0, 0.01, 200, sampling="fixed_size", neighbouring="replace_one", dataset_size=1000
)


@pytest.mark.parametrize("mu", [0.3, 1.0, 3.0])
def test_tradeoff_curve_is_g_mu(mu):
    alphas = [1e-6, 1e-3, 0.05, 0.3, 0.5, 0.9, 0.999]
    got = tradeoff_curve(mu, alphas)
    for a, b in zip(alphas, got, strict=True):
        assert b == pytest.approx(mp_tradeoff(mu, a), rel=1e-9, abs=1e-15)
    assert tradeoff_curve(mu, [0.0, 1.0]).tolist() == [1.0, 0.0]
    assert tradeoff_curve(0.0, [0.25])[0] == pytest.approx(0.75)  # mu = 0: perfect privacy


def test_tradeoff_curve_rejects_bad_input():
    with pytest.raises(PrivacyError):
        tradeoff_curve(-1.0, [0.5])
    with pytest.raises(PrivacyError):
        tradeoff_curve(1.0, [1.5])


def test_tradeoff_from_one_pair_closed_form():
    # (0, delta)-DP: beta = 1 - delta - alpha; (log 2, 0)-DP at alpha 0.5: max(0, 0.25) = 0.25
    assert tradeoff_from_pairs([0.0], [0.1], [0.2])[0] == pytest.approx(0.7)
    assert tradeoff_from_pairs([math.log(2.0)], [0.0], [0.5])[0] == pytest.approx(0.25)
    # alpha small: the steep piece 1 - delta - e^eps alpha
    assert tradeoff_from_pairs([math.log(2.0)], [0.0], [0.1])[0] == pytest.approx(0.8)
    # several pairs: the largest of their lower bounds
    both = tradeoff_from_pairs([0.0, math.log(2.0)], [0.1, 0.0], [0.1, 0.5])
    assert both.tolist() == pytest.approx([0.8, 0.4])


def test_compare_unsampled_gaussian_row_is_exact_and_tightest():
    delta = 1e-5
    rows = {r["accountant"]: r for r in compare_event(UNSAMPLED, delta=delta)}
    g = rows["gaussian"]
    assert g["epsilon"] == gaussian_epsilon(100 / (2 * 2.0**2), delta)
    assert g["mu"] == pytest.approx(5.0) and g["tightest"] and g["certified"]
    assert mp_delta(5.0, g["epsilon"]) == pytest.approx(delta, rel=1e-6)  # independent of privdl
    assert [r["accountant"] for r in rows.values() if r["tightest"]] == ["gaussian"]
    for name in ("pld", "rdp", "rdp-classic"):
        assert rows[name]["certified"] and rows[name]["epsilon"] >= g["epsilon"] * (1 - 1e-9)
    # classic: min over the orders of alpha rho + log(1/delta)/(alpha - 1), rho = T/(2 z^2)
    orders = np.asarray(RDP_ORDERS)
    by_hand = np.min(orders * 12.5 + math.log(1 / delta) / (orders - 1))
    assert rows["rdp-classic"]["epsilon"] == pytest.approx(by_hand, rel=1e-9)
    assert rows["rdp"]["epsilon"] < rows["rdp-classic"]["epsilon"]


@pytest.mark.parametrize("event", [POISSON_REPLACE, POISSON_ADD, FIXED], ids=str)
def test_tightest_mark_is_the_minimum_certified_row(event):
    rows = compare_event(event, delta=1e-5)
    marked = [r for r in rows if r["tightest"]]
    assert len(marked) == 1 and marked[0]["certified"]
    certified = [r["epsilon"] for r in rows if r["certified"]]
    assert marked[0]["epsilon"] == min(certified)
    got = tightest_epsilon(event, delta=1e-5)
    assert marked[0]["accountant"] == got.accountant
    assert marked[0]["epsilon"] == pytest.approx(got.epsilon, rel=1e-6)
    for r in rows:
        if r["epsilon"] is None:
            assert not r["certified"] and r["note"].startswith("not applicable")
    names = {r["accountant"]: r for r in rows}
    assert names["gaussian"]["epsilon"] is None  # subsampled: not a Gaussian mechanism
    if event.sampling == "fixed_size":
        assert names["pld"]["epsilon"] is None and "fixed-size" in names["pld"]["note"]
    if event.neighbouring == "replace_one" and event.sampling == "poisson":
        assert names["rdp"]["epsilon"] is None and names["pld"]["tightest"]
    if names["rdp"]["epsilon"] is not None:
        assert names["rdp-classic"]["epsilon"] >= names["rdp"]["epsilon"]


def test_small_noise_has_no_pld_row():
    rows = compare_event(SubsampledGaussianEvent(0.1, 0.01, 10), delta=1e-5)
    pld = next(r for r in rows if r["accountant"] == "pld")
    assert pld["epsilon"] is None and "0.25" in pld["note"]


def test_compare_decor_user_level():
    graph = parse_graph("ring:8").graph
    settings = dict(sigma_cdp=1.0, sigma_cor=10.0, steps=100)
    rows = {r["accountant"]: r for r in compare_decor(graph, delta=1e-5, **settings)}
    assert list(rows) == ["gaussian", "improved", "classic"]
    step = rows["gaussian"]["mu"] ** 2 / (2 * 100)
    assert rows["gaussian"]["epsilon"] == pytest.approx(
        compose_convert(step, steps=100, delta=1e-5, conversion="gaussian"), rel=1e-12
    )
    assert rows["gaussian"]["tightest"] and not rows["classic"]["tightest"]
    assert rows["gaussian"]["epsilon"] <= rows["improved"]["epsilon"] <= rows["classic"]["epsilon"]
    assert "secrdp+classic" in rows["classic"]["label"]


def test_compare_decor_example_level_legacy_is_never_tightest():
    graph = parse_graph("ring:8").graph
    rows = compare_decor(graph, delta=1e-5, sigma_cdp=0.5, sigma_cor=1.0, steps=100,
                         sampling_rate=0.1, batch_size=10)  # fmt: skip
    by = {r["accountant"]: r for r in rows}
    legacy = by["legacy-uncomposed"]
    assert legacy["epsilon"] is not None and not legacy["certified"] and not legacy["tightest"]
    # the legacy number is the smallest here, yet not a guarantee: the mark goes elsewhere
    assert legacy["epsilon"] < min(r["epsilon"] for r in rows if r["certified"])
    marked = [r for r in rows if r["tightest"]]
    assert len(marked) == 1
    assert marked[0]["epsilon"] == min(r["epsilon"] for r in rows if r["certified"])
    assert by["pld"]["epsilon"] is None  # fixed-size sampling: no PLD in dp-accounting
    assert by["rdp"]["epsilon"] <= by["gaussian-unsampled"]["epsilon"]


@pytest.mark.parametrize("mu", [0.5, 2.0])
def test_epsilon_delta_curve_of_mu_inverts_gaussian_delta(mu):
    curve = epsilon_delta_curve(mu)
    assert curve["deltas"] == list(DEFAULT_DELTAS) and len(curve["deltas"]) == 17
    assert curve["deltas"][0] == pytest.approx(1e-10) and curve["deltas"][-1] == pytest.approx(1e-2)
    for d, e in zip(curve["deltas"], curve["epsilons"], strict=True):
        assert gaussian_delta(mu, e) == pytest.approx(d, rel=1e-6)
        assert mp_delta(mu, e) <= d * (1 + 1e-6)  # the certified side
    assert all(np.diff(curve["epsilons"]) < 0)  # a larger delta, a smaller epsilon


def test_epsilon_delta_curve_of_sampled_event_is_tightest_per_delta():
    deltas = [1e-8, 1e-5, 1e-3]
    curve = epsilon_delta_curve(POISSON_REPLACE, deltas=deltas)
    assert curve["mu"] is None
    for d, e, name in zip(deltas, curve["epsilons"], curve["accountants"], strict=True):
        got = tightest_epsilon(POISSON_REPLACE, delta=d)
        assert e == pytest.approx(got.epsilon, rel=1e-9) and name == got.accountant


def test_conservative_tradeoff_lies_below_exact_g_mu():
    mu = 1.5
    pairs = epsilon_delta_curve(mu, deltas=TRADEOFF_DELTAS)
    alphas = np.linspace(0, 1, 201)
    lower = tradeoff_from_pairs(pairs["epsilons"], pairs["deltas"], alphas)
    exact = tradeoff_curve(mu, alphas)
    assert np.all(lower <= exact + 1e-9)
    assert np.max(exact - lower) < 0.05  # and close: 48 pairs


def test_privacy_curves_exact_and_conservative():
    exact = privacy_curves(UNSAMPLED)
    assert exact["mu"] == pytest.approx(5.0) and exact["tradeoff"]["kind"].startswith("exact")
    sampled = privacy_curves(FIXED)
    t = sampled["tradeoff"]
    assert sampled["mu"] is None and t["kind"].startswith("conservative")
    a, b = np.asarray(t["alphas"]), np.asarray(t["betas"])
    assert np.all(np.diff(b) <= 1e-12) and np.all(b <= 1 - a + 1e-12) and np.all(b >= 0)
    # more certified pairs only raise the lower bound: above the printed curve's own pairs
    ed = sampled["epsilon_delta"]
    assert np.all(b >= tradeoff_from_pairs(ed["epsilons"], ed["deltas"], a) - 1e-12)
    assert ed["accountants"] == ["rdp"] * len(ed["deltas"])  # fixed size: RDP only
