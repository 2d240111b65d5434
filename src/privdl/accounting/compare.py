"""Every accountant side by side, and the privacy curves of a mechanism.

* :func:`compare_event` / :func:`compare_decor` -- one labelled row per accountant (``epsilon``
  None, with the reason, where it does not apply); the tightest certified row is marked.
* :func:`tradeoff_curve` -- the trade-off curve ``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)`` of
  mu-GDP (Dong, Roth and Su 2019, Def. 2.7): the smallest type II error of any test of the
  hypotheses "the record is in" against "it is not" at type I error alpha.
* :func:`epsilon_delta_curve` -- epsilon over a grid of deltas: exact for mu-GDP (the delta(eps)
  of Balle and Wang 2018, Thm 8, inverted), the tightest certified accountant per delta otherwise.
* :func:`tradeoff_from_pairs` -- the f-DP implied by a collection of (epsilon, delta) guarantees
  (Dong, Roth and Su 2019, Prop. 2.5; Kairouz, Oh and Viswanath 2015).

Conversions named in the rows: ``rdp`` is dp-accounting's RDP curve converted by Canonne, Kamath
and Steinke 2020 (Prop. 12), ``rdp-classic`` the same curve by Mironov 2017 (Prop. 3):
``min_alpha rdp(alpha) + log(1/delta) / (alpha - 1)``, never smaller than ``rdp``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import numpy as np
from dp_accounting import pld, rdp
from scipy import special

from privdl.accounting.conversion import check_delta, compose_convert, gaussian_epsilon
from privdl.accounting.decor import DecorAccount, account_decor
from privdl.accounting.events import DecorStepEvent, SubsampledGaussianEvent
from privdl.accounting.rdp_pld import (
    RDP_ORDERS,
    _relation,
    classic_from_curve,
    pld_round_off_mass,
    poisson_rdp_curves,
)
from privdl.accounting.tightest import _pld_unavailable, exact_gaussian_epsilon, gaussian_mu
from privdl.errors import PrivacyError

#: The delta grid of the printed (epsilon, delta) curve: 1e-10 .. 1e-2, half decades.
DEFAULT_DELTAS: tuple[float, ...] = tuple(float(10.0**k) for k in np.arange(-10.0, -1.9, 0.5))
#: Type I errors of the trade-off grid: linear in [0, 1] plus small ones (G_mu is steep at 0).
DEFAULT_ALPHAS: tuple[float, ...] = tuple(
    float(a) for a in np.unique(np.r_[np.logspace(-6, -2, 5), np.linspace(0.0, 1.0, 101)])
)
#: The deltas whose (epsilon, delta) pairs make a subsampled event's conservative trade-off.
TRADEOFF_DELTAS: tuple[float, ...] = tuple(float(d) for d in np.logspace(-12, math.log10(0.5), 48))


def _row(accountant: str, epsilon: float | None, delta: float, note: str, **extra: Any) -> dict:
    """One row; ``extra`` may set certified (default True), exact, mu, label."""
    certified = extra.pop("certified", True) and epsilon is not None
    return {"accountant": accountant, "epsilon": None if epsilon is None else float(epsilon),
            "delta": delta, "certified": certified, "exact": extra.pop("exact", False),
            "tightest": False, "mu": extra.pop("mu", None), "note": note, **extra}  # fmt: skip


def mark_tightest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark the smallest certified epsilon ``tightest`` (a nominal row never is). An exact row
    wins outright: every certified bound of the same mechanism lies above it, up to rounding."""
    certified = [r for r in rows if r["certified"] and r["epsilon"] is not None]
    if certified:
        exact = [r for r in certified if r["exact"]]
        best = exact[0] if exact else min(certified, key=lambda r: r["epsilon"])
        best["tightest"] = True
    return rows


def _rdp_curves(event: SubsampledGaussianEvent) -> list[np.ndarray]:
    """Composed RDP curves on :data:`RDP_ORDERS` that each bound ``event``: dp-accounting's and,
    for Poisson add/remove, privdl's series (the larger epsilon of the two holds, as in
    :func:`~privdl.accounting.rdp_pld.event_epsilon`)."""
    acc = rdp.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=_relation(event.neighbouring))
    dp_event = event.to_dp_event()
    if not acc.supports(dp_event):
        raise PrivacyError(
            f"dp-accounting has no RDP for {event.sampling} sampling under {event.neighbouring}"
        )
    absl, level = logging.getLogger("absl"), logging.getLogger("absl").level
    absl.setLevel(logging.ERROR)  # one warning per fractional order it cannot sum: dropped
    try:
        acc.compose(dp_event)
    finally:
        absl.setLevel(level)
    curves = [np.asarray(acc._rdp, dtype=float)]
    if (event.sampling, event.neighbouring) == (
        "poisson",
        "add_remove",
    ) and event.sampling_rate < 1:
        ours = poisson_rdp_curves([event.sampling_rate], [event.noise_multiplier])[0]
        curves.append(event.steps * ours)
    return curves


