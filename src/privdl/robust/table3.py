"""Robust-HDP Table 3 in closed form: normalised aggregate noise of each aggregation rule.

Table 3 of Malekmohammadi et al. (ICML 2024) reports, after round 1 on FMNIST with E = 200,

    NoiseAgg(w) = sum_i w_i^2 sigma_i^2 / (p eta_l^2) = sum_i w_i^2 K ceil(N_i/b_i) c^2 z_i^2 / b_i^2

with sigma_i^2 the update variance of Eq. 7 under effective clipping (Eq. 3 with p >> 1). Every
input is known in advance (official eps lists, batch sizes, N_i = 2400, K = 1, c = 3,
delta = 1e-4), so the table is a closed form except the Robust-HDP row (RPCA estimates). The
noise multipliers z_i come from the reference code's accountant: RDP of the Poisson-subsampled
Gaussian (Mironov, Talwar & Zhang 2019) on orders 1.1..10.9 (step 0.1) and 12..64, the classic
conversion eps = min_a [T rdp(a) + log(1/delta)/(a - 1)], T = K E N/b steps, bisection on
[0.001, 1000], z rounded to 2 decimals (spec §1, A10, A11).

Weight rules (spec §4): WeiAvg w ∝ eps_i; DPFedAvg w ∝ N_i; minEps: every client uses
z(min_j eps_j) and w ∝ N_i; Oracle: w ∝ 1/sigma_i^2 (Eq. 8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp

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

HDPFL_ORDERS: tuple[float, ...] = tuple([1 + x / 10 for x in range(1, 100)] + list(range(12, 65)))

# Appendix A of the spec (Saber-mm/HDPFL utils/privacy_params.py): the 20-client lists.
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

_FRAC_TERMS = (48, 512)  # series lengths tried for fractional orders; a live tail gives inf


def _rdp_integer(q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """log A_a / (a - 1) for integer a: A_a = sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k)/(2z^2))."""
    k = np.arange(int(orders.max()) + 1)[None, None, :]
    a = orders[None, :, None]
    qq, zz = q[:, None, None], z[:, None, None]
    valid = k <= a
    log_term = (
        gammaln(a + 1) - gammaln(k + 1) - gammaln(np.where(valid, a - k, 0) + 1)
        + k * np.log(qq) + (a - k) * np.log1p(-qq) + (k * k - k) / (2 * zz**2)
    )  # fmt: skip
    log_a = logsumexp(np.where(valid, log_term, -np.inf), axis=2)
    return log_a / (orders[None, :] - 1)


def _rdp_fractional(q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Fractional orders via the two-sided series of Mironov, Talwar & Zhang (2019), Sec. 3.3.

    Summed to a short length first; (q, z) pairs whose tail is not negligible are redone longer.
    """
    out = _rdp_fractional_terms(q, z, orders, _FRAC_TERMS[0])
    redo = ~np.isfinite(out).all(axis=1)
    if redo.any():
        out[redo] = _rdp_fractional_terms(q[redo], z[redo], orders, _FRAC_TERMS[1])
    return out


def _rdp_fractional_terms(
    q: np.ndarray, z: np.ndarray, orders: np.ndarray, terms: int
) -> np.ndarray:
    i = np.arange(terms)[None, None, :].astype(float)
    a = orders[None, :, None]
    qq, zz = q[:, None, None], z[:, None, None]
    z0 = zz**2 * np.log(1 / qq - 1) + 0.5
    j = a - i
    log_coef = gammaln(a + 1) - gammaln(i + 1) - gammaln(j + 1)  # log |C(a, i)|
    log_s0 = (
        log_coef + i * np.log(qq) + j * np.log1p(-qq) + (i * i - i) / (2 * zz**2)
        + log_ndtr((z0 - i) / zz)
    )  # fmt: skip
    log_s1 = (
        log_coef + j * np.log(qq) + i * np.log1p(-qq) + (j * j - j) / (2 * zz**2)
        + log_ndtr((j - z0) / zz)
    )  # fmt: skip
    total = np.logaddexp(logsumexp(log_s0, axis=2), logsumexp(log_s1, axis=2))
    tail = np.maximum(log_s0[..., -1], log_s1[..., -1])
    out = total / (orders[None, :] - 1)
    return np.where(tail < total - 30, out, np.inf)


