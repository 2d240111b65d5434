"""Composition and RDP -> (epsilon, delta) conversion for Gaussian-type RDP curves.

A DECOR step (and any Gaussian mechanism) has a linear RDP curve eps(alpha) = alpha * rho. T
adaptive steps compose to alpha * T * rho (Lemma 10). Three conversions are offered:

* ``classic`` -- Mironov 2017, Lemma 11: eps = min_alpha [alpha rho_T + log(1/delta)/(alpha-1)],
  minimised in closed form (DECOR App. C, (ACC-1)): eps = rho_T + 2 sqrt(rho_T log(1/delta)).
  This is what the DECOR paper and code use (``conversion="classic"`` reproduces their numbers).
* ``improved`` -- Canonne, Kamath, Steinke 2020 (Prop. 12; also Asoodeh et al.):
  eps = min_{alpha > 1} alpha rho_T + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1),
  minimised numerically over real alpha.
* ``gaussian`` -- exact. A composition of Gaussian mechanisms with slopes rho_t is exactly
  mu-GDP with mu = sqrt(2 sum_t rho_t) (Dong, Roth, Su 2019), whose tight (eps, delta) curve is
  delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Balle and Wang 2018). This is the
  tightest possible conversion and is the reference for the other two; privdl's default
  (:data:`DEFAULT_CONVERSION`), where the DECOR paper and code use ``classic``.

:func:`cap_by_unsampled` caps a subsampled accountant's epsilon by the exact epsilon of the T-fold
unsampled mechanism (example-level accounting: subsampling never hurts).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from privdl.errors import PrivacyError

CONVERSIONS = ("classic", "improved", "gaussian")
#: privdl's default: the exact conversion (a composition of Gaussian mechanisms is a Gaussian).
DEFAULT_CONVERSION = "gaussian"


def check_delta(delta: float) -> None:
    """Raise :class:`PrivacyError` unless 0 < delta < 1."""
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise PrivacyError(f"delta must lie in (0, 1), got {delta}")


def log_inv_delta(delta: float) -> float:
    """log(1/delta), as -log(delta): 1/delta overflows for a subnormal delta (< 2.2e-308)."""
    return -math.log(delta)


def classic_epsilon(rho: float, delta: float) -> float:
    """(ACC-1): eps = rho + 2 sqrt(rho log(1/delta)) for the RDP curve alpha * rho (Lemma 11)."""
    check_delta(delta)
    if rho < 0:
        raise PrivacyError(f"RDP slope must be >= 0, got {rho}")
    return float(rho + 2.0 * math.sqrt(rho * log_inv_delta(delta)))


def classic_rho_for_epsilon(epsilon: float, delta: float) -> float:
    """(ACC-2), the inverse of (ACC-1): rho = (sqrt(log(1/delta) + eps) - sqrt(log(1/delta)))^2,
    evaluated as eps^2 / (sqrt(log(1/delta) + eps) + sqrt(log(1/delta)))^2: the difference of
    square roots cancels (26% too large at eps = 1e-12, delta = 1e-300)."""
    check_delta(delta)
    if epsilon <= 0:
        raise PrivacyError(f"epsilon must be > 0, got {epsilon}")
    log_inv = log_inv_delta(delta)
    return float(epsilon**2 / (math.sqrt(log_inv + epsilon) + math.sqrt(log_inv)) ** 2)


def improved_epsilon(rho: float, delta: float) -> float:
    """Canonne-Kamath-Steinke conversion of the RDP curve alpha * rho, minimised over alpha > 1."""
    check_delta(delta)
    if rho < 0:
        raise PrivacyError(f"RDP slope must be >= 0, got {rho}")
    if rho == 0:
        return 0.0
    log_delta = math.log(delta)

    def eps(log_am1: float) -> float:
        a = 1.0 + math.exp(log_am1)
        return a * rho + math.log1p(-1.0 / a) - (log_delta + math.log(a)) / (a - 1.0)

    # the classic optimum is a good centre; search log(alpha - 1) around it
    centre = math.log(math.sqrt(log_inv_delta(delta) / rho))
    res = optimize.minimize_scalar(
        eps, bounds=(centre - 12.0, centre + 12.0), method="bounded", options={"xatol": 1e-10}
    )
    # never report more than the classic value (the improved bound is never worse)
    return float(max(0.0, min(res.fun, classic_epsilon(rho, delta))))


def gaussian_delta(mu: float, epsilon: float) -> float:
    """Tight delta(eps) of a mu-GDP mechanism (Balle and Wang 2018, Thm 8)."""
    if mu == 0:
        return 0.0
    a = special.ndtr(-epsilon / mu + mu / 2.0)
    # e^eps Phi(-eps/mu - mu/2) computed in log space to avoid overflow; it is at most
    # Phi(-eps/mu + mu/2) <= 1, which rounding of huge eps and mu can break (then 1 is used)
    log_b = epsilon + special.log_ndtr(-epsilon / mu - mu / 2.0)
    return float(a - math.exp(min(log_b, 0.0)))


#: Above this mu the exact conversion returns the classic bound: eps ~ mu^2/2 there, whose
#: rounding swamps delta(eps), and classic exceeds the exact eps by a relative ~1/mu only.
GAUSSIAN_MU_MAX = 1e6


def gaussian_epsilon(rho: float, delta: float) -> float:
    """Exact eps for total RDP slope rho (a Gaussian with mu = sqrt(2 rho)) at the given delta.

    The root of delta(eps) = delta is bracketed to relative 1e-14 and then moved up until
    delta(eps) plus its rounding error is at most delta (delta(eps) is a difference of two tails
    whose arguments differ by mu: a few ulps of each argument move it by phi(x) |x| ulps). Where that error is not small against delta (tiny
    mu and delta) the classic conversion, an upper bound on the exact eps and nearly tight there,
    is returned instead; never more than the classic value either way.
    """
    check_delta(delta)
    if rho < 0:
        raise PrivacyError(f"RDP slope must be >= 0, got {rho}")
    mu = math.sqrt(2.0 * rho)
    if gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    classic = classic_epsilon(rho, delta)
    if mu > GAUSSIAN_MU_MAX:  # delta(eps) is a difference of terms float64 cannot resolve there
        return float(classic)
    hi = max(1.0, classic)
    while gaussian_delta(mu, hi) > delta:  # pragma: no cover - classic is always an upper bound
        hi *= 2.0
    try:
        eps = optimize.brentq(
            lambda e: gaussian_delta(mu, e) - delta, 0.0, hi, xtol=1e-300, rtol=1e-14, maxiter=400
        )
    except RuntimeError:  # delta(eps) is rounding noise near the root
        return float(classic)

    def certified(e: float) -> bool | None:
        """delta(e) + its rounding <= delta; None where rounding swamps delta."""
        x = -e / mu + mu / 2.0  # a few ulps in x and in the tails, through Phi and phi
        rounding = 1.6e-15 * float(special.ndtr(x) + math.exp(-0.5 * x * x) * (abs(x) + 1.0))
        if rounding > 0.5 * delta:
            return None
        return gaussian_delta(mu, e) + rounding <= delta

    step, below = 1e-14, eps
    while eps < classic:
        ok = certified(eps)
        if ok is None:
            break  # the subtraction has lost the digits that decide
        if ok:
            for _ in range(60):  # back towards the root while it stays certified
                mid = 0.5 * (below + eps)
                if not below < mid < eps:
                    break
                if certified(mid):
                    eps = mid
                else:
                    below = mid
            return float(eps)
        below, eps, step = eps, eps * (1.0 + step), step * 2.0
    return float(classic)


def compose_convert(
    step_rdp: float, *, steps: int, delta: float, conversion: str = DEFAULT_CONVERSION
) -> float:
    """T-fold composition of a per-step slope and conversion to epsilon at ``delta``."""
    if not (isinstance(steps, (int, np.integer)) and steps >= 1):
        raise PrivacyError(f"steps must be a positive integer, got {steps}")
    rho = step_rdp * steps
    if conversion == "classic":
        return classic_epsilon(rho, delta)
    if conversion == "improved":
        return improved_epsilon(rho, delta)
    if conversion == "gaussian":
        return gaussian_epsilon(rho, delta)
    raise PrivacyError(f"unknown conversion {conversion!r}; use one of {CONVERSIONS}")


#: What an example-level record's notes add when :func:`cap_by_unsampled` decided its epsilon.
UNSAMPLED_CAP_NOTE = "; capped by the unsampled mechanism's exact Gaussian epsilon (tighter here)"
#: The same with privdl 0.1's classic-conversion cap (``accountant="rdp"`` runs).
UNSAMPLED_CAP_CLASSIC_NOTE = (
    "; capped by the unsampled mechanism's classic conversion (tighter here)"
)


def gaussian_mu(rho: float) -> float:
    """mu of the mu-GDP mechanism with total RDP slope ``rho`` (a Gaussian: mu = sqrt(2 rho))."""
    return math.sqrt(2.0 * rho)


def cap_by_unsampled(
    epsilon: float, step_rdp: float, *, steps: int, delta: float, conversion: str = "gaussian"
) -> tuple[float, bool]:
    """``min(epsilon, eps_unsampled)`` and whether the cap binds, for example-level accounting.

    Subsampling never hurts: the sampled step is a mixture, with the same weights under both
    neighbouring datasets, of unsampled steps on batches that differ in at most one example
    (per-step sensitivity 2C/b, slope ``step_rdp``), each of them mu_1-GDP with
    mu_1 = sqrt(2 step_rdp). The hockey-stick divergence is jointly convex, so the mixture
    satisfies every (eps, delta(eps)) of G_mu_1 as well, i.e. it is mu_1-GDP; T adaptive steps are
    sqrt(T) mu_1-GDP (Dong, Roth and Su 2019, Cor. 2), whose exact (eps, delta) holds. At tiny
    noise that bound is the tighter one: a subsampled accountant's finite order grid cannot
    reach the optimal order near 1 (example-level epsilon would exceed user-level at b = 1).
    ``conversion="classic"`` is the looser cap of privdl 0.1 (Mironov 2017, Prop. 1 + 3).
    """
    unsampled = compose_convert(step_rdp, steps=int(steps), delta=delta, conversion=conversion)
    return (unsampled, True) if unsampled < epsilon else (epsilon, False)


def step_rdp_for_epsilon(
    epsilon: float, *, steps: int, delta: float, conversion: str = DEFAULT_CONVERSION
) -> float:
    """Largest per-step slope whose T-fold composition converts to at most ``epsilon``."""
    if epsilon <= 0:
        raise PrivacyError(f"epsilon must be > 0, got {epsilon}")

    def f(r: float) -> float:
        return compose_convert(r, steps=1, delta=delta, conversion=conversion) - epsilon

    rho = classic_rho_for_epsilon(epsilon, delta)
    if conversion != "classic" and rho > 0.0:  # rho underflows to 0 for epsilon ~ 1e-160
        hi = rho
        while f(hi) < 0:
            hi *= 2.0
        rho = optimize.brentq(f, 0.0, hi, xtol=1e-300, rtol=1e-13)
    shrink = 1e-13
    while compose_convert(rho / steps, steps=steps, delta=delta, conversion=conversion) > epsilon:
        rho *= 1 - shrink  # conservative side of the rounding
        shrink = min(2.0 * shrink, 0.5)
    return float(rho / steps)
