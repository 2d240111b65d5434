"""One-run auditing (Steinke, Nasr and Jagielski 2023, "Privacy auditing with one (1) training
run", NeurIPS 2023; arXiv:2305.08846): a lower bound on epsilon from a *single* run of the
mechanism on ``m`` canaries.

Each canary is included independently with probability 1/2 (``S in {-1, +1}^m`` uniform). The
auditor scores every canary from what its adversary sees (a function fixed before the run, that
never reads ``S``), guesses "included" for the ``k+`` highest scores and "excluded" for the
``k-`` lowest, abstains on the rest (``r = k+ + k-`` guesses), and counts the ``v`` correct
guesses. Their main theorem for (epsilon, delta)-DP (evaluated as in their Appendix D) bounds
the count for any such mechanism and any such guesser: with
``W ~ Binomial(r, q)``, ``q = e^epsilon / (1 + e^epsilon)`` (the accuracy of epsilon-DP
randomized response, the worst case),

    P[V >= v] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i,   f(v) = P[W >= v].

The right-hand side is the p-value of "the mechanism is (epsilon, delta)-DP" given ``v``
correct guesses. The lower bound at confidence ``1 - beta`` is the smallest epsilon whose
p-value reaches ``beta``: every smaller epsilon is rejected at level ``beta``, so
``P[epsilon_lower > epsilon_true] <= beta``.

Choosing ``k+`` and ``k-`` after seeing which guesses were right would void the theorem;
:func:`one_run_bound_from_scores` tries a fixed grid of ``(k+, k-)`` and takes the largest bound
with each computed at level ``beta / len(grid)`` (a union bound), so the result still holds with
probability ``1 - beta``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from privdl.errors import PrivacyError

__all__ = [
    "GUESS_FRACTIONS",
    "OneRunBound",
    "one_run_epsilon_lower_bound",
    "one_run_guesses",
    "one_run_bound_from_scores",
    "one_run_p_value",
]

#: The default grid of guess counts, as fractions of the canaries: each ``k`` is tried as
#: ``(k+, k-) = (k, 0)``, ``(0, k)`` and ``(k, k)`` (with the union bound over the grid).
GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


@dataclass(frozen=True)
class OneRunBound:
    """A one-run lower bound on epsilon (module docstring) and the game it rests on.

    Attributes:
        epsilon_lower: the bound (0 when the guesses certify nothing).
        confidence: probability with which it holds (the union bound over the grid included).
        delta: the delta it is stated at.
        canaries: ``m``, each included with probability 1/2.
        guesses: ``r = k+ + k-`` of the guess pair that gave the bound.
        correct: ``v`` of those guesses that were right.
        k_plus, k_minus: the guess pair (top scores guessed in, bottom scores guessed out).
        candidates: how many ``(k+, k-)`` pairs were tried (each at level
            ``(1 - confidence) / candidates``).
    """

    epsilon_lower: float
    confidence: float
    delta: float
    canaries: int
    guesses: int
    correct: int
    k_plus: int
    k_minus: int
    candidates: int = 1
    method: str = "one-run"


def _check_game(canaries: int, guesses: int, correct: int, delta: float) -> None:
    if not 0 <= correct <= guesses <= canaries:
        raise PrivacyError(
            f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {canaries}"
        )
    if not 0 <= delta < 1:
        raise PrivacyError(f"delta must lie in [0, 1), got {delta}")


def one_run_p_value(
    *, canaries: int, guesses: int, correct: int, epsilon: float | np.ndarray, delta: float
) -> np.ndarray:
    """The bound on ``P[V >= correct]`` for an (epsilon, delta)-DP mechanism (module docstring),
    clipped to 1; vectorised over ``epsilon``."""
    m, r, v = int(canaries), int(guesses), int(correct)
    _check_game(m, r, v, delta)
    eps = np.atleast_1d(np.asarray(epsilon, dtype=float))
    if np.any(eps < 0):
        raise PrivacyError("epsilon must be >= 0")
    q = special.expit(eps)[:, None]  # e^eps / (1 + e^eps)
    tail = stats.binom.sf(v - 1, r, q[:, 0])  # f(v) = P[W >= v]
    if delta == 0 or v == 0:
        return np.minimum(tail, 1.0)
    # f(v - i) - f(v) = P[v - i <= W < v] = F(v - 1) - F(v - 1 - i), i = 1..v (F(-1) = 0)
    cdf = stats.binom.cdf(np.arange(-1, v), r, q)  # (len(eps), v + 1): F(-1), ..., F(v - 1)
    gaps = cdf[:, -1:] - cdf[:, -2::-1]  # column i - 1: F(v - 1) - F(v - 1 - i)
    alpha = np.max(gaps / np.arange(1, v + 1), axis=1)
    return np.minimum(tail + 2.0 * m * delta * alpha, 1.0)


def one_run_epsilon_lower_bound(
    *, canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> float:
    """The smallest epsilon whose p-value (:func:`one_run_p_value`) reaches ``1 - confidence``:
    every epsilon below it is rejected at that level (module docstring). Found on a grid from 0
    up, then refined by bisection below the first grid point that reaches the level."""
    if not 0 < confidence < 1:
        raise PrivacyError(f"confidence must lie in (0, 1), got {confidence}")
    _check_game(canaries, guesses, correct, delta)
    beta = 1.0 - confidence

    def p(e: float | np.ndarray) -> np.ndarray:
        return one_run_p_value(canaries=canaries, guesses=guesses, correct=correct, epsilon=e,
                               delta=delta)  # fmt: skip

    if guesses == 0 or p(0.0)[0] >= beta:
        return 0.0
    hi = 1.0
    while p(hi)[0] < beta:  # f(v) -> 1 as epsilon grows (v <= r), so this ends
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    grid = np.linspace(0.0, hi, 257)
    first = int(np.argmax(p(grid) >= beta))  # > 0: p(0) < beta
    lo, hi = float(grid[first - 1]), float(grid[first])
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if p(mid)[0] < beta:
            lo = mid
        else:
            hi = mid
    return lo  # every epsilon up to lo is rejected


def one_run_guesses(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """``T in {-1, 0, +1}^m``: +1 for the ``k_plus`` highest scores, -1 for the ``k_minus``
    lowest, 0 (abstain) elsewhere; ties broken by position (never by inclusion)."""
    s = np.asarray(scores, dtype=float)
    if s.ndim != 1:
        raise PrivacyError("scores must be one number per canary")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > s.size:
        raise PrivacyError(f"need 0 <= k+ + k- <= {s.size} canaries, got {k_plus} + {k_minus}")
    order = np.argsort(s, kind="stable")
    out = np.zeros(s.size, dtype=np.int8)
    out[order[s.size - k_plus :]] = 1
    out[order[:k_minus]] = -1
    return out


def guess_grid(
    canaries: int, fractions: Sequence[float] = GUESS_FRACTIONS
) -> list[tuple[int, int]]:
    """The ``(k+, k-)`` pairs tried by default: for each ``k = max(1, round(f m))``, ``(k, 0)``,
    ``(0, k)`` and ``(k, k)`` where they fit."""
    ks = sorted({max(1, round(f * canaries)) for f in fractions})
    pairs: list[tuple[int, int]] = []
    for k in ks:
        pairs += [(k, 0), (0, k)] + ([(k, k)] if 2 * k <= canaries else [])
    return [p for p in dict.fromkeys(pairs) if sum(p) <= canaries]


def one_run_bound_from_scores(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    k_plus: int | None = None,
    k_minus: int | None = None,
) -> OneRunBound:
    """The one-run bound of canaries with these ``scores`` (larger means "included"; computed
    without looking at ``included``) and inclusions ``included`` (bool, drawn with probability
    1/2 each): at the given ``(k_plus, k_minus)``, or the best over :func:`guess_grid` with the
    union bound (module docstring)."""
    s = np.asarray(scores, dtype=float)
    inc = np.asarray(included, dtype=bool)
    if s.ndim != 1 or inc.shape != s.shape or s.size < 2:
        raise PrivacyError("need one score and one inclusion flag per canary, at least 2")
    if not np.all(np.isfinite(s)):
        raise PrivacyError("canary scores must be finite")
    if (k_plus is None) != (k_minus is None):
        raise PrivacyError("give both k_plus and k_minus, or neither (the default grid)")
    pairs = guess_grid(s.size) if k_plus is None else [(int(k_plus), int(k_minus or 0))]
    level = 1.0 - (1.0 - confidence) / len(pairs)
    truth = np.where(inc, 1, -1)
    best: OneRunBound | None = None
    for kp, km in pairs:  # a few pairs, not a loop over canaries
        t = one_run_guesses(s, kp, km)
        v = int(np.sum(t * truth == 1))
        eps = one_run_epsilon_lower_bound(canaries=s.size, guesses=kp + km, correct=v,
                                          delta=delta, confidence=level)  # fmt: skip
        if best is None or eps > best.epsilon_lower:
            best = OneRunBound(eps, confidence, delta, s.size, kp + km, v, kp, km, len(pairs))
    assert best is not None
    return best