def rdp_poisson_subsampled_gaussian(
    q: float | np.ndarray, z: float | np.ndarray, orders: Sequence[float] = HDPFL_ORDERS
) -> np.ndarray:
    """RDP of ONE step of the Poisson-subsampled Gaussian mechanism, shape ``(len(q), len(orders))``.

    ``q`` (sampling rate in (0, 1)) and ``z`` (noise multiplier) broadcast together.
    """
    q_arr, z_arr = np.broadcast_arrays(np.atleast_1d(np.asarray(q, float)), np.atleast_1d(z))
    q_arr, z_arr = q_arr.astype(float), z_arr.astype(float)
    if np.any((q_arr <= 0) | (q_arr >= 1)) or np.any(z_arr <= 0):
        raise PrivacyError("need sampling rate q in (0, 1) and noise multiplier z > 0")
    orders_arr = np.asarray(orders, float)
    out = np.empty((q_arr.size, orders_arr.size))
    is_int = orders_arr == np.round(orders_arr)
    if is_int.any():
        out[:, is_int] = _rdp_integer(q_arr, z_arr, orders_arr[is_int])
    if (~is_int).any():
        out[:, ~is_int] = _rdp_fractional(q_arr, z_arr, orders_arr[~is_int])
    return out


def epsilon_from_rdp(
    rdp: np.ndarray, *, delta: float, orders: Sequence[float] = HDPFL_ORDERS
) -> np.ndarray:
    """Classic conversion eps = min_a [rdp(a) + log(1/delta)/(a - 1)] (Mironov 2017, Prop. 3)."""
    a = np.asarray(orders, float)
    return np.min(rdp + math.log(1 / delta) / (a - 1), axis=-1)


def noise_multiplier(
    eps: Sequence[float] | np.ndarray,
    batch_sizes: Sequence[int] | np.ndarray,
    *,
    num_samples: int = 2400,
    local_epochs: int = 1,
    rounds: int = 200,
    delta: float = 1e-4,
    decimals: int | None = 2,
) -> np.ndarray:
    """z_i such that E rounds of K epochs of DP-SGD (q = b/N, T = K E N/b) give eps_i.

    The Robust-HDP reference accountant (``get_noise_multiplier``): bisection on [0.001, 1000],
    then rounding to ``decimals`` (None keeps the exact root). Vectorised over clients.
    """
    eps_arr = np.asarray(eps, float)
    b = np.broadcast_to(np.asarray(batch_sizes, float), eps_arr.shape)
    if np.any(eps_arr <= 0) or not (0 < delta < 1):
        raise PrivacyError("need eps > 0 and delta in (0, 1)")
    if np.any(b < 1) or np.any(b >= num_samples):
        raise PrivacyError(f"batch sizes must be in [1, {num_samples})")
    q = b / num_samples
    steps = local_epochs * rounds * num_samples / b
    # solve once per distinct (eps, b) pair; bisection on log z (same root as the reference's
    # arithmetic bisection; width ln(1e6) / 2^42 ~ 3e-12 relative)
    pairs, inverse = np.unique(np.stack([eps_arr.ravel(), b.ravel()]), axis=1, return_inverse=True)
    target, q, steps = (
        pairs[0],
        pairs[1] / num_samples,
        local_epochs * rounds * num_samples / pairs[1],
    )
    lo, hi = np.full(target.shape, math.log(0.001)), np.full(target.shape, math.log(1000.0))
    for _ in range(42):
        mid = (lo + hi) / 2
        rdp = rdp_poisson_subsampled_gaussian(q, np.exp(mid))
        too_private = epsilon_from_rdp(steps[:, None] * rdp, delta=delta) < target
        hi = np.where(too_private, mid, hi)  # more noise than needed: z can shrink
        lo = np.where(too_private, lo, mid)
    z = np.exp((lo + hi) / 2)[np.ravel(inverse)].reshape(eps_arr.shape)
    return z if decimals is None else np.round(z, decimals)


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
    kw = dict(num_samples=num_samples, local_epochs=local_epochs, rounds=rounds, delta=delta)
    z = noise_multiplier(eps_arr, b, decimals=decimals, **kw)
    z_min = noise_multiplier(np.full_like(eps_arr, eps_arr.min()), b, decimals=decimals, **kw)
    var_kw = dict(num_samples=num_samples, local_epochs=local_epochs, clip_norm=clip_norm)
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