def _rdp_epsilon(curves: list[np.ndarray], delta: float) -> float:
    """Canonne-Kamath-Steinke conversion (dp-accounting's) of the curves; the largest holds."""
    compute = rdp.rdp_privacy_accountant.compute_epsilon
    return max(float(compute(np.asarray(RDP_ORDERS), c, delta)[0]) for c in curves)


def _pld_accountant(event: SubsampledGaussianEvent) -> pld.PLDAccountant:
    """dp-accounting's PLD composed once (replace-one gets 2z, see ``event_epsilon``)."""
    acc = pld.PLDAccountant(neighboring_relation=_relation(event.neighbouring))
    if event.neighbouring == "replace_one":
        event = replace(event, noise_multiplier=2.0 * event.noise_multiplier)
    acc.compose(event.to_dp_event())
    return acc


class _Pieces:
    """The accountants of one event, each composed once, evaluated per delta."""

    def __init__(self, event: SubsampledGaussianEvent, cap_mu: float | None = None) -> None:
        self.pld: Any = None
        self.curves: list[np.ndarray] = []
        self.cap_mu = cap_mu
        self.why: dict[str, str] = {}  # why an accountant is not asked, by name
        why = _pld_unavailable(event)
        if why is None:
            try:
                self.pld = _pld_accountant(event)
            except (MemoryError, OverflowError, ValueError) as exc:  # RDP stands, as in tightest
                why = f"PLD failed ({type(exc).__name__}: {exc})"
        if why is not None:
            self.why["pld"] = why
        # the FFT round-off allowance of event_epsilon (asked at delta - 4x the negative mass)
        self.pld_mass = pld_round_off_mass(self.pld) if self.pld is not None else 0.0
        try:
            self.curves = _rdp_curves(event)
        except PrivacyError as exc:
            self.why["rdp"] = str(exc)
        if self.pld is None and not self.curves:
            raise PrivacyError(f"no accountant covers this event: {'; '.join(self.why.values())}")

    def epsilons(self, delta: float) -> dict[str, float]:
        out = {}
        if self.pld is not None and self.pld_mass <= 1e-3 * delta:
            out["pld"] = float(self.pld.get_epsilon(delta - 4.0 * self.pld_mass))
        if self.curves:
            out["rdp"] = _rdp_epsilon(self.curves, delta)
        if self.cap_mu is not None:
            out["gaussian-unsampled-cap"] = gaussian_epsilon(self.cap_mu**2 / 2.0, delta)
        return out

    def curve(self, deltas: list[float]) -> dict[str, Any]:
        # where no accountant certifies a delta (PLD's round-off too large, no RDP): inf
        best = [
            min(v.items(), key=lambda kv: kv[1]) if v else ("none", math.inf)
            for v in map(self.epsilons, deltas)
        ]
        return {"mu": None, "deltas": deltas, "epsilons": [e for _, e in best],
                "accountants": [n for n, _ in best]}  # fmt: skip

    def tradeoff(self, alphas: Any, curve: dict[str, Any]) -> np.ndarray:
        """Pairs: ``curve``'s, RDP's on :data:`TRADEOFF_DELTAS`, PLD's delta(eps) on an epsilon
        grid up to its epsilon at the smallest of those; raised to G_cap_mu where the cap holds
        (all are lower bounds)."""
        eps: list[float] = list(curve["epsilons"])
        dels: list[float] = list(curve["deltas"])
        eps_max = self.curve([min(TRADEOFF_DELTAS)])["epsilons"][0]
        if self.curves:
            eps.extend(_rdp_epsilon(self.curves, d) for d in TRADEOFF_DELTAS)
            dels.extend(TRADEOFF_DELTAS)
        if self.pld is not None and math.isfinite(eps_max):
            grid = np.linspace(0.0, eps_max, 64)
            eps.extend(grid)
            pld_deltas = np.atleast_1d(self.pld._pld.get_delta_for_epsilon(grid))
            dels.extend(pld_deltas + 4.0 * self.pld_mass)
        betas = tradeoff_from_pairs(eps, dels, alphas)
        if self.cap_mu is not None:
            betas = np.maximum(betas, tradeoff_curve(self.cap_mu, alphas))
        return betas


