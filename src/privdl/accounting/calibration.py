"""Noise calibration for DECOR (App. D.1; docs/accounting.md): sigma_cor for a target (eps, delta).

For fixed sigma_cdp, Alg 2/3 is non-increasing in sigma_cor, so a bisection on log(sigma_cor)
finds the smallest sigma_cor (to relative ``rtol``) with achieved eps <= target. Unlike the
official code (which accepts an overshoot of 1e-4 absolute per step, giving e.g. 8.14 for a
target of 7), the returned value is always on the conservative side.

The admissible sigma_cdp range is (sigma_cdp_min, sigma_ldp]: at sigma_cdp >= sigma_ldp no
correlated noise is needed (sigma_cor = 0); at or below sigma_cdp_min even sigma_cor -> infinity
does not reach the target (sigma_cdp_min = sigma_ldp / sqrt(smallest component of G[H]), the CDP
level sigma_ldp/sqrt(n) on a connected graph with q = 0).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import networkx as nx

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.conversion import (
    DEFAULT_CONVERSION,
    compose_convert,
    gaussian_mu,
    step_rdp_for_epsilon,
)
from privdl.accounting.secrdp import (
    MAX_SUBSETS,
    Adversary,
    PrivacyWarning,
    cdp_limit_step_rdp,
    decor_step_rdp,
    parse_adversary,
)
from privdl.errors import PrivacyError


@dataclass(frozen=True)
class DecorCalibration:
    """Result of :func:`calibrate_sigma_cor`."""

    sigma_cor: float
    sigma_cdp: float
    epsilon_target: float
    epsilon_achieved: float
    delta: float
    steps: int
    step_rdp: float
    step_rdp_target: float
    sigma_cdp_min: float
    sigma_cdp_max: float
    adversary: str
    conversion: str

    @property
    def budget(self) -> PrivacyBudget:
        """The achieved guarantee, labelled (user level, sensitivity 2C per step)."""
        return PrivacyBudget(
            epsilon=self.epsilon_achieved,
            delta=self.delta,
            accountant=f"secrdp+{self.conversion}",
            neighbouring="replace_one",
            unit="user",
            threat_model=self.adversary,
            notes="user-level, sensitivity 2C per step",
            mu=gaussian_mu(self.steps * self.step_rdp) if self.conversion == "gaussian" else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the labelled ``budget`` and its ``label``."""
        return {**asdict(self), "budget": self.budget.to_dict(), "label": self.budget.label()}


def sigma_cdp_range(
    graph: nx.Graph,
    *,
    epsilon: float,
    delta: float,
    steps: int,
    clip: float = 1.0,
    adversary: str | int | Adversary = "eavesdropper",
    conversion: str = DEFAULT_CONVERSION,
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
) -> tuple[float, float]:
    """(sigma_cdp_min, sigma_ldp): sigma_cor exists iff sigma_cdp_min < sigma_cdp.

    sigma_ldp = C sqrt(2/eps_iter) with eps_iter from (ACC-2) (or the chosen conversion).
    """
    rho = step_rdp_for_epsilon(epsilon, steps=steps, delta=delta, conversion=conversion)
    sigma_ldp = clip * math.sqrt(2.0 / rho)
    limit_at_one = cdp_limit_step_rdp(
        graph, sigma_cdp=1.0, clip=clip, adversary=adversary, max_subsets=max_subsets, force=force
    )
    # limit(s) = limit_at_one / s^2 <= rho  <=>  s >= sqrt(limit_at_one / rho)
    return math.sqrt(limit_at_one / rho), sigma_ldp


DEFAULT_SIGMA_CDP_FACTOR = math.sqrt(2.0)


