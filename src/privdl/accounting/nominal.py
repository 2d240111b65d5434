"""The papers' closed-form noise formulas, labelled ``nominal``, next to what they really deliver.

* PrivSGP-VR (Zhu et al.) Theorem 2, eq. (11): sigma_i = 3 c2 G sqrt(K log(1/delta_i)) / (J eps_i),
  with an unspecified constant c2 (Abadi et al. Thm 1); Corollary 1, eq. (12)-(14): K* and U*.
* PORTER-DP (Li and Chi) Theorem 1: sigma_p = c tau sqrt(T log(1/delta)) / (m eps) (c = 1 as in
  the paper; the proof's leading constant is 2); phi_m = sqrt(d log(1/delta)) / (m eps).
* Robust-HDP (Malekmohammadi et al.) reference code: z_i by bisection on [0.001, 1000] of the
  sampled-Gaussian RDP at orders 1 + x/10 (x = 1..99) and 12..64, T = K E N / b steps (a float),
  classic conversion, stopped at |eps - eps_i| <= 1e-6 and rounded to 2 decimals.

Every nominal value is paired with the epsilon that an accountant (dp-accounting RDP, Poisson
sampling, add/remove) really certifies for the noise it prescribes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp_impl

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.conversion import check_delta
from privdl.accounting.dpsgd import dpsgd_budget
from privdl.errors import PrivacyError

#: RDP orders of the Robust-HDP reference code (TF-privacy style).
ROBUST_HDP_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 65))
)


@dataclass(frozen=True)
class NominalPlan:
    """A paper formula's output (``values``), its nominal budget and the accounted one."""

    formula: str
    values: dict[str, Any]
    nominal: PrivacyBudget
    accounted: PrivacyBudget | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``epsilon_nominal`` and ``epsilon_accounted``."""
        return {
            "formula": self.formula,
            **self.values,
            "epsilon_nominal": self.nominal.epsilon,
            "epsilon_accounted": None if self.accounted is None else self.accounted.epsilon,
            "nominal": self.nominal.to_dict(),
            "accounted": None if self.accounted is None else self.accounted.to_dict(),
            "warnings": list(self.warnings),
        }


def _positive(**kwargs: float) -> None:
    for name, value in kwargs.items():
        if not (value > 0 and math.isfinite(value)):
            raise PrivacyError(f"{name} must be a positive finite number, got {value}")


# --------------------------------------------------------------------------- PrivSGP-VR
def privsgp_sigma(
    *,
    gradient_bound: float,
    steps: float,
    local_samples: int,
    epsilon: float,
    delta: float,
    c2: float = 1.0,
) -> float:
    """PrivSGP-VR Theorem 2, eq. (11): sigma_i = 3 c2 G sqrt(K log(1/delta)) / (J eps)."""
    check_delta(delta)
    _positive(
        gradient_bound=gradient_bound,
        steps=steps,
        local_samples=local_samples,
        epsilon=epsilon,
        c2=c2,
    )
    return (
        3.0
        * c2
        * gradient_bound
        * math.sqrt(steps * math.log(1.0 / delta))
        / (local_samples * epsilon)
    )


def _budget_sum(epsilons: Sequence[float], deltas: Sequence[float]) -> float:
    """S = sum_i log(1/delta_i) / eps_i^2 (Corollary 1)."""
    return float(sum(math.log(1.0 / d) / e**2 for e, d in zip(epsilons, deltas, strict=True)))


def privsgp_utility(
    steps: float,
    *,
    A: float,
    local_samples: int,
    n: int,
    smoothness: float,
    dim: int,
    gradient_bound: float,
    epsilons: Sequence[float],
    deltas: Sequence[float],
    c2: float = 1.0,
) -> float:
    """U(K) = A/sqrt(nK) + sqrt(K) 216 L d c2^2 G^2 S / (J^2 n^{3/2}) (proof of Cor 1, eq. 14)."""
    s = _budget_sum(epsilons, deltas)
    j = local_samples
    return A / math.sqrt(n * steps) + math.sqrt(steps) * 216.0 * smoothness * dim * c2**2 * (
        gradient_bound**2
    ) * s / (j**2 * n**1.5)


def privsgp_optimal_steps(
    *,
    A: float,
    local_samples: int,
    n: int,
    smoothness: float,
    dim: int,
    gradient_bound: float,
    epsilons: Sequence[float],
    deltas: Sequence[float],
    c2: float = 1.0,
) -> tuple[float, float]:
    """Corollary 1: K* = A J^2 n / (216 L d c2^2 G^2 S) (eq. 12) and U(K*) (eq. 13)."""
    if len(epsilons) != n or len(deltas) != n:
        raise PrivacyError("epsilons and deltas need one entry per node")
    for d in deltas:
        check_delta(d)
    s = _budget_sum(epsilons, deltas)
    k_star = A * local_samples**2 * n / (216.0 * smoothness * dim * c2**2 * gradient_bound**2 * s)
    u_star = (
        12.0 * c2 * gradient_bound * math.sqrt(6.0 * smoothness * dim * A * s) / (n * local_samples)
    )
    return float(k_star), float(u_star)


def privsgp_plan(
    *,
    gradient_bound: float,
    steps: int,
    local_samples: int,
    epsilon: float,
    delta: float,
    c2: float = 1.0,
) -> NominalPlan:
    """Theorem 2's sigma_i and the epsilon an RDP accountant certifies for it.

    Accounting: noise multiplier z = sigma_i / (3G) (sensitivity 3G), sampling rate 1/J, K steps,
    Poisson sampling and add/remove (the algorithm samples one point uniformly; the SAGA mean term
    touches every sample, so even this is optimistic, spec s.8 item 4).
    """
    sigma = privsgp_sigma(
        gradient_bound=gradient_bound,
        steps=steps,
        local_samples=local_samples,
        epsilon=epsilon,
        delta=delta,
        c2=c2,
    )
    z = sigma / (3.0 * gradient_bound)
    accounted = dpsgd_budget(
        noise_multiplier=z,
        sampling_rate=1.0 / local_samples,
        steps=int(steps),
        delta=delta,
        threat_model="curious",
    )
    nominal = PrivacyBudget(
        epsilon=epsilon,
        delta=delta,
        accountant="nominal:privsgp-thm2",
        neighbouring="replace_one",
        unit="example",
        threat_model="curious",
        nominal=True,
        notes=f"c2={c2} (unspecified in the paper)",
    )
    return NominalPlan(
        "privsgp-thm2", {"sigma": sigma, "noise_multiplier": z, "c2": c2}, nominal, accounted
    )


# --------------------------------------------------------------------------- PORTER
def porter_phi(*, dim: int, local_samples: int, epsilon: float, delta: float) -> float:
    """phi_m = sqrt(d log(1/delta)) / (m eps), the centralised DP-SGD utility (PORTER s.1.5)."""
    check_delta(delta)
    return math.sqrt(dim * math.log(1.0 / delta)) / (local_samples * epsilon)


def porter_sigma(
    *, tau: float, steps: int, delta: float, local_samples: int, epsilon: float, c: float = 1.0
) -> float:
    """PORTER-DP Theorem 1: sigma_p = c tau sqrt(T log(1/delta)) / (m eps) (c = 1 in the paper)."""
    check_delta(delta)
    _positive(tau=tau, steps=steps, local_samples=local_samples, epsilon=epsilon, c=c)
    return c * tau * math.sqrt(steps * math.log(1.0 / delta)) / (local_samples * epsilon)


def porter_plan(
    *,
    tau: float,
    steps: int,
    delta: float,
    local_samples: int,
    epsilon: float,
    c: float = 1.0,
    dim: int | None = None,
) -> NominalPlan:
    """Theorem 1's sigma_p, its validity checks (spec s.4.2) and the accounted epsilon.

    Accounting: z = sigma_p / tau (b = 1, add/remove sensitivity tau), q = 1/m, T steps, Poisson.
    """
    sigma = porter_sigma(
        tau=tau, steps=steps, delta=delta, local_samples=local_samples, epsilon=epsilon, c=c
    )
    z = sigma / tau
    q = 1.0 / local_samples
    warns = []
    if z < 1:
        warns.append(f"noise multiplier {z:.3g} < 1 (outside the moments-accountant lemma)")
    if q * z > 1.0 / 16:
        warns.append("q z > 1/16: Abadi et al. Lemma 3 does not apply")
    if epsilon > steps * q**2:
        warns.append(f"eps > T/m^2 = {steps * q**2:.3g}: outside Theorem 1's condition")
    lam = 2.0 * math.log(1.0 / delta) / epsilon
    if q * z < 1 and lam > z**2 * math.log(1.0 / (q * z)):
        warns.append("lambda* = 2 log(1/delta)/eps exceeds z^2 log(1/(q z))")
    values: dict[str, Any] = {"sigma_p": sigma, "noise_multiplier": z, "c": c}
    if dim is not None:
        values["phi_m"] = porter_phi(
            dim=dim, local_samples=local_samples, epsilon=epsilon, delta=delta
        )
    accounted = dpsgd_budget(
        noise_multiplier=z, sampling_rate=q, steps=int(steps), delta=delta, threat_model="curious"
    )
    nominal = PrivacyBudget(
        epsilon=epsilon,
        delta=delta,
        accountant="nominal:porter-thm1",
        neighbouring="replace_one",
        unit="example",
        threat_model="curious",
        nominal=True,
        notes=f"c={c}; proof's leading constant is 2",
    )
    return NominalPlan("porter-thm1", values, nominal, accounted, warns)


# --------------------------------------------------------------------------- Robust-HDP
def _sgm_rdp(q: float, z: float, orders: Sequence[float]) -> np.ndarray:
    """Per-step RDP of the Poisson-sampled Gaussian (Mironov et al. 2019) via dp-accounting."""
    return np.asarray(_rdp_impl._compute_rdp_poisson_subsampled_gaussian(q, z, orders))


def robust_hdp_epsilon(
    noise_multiplier: float,
    *,
    batch_size: int,
    dataset_size: int,
    delta: float,
    local_epochs: int = 1,
    rounds: int = 200,
) -> float:
    """The Robust-HDP code's epsilon: classic conversion at its orders with T = K E N / b."""
    check_delta(delta)
    q = batch_size / dataset_size
    steps = local_epochs * rounds * dataset_size / batch_size
    orders = np.asarray(ROBUST_HDP_ORDERS)
    rdp = steps * _sgm_rdp(q, noise_multiplier, orders)
    return float(np.min(rdp - math.log(delta) / (orders - 1.0)))


