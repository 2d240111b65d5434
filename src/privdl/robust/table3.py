"""Robust-HDP Table 3 in closed form: normalised aggregate noise of each aggregation rule.

Table 3 of Malekmohammadi et al. (ICML 2024) reports, after round 1 on FMNIST with E = 200,

    NoiseAgg(w) = sum_i w_i^2 sigma_i^2 / (p eta_l^2) = sum_i w_i^2 K ceil(N_i/b_i) c^2 z_i^2 / b_i^2

with sigma_i^2 the update variance of Eq. 7 under effective clipping (Eq. 3 with p >> 1). Every
input is known in advance (official eps lists, batch sizes, N_i = 2400, K = 1, c = 3,
delta = 1e-4), so the table is a closed form except the Robust-HDP row (RPCA estimates). The
noise multipliers z_i come from the reference code's accountant: RDP of the Poisson-subsampled
Gaussian (Mironov, Talwar & Zhang 2019) on orders 1.1..10.9 (step 0.1) and 12..64, the classic
conversion eps = min_a [T rdp(a) + log(1/delta)/(a - 1)], T = K E N/b steps, bisection on
[0.001, 1000], z rounded to 2 decimals (as the authors' reference code does).

Weight rules (Table 1, App. B.3): WeiAvg w ∝ eps_i; DPFedAvg w ∝ N_i; minEps: every client uses
z(min_j eps_j) and w ∝ N_i; Oracle: w ∝ 1/sigma_i^2 (Eq. 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from privdl.accounting.nominal import ROBUST_HDP_ORDERS as HDPFL_ORDERS
from privdl.accounting.nominal import epsilon_from_rdp, rdp_poisson_subsampled_gaussian
from privdl.accounting.nominal import robust_hdp_noise_multipliers as noise_multiplier
from privdl.errors import PrivacyError

__all__ = [
    "HDPFL_ORDERS",
    "BATCH_SIZES_20",
    "EPS_LISTS_20",
    "rdp_poisson_subsampled_gaussian",
    "epsilon_from_rdp",
    "noise_multiplier",
    "update_variance",
    "table3_row",
]


# The authors' reference code's fixed eps lists (Table 7's draws): the 20-client lists.
BATCH_SIZES_20: tuple[int, ...] = (
    32, 64, 16, 32, 16, 16, 16, 32, 32, 64, 32, 64, 16, 128, 16, 64, 32, 64, 16, 16,
)  # fmt: skip
EPS_LISTS_20: dict[str, tuple[float, ...]] = {
    "Dist1": (2.81, 1.69, 1.74, 1.46, 2.43, 0.85, 2.87, 1.62, 2.16, 1.88,
              2.73, 0.97, 1.84, 1.81, 2.57, 1.45, 1.91, 1.56, 2.02, 2.29),
    "Dist2": (5.45, 1.0, 1.15, 0.2, 4.52, 4.88, 0.98, 0.2, 1.05, 0.93,
              1.0, 0.21, 0.21, 1.27, 0.89, 1.17, 0.96, 0.89, 1.04, 0.84),
    "Dist3": (2.2, 3.66, 0.2, 1.65, 0.9, 0.64, 1.09, 1.86, 2.1, 2.79,
              2.21, 3.49, 1.18, 4.41, 0.33, 3.42, 2.2, 2.88, 0.87, 1.15),
    "Dist4": (0.57, 0.66, 0.42, 3.97, 3.27, 0.45, 0.55, 2.58, 1.82, 0.64,
              0.19, 2.38, 0.34, 0.44, 0.47, 0.5, 0.56, 0.51, 0.68, 0.19),
    "Dist5": (0.95, 1.5, 0.2, 0.74, 0.46, 0.37, 0.54, 0.82, 0.91, 1.17,
              0.95, 1.43, 0.57, 1.78, 0.25, 1.41, 0.95, 1.21, 0.45, 0.56),
    "Dist6": (0.5, 0.46, 0.39, 0.44, 0.21, 0.36, 0.19, 0.51, 1.12, 0.2,
              0.49, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.15, 0.38, 0.53),
    "Dist7": (0.26, 0.82, 0.55, 0.78, 0.98, 0.63, 0.6, 0.26, 0.41, 0.6,
              0.74, 0.84, 0.5, 0.25, 0.43, 0.93, 0.37, 0.56, 0.94, 0.22),
    "Dist8": (0.2, 0.2, 0.19, 0.44, 0.21, 0.19, 0.19, 0.51, 0.62, 0.2,
              0.2, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.17, 0.38, 0.53),
    "Dist9": (0.45, 0.25, 0.22, 0.31, 0.28, 0.36, 0.29, 0.29, 0.23, 0.27,
              0.48, 0.28, 0.42, 0.46, 0.44, 0.26, 0.25, 0.21, 0.21, 0.26),
}  # fmt: skip


def update_variance(
    z: np.ndarray,
    batch_sizes: Sequence[int] | np.ndarray,
    *,
    num_samples: int = 2400,
    local_epochs: int = 1,
    clip_norm: float = 3.0,
) -> np.ndarray:
    """sigma_i^2 / (p eta_l^2) = K ceil(N/b) c^2 z^2 / b^2 (Eq. 7 with Eq. 3, effective clipping)."""
    b = np.asarray(batch_sizes, float)
    return local_epochs * np.ceil(num_samples / b) * clip_norm**2 * np.asarray(z) ** 2 / b**2


def table3_row(
    eps: Sequence[float],
    batch_sizes: Sequence[int] = BATCH_SIZES_20,
    *,
    num_samples: int = 2400,
    local_epochs: int = 1,
    rounds: int = 200,
    delta: float = 1e-4,
    clip_norm: float = 3.0,
    decimals: int | None = 2,
) -> dict[str, float]:
    """NoiseAgg(w) of Table 3 for one eps distribution: WeiAvg, DPFedAvg, minEps, Oracle.

    Uniform N_i (the paper's setting), so DPFedAvg and minEps weights are 1/n.
    """
    eps_arr = np.asarray(eps, float)
    b = np.asarray(batch_sizes, float)
    if eps_arr.shape != b.shape or eps_arr.ndim != 1:
        raise PrivacyError("eps and batch_sizes must be 1-D lists of equal length")
    kw: dict[str, Any] = dict(
        num_samples=num_samples, local_epochs=local_epochs, rounds=rounds, delta=delta
    )
    z = noise_multiplier(eps_arr, b, decimals=decimals, **kw)
    z_min = noise_multiplier(np.full_like(eps_arr, eps_arr.min()), b, decimals=decimals, **kw)
    var_kw: dict[str, Any] = dict(
        num_samples=num_samples, local_epochs=local_epochs, clip_norm=clip_norm
    )
    s = update_variance(z, b, **var_kw)
    s_min = update_variance(z_min, b, **var_kw)
    n = eps_arr.size
    uniform = np.full(n, 1.0 / n)
    wei = eps_arr / eps_arr.sum()
    oracle = (1 / s) / (1 / s).sum()
    return {
        "WeiAvg": float((wei**2 * s).sum()),
        "DPFedAvg": float((uniform**2 * s).sum()),
        "minEps": float((uniform**2 * s_min).sum()),
        "Oracle": float((oracle**2 * s).sum()),
    }