def compare_event(event: SubsampledGaussianEvent, *, delta: float) -> list[dict[str, Any]]:
    """Every applicable accountant's epsilon of a DP-SGD event at ``delta``, labelled.

    Rows: ``gaussian`` (exact mu-GDP, unsampled events only), ``pld`` (dp-accounting, for noise
    multipliers >= PLD_MIN_NOISE, not fixed-size sampling), ``rdp`` (dp-accounting, Canonne-Kamath-
    Steinke conversion) and ``rdp-classic`` (the same curve, Mironov's conversion). A row whose
    accountant does not apply has ``epsilon`` None and says why in ``note``.
    """
    check_delta(delta)
    rows = []
    mu = gaussian_mu(event)
    if mu is not None:
        eps = exact_gaussian_epsilon(event, delta=delta)
        note = f"exact: mu-GDP, mu = sqrt(T)/z = {mu:.6g}"
    else:
        eps, note = None, "not applicable: a subsampled Gaussian is not a Gaussian mechanism"
    rows.append(_row("gaussian", eps, delta, note, exact=mu is not None, mu=mu))
    pieces = _Pieces(event)
    got = pieces.epsilons(delta)
    na = {k: f"not applicable: {v}" for k, v in pieces.why.items()}
    if pieces.pld is not None and "pld" not in got:
        na["pld"] = (
            f"not certified here: the PLD's FFT round-off ({pieces.pld_mass:.2g}) is not small "
            f"against delta {delta:g}"
        )
    pld_note = "dp-accounting PLD, pessimistic discretisation"
    if pieces.pld_mass > 0:
        pld_note += f", asked at delta - 4 x its FFT round-off ({pieces.pld_mass:.2g})"
    rows.append(_row("pld", got.get("pld"), delta, na.get("pld", pld_note)))
    rows.append(_row("rdp", got.get("rdp"), delta, na.get("rdp", "dp-accounting RDP, "
                     "Canonne-Kamath-Steinke conversion")))  # fmt: skip
    orders = np.asarray(RDP_ORDERS)
    classic = max((classic_from_curve(orders, c, delta) for c in pieces.curves), default=None)
    rows.append(_row("rdp-classic", classic, delta, na.get("rdp", "dp-accounting RDP curve, "
                     "Mironov conversion")))  # fmt: skip
    return mark_tightest(rows)


#: The example-level rows of :func:`compare_decor` (their order in the table).
_EXAMPLE_ROWS = ("pld", "rdp", "classic", "legacy-uncomposed")


def compare_decor(graph: Any, *, delta: float, **settings: Any) -> list[dict[str, Any]]:
    """Every applicable conversion of a DECOR deployment at ``delta``, labelled.

    ``settings`` are :func:`~privdl.accounting.decor.account_decor`'s (no ``conversion``). User
    level: ``gaussian`` (exact), ``improved``, ``classic``. Example level: ``pld`` and ``rdp``
    (the tightest default's pieces, each capped by the unsampled mechanism's exact epsilon),
    ``gaussian-unsampled`` (that cap on its own), ``classic`` (Wang et al. 2019, Lemma 11) and
    ``legacy-uncomposed`` (nominal: never certified, never marked tightest).
    """
    settings.pop("conversion", None)
    base = account_decor(graph, delta=delta, **settings)  # the default: errors surface here
    rows = []

    def row(name: str, acc: DecorAccount, exact: bool = False) -> dict[str, Any]:
        b = acc.budget
        return _row(name, b.epsilon, delta, b.notes, certified=not b.nominal, exact=exact,
                    mu=b.mu, label=b.label())  # fmt: skip

    if base.budget.unit == "user":
        rows.append(row("gaussian", base, exact=True))
        for name in ("improved", "classic"):
            rows.append(row(name, account_decor(graph, delta=delta, conversion=name, **settings)))
        return mark_tightest(rows)
    for name in _EXAMPLE_ROWS:
        try:
            rows.append(row(name, account_decor(graph, delta=delta, conversion=name, **settings)))
        except PrivacyError as exc:
            rows.append(_row(name, None, delta, f"not applicable: {exc}"))
    rho = base.steps * base.step_rdp
    eps = compose_convert(base.step_rdp, steps=base.steps, delta=delta, conversion="gaussian")
    rows.insert(2, _row("gaussian-unsampled", eps, delta, "exact epsilon of the unsampled "
                        "mechanism at C/b: subsampling never hurts (the pld and rdp rows are "
                        "capped by it)", mu=math.sqrt(2.0 * rho)))  # fmt: skip
    return mark_tightest(rows)


def tradeoff_curve(mu: float, alphas: Any = DEFAULT_ALPHAS) -> np.ndarray:
    """beta(alpha) = Phi(Phi^-1(1 - alpha) - mu), the trade-off curve G_mu of mu-GDP (Dong, Roth
    and Su 2019, Def. 2.7), as ``Phi(-Phi^-1(alpha) - mu)`` (no cancellation in 1 - alpha)."""
    a = np.asarray(alphas, dtype=float)
    if mu < 0 or np.any((a < 0) | (a > 1)):
        raise PrivacyError("need mu >= 0 and type I errors alpha in [0, 1]")
    return np.asarray(special.ndtr(-special.ndtri(a) - mu), dtype=float)


