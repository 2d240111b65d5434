"""The one-run bound (Steinke, Nasr and Jagielski 2023) against independent computations: the
p-value summed term by term from scipy's binomial pmf, its closed form when every guess is
right, and Monte Carlo of the guessing game played against randomized response (the worst
epsilon-DP mechanism) and against a randomized response that leaks each canary with
probability delta (an (epsilon, delta)-DP mechanism whose leaks the delta term must absorb)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats
from test_estimators import exact_gaussian_epsilon

from privdl.audit import (
    one_run_bound_from_scores,
    one_run_epsilon_lower_bound,
    one_run_guesses,
    one_run_p_value,
)
from privdl.errors import PrivacyError


def reference_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[Bin(r, q) >= v] + 2 m delta max_i P[v - i <= Bin(r, q) < v] / i, q = e^eps/(1+e^eps),
    summed term by term from scipy's pmf (not the cdf differences the library takes)."""
    q = math.exp(eps) / (1.0 + math.exp(eps))
    tail = float(stats.binom.sf(v - 1, r, q))
    window, alpha = 0.0, 0.0
    for i in range(1, v + 1):
        window += float(stats.binom.pmf(v - i, r, q))
        alpha = max(alpha, window / i)
    return min(1.0, tail + 2 * m * delta * alpha)


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [(1000, 100, 80, 1.0, 1e-5), (1000, 100, 60, 0.3, 1e-4), (100, 50, 50, 3.0, 1e-3),
     (10_000, 500, 400, 1.5, 1e-6), (200, 40, 31, 0.7, 0.0), (50, 10, 0, 2.0, 1e-3)],
)  # fmt: skip
def test_p_value_is_the_binomial_tail_plus_the_delta_term(m, r, v, eps, delta):
    got = one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=eps, delta=delta)
    assert got[0] == pytest.approx(reference_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-15)
    # vectorised over epsilon
    many = one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=[0.0, eps], delta=delta)
    assert many[1] == got[0]


@pytest.mark.parametrize("r", [10, 100, 1000])
def test_all_guesses_right_has_a_closed_form(r):
    """delta = 0 and v = r: the p-value is q^r, so the bound solves q^r = beta:
    epsilon = log(t / (1 - t)) with t = beta^(1/r)."""
    t = 0.05 ** (1.0 / r)
    got = one_run_epsilon_lower_bound(canaries=2 * r, guesses=r, correct=r, delta=0.0)
    assert got == pytest.approx(math.log(t / (1 - t)), rel=1e-9)


@pytest.mark.parametrize(("m", "r", "v", "delta"), [(1000, 100, 90, 1e-5), (5000, 200, 150, 1e-6),
                                                   (1000, 40, 40, 1e-4)])  # fmt: skip
def test_bound_is_where_the_p_value_reaches_the_level(m, r, v, delta):
    """Below the bound every epsilon is rejected at 5%, just above it none is (the reference
    p-value, root found by scipy)."""
    got = one_run_epsilon_lower_bound(canaries=m, guesses=r, correct=v, delta=delta)
    root = optimize.brentq(lambda e: reference_p_value(m, r, v, e, delta) - 0.05, 0.0, 20.0)
    assert got == pytest.approx(root, abs=1e-6)
    assert all(reference_p_value(m, r, v, e, delta) < 0.05 for e in np.linspace(0, got - 1e-7, 20))


def test_nothing_is_certified_by_chance_level_guesses():
    assert one_run_epsilon_lower_bound(canaries=1000, guesses=100, correct=50, delta=1e-5) == 0.0
    assert one_run_epsilon_lower_bound(canaries=1000, guesses=0, correct=0, delta=1e-5) == 0.0


