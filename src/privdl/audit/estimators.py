"""Empirical lower bounds on epsilon from a distinguishing test's outcomes (privacy auditing).

An (epsilon, delta)-DP mechanism bounds every test that tells a neighbouring pair apart: with
false-positive rate FPR and false-negative rate FNR,
``FPR + e^epsilon FNR >= 1 - delta`` and ``FNR + e^epsilon FPR >= 1 - delta`` (Kairouz, Oh and
Viswanath 2015, Thm 2.1). So observed rates certify
``epsilon >= max(log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR))`` (Jagielski,
Ullman and Oprea 2020; Nasr et al. 2021). Rates are estimated from trials, so the bound is taken at
Clopper-Pearson upper confidence limits of both rates (each at level ``(1 - confidence) / 2``, a
union bound): the result is a lower bound on epsilon with probability at least ``confidence``.

:func:`gdp_epsilon_lower_bound` assumes in addition that the mechanism is mu-GDP (true of every
Gaussian composition; Nasr et al. 2023): mu >= Phi^-1(1 - FPR) - Phi^-1(FNR) from the trade-off
curve G_mu, converted to epsilon at delta exactly. Tighter from the same trials, but only as
valid as that assumption; its result says so.

:func:`epsilon_lower_bound_from_scores` turns the scores of trials with and without the canary
into a bound: the threshold is chosen on one half of the trials and the bound computed on the
other (a threshold chosen on the same trials would overfit the estimate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from privdl.accounting.conversion import check_delta, gaussian_epsilon
from privdl.errors import PrivacyError


@dataclass(frozen=True)
class AuditBound:
    """A lower bound on epsilon and what it rests on.

    Attributes:
        epsilon_lower: the bound (0 when the trials certify nothing).
        confidence: probability with which it holds.
        delta: the delta it is stated at.
        method: ``clopper-pearson`` (any mechanism) or ``gdp`` (assumes mu-GDP).
        fpr_upper, fnr_upper: the rates' upper confidence limits it used.
        mu_lower: for ``gdp``, the lower bound on mu.
        threshold: the score threshold of the test, where scores were given.
    """

    epsilon_lower: float
    confidence: float
    delta: float
    method: str
    fpr_upper: float
    fnr_upper: float
    mu_lower: float | None = None
    threshold: float | None = None


def clopper_pearson_upper(errors: int, trials: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper limit of a binomial rate: the rate p with
    P(Binom(trials, p) <= errors) = alpha, i.e. the (1 - alpha) quantile of Beta(errors + 1,
    trials - errors); 1 when every trial erred."""
    if trials < 1 or not 0 <= errors <= trials:
        raise PrivacyError(f"need 0 <= errors <= trials and trials >= 1, got {errors}/{trials}")
    if not 0 < alpha < 1:
        raise PrivacyError(f"alpha must lie in (0, 1), got {alpha}")
    return float(_upper_limits(np.asarray(errors), trials, alpha))


