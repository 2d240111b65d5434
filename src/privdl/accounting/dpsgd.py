"""DP-SGD accounting for per-node mechanisms (PrivSGP-VR, PORTER-DP, Robust-HDP clients, the
LDP/CDP baselines): labelled budgets and calibration, by default with the tightest certified
accountant (:mod:`privdl.accounting.tightest`: exact Gaussian when unsampled, else the smaller of
dp-accounting's PLD and RDP). ``accountant="rdp"``, ``"pld"`` or ``"gaussian"`` asks one.

The building blocks (``event_epsilon``, the RDP orders, the Wang et al. bound, the many-clients
RDP curves) live in :mod:`privdl.accounting.rdp_pld` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.events import SubsampledGaussianEvent
from privdl.accounting.rdp_pld import (
    ACCOUNTANTS,
    PLD_MIN_NOISE,
    RDP_ORDERS,
    calibrate_noise_multipliers,
    calibrate_one_accountant,
    classic_from_curve,
    epsilons_from_curves,
    event_epsilon,
    poisson_rdp_curves,
    wang_fixed_size_rdp,
)
from privdl.accounting.tightest import TIGHTEST, account_event, calibrate_tightest
from privdl.errors import PrivacyError

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "PLD_MIN_NOISE",
    "RDP_ORDERS",
    "calibrate_noise_multiplier",
    "calibrate_noise_multipliers",
    "calibrate_nodes",
    "classic_from_curve",
    "dpsgd_budget",
    "epsilons_from_curves",
    "event_epsilon",
    "node_budgets",
    "poisson_rdp_curves",
    "wang_fixed_size_rdp",
]

#: privdl's default accountant for (subsampled) Gaussian events: the tightest certified one.
DEFAULT_ACCOUNTANT = TIGHTEST


def dpsgd_budget(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    sampling: str = "poisson",
    neighbouring: str = "add_remove",
    dataset_size: int | None = None,
    threat_model: str = "server",
) -> PrivacyBudget:
    """Example-level (epsilon, delta) of DP-SGD: T steps of a subsampled Gaussian (Abadi et al.
    2016, Alg. 1), labelled with the accountant that produced the number (with the default,
    ``gaussian``, ``pld`` or ``rdp``, whichever is the tightest certified here)."""
    event = SubsampledGaussianEvent(
        noise_multiplier=noise_multiplier,
        sampling_rate=sampling_rate,
        steps=steps,
        sampling=sampling,
        neighbouring=neighbouring,
        dataset_size=dataset_size,
    )
    got = account_event(event, delta=delta, accountant=accountant)
    notes = f"{sampling} sampling q={sampling_rate:.6g}, z={noise_multiplier:.6g}, T={steps}"
    return PrivacyBudget(
        epsilon=got.epsilon,
        delta=delta,
        accountant=got.accountant,
        neighbouring=neighbouring,
        unit="example",
        threat_model=threat_model,
        notes=f"{notes}; {got.notes}" if got.notes else notes,
        mu=got.mu,
    )


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    sampling: str = "poisson",
    neighbouring: str = "add_remove",
    dataset_size: int | None = None,
    rtol: float = 1e-4,
) -> float:
    """Smallest noise multiplier (to relative ``rtol``, on the conservative side) whose epsilon
    after ``steps`` steps is at most ``target_epsilon``, by the named accountant or (default) the
    tightest certified one."""
    if accountant in ("rdp", "pld"):
        return calibrate_one_accountant(
            target_epsilon=target_epsilon,
            sampling_rate=sampling_rate,
            steps=steps,
            delta=delta,
            accountant=accountant,
            sampling=sampling,
            neighbouring=neighbouring,
            dataset_size=dataset_size,
            rtol=rtol,
        )
    if accountant not in (TIGHTEST, "gaussian"):
        raise PrivacyError(f"unknown accountant {accountant!r}; use tightest, gaussian, pld or rdp")
    event = SubsampledGaussianEvent(
        noise_multiplier=1.0,
        sampling_rate=sampling_rate,
        steps=steps,
        sampling=sampling,
        neighbouring=neighbouring,
        dataset_size=dataset_size,
    )
    if accountant == "gaussian" and not (sampling == "none" or sampling_rate >= 1.0):
        raise PrivacyError("the exact Gaussian accountant needs an unsampled event (rate 1)")
    return calibrate_tightest(target_epsilon=target_epsilon, event=event, delta=delta, rtol=rtol)


def node_budgets(
    *,
    noise_multipliers: Sequence[float],
    sampling_rates: Sequence[float] | float,
    steps: Sequence[int] | int,
    deltas: Sequence[float] | float,
    accountant: str = DEFAULT_ACCOUNTANT,
    sampling: str = "poisson",
    neighbouring: str = "add_remove",
    threat_model: str = "server",
) -> list[PrivacyBudget]:
    """Heterogeneous per-node budgets (eps_i, delta_i); each node is accounted on its own data."""
    n = len(noise_multipliers)

    def expand(x: Sequence | float) -> list:
        return list(x) if isinstance(x, Sequence) else [x] * n

    rates, counts, dels = expand(sampling_rates), expand(steps), expand(deltas)
    if not (len(rates) == len(counts) == len(dels) == n):
        raise PrivacyError("per-node lists must all have one entry per node")
    return [
        dpsgd_budget(
            noise_multiplier=z,
            sampling_rate=r,
            steps=int(t),
            delta=d,
            accountant=accountant,
            sampling=sampling,
            neighbouring=neighbouring,
            threat_model=threat_model,
        )
        for z, r, t, d in zip(noise_multipliers, rates, counts, dels, strict=True)
    ]


def calibrate_nodes(
    *,
    epsilons: Sequence[float],
    deltas: Sequence[float] | float,
    sampling_rates: Sequence[float] | float,
    steps: Sequence[int] | int,
    accountant: str = DEFAULT_ACCOUNTANT,
    rtol: float = 1e-4,
) -> list[float]:
    """Per-node noise multipliers z_i for heterogeneous targets (eps_i, delta_i) (Poisson)."""
    n = len(epsilons)

    def expand(x: Sequence | float) -> list:
        return list(x) if isinstance(x, Sequence) else [x] * n

    return [
        calibrate_noise_multiplier(
            target_epsilon=e,
            sampling_rate=r,
            steps=int(t),
            delta=d,
            accountant=accountant,
            rtol=rtol,
        )
        for e, d, r, t in zip(
            epsilons, expand(deltas), expand(sampling_rates), expand(steps), strict=True
        )
    ]