def _rr_game(eps: float, leak: float, m: int, runs: int, k: int, seed: int) -> np.ndarray:
    """Correct guesses among the top ``k`` scores in ``runs`` plays of the one-run game against
    per-canary randomized response at ``eps`` that reveals the canary (score +-2) with
    probability ``leak``: an (eps, leak)-DP mechanism of the inclusion vector."""
    rng = np.random.default_rng(seed)
    included = rng.random((runs, m)) < 0.5
    s = np.where(included, 1.0, -1.0)
    truthful = rng.random((runs, m)) < math.exp(eps) / (1 + math.exp(eps))
    out = np.where(truthful, s, -s)
    out = np.where(rng.random((runs, m)) < leak, 2 * s, out)
    scores = out + 1e-3 * rng.random((runs, m))  # ties broken at random, not by inclusion
    correct = np.empty(runs, dtype=int)
    for j in range(runs):  # the library's guesser, one play at a time
        t = one_run_guesses(scores[j], k, 0)
        correct[j] = int(np.sum(t * s[j] == 1))
    return correct


def test_monte_carlo_randomized_response_is_rejected_at_most_at_the_level():
    """Randomized response at epsilon 1 is exactly the theorem's worst case: the bound exceeds
    the true epsilon in at most 5% of plays, and not much less (the test is tight)."""
    eps, m, k, runs = 1.0, 400, 100, 2000
    correct = _rr_game(eps, 0.0, m, runs, k, seed=1)
    bound = np.array([one_run_epsilon_lower_bound(canaries=m, guesses=k, correct=v, delta=0.0)
                      for v in range(k + 1)])  # fmt: skip
    rate = float(np.mean(bound[correct] > eps))
    assert 0.01 < rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs), rate


def test_monte_carlo_the_delta_term_absorbs_leaks():
    """A randomized response that leaks each canary with probability delta is (1, delta)-DP: with
    the delta term the bound stays under 1 in at least 95% of plays; the same counts read
    without it (delta = 0) exceed 1 far more often than 5%."""
    eps, delta, m, k, runs = 1.0, 5e-3, 1000, 10, 3000
    correct = _rr_game(eps, delta, m, runs, k, seed=2)

    def rate(d: float) -> float:
        bound = np.array([one_run_epsilon_lower_bound(canaries=m, guesses=k, correct=v, delta=d)
                          for v in range(k + 1)])  # fmt: skip
        return float(np.mean(bound[correct] > eps))

    assert rate(delta) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)
    assert rate(0.0) > 0.08


def test_gaussian_canaries_bound_is_positive_and_under_the_true_epsilon():
    """1000 canaries, each seen through N(mu s_i / 2, 1): the mechanism's true epsilon at delta
    (Balle and Wang 2018) bounds the one-run bound, which is positive for a weak mechanism."""
    mu, delta = 6.0, 1e-5
    rng = np.random.default_rng(3)
    included = rng.random(1000) < 0.5
    scores = mu * (included - 0.5) + rng.standard_normal(1000)
    got = one_run_bound_from_scores(scores, included, delta=delta)
    assert 1.0 < got.epsilon_lower <= exact_gaussian_epsilon(mu, delta)
    assert got.candidates > 1 and got.correct <= got.guesses == got.k_plus + got.k_minus
    fixed = one_run_bound_from_scores(scores, included, delta=delta, k_plus=100, k_minus=100)
    assert fixed.candidates == 1 and fixed.guesses == 200


def test_guesses_and_bad_input():
    t = one_run_guesses(np.array([0.3, -1.0, 2.0, 0.1, 5.0]), 2, 1)
    assert t.tolist() == [0, -1, 1, 0, 1]
    with pytest.raises(PrivacyError, match="k\\+ \\+ k-"):
        one_run_guesses(np.zeros(4), 3, 2)
    with pytest.raises(PrivacyError, match="correct <= guesses <= canaries"):
        one_run_p_value(canaries=10, guesses=20, correct=5, epsilon=1.0, delta=0.0)
    with pytest.raises(PrivacyError, match="delta"):
        one_run_epsilon_lower_bound(canaries=10, guesses=5, correct=5, delta=1.5)
    with pytest.raises(PrivacyError, match="both"):
        one_run_bound_from_scores(np.zeros(10), np.zeros(10, bool), delta=1e-5, k_plus=3)
    with pytest.raises(PrivacyError, match="finite"):
        one_run_bound_from_scores(np.full(10, np.nan), np.zeros(10, bool), delta=1e-5)
