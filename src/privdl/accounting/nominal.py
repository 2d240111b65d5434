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
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.conversion import (
    UNSAMPLED_CAP_NOTE,
    cap_by_unsampled,
    check_delta,
    compose_convert,
    gaussian_mu,
    step_rdp_for_epsilon,
)
from privdl.accounting.dpsgd import calibrate_noise_multiplier, dpsgd_budget
from privdl.accounting.poisson_rdp import ROBUST_HDP_ORDERS, rdp_poisson_subsampled_gaussian
from privdl.errors import PrivacyError


@dataclass(frozen=True)
class NominalPlan:
    """A paper formula's output (``values``), its nominal budget and the accounted one."""

    formula: str
    values: dict[str, Any]
    nominal: PrivacyBudget
    accounted: PrivacyBudget | None = None
    warnings: list[str] = field(default_factory=list)
    #: Side figures an epsilon of ``values`` stands for, each with its full label (e.g. the
    #: paper-style Poisson approximation, the reference code's own accountant).
    comparisons: dict[str, PrivacyBudget] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``epsilon_nominal`` and ``epsilon_accounted``."""
        return {
            "formula": self.formula,
            **self.values,
            "epsilon_nominal": self.nominal.epsilon,
            "epsilon_accounted": None if self.accounted is None else self.accounted.epsilon,
            "nominal": self.nominal.to_dict(),
            "accounted": None if self.accounted is None else self.accounted.to_dict(),
            "comparisons": {k: b.to_dict() for k, b in self.comparisons.items()},
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
        * math.sqrt(steps * (-math.log(delta)))
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


def privsgp_vr_sensitivity(clip: float, *, entries: int, block_size: int = 1) -> float:
    """Replace-one L2 sensitivity of one PrivSGP-VR step's vector ``h - T[xi] + mean(T)`` before
    noise (Algorithm 1, eq. (6)): ``(4 - 2/J) C / B`` with J table entries of B per-sample
    gradients clipped at C. When the example's block b is drawn, g changes by
    ``dh - dT[b] + dT[b] / J`` (T[b] is one of the mean's J terms), at most
    ``2C/B + (1 - 1/J) 2C/B``; otherwise by ``dT[b] / J``, at most ``2C/(BJ)``. J = 1 gives
    ``2C/B``: g is then h."""
    return (4.0 - 2.0 / entries) * clip / block_size


def privsgp_vr_budget(
    *,
    sigma: float,
    clip: float,
    entries: int,
    steps: int,
    delta: float,
    block_size: int = 1,
    conversion: str = "gaussian",
) -> PrivacyBudget:
    """What ``privdl run privsgp-vr`` certifies after ``steps`` steps at noise ``sigma``: K
    Gaussian steps of sensitivity :func:`privsgp_vr_sensitivity`, no subsampling amplification:
    exactly a Gaussian mechanism, mu-GDP with mu = sqrt(K) sens / sigma, converted exactly
    (replace-one, example level, threat model ldp); ``conversion="classic"`` is privdl 0.1's."""
    sens = privsgp_vr_sensitivity(clip, entries=entries, block_size=block_size)
    rho = sens * sens / (2.0 * sigma * sigma)
    eps = (
        0.0
        if steps == 0
        else compose_convert(rho, steps=int(steps), delta=delta, conversion=conversion)
    )
    return PrivacyBudget(
        epsilon=eps,
        delta=delta,
        mu=gaussian_mu(rho * steps),
        accountant="gaussian" if conversion == "gaussian" else f"gaussian-rdp+{conversion}",
        neighbouring="replace_one",
        unit="example",
        threat_model="ldp",
        notes=(
            f"no subsampling amplification (the SAGA mean depends on every sample); "
            f"sensitivity (4-2/J)C/B with J={entries}, B={block_size}; step_rdp={rho:.6g}"
        ),
    )


def privsgp_accounted_sigma(
    *,
    clip: float,
    steps: int,
    delta: float,
    entries: int,
    epsilon: float,
    block_size: int = 1,
    variance_reduction: bool = True,
    accountant: str = "tightest",
) -> float:
    """The sigma ``privdl run privsgp(-vr)`` calibrates for ``epsilon`` (replace-one, example level,
    threat model ldp; what its records account).

    PrivSGP-VR: no amplification (the SAGA mean depends on every sample), K Gaussian steps of
    sensitivity :func:`privsgp_vr_sensitivity`, exact Gaussian conversion. PrivSGP: one entry of J
    drawn without replacement per step, sensitivity ``2C/B``, subsampled RDP (Wang et al. 2019).
    """
    if variance_reduction:
        sens = privsgp_vr_sensitivity(clip, entries=entries, block_size=block_size)
        conversion = "gaussian" if accountant == "tightest" else "classic"
        rho = step_rdp_for_epsilon(epsilon, steps=int(steps), delta=delta, conversion=conversion)
        return sens / math.sqrt(2.0 * rho) * (1 + 1e-9)
    one = one_of_m_sigma(
        bound=clip / block_size, m=entries, steps=steps, delta=delta, epsilon=epsilon
    )
    return one * (1 + 1e-9)


def nominal_ldp_budget(
    epsilon: float, delta: float, *, formula: str, notes: str = ""
) -> PrivacyBudget:
    """The per-node budget a paper's noise formula is named by (PrivSGP-VR eq. (11), PORTER
    Theorem 1): NOMINAL, example level, replace-one, threat model ldp."""
    return PrivacyBudget(
        epsilon=epsilon,
        delta=delta,
        accountant=f"nominal:{formula}",
        neighbouring="replace_one",
        unit="example",
        threat_model="ldp",
        nominal=True,
        notes=notes,
    )


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

    Certified (``accounted``), as ``privdl run privsgp-vr`` labels its runs: the SAGA mean term
    touches every sample, so there is no subsampling amplification; a replaced sample moves the
    step's vector by up to (4 - 2/J) G (privsgp_vr_sensitivity, B = 1); K Gaussian
    steps composed in RDP, classic conversion, replace-one. ``values["epsilon_poisson_
    approximation"]``: the paper-style number (sensitivity 3G, Poisson rate 1/J, add/remove),
    an approximation that no theorem certifies (docs/privsgp-vr.md, "Privacy: nominal vs
    accounted"), for comparison.
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
    approx = dpsgd_budget(
        noise_multiplier=z,
        sampling_rate=1.0 / local_samples,
        steps=int(steps),
        delta=delta,
        threat_model="ldp",
    )
    accounted = privsgp_vr_budget(
        sigma=sigma, clip=gradient_bound, entries=local_samples, steps=steps, delta=delta
    )
    notes = f"c2={c2} (unspecified in the paper)"
    nominal = nominal_ldp_budget(epsilon, delta, formula="privsgp-thm2", notes=notes)
    values = {
        "sigma": sigma,
        "noise_multiplier": z,
        "c2": c2,
        "epsilon_poisson_approximation": approx.epsilon,
    }
    poisson = replace(
        approx,
        accountant="rdp-poisson-approx",
        nominal=True,
        notes=f"{approx.notes}; sensitivity 3G, rate 1/J: an approximation no theorem certifies "
        "(the SAGA mean touches every sample)",
    )
    return NominalPlan(
        "privsgp-thm2", values, nominal, accounted, comparisons={"poisson_approximation": poisson}
    )


# --------------------------------------------------------------------------- PORTER
def porter_phi(*, dim: int, local_samples: int, epsilon: float, delta: float) -> float:
    """phi_m = sqrt(d log(1/delta)) / (m eps), the centralised DP-SGD utility (PORTER Theorem 1)."""
    check_delta(delta)
    return math.sqrt(dim * (-math.log(delta))) / (local_samples * epsilon)


def porter_sigma(
    *, tau: float, steps: int, delta: float, local_samples: int, epsilon: float, c: float = 1.0
) -> float:
    """PORTER-DP Theorem 1: sigma_p = c tau sqrt(T log(1/delta)) / (m eps) (c = 1 in the paper)."""
    check_delta(delta)
    _positive(tau=tau, steps=steps, local_samples=local_samples, epsilon=epsilon, c=c)
    return c * tau * math.sqrt(steps * (-math.log(delta))) / (local_samples * epsilon)


def one_of_m_sigma(
    *, bound: float, m: int, steps: int, delta: float, epsilon: float, rtol: float = 1e-3
) -> float:
    """sigma for ``epsilon`` when each step draws 1 of ``m`` entries without replacement and a
    replaced entry moves the noised vector by ``2 bound`` (replace-one; dp-accounting's RDP of
    the sampled-without-replacement Gaussian, T steps): ``2 bound z``."""
    z = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        sampling_rate=1.0 / m,
        steps=int(steps),
        delta=delta,
        sampling="fixed_size",
        neighbouring="replace_one",
        dataset_size=int(m),
        rtol=rtol,
    )
    return 2.0 * bound * z


def porter_accounted_sigma(
    *, tau: float, steps: int, delta: float, local_samples: int, epsilon: float, rtol: float = 1e-3
) -> float:
    """The sigma_p the accountant of :func:`porter_plan` needs for ``epsilon`` (replace-one,
    b = 1 of m without replacement: a replaced sample moves the clipped gradient by 2 tau)."""
    return one_of_m_sigma(
        bound=tau, m=local_samples, steps=steps, delta=delta, epsilon=epsilon, rtol=rtol
    )


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
    """Theorem 1's sigma_p, its validity checks (PORTER Appendix A: the conditions
    of Abadi et al.'s moments accountant) and the accounted epsilon.

    Accounting under the paper's own relation (Definition 4: replace-one, the LDP of each
    agent's dataset) and sampling (b = 1 uniform of m): T steps of a sampled-without-replacement
    Gaussian with noise multiplier sigma_p / (2 tau) (a replaced sample moves the clipped
    gradient by up to 2 tau), capped by T unsampled steps as ``privdl run porter-dp`` labels its
    runs.
    ``values["epsilon_add_remove_poisson"]`` is the ACG-style number (add/remove, sensitivity
    tau, Poisson q = 1/m) of the moments accountant that PORTER Appendix A applies, for comparison;
    it is not the paper's relation.
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
    lam = 2.0 * (-math.log(delta)) / epsilon
    if q * z < 1 and lam > z**2 * math.log(1.0 / (q * z)):
        warns.append("lambda* = 2 log(1/delta)/eps exceeds z^2 log(1/(q z))")
    values: dict[str, Any] = {"sigma_p": sigma, "noise_multiplier": z, "c": c}
    if dim is not None:
        values["phi_m"] = porter_phi(
            dim=dim, local_samples=local_samples, epsilon=epsilon, delta=delta
        )
    accounted = dpsgd_budget(
        noise_multiplier=z / 2.0,
        sampling_rate=q,
        steps=int(steps),
        delta=delta,
        sampling="fixed_size",
        neighbouring="replace_one",
        dataset_size=int(local_samples),
        threat_model="ldp",
    )
    values["noise_multiplier_replace_one"] = z / 2.0
    # as the run's records: never above T unsampled steps (slope 1/(2 z_r^2)), which at small
    # noise is the tighter bound (1 of m is a mixture of unsampled steps)
    eps, capped = cap_by_unsampled(
        accounted.epsilon, 1.0 / (2.0 * (z / 2.0) ** 2), steps=int(steps), delta=delta
    )
    if capped:
        accounted = replace(accounted, epsilon=eps, notes=accounted.notes + UNSAMPLED_CAP_NOTE)
    poisson = dpsgd_budget(
        noise_multiplier=z, sampling_rate=q, steps=int(steps), delta=delta, threat_model="ldp"
    )
    poisson = replace(
        poisson,
        notes=f"{poisson.notes}; Poisson sampling and add/remove, which PORTER-DP (b = 1 of m "
        "without replacement, replace-one) does not use: a comparison, not its guarantee",
    )
    values["epsilon_add_remove_poisson"] = poisson.epsilon
    notes = f"c={c}; proof's leading constant is 2"
    nominal = nominal_ldp_budget(epsilon, delta, formula="porter-thm1", notes=notes)
    return NominalPlan(
        "porter-thm1",
        values,
        nominal,
        accounted,
        warns,
        comparisons={"add_remove_poisson": poisson},
    )


# --------------------------------------------------------------------------- Robust-HDP
# The reference code's accountant: the Poisson-subsampled Gaussian's RDP at its orders
# (privdl.accounting.poisson_rdp) and the classic conversion below. One implementation serves the
# nominal z_i (robust_hdp_plan) and the Table 3 closed form (privdl.robust.table3).


def epsilon_from_rdp(
    rdp: np.ndarray, *, delta: float, orders: Sequence[float] = ROBUST_HDP_ORDERS
) -> np.ndarray:
    """Classic conversion eps = min_a [rdp(a) + log(1/delta)/(a - 1)] (Mironov 2017, Prop. 3)."""
    a = np.asarray(orders, float)
    return np.min(rdp + (-math.log(delta)) / (a - 1), axis=-1)


def robust_hdp_noise_multipliers(
    eps: Sequence[float] | np.ndarray,
    batch_sizes: Sequence[float] | np.ndarray,
    *,
    num_samples: int = 2400,
    local_epochs: int = 1,
    rounds: int = 200,
    delta: float = 1e-4,
    decimals: int | None = 2,
) -> np.ndarray:
    """z_i such that E rounds of K epochs of DP-SGD (q = b/N, T = K E N/b) give eps_i.

    The Robust-HDP reference accountant (``get_noise_multiplier``): arithmetic bisection on
    [0.001, 1000] that stops as soon as |eps(z) - eps_i| <= 1e-6 (that early stop matters: for
    eps = 0.15, b = 64 it gives 211.79 where the exact root is 211.815), then rounding to
    ``decimals`` (None keeps the unrounded bisection point). Vectorised over clients; each
    distinct (eps, b) pair is solved once.
    """
    eps_arr = np.asarray(eps, float)
    b = np.broadcast_to(np.asarray(batch_sizes, float), eps_arr.shape)
    if np.any(eps_arr <= 0) or not (0 < delta < 1):
        raise PrivacyError("need eps > 0 and delta in (0, 1)")
    if np.any(b < 1) or np.any(b >= num_samples):
        raise PrivacyError(f"batch sizes must be in [1, {num_samples})")
    pairs, inverse = np.unique(np.stack([eps_arr.ravel(), b.ravel()]), axis=1, return_inverse=True)
    target, q = pairs[0], pairs[1] / num_samples
    steps = local_epochs * rounds * num_samples / pairs[1]
    lo, hi = np.full(target.shape, 0.001), np.full(target.shape, 1000.0)
    z = np.full(target.shape, np.nan)
    todo = np.ones(target.shape, dtype=bool)
    for _ in range(200):
        mid = (lo[todo] + hi[todo]) / 2
        rdp = rdp_poisson_subsampled_gaussian(q[todo], mid)
        e = epsilon_from_rdp(steps[todo, None] * rdp, delta=delta)
        idx = np.flatnonzero(todo)
        done = np.abs(e - target[todo]) <= 1e-6
        z[idx[done]] = mid[done]
        lo[idx] = np.where(e > target[todo], mid, lo[idx])  # too little noise: z must grow
        hi[idx] = np.where(e > target[todo], hi[idx], mid)
        todo[idx[done]] = False
        if not todo.any():
            break
    z = np.where(np.isnan(z), (lo + hi) / 2, z)[np.ravel(inverse)].reshape(eps_arr.shape)
    return z if decimals is None else np.round(z, decimals)


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
    _positive(noise_multiplier=noise_multiplier, batch_size=batch_size, dataset_size=dataset_size)
    q = batch_size / dataset_size
    steps = local_epochs * rounds * dataset_size / batch_size
    rdp = steps * rdp_poisson_subsampled_gaussian(q, noise_multiplier)
    return float(epsilon_from_rdp(rdp, delta=delta)[0])


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
    """z_i by the reference code's bisection on [0.001, 1000], rounded to ``round_to`` decimals.

    One client of :func:`robust_hdp_noise_multipliers` (the same root to ~1e-12 relative).
    """
    _positive(epsilon=epsilon, batch_size=batch_size, dataset_size=dataset_size)
    check_delta(delta)
    if batch_size > dataset_size:
        raise PrivacyError("batch size must not exceed the dataset size")
    if (
        robust_hdp_epsilon(
            1000.0,
            batch_size=batch_size,
            dataset_size=dataset_size,
            delta=delta,
            local_epochs=local_epochs,
            rounds=rounds,
        )
        > epsilon
    ):
        raise PrivacyError(f"no noise multiplier in [0.001, 1000] reaches epsilon {epsilon}")
    z = robust_hdp_noise_multipliers(
        [epsilon],
        [batch_size],
        num_samples=dataset_size,
        local_epochs=local_epochs,
        rounds=rounds,
        delta=delta,
        decimals=round_to,
    )
    return float(z[0])


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
    code = replace(
        nominal,
        epsilon=code_eps,
        notes=f"the reference code's accountant at the rounded z={z:g} (its orders, classic "
        "conversion)",
    )
    return NominalPlan(
        "robust-hdp-z",
        {"noise_multiplier": z, "epsilon_code_orders": code_eps, "steps": steps},
        nominal,
        accounted,
        comparisons={"code_orders": code},
    )