def tradeoff_from_pairs(epsilons: Any, deltas: Any, alphas: Any = DEFAULT_ALPHAS) -> np.ndarray:
    """The trade-off curve implied by (epsilon_i, delta_i)-DP for every i: beta(alpha) =
    max_i max(0, 1 - delta_i - e^eps_i alpha, e^-eps_i (1 - delta_i - alpha)) (Dong, Roth and Su
    2019, Prop. 2.5; Kairouz et al. 2015). Each pair that holds bounds the true curve from below,
    so where the pairs are certified this is a valid lower bound on the mechanism's trade-off
    curve (conservative: more pairs bring it closer)."""
    a = np.asarray(alphas, dtype=float)[:, None]
    e = np.minimum(np.asarray(epsilons, dtype=float), 700.0)[None, :]  # e^eps finite
    d = np.asarray(deltas, dtype=float)[None, :]
    beta = np.maximum(1.0 - d - np.exp(e) * a, np.exp(-e) * (1.0 - d - a))
    return np.asarray(np.maximum(beta, 0.0).max(axis=1), dtype=float)


def _checked(deltas: Any) -> list[float]:
    ds = [float(d) for d in deltas]
    for d in ds:
        check_delta(d)
    return ds


def epsilon_delta_curve(
    source: float | SubsampledGaussianEvent,
    *,
    deltas: Any = DEFAULT_DELTAS,
    cap_mu: float | None = None,
) -> dict[str, Any]:
    """epsilon at each delta, with the accountant that gave it.

    ``source`` is a mu (exact: mu-GDP inverted per delta) or an event (unsampled: exact with its
    mu; sampled: per delta the smallest of dp-accounting's PLD, composed once, and RDP).
    ``cap_mu`` adds the exact epsilon of a mu-GDP bound that also holds (DECOR's unsampled cap).
    """
    ds = _checked(deltas)
    mu = gaussian_mu(source) if isinstance(source, SubsampledGaussianEvent) else float(source)
    if mu is not None:
        if not (mu >= 0 and math.isfinite(mu)):
            raise PrivacyError(f"mu must be a finite number >= 0, got {mu}")
        eps = [gaussian_epsilon(mu * mu / 2.0, d) for d in ds]
        return {"mu": mu, "deltas": ds, "epsilons": eps, "accountants": ["gaussian"] * len(ds)}
    assert isinstance(source, SubsampledGaussianEvent)  # only an event has no mu
    return _Pieces(source, cap_mu).curve(ds)


def privacy_curves(
    source: float | SubsampledGaussianEvent,
    *,
    deltas: Any = DEFAULT_DELTAS,
    alphas: Any = DEFAULT_ALPHAS,
    cap_mu: float | None = None,
) -> dict[str, Any]:
    """The (epsilon, delta) curve on ``deltas`` and the trade-off curve on ``alphas``: exact
    (G_mu) for mu-GDP, else the conservative one of :func:`tradeoff_from_pairs` (certified pairs
    of RDP and PLD, and G_cap_mu where a cap holds: each a lower bound of the true curve)."""
    mu = gaussian_mu(source) if isinstance(source, SubsampledGaussianEvent) else float(source)
    if mu is not None:
        curve = epsilon_delta_curve(mu, deltas=deltas)
        betas, kind = tradeoff_curve(mu, alphas), "exact: G_mu of mu-GDP"
    else:
        assert isinstance(source, SubsampledGaussianEvent)
        pieces = _Pieces(source, cap_mu)
        curve = pieces.curve(_checked(deltas))
        betas = pieces.tradeoff(alphas, curve)
        kind = "conservative: implied by certified (epsilon, delta) pairs (a lower bound)"
    return {
        "mu": mu,
        "epsilon_delta": curve,
        "tradeoff": {"alphas": [float(a) for a in alphas], "betas": [float(b) for b in betas],
                     "kind": kind},
    }  # fmt: skip


def decor_curves(account: DecorAccount, **grids: Any) -> dict[str, Any]:
    """:func:`privacy_curves` of a DECOR account: the mechanism's curves, whatever conversion
    the account's epsilon came from (user level exact; example level its equivalent subsampled
    Gaussian, capped by the unsampled mechanism's mu-GDP)."""
    mu_unsampled = math.sqrt(2.0 * account.steps * account.step_rdp)
    if account.budget.unit == "user":
        return privacy_curves(mu_unsampled, **grids)
    s = account.sampling
    event = DecorStepEvent(account.step_rdp, account.steps, account.adversary, s["sampling_rate"],
                           s["sampling"], s["dataset_size"]).as_gaussian(s["neighbouring"])  # fmt: skip
    return privacy_curves(event, cap_mu=mu_unsampled, **grids)
