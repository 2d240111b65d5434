"""The tightest certified epsilon of a (subsampled) Gaussian event: privdl's default accountant.

Every accountant here certifies an upper bound on the privacy loss of the mechanism it is given;
the smallest of them is therefore certified as well, and is what privdl reports by default:

* ``gaussian`` -- exact. ``T`` unsampled Gaussian steps with noise multiplier ``z`` (relative to
  the sensitivity of the stated neighbouring relation) compose to exactly mu-GDP with
  ``mu = sqrt(T) / z`` (Dong, Roth and Su 2019, Cor. 2), whose (epsilon, delta) curve is exact
  (Balle and Wang 2018, Thm 8). Nothing certified is smaller; no other accountant is asked.
* ``pld`` -- dp-accounting's privacy-loss-distribution accountant with pessimistic
  discretisation (Koskela et al. 2020; Doroshenko et al. 2022): an upper bound up to the
  discretisation, which it rounds in the safe direction. Computed for Poisson sampling (both
  relations) and for no sampling; dp-accounting has no PLD for fixed-size sampling, and it is
  not asked below :data:`~privdl.accounting.rdp_pld.PLD_MIN_NOISE` (gigabytes of memory there).
* ``rdp`` -- dp-accounting's RDP accountant (Mironov 2017; Mironov, Talwar and Zhang 2019;
  Wang, Balle and Kasiviswanathan 2019 for fixed-size sampling), converted by Canonne, Kamath
  and Steinke 2020, Prop. 12. Always computed for sampled events: it is the fallback where PLD
  cannot be computed, and where it is smaller it is the number.

:func:`tightest_epsilon` returns an :class:`Accounted` that names the accountant that produced
the number and notes which were compared or why one was left out. :func:`calibrate_tightest`
inverts it: the smallest noise multiplier whose tightest epsilon meets a target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from privdl.accounting.conversion import gaussian_epsilon, step_rdp_for_epsilon
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.rdp_pld import (
    PLD_INTERVAL,
    PLD_MIN_NOISE,
    RDP_AGREEMENT,
    PoissonStepCache,
    calibrate_one_accountant,
    event_epsilon,
    privdl_rdp_epsilon,
)
from privdl.errors import PrivacyError

#: The name of the default accountant policy (``--accountant tightest``).
TIGHTEST = "tightest"
#: Every name ``accountant=`` accepts for a (subsampled) Gaussian event.
EVENT_ACCOUNTANTS = (TIGHTEST, "gaussian", "pld", "rdp")


@dataclass(frozen=True)
class Accounted:
    """An epsilon and how it was obtained.

    Attributes:
        epsilon: the certified epsilon at the requested delta.
        accountant: the accountant that produced it (``gaussian``, ``pld`` or ``rdp``).
        notes: which accountants were compared, and why any was not computed.
        mu: the mu of mu-GDP where the event composes to a Gaussian mechanism, else None.
        candidates: every accountant's epsilon that was computed, by name.
    """

    epsilon: float
    accountant: str
    notes: str = ""
    mu: float | None = None
    candidates: dict[str, float] = field(default_factory=dict)


def unsampled(event: SubsampledGaussianEvent) -> bool:
    """True when every step sees every record (no subsampling amplification)."""
    return event.sampling == "none" or event.sampling_rate >= 1.0


def gaussian_mu(event: SubsampledGaussianEvent) -> float | None:
    """mu of the mu-GDP mechanism an unsampled event composes to: ``sqrt(T) / z``; else None."""
    if not unsampled(event):
        return None
    return math.sqrt(event.steps) / event.noise_multiplier


def exact_gaussian_epsilon(event: SubsampledGaussianEvent, *, delta: float) -> float:
    """Exact epsilon of an unsampled event: mu-GDP with mu = sqrt(T)/z, i.e. total RDP slope
    ``T / (2 z^2)`` handed to :func:`~privdl.accounting.conversion.gaussian_epsilon`."""
    if not unsampled(event):
        raise PrivacyError(
            "the exact Gaussian accountant needs an unsampled event (sampling 'none' or rate 1); "
            "a subsampled Gaussian is not a Gaussian mechanism: use pld or rdp"
        )
    return gaussian_epsilon(event.steps / (2.0 * event.noise_multiplier**2), delta)


def _pld_unavailable(event: SubsampledGaussianEvent) -> str | None:
    """Why dp-accounting's PLD is not asked about this event, or None when it is."""
    if event.sampling == "fixed_size":
        return "dp-accounting has no PLD for fixed-size sampling"
    if event.noise_multiplier < PLD_MIN_NOISE:
        return f"PLD not computed below z = {PLD_MIN_NOISE} (its discretisation needs gigabytes)"
    return None