def _upper_limits(errors: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """:func:`clopper_pearson_upper` for many error counts at once (unchecked)."""
    errors = np.asarray(errors)
    safe = np.minimum(errors, trials - 1)
    up = special.betaincinv(safe + 1.0, trials - safe, 1.0 - alpha)
    return np.where(errors >= trials, 1.0, up)


def _check(confidence: float, delta: float) -> None:
    if not 0 < confidence < 1:
        raise PrivacyError(f"confidence must lie in (0, 1), got {confidence}")
    if delta != 0:
        check_delta(delta)


def _rate_limits(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float,
) -> tuple[float, float]:
    """Checked inputs; the Clopper-Pearson upper limits of FPR and FNR, each at level
    (1 - confidence) / 2 (a union bound over the two)."""
    _check(confidence, delta)
    alpha = (1.0 - confidence) / 2.0
    return (
        clopper_pearson_upper(false_positives, negatives, alpha),
        clopper_pearson_upper(false_negatives, positives, alpha),
    )  # fmt: skip


def _eps_from_rates(fpr: float, fnr: float, delta: float) -> float:
    best = 0.0
    for a, b in ((fpr, fnr), (fnr, fpr)):
        if a > 0 and 1 - delta - b > a:
            best = max(best, math.log((1 - delta - b) / a))
        elif a == 0 and 1 - delta - b > 0:
            return math.inf
    return best


def epsilon_lower_bound(
    *,
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float = 0.95,
) -> AuditBound:
    """Epsilon that a test with these outcomes certifies with probability ``confidence``
    (Clopper-Pearson limits on FPR = false_positives / negatives and FNR = false_negatives /
    positives, module docstring)."""
    fpr, fnr = _rate_limits(
        false_positives, negatives, false_negatives, positives, delta, confidence
    )
    return AuditBound(_eps_from_rates(fpr, fnr, delta), confidence, delta, "clopper-pearson",
                      fpr, fnr)  # fmt: skip


def gdp_epsilon_lower_bound(
    *,
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float = 0.95,
) -> AuditBound:
    """Epsilon at ``delta`` of the smallest mu-GDP consistent with the test's outcomes (valid only
    for a mechanism that is mu-GDP for some mu: module docstring)."""
    fpr, fnr = _rate_limits(
        false_positives, negatives, false_negatives, positives, delta, confidence
    )
    mu = max(0.0, float(stats.norm.isf(fpr) - stats.norm.ppf(fnr))) if fpr < 1 and fnr < 1 else 0.0
    eps = 0.0 if mu == 0 or delta == 0 else gaussian_epsilon(mu * mu / 2.0, delta)
    if delta == 0:
        eps = math.inf if mu > 0 else 0.0
    return AuditBound(eps, confidence, delta, "gdp", fpr, fnr, mu_lower=mu)


def _counts(scores_out: np.ndarray, scores_in: np.ndarray, t: float) -> tuple[int, int]:
    """(false positives, false negatives) of the test "canary present iff score >= t"."""
    return int(np.sum(scores_out >= t)), int(np.sum(scores_in < t))


def epsilon_lower_bound_from_scores(
    scores_out: np.ndarray,
    scores_in: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    method: str = "clopper-pearson",
    rng: np.random.Generator | None = None,
) -> AuditBound:
    """A lower bound from the test statistics of trials without (``scores_out``) and with
    (``scores_in``) the canary, larger meaning "present": the threshold maximising the bound on a
    random half of each, the bound on the other halves (module docstring)."""
    out, inn = np.asarray(scores_out, dtype=float), np.asarray(scores_in, dtype=float)
    if out.ndim != 1 or inn.ndim != 1 or min(out.size, inn.size) < 4:
        raise PrivacyError("need at least 4 trials with and 4 without the canary (1-D scores)")
    rng = rng if rng is not None else np.random.default_rng(0)
    out, inn = rng.permutation(out), rng.permutation(inn)
    return epsilon_lower_bound_heldout(
        out[: out.size // 2],
        inn[: inn.size // 2],
        out[out.size // 2 :],
        inn[inn.size // 2 :],
        delta=delta,
        confidence=confidence,
        method=method,
    )


def epsilon_lower_bound_heldout(
    fit_out: np.ndarray,
    fit_in: np.ndarray,
    test_out: np.ndarray,
    test_in: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    method: str = "clopper-pearson",
) -> AuditBound:
    """The threshold that maximises the bound on the ``fit`` scores, the bound it gives on the
    independent ``test`` scores (without / with the canary; larger means "present")."""
    arrays = [np.asarray(a, dtype=float) for a in (fit_out, fit_in, test_out, test_in)]
    if any(a.ndim != 1 or a.size < 2 for a in arrays):
        raise PrivacyError("need at least 2 fit and 2 test trials with and without the canary")
    if method not in ("clopper-pearson", "gdp"):
        raise PrivacyError(f"method must be clopper-pearson or gdp, got {method!r}")
    _check(confidence, delta)
    fit_out, fit_in, test_out, test_in = arrays
    bound = epsilon_lower_bound if method == "clopper-pearson" else gdp_epsilon_lower_bound
    candidates = np.unique(np.concatenate([fit_out, fit_in]))
    # every candidate threshold at once (sorted counts, vectorised limits): no loop over trials
    fp = fit_out.size - np.searchsorted(np.sort(fit_out), candidates, side="left")
    fn = np.searchsorted(np.sort(fit_in), candidates, side="left")
    alpha = (1.0 - confidence) / 2.0
    fpr = _upper_limits(fp, fit_out.size, alpha)
    fnr = _upper_limits(fn, fit_in.size, alpha)
    if method == "gdp":  # the bound grows with mu: maximise mu
        with np.errstate(divide="ignore", invalid="ignore"):
            score = stats.norm.isf(fpr) - stats.norm.ppf(fnr)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.maximum(
                np.log(np.maximum(1 - delta - fnr, 0) / fpr),
                np.log(np.maximum(1 - delta - fpr, 0) / fnr),
            )
    score = np.where(np.isnan(score), -np.inf, score)
    best_t = float(candidates[int(np.argmax(score))])
    a, b = _counts(test_out, test_in, best_t)
    got = bound(false_positives=a, negatives=test_out.size, false_negatives=b,
                positives=test_in.size, delta=delta, confidence=confidence)  # fmt: skip
    return AuditBound(got.epsilon_lower, got.confidence, got.delta, got.method, got.fpr_upper,
                      got.fnr_upper, got.mu_lower, best_t)  # fmt: skip


def empirical_tradeoff(
    scores_out: np.ndarray, scores_in: np.ndarray, *, points: int = 41
) -> list[tuple[float, float]]:
    """Observed (FPR, FNR) of the tests "present iff score >= t" at ``points`` thresholds spread
    over the scores' quantiles (what a trade-off plot draws against an accountant's f-DP curve)."""
    out, inn = np.sort(np.asarray(scores_out, float)), np.sort(np.asarray(scores_in, float))
    both = np.concatenate([out, inn])
    ts = np.unique(np.quantile(both, np.linspace(0.0, 1.0, points)))
    fpr = (out.size - np.searchsorted(out, ts, side="left")) / out.size
    fnr = np.searchsorted(inn, ts, side="left") / inn.size
    return [(float(a), float(b)) for a, b in zip(fpr, fnr, strict=True)]
