"""The auditing estimators against independent oracles: scipy's exact binomial confidence
interval and binomial CDF, the hypothesis-testing bound recomputed by hand, and Monte Carlo on
the Gaussian mechanism, whose true epsilon is known exactly (Balle and Wang 2018)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from privdl.audit import (
    clopper_pearson_upper,
    epsilon_lower_bound,
    epsilon_lower_bound_from_scores,
    gdp_epsilon_lower_bound,
)
from privdl.errors import PrivacyError


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The true epsilon of N(0, 1) vs N(mu, 1) at delta (Balle and Wang 2018, Thm 8), by root
    finding on scipy's normal CDF: independent of privdl's conversion code."""

    def gap(e: float) -> float:
        return (
            stats.norm.cdf(-e / mu + mu / 2)
            - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
            - delta
        )

    return float(optimize.brentq(gap, 0.0, 100.0, xtol=1e-12))


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (9, 10), (17, 1000), (500, 1000)])
@pytest.mark.parametrize("alpha", [0.025, 0.05])
def test_clopper_pearson_upper_is_scipys_exact_interval(k, n, alpha):
    ours = clopper_pearson_upper(k, n, alpha)
    # the two-sided exact interval at level 1 - 2 alpha has the one-sided 1 - alpha upper limit
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact").high
    assert ours == pytest.approx(ref, rel=1e-9)
    assert stats.binom.cdf(k, n, ours) == pytest.approx(alpha, rel=1e-6)  # the definition
    assert clopper_pearson_upper(n, n, alpha) == 1.0


def test_epsilon_lower_bound_is_the_testing_inequality_at_the_limits():
    fp, neg, fn, pos, delta, conf = 12, 5000, 2100, 5000, 1e-5, 0.95
    got = epsilon_lower_bound(
        false_positives=fp, negatives=neg, false_negatives=fn, positives=pos, delta=delta,
        confidence=conf,
    )  # fmt: skip
    alpha = (1 - conf) / 2
    fpr = optimize.brentq(lambda p: stats.binom.cdf(fp, neg, p) - alpha, 1e-12, 1 - 1e-12)
    fnr = optimize.brentq(lambda p: stats.binom.cdf(fn, pos, p) - alpha, 1e-12, 1 - 1e-12)
    want = max(math.log((1 - delta - fnr) / fpr), math.log((1 - delta - fpr) / fnr))
    assert got.epsilon_lower == pytest.approx(want, rel=1e-6)
    assert (got.fpr_upper, got.fnr_upper) == (pytest.approx(fpr), pytest.approx(fnr))
    assert got.method == "clopper-pearson" and got.confidence == conf
    # a test no better than chance certifies nothing
    none = epsilon_lower_bound(false_positives=2500, negatives=5000, false_negatives=2500,
                               positives=5000, delta=delta)  # fmt: skip
    assert none.epsilon_lower == 0.0


def _gaussian_scores(mu: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), mu + rng.standard_normal(n)


@pytest.mark.parametrize("method", ["clopper-pearson", "gdp"])
def test_bounds_are_sound_on_the_gaussian_mechanism(method):
    """20 independent audits of N(0,1) vs N(mu,1) (2000 trials each side): at 95% confidence a
    lower bound above the true epsilon may happen in about 1 of 20; more than 3 would fail."""
    mu, delta = 1.0, 1e-5
    truth = exact_gaussian_epsilon(mu, delta)
    above = 0
    for seed in range(20):
        out, inn = _gaussian_scores(mu, 2000, seed)
        got = epsilon_lower_bound_from_scores(out, inn, delta=delta, method=method,
                                              rng=np.random.default_rng(seed))  # fmt: skip
        above += got.epsilon_lower > truth
        assert got.threshold is not None
    assert above <= 3


@pytest.mark.parametrize("target", [1.0, 4.0])
def test_gdp_bound_reaches_half_the_true_epsilon_with_many_trials(target):
    """Tightness of the estimator on ideal scores (the mechanism is exactly mu-GDP): with 10^5
    trials a side, the GDP bound certifies more than half of the true epsilon at epsilon 1 and 4
    (the Clopper-Pearson bound needs far more trials at delta = 1e-5)."""
    delta = 1e-5
    mu = optimize.brentq(lambda m: exact_gaussian_epsilon(m, delta) - target, 0.05, 5.0)
    out, inn = _gaussian_scores(mu, 100_000, 7)
    got = epsilon_lower_bound_from_scores(out, inn, delta=delta, method="gdp")
    assert 0.5 * target < got.epsilon_lower <= target
    assert got.mu_lower is not None and got.mu_lower <= mu


def test_bad_input_is_refused_with_one_line():
    with pytest.raises(PrivacyError, match="errors <= trials"):
        clopper_pearson_upper(11, 10, 0.05)
    with pytest.raises(PrivacyError, match="confidence"):
        epsilon_lower_bound(false_positives=1, negatives=10, false_negatives=1, positives=10,
                            delta=1e-5, confidence=1.0)  # fmt: skip
    with pytest.raises(PrivacyError, match="at least 4 trials"):
        epsilon_lower_bound_from_scores(np.zeros(3), np.ones(3), delta=1e-5)
    with pytest.raises(PrivacyError, match="method"):
        epsilon_lower_bound_from_scores(np.zeros(8), np.ones(8), delta=1e-5, method="max")
    with pytest.raises(PrivacyError, match="delta"):
        gdp_epsilon_lower_bound(false_positives=1, negatives=10, false_negatives=1, positives=10,
                                delta=2.0)  # fmt: skip