#: The single steps :func:`tightest_epsilon` and :func:`calibrate_tightest` keep between calls
#: when not handed a cache of their own: a memo of a pure function (the numbers are those of
#: the uncached path, bit for bit), bounded to a few PLDs, so that accounting the noise
#: multiplier a calibration just settled on (``privdl calibrate dpsgd``), or one mechanism
#: after several step counts, builds its PLD once.
SHARED_STEPS = PoissonStepCache(max_plds=4)


def tightest_epsilon(
    event: SubsampledGaussianEvent, *, delta: float, steps_cache: PoissonStepCache | None = None
) -> Accounted:
    """The smallest certified epsilon of ``event`` at ``delta`` (see the module docstring).

    ``steps_cache``: keeps the single step of Poisson-sampled events between calls (the same
    numbers, without rebuilding it; :class:`~privdl.accounting.rdp_pld.PoissonStepCache`);
    :data:`SHARED_STEPS` when not given.

    The PLD is asked first. dp-accounting's RDP accountant (the slow part of a call where the
    PLD is quick: a Python loop over 160 orders up to 4096) is then asked only if it could be
    the smaller: where privdl's own RDP epsilon of the event
    (:func:`~privdl.accounting.rdp_pld.privdl_rdp_epsilon`, a lower bound on the ``rdp``
    answer up to a factor ``1 + 1e-6``) already exceeds the PLD's by that factor, the ``pld``
    answer is the tightest either way, and the ``rdp`` candidate reported beside it is privdl's
    (dp-accounting's to ~1e-9)."""
    if unsampled(event):
        eps = exact_gaussian_epsilon(event, delta=delta)
        return Accounted(
            eps,
            "gaussian",
            f"exact: mu-GDP, mu = sqrt(T)/z = {gaussian_mu(event):.6g}",
            gaussian_mu(event),
            {"gaussian": eps},
        )
    cache = SHARED_STEPS if steps_cache is None else steps_cache
    candidates: dict[str, float] = {}
    left_out: list[str] = []
    pld_eps: float | None = None
    why = _pld_unavailable(event)
    if why is None:
        try:
            pld_eps = event_epsilon(event, delta=delta, accountant="pld", steps_cache=cache)
        except (PrivacyError, MemoryError, OverflowError, ValueError) as exc:
            why = f"PLD failed ({type(exc).__name__}: {exc})"
    if event.sampling == "poisson" and event.neighbouring == "replace_one":
        left_out.append("dp-accounting has no RDP for Poisson sampling under replace-one")
    else:
        ours = (
            privdl_rdp_epsilon(event, delta=delta, steps_cache=cache)
            if pld_eps is not None
            else None
        )
        if ours is not None and pld_eps is not None and ours > pld_eps * (1.0 + RDP_AGREEMENT):
            candidates["rdp"] = ours  # dp-accounting's RDP cannot be below the PLD here
        else:
            candidates["rdp"] = event_epsilon(
                event, delta=delta, accountant="rdp", steps_cache=cache
            )
    if pld_eps is not None:
        candidates["pld"] = pld_eps
    if why is not None:
        left_out.append(why)
    if not candidates:
        raise PrivacyError(f"no accountant covers this event: {'; '.join(left_out)}")
    best = min(candidates, key=lambda name: candidates[name])
    others = ", ".join(f"{k} {v:.6g}" for k, v in candidates.items() if k != best)
    notes = f"tightest certified: {best}" + (f" (beside {others})" if others else "")
    if left_out:
        notes += "; " + "; ".join(left_out)
    return Accounted(candidates[best], best, notes, None, candidates)


