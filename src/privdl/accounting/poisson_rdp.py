"""RDP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar & Zhang 2019).

One step's RDP curve, vectorised over ``(q, z)`` pairs and orders: a DP-SGD/RDP primitive with no
dependency on the rest of :mod:`privdl.accounting`. It serves dp-accounting-free curves for many
clients at once (:func:`privdl.accounting.dpsgd.poisson_rdp_curves`), the Robust-HDP reference
code's accountant (:mod:`privdl.accounting.nominal`, whose nominal z_i it computes) and the Table 3
closed form (:mod:`privdl.robust.table3`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp

from privdl.errors import PrivacyError

__all__ = ["ROBUST_HDP_ORDERS", "rdp_poisson_subsampled_gaussian"]

#: RDP orders of the Robust-HDP reference code (TF-privacy style); the default grid of
#: :func:`rdp_poisson_subsampled_gaussian`.
ROBUST_HDP_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 65))
)

_FRAC_TERMS = (48, 512)  # series lengths tried for fractional orders; a live tail gives inf
_FRAC_RELIABLE = 1e-11  # below this, a fractional order's series value is rounding noise


def _rdp_integer(q: np.ndarray, z: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """log A_a / (a - 1) for integer a: A_a = sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k)/(2z^2)).

    Computed as log1p(A_a - 1) with A_a - 1 = sum_{k >= 2} Binom(a, q)(k) expm1((k^2-k)/(2z^2)),
    a sum of non-negative terms (the binomial weights sum to one): full relative precision even
    when A_a - 1 is below rounding of A_a (tiny q/z), where log(sum) gives noise, zero or a
    negative value (and an epsilon of 0 downstream).

    The terms are evaluated only at the ``2 <= k <= a`` pairs (a few percent of the
    ``orders x (max order + 1)`` grid when the orders reach 4096), their log-binomials looked up
    in one table of ``log j!``. The sum over ``k`` is taken as a dense evaluation on that grid
    (``-inf`` elsewhere) takes it, to the last bit: numpy sums a row longer than 128 pairwise,
    splitting it at half its length rounded down to a multiple of 8, down to a first block of
    at most 128 (:func:`_first_block`); a row whose terms all lie in that block has the sum of
    the block alone (the rest adds exact zeros). So the orders below the block's length are
    summed on it, and the others on the full width: ~10x less work at privdl's orders.
    """
    width = int(orders.max()) + 1
    k_all = np.arange(width)
    qq, zz = q[:, None], z[:, None]
    x = (k_all[None, :] * k_all[None, :] - k_all[None, :]) / (2 * zz**2)  # (nq, width)
    with np.errstate(divide="ignore"):  # k < 2 and underflowed exponents drop out as -inf
        log_expm1 = np.where(x > 20.0, x + np.log1p(-np.exp(-np.minimum(x, 700.0))), 0.0)
        log_expm1 = np.where(x > 20.0, log_expm1, np.log(np.expm1(np.minimum(x, 20.0))))
    log_fact = gammaln(k_all + 1.0)  # log j! for j = 0 .. max order
    log_q, log_1mq = np.log(qq), np.log1p(-qq)
    out = np.empty((len(q), len(orders)))
    block = _first_block(width)
    small = orders.astype(np.int64) < block
    for cols, row_width in ((np.flatnonzero(small), block), (np.flatnonzero(~small), width)):
        if not len(cols):
            continue
        sub = orders[cols]
        counts = np.maximum(sub.astype(np.int64) - 1, 0)  # k = 2..a for each order
        row = np.repeat(np.arange(len(sub)), counts)
        k = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + 2
        a = sub[row]
        a_int = a.astype(np.int64)
        log_term = (
            log_fact[a_int] - log_fact[k] - log_fact[a_int - k]
            + k * log_q + (a - k) * log_1mq + log_expm1[:, k]
        )  # fmt: skip
        dense = np.full((len(q), len(sub), row_width), -np.inf)
        dense[:, row, k] = log_term
        out[:, cols] = logsumexp(dense, axis=2)
    return np.logaddexp(0.0, out) / (orders[None, :] - 1)


def _first_block(width: int) -> int:
    """The length of the first block numpy's pairwise summation sums on its own in a row of
    ``width`` (halving, rounded down to a multiple of 8, while longer than 128)."""
    while width > 128:
        half = width // 2
        width = half - half % 8
    return width


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
    q: float | np.ndarray,
    z: float | np.ndarray,
    orders: Sequence[float] | np.ndarray = ROBUST_HDP_ORDERS,
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
        frac = orders_arr[~is_int]
        values = _rdp_fractional(q_arr, z_arr, frac)
        # the signed series has absolute rounding error ~1e-16: a value near that level (or
        # negative) says nothing, so the next integer order's value, an upper bound (RDP is
        # non-decreasing in the order), takes its place
        ceil = _rdp_integer(q_arr, z_arr, np.ceil(frac))
        out[:, ~is_int] = np.where(values > _FRAC_RELIABLE, values, ceil)
    return out