def robust_hdp_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    batch_size: int,
    dataset_size: int,
    local_epochs: int = 1,
    rounds: int = 200,
    round_to: int | None = 2,
) -> float:
    """z_i by the reference code's bisection on [0.001, 1000] (|eps - eps_i| <= 1e-6), rounded."""
    _positive(epsilon=epsilon, batch_size=batch_size, dataset_size=dataset_size)
    if batch_size > dataset_size:
        raise PrivacyError("batch size must not exceed the dataset size")

    def eps(z: float) -> float:
        return robust_hdp_epsilon(
            z,
            batch_size=batch_size,
            dataset_size=dataset_size,
            delta=delta,
            local_epochs=local_epochs,
            rounds=rounds,
        )

    lo, hi = 0.001, 1000.0
    if eps(hi) > epsilon:
        raise PrivacyError(f"no noise multiplier in [0.001, 1000] reaches epsilon {epsilon}")
    z = hi
    for _ in range(200):
        z = 0.5 * (lo + hi)
        e = eps(z)
        if abs(e - epsilon) <= 1e-6:
            break
        if e > epsilon:
            lo = z
        else:
            hi = z
    return round(z, round_to) if round_to is not None else z


def robust_hdp_plan(
    *,
    epsilon: float,
    delta: float,
    batch_size: int,
    dataset_size: int,
    local_epochs: int = 1,
    rounds: int = 200,
    round_to: int | None = 2,
) -> NominalPlan:
    """The reference code's z_i, the epsilon it claims and what dp-accounting certifies.

    Accounting: ceil(N/b) Poisson steps per epoch (Opacus), K E epochs, rate b/N.
    """
    z = robust_hdp_noise_multiplier(
        epsilon=epsilon,
        delta=delta,
        batch_size=batch_size,
        dataset_size=dataset_size,
        local_epochs=local_epochs,
        rounds=rounds,
        round_to=round_to,
    )
    steps = local_epochs * rounds * math.ceil(dataset_size / batch_size)
    accounted = dpsgd_budget(
        noise_multiplier=z,
        sampling_rate=batch_size / dataset_size,
        steps=steps,
        delta=delta,
        threat_model="server",
    )
    code_eps = robust_hdp_epsilon(
        z,
        batch_size=batch_size,
        dataset_size=dataset_size,
        delta=delta,
        local_epochs=local_epochs,
        rounds=rounds,
    )
    nominal = PrivacyBudget(
        epsilon=epsilon,
        delta=delta,
        accountant="nominal:robust-hdp-code",
        neighbouring="add_remove",
        unit="example",
        threat_model="server",
        nominal=True,
        notes=f"z rounded to {round_to} decimals",
    )
    return NominalPlan(
        "robust-hdp-z",
        {"noise_multiplier": z, "epsilon_code_orders": code_eps, "steps": steps},
        nominal,
        accounted,
    )