def account_event(event: SubsampledGaussianEvent, *, delta: float, accountant: str) -> Accounted:
    """``event`` accounted by one named accountant, or by :data:`TIGHTEST` (the default)."""
    if accountant == TIGHTEST:
        return tightest_epsilon(event, delta=delta)
    if accountant == "gaussian":
        eps = exact_gaussian_epsilon(event, delta=delta)
        return Accounted(eps, "gaussian", "exact: mu-GDP", gaussian_mu(event), {"gaussian": eps})
    if accountant in ("pld", "rdp"):
        eps = event_epsilon(event, delta=delta, accountant=accountant)
        return Accounted(eps, accountant, "", gaussian_mu(event), {accountant: eps})
    raise PrivacyError(f"unknown accountant {accountant!r}; use one of {EVENT_ACCOUNTANTS}")


def _regula_falsi(
    eps_of, target: float, lo: float, hi: float, e_lo: float, e_hi: float, rtol: float
) -> tuple[float, float, float]:
    """Shrink a bracket with eps_of(lo) = e_lo > target >= e_hi = eps_of(hi) to relative ``rtol``
    by interpolating log eps in log z (epsilon is nearly a power of z), each point kept inside
    the inner 80% of the bracket so that it always shrinks; returns (hi, e_hi, slope) with the
    bracket's last log-log slope."""
    slope = -1.0
    while hi / lo - 1.0 > rtol:
        a, b = math.log(lo), math.log(hi)
        frac = 0.5
        if e_hi > 0 and e_lo > e_hi:
            slope = (math.log(e_lo) - math.log(e_hi)) / (a - b)
            frac = min(
                max((math.log(e_lo) - math.log(target)) / (math.log(e_lo) - math.log(e_hi)), 0.1),
                0.9,
            )
        mid = math.exp(a + frac * (b - a))
        if not lo < mid < hi:
            break
        e_mid = eps_of(mid)
        if e_mid <= target:
            hi, e_hi = mid, e_mid
        else:
            lo, e_lo = mid, e_mid
    if e_hi > 0 and e_lo > e_hi:
        slope = (math.log(e_lo) - math.log(e_hi)) / (math.log(lo) - math.log(hi))
    return hi, e_hi, slope