def calibrate_sigma_cor(
    graph: nx.Graph,
    *,
    epsilon: float,
    delta: float,
    steps: int,
    sigma_cdp: float | None = None,
    clip: float = 1.0,
    adversary: str = "eavesdropper",
    conversion: str = DEFAULT_CONVERSION,
    rtol: float = 1e-6,
    max_subsets: int = MAX_SUBSETS,
    force: bool = False,
) -> DecorCalibration:
    """Smallest sigma_cor (to relative ``rtol``) such that DECOR is (eps, delta)-SecLDP.

    ``sigma_cdp=None`` takes the default ``sqrt(2) x sigma_cdp_min``, capped at sigma_ldp.
    ``sigma_cdp_min`` is where even sigma_cor -> infinity only just meets the budget (the CDP level
    sigma_ldp / sqrt(n) against an eavesdropper on a connected graph; larger against colluders).
    ``sqrt(2) sigma_cdp_min`` gives half of the step's RDP budget to the independent noise and
    half to the correlated noise: the split of the paper's theory calibration (Cor. 3 / Cor. 12,
    DECOR Section 5.3 and Appendix C). At the cap no correlated noise is needed (e.g. two colluders
    on a ring can cut a node off, so sigma_cdp_min = sigma_ldp and DECOR adds LDP noise). Measured
    against other points of the range (docs/reproductions-decor.md): within 10-20% of the best
    sigma_cdp on the a9a demo and Fig 1a's ring, where twice the CDP level was 1.1-3x worse.

    Raises :class:`PrivacyError` if ``sigma_cdp`` is outside the admissible range.
    """
    if epsilon <= 0:
        raise PrivacyError(f"epsilon must be > 0, got {epsilon}")
    adv = parse_adversary(adversary)
    lo_cdp, hi_cdp = sigma_cdp_range(
        graph,
        epsilon=epsilon,
        delta=delta,
        steps=steps,
        clip=clip,
        adversary=adv,
        conversion=conversion,
        max_subsets=max_subsets,
        force=force,
    )
    if sigma_cdp is None:
        sigma_cdp = min(hi_cdp * (1 + 1e-9), DEFAULT_SIGMA_CDP_FACTOR * lo_cdp)
        if DEFAULT_SIGMA_CDP_FACTOR * lo_cdp >= hi_cdp and adv.kind != "ldp":
            why = (
                f"{adv.label} can cut a node off from the others (the graph is not "
                f"{adv.q + 1}-connected)"
                if lo_cdp >= hi_cdp * (1 - 1e-9)
                else f"sigma_cdp_min is {lo_cdp / hi_cdp:.3g} x the LDP level against {adv.label}"
            )
            warnings.warn(
                f"{why}: DECOR adds the LDP noise and no correlated noise (sigma_cor = 0)",
                PrivacyWarning,
                stacklevel=2,
            )
    rho = step_rdp_for_epsilon(epsilon, steps=steps, delta=delta, conversion=conversion)

    def step(c: float) -> float:
        return decor_step_rdp(
            graph,
            sigma_cdp=sigma_cdp,
            sigma_cor=c,
            clip=clip,
            adversary=adv,
            max_subsets=max_subsets,
            force=force,
        ).step_rdp

    def eps_of(s: float) -> float:
        return compose_convert(s, steps=steps, delta=delta, conversion=conversion)

    if sigma_cdp <= lo_cdp:
        raise PrivacyError(
            f"sigma_cdp = {sigma_cdp:.6g} is too small: no sigma_cor reaches epsilon {epsilon} "
            f"(need sigma_cdp > {lo_cdp:.6g}; LDP level {hi_cdp:.6g})"
        )
    if eps_of(step(0.0)) <= epsilon:
        c, s = 0.0, step(0.0)
    else:
        hi = max(sigma_cdp, 1e-12)
        while eps_of(step(hi)) > epsilon:
            hi *= 4.0
            if hi > 1e12 * sigma_cdp:
                raise PrivacyError("sigma_cor search diverged; sigma_cdp is too close to its limit")
        lo = hi / 4.0
        while eps_of(step(lo)) <= epsilon and lo > 1e-12 * sigma_cdp:
            lo, hi = lo / 4.0, lo
        while hi / lo - 1.0 > rtol:
            mid = math.sqrt(lo * hi)
            if eps_of(step(mid)) <= epsilon:
                hi = mid
            else:
                lo = mid
        c, s = hi, step(hi)
    return DecorCalibration(
        sigma_cor=float(c),
        sigma_cdp=float(sigma_cdp),
        epsilon_target=float(epsilon),
        epsilon_achieved=float(eps_of(s)),
        delta=float(delta),
        steps=int(steps),
        step_rdp=float(s),
        step_rdp_target=float(rho),
        sigma_cdp_min=float(lo_cdp),
        sigma_cdp_max=float(hi_cdp),
        adversary=adv.label,
        conversion=conversion,
    )