def _calibrate_pld(at, target: float, delta: float, rtol: float) -> float:
    """Smallest z >= PLD_MIN_NOISE (to about ``rtol``) with PLD epsilon <= target.

    The search runs on a 10x coarser loss discretisation (pessimistic, so still an upper bound,
    ~10x faster). At its answer the default-interval PLD (never looser) is evaluated, and one
    Newton step on log eps in log z, with the coarse bracket's slope, moves z down by the margin
    left; it is kept only if the default-interval PLD certifies it. Every z returned is
    certified by one of the two discretisations of the pessimistic PLD."""

    def coarse(z: float) -> float:
        return event_epsilon(at(z), delta=delta, accountant="pld", pld_interval=10 * PLD_INTERVAL)

    def fine(z: float) -> float:  # kept: the budget at the answer is asked next, as a rule
        return event_epsilon(at(z), delta=delta, accountant="pld", steps_cache=SHARED_STEPS)

    hi = 1.0
    e_hi = coarse(hi)
    while e_hi > target:
        hi *= 2.0
        if hi > 1e7:
            raise PrivacyError(f"no noise multiplier below 1e7 reaches epsilon {target}")
        e_hi = coarse(hi)
    lo = hi
    while True:
        if lo <= PLD_MIN_NOISE:
            return PLD_MIN_NOISE  # already meets the target: the smallest z PLD is asked about
        lo = max(lo * 0.7, PLD_MIN_NOISE)
        e_lo = coarse(lo)
        if e_lo > target:
            break
        hi, e_hi = lo, e_lo
    hi, _, slope = _regula_falsi(coarse, target, lo, hi, e_lo, e_hi, rtol)
    e_fine = fine(hi)
    if e_fine > target:  # pragma: no cover - the fine PLD is never looser than the coarse
        return hi
    if e_fine > 0 and slope < 0:
        for _ in range(2):  # a Newton step, and one more if it overshot the margin
            z = hi * math.exp((math.log(target) - math.log(e_fine)) / slope) * (1.0 + rtol)
            if not PLD_MIN_NOISE <= z < hi * (1.0 - rtol):
                break
            e_z = fine(z)
            if e_z > target:  # overshot: the root is bracketed by [z, hi]; shrink it to rtol
                hi, e_fine, _ = _regula_falsi(fine, target, z, hi, e_z, e_fine, rtol)
                break
            hi, e_fine = z, e_z
    return hi


def calibrate_tightest(
    *,
    target_epsilon: float,
    event: SubsampledGaussianEvent,
    delta: float,
    rtol: float = 1e-4,
) -> float:
    """Smallest noise multiplier (to relative ``rtol``, on the safe side) whose tightest epsilon
    over ``event.steps`` steps is at most ``target_epsilon``.

    ``event.noise_multiplier`` is ignored. Unsampled: the exact Gaussian inverted in closed form
    (total slope from :func:`step_rdp_for_epsilon`, then ``z = sqrt(T / (2 rho))``). Sampled:
    the RDP calibration is an upper end (the tightest epsilon is never above RDP's), the PLD's
    is searched below it, and the smaller of the two noise multipliers is returned.
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise PrivacyError(f"target epsilon must be a finite number > 0, got {target_epsilon}")

    def at(z: float) -> SubsampledGaussianEvent:
        return replace(event, noise_multiplier=float(z))

    if unsampled(event):
        rho = step_rdp_for_epsilon(target_epsilon, steps=1, delta=delta, conversion="gaussian")
        z = math.sqrt(event.steps / (2.0 * rho))
        while exact_gaussian_epsilon(at(z), delta=delta) > target_epsilon:
            z *= 1.0 + rtol / 10.0
        return z
    common = dict(
        target_epsilon=target_epsilon,
        sampling_rate=event.sampling_rate,
        steps=event.steps,
        delta=delta,
        sampling=event.sampling,
        neighbouring=event.neighbouring,
        dataset_size=event.dataset_size,
        rtol=rtol,
    )
    z_pld: float | None = None
    if _pld_unavailable(at(1.0)) is None:
        try:
            z_pld = _calibrate_pld(at, target_epsilon, delta, rtol)
        except (MemoryError, OverflowError, ValueError):
            z_pld = None  # PLD could not be computed here: RDP's calibration stands
    rdp_supported = not (event.sampling == "poisson" and event.neighbouring == "replace_one")
    z_rdp: float | None = None
    # RDP's z is needed only where RDP certifies the target at PLD's z already (then it may go
    # lower) or where there is no PLD answer
    if rdp_supported and (
        z_pld is None or event_epsilon(at(z_pld), delta=delta, accountant="rdp") <= target_epsilon
    ):
        try:
            z_rdp = calibrate_one_accountant(accountant="rdp", **common)  # type: ignore[arg-type]
        except PrivacyError:
            if z_pld is None:
                raise
    candidates = [z for z in (z_pld, z_rdp) if z is not None]
    if not candidates:
        raise PrivacyError(f"no noise multiplier reaches epsilon {target_epsilon}")
    return min(candidates)
