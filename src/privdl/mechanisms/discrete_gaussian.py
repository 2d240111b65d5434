"""Secure noise mode: a discrete Gaussian on a grid, from keyed streams (docs/security.md s.4).

Floating-point Gaussian samplers release values whose set has gaps and uneven spacing, and where
a value lands can tell which input produced it (Mironov 2012 for the Laplace mechanism; Jin et al.
2022 and Holohan & Braghin 2021, "Secure random sampling in differential privacy", for the
Gaussian). The secure mode releases values on a fixed lattice instead:

* the grid is ``gamma = 2^(floor(log2 sigma) - GRID_BITS)``, a power of two (exact scaling), so
  ``sigma / gamma`` lies in ``[2^GRID_BITS, 2^(GRID_BITS + 1))``;
* the clipped gradient is snapped to the grid, ``gamma round(g / gamma)``, after clipping at
  ``C - gamma sqrt(d) / 2``, so the snapped gradient still has norm at most ``C`` and the
  sensitivity the accountant uses is unchanged;
* the noise is ``gamma K`` with ``K`` drawn from the discrete Gaussian ``N_Z(0, (sigma/gamma)^2)``
  (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy",
  Algorithm 3: discrete Laplace proposals of scale ``t = floor(s) + 1`` accepted with probability
  ``exp(-(|Y| - s^2/t)^2 / (2 s^2))``), and the sum is formed in float64, where every value
  involved is an exact multiple of ``gamma``.

Accounting: a query with values in ``gamma Z^d`` and L2 sensitivity ``Delta`` released with
independent ``N_Z(0, (sigma/gamma)^2)`` noise per coordinate (times gamma) satisfies
``Delta^2 / (2 sigma^2)``-zCDP (Canonne, Kamath & Steinke 2020, Section 2: the concentrated DP
of the discrete Gaussian, univariate and multivariate): the Renyi divergence of every order is at most the continuous Gaussian's, so
privdl's RDP accounting (``accountant = "rdp"``) holds unchanged. The exact Gaussian trade-off
curve (mu-GDP, the ``tightest`` accountant) and subsampling amplification are proved for the
continuous Gaussian, so the secure mode runs with the RDP accountant at user level only.

Sampler precision: the proposals and acceptance tests use 53-bit uniforms and float64 ``log`` /
``exp`` rather than the exact rational Bernoulli sampling of the paper's Algorithms 1-2, so each
integer's probability is that of ``N_Z`` up to a relative error of order ``t 2^-53``
(``2^-32`` at the default grid); the released values are still exactly on the lattice, which is
what the floating-point attacks exploit. Every draw is vectorized: a few rejection rounds over
all entries, not a loop over samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from privdl.errors import PrivacyError
from privdl.mechanisms._edges import incident_edges
from privdl.mechanisms.prng import uniform_streams
from privdl.mechanisms.secrets import as_edge_array

__all__ = [
    "GRID_BITS",
    "discrete_gaussian_exact",
    "discrete_gaussian_streams",
    "exact_scale",
    "grid_for",
    "secure_edge_noise",
    "secure_noise",
    "snap",
    "snap_clip",
]

#: sigma / gamma lies in [2^GRID_BITS, 2^(GRID_BITS + 1)).
GRID_BITS = 20
#: Rejection rounds before giving up (each accepts an entry with probability above 0.5).
MAX_ROUNDS = 128


def grid_for(sigma: float) -> float:
    """The grid ``gamma = 2^(floor(log2 sigma) - GRID_BITS)`` of noise std ``sigma``."""
    if not (math.isfinite(sigma) and sigma > 0):
        raise PrivacyError(f"the secure noise mode needs a noise std > 0; got {sigma}")
    return math.ldexp(1.0, math.floor(math.log2(sigma)) - GRID_BITS)


def snap_clip(clip: float, grid: float, size: int) -> float:
    """The clipping bound before snapping so the snapped vector has norm at most ``clip``:
    ``clip - grid sqrt(size) / 2`` (each coordinate moves by at most ``grid / 2``)."""
    inner = clip - grid * math.sqrt(size) / 2
    if inner <= 0:
        raise PrivacyError(
            f"clip {clip:g} is below the snapping margin {grid * math.sqrt(size) / 2:.3g} of "
            f"{size} coordinates on grid {grid:.3g}: raise clip"
        )
    return inner


def snap(x: torch.Tensor, grid: float) -> torch.Tensor:
    """``grid round(x / grid)`` in float64 (exact: ``grid`` is a power of two)."""
    return torch.round(x.to(torch.float64) / grid) * grid


def discrete_gaussian_streams(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    scale: float,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Integers from ``N_Z(0, scale^2)``: row k a pure function of ``(keys[k], counter)``.

    Canonne, Kamath & Steinke 2020, Algorithm 3 with ``t = floor(scale) + 1``; rejection round
    r reads three uniforms for each entry still pending from
    :func:`~privdl.mechanisms.prng.uniform_streams` at substream r (the row's m-th pending entry,
    in column order, takes words 3m, 3m + 1 and 3m + 2, so a row depends on its key only): the
    geometric magnitude ``G = floor(log(1 - u0) / log(p))``, ``p = e^(-1/t)``,
    its sign (``u1 < 1/2``; a negative zero is rejected, which makes the proposal the discrete
    Laplace ``P(y) ~ p^|y|``), and the acceptance ``u2 < exp(-(|y| - s^2/t)^2 / (2 s^2))``.
    Returns ``(len(keys), size)`` int64.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise PrivacyError(f"the discrete Gaussian needs a scale > 0; got {scale}")
    t = math.floor(scale) + 1
    log_p = -1.0 / t
    s2 = scale * scale
    n = len(keys)
    out = torch.zeros(n * size, dtype=torch.int64)
    pos = torch.arange(n * size)  # the flat positions still pending
    row, slot = pos // max(size, 1), pos % max(size, 1)  # slot: rank among the row's pending
    for r in range(MAX_ROUNDS):  # rounds over the entries left, each accepts most of them
        width = int(slot.max()) + 1 if len(slot) else 0
        u = uniform_streams(keys, counter, 3 * width, substream=r)
        if r == 0:  # every entry pending: no gather
            u0, u1, u2 = (u.reshape(n, width, 3)[..., j].reshape(-1) for j in range(3))
        else:  # the m-th pending entry of a row reads its words 3m, 3m + 1, 3m + 2
            flat = u.reshape(-1)
            at = row * (3 * width) + 3 * slot
            u0, u1, u2 = flat[at], flat[at + 1], flat[at + 2]
        g = torch.floor(torch.log1p(-u0) / log_p)
        negative = u1 < 0.5
        accept = ~(negative & (g == 0)) & (u2 < torch.exp(-((g - s2 / t) ** 2) / (2 * s2)))
        y = torch.where(negative, -g, g).to(torch.int64)
        out[pos[accept]] = y[accept]
        keep = ~accept
        pos, row = pos[keep], row[keep]
        if not len(pos):
            return out.reshape(n, size).to(device)
        slot = torch.arange(len(row)) - torch.searchsorted(row, row)  # rows stay sorted
    raise PrivacyError(  # pragma: no cover - probability below 2^-128 per entry
        f"the discrete Gaussian sampler did not finish in {MAX_ROUNDS} rounds"
    )


def secure_noise(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    sigma: float,
    device: torch.device | str = "cpu",
    exact: bool = False,
) -> torch.Tensor:
    """``gamma N_Z(0, (sigma/gamma)^2)`` rows in float64 on the grid of :func:`grid_for`
    (``exact``: by :func:`discrete_gaussian_exact` at the scale :func:`exact_scale`)."""
    grid = grid_for(sigma)
    if exact:
        k = discrete_gaussian_exact(keys, counter, size, scale=exact_scale(sigma, grid))
    else:
        k = discrete_gaussian_streams(keys, counter, size, scale=sigma / grid)
    return (k.to(torch.float64) * grid).to(device)


def secure_edge_noise(
    edge_keys: Sequence[bytes | None],
    edges: object,
    n_nodes: int,
    counter: int,
    size: int,
    *,
    sigma_cor: float,
    grid: float,
    nodes: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
    exact: bool = False,
) -> torch.Tensor:
    """DECOR's correlated noise on the grid: rows ``sum_{j in N_i} +-gamma_e K_ij`` (DECOR Alg 1
    line 3, eq. 3, with ``K_e ~ N_Z(0, (sigma_cor / gamma_e)^2)`` drawn from edge e's secret by
    :func:`discrete_gaussian_streams` (``exact``: :func:`discrete_gaussian_exact`) at
    ``counter``; ``+`` at an edge's lower endpoint, ``-`` at its upper one), summed as integers,
    so the rows cancel exactly over the graph. ``gamma_e`` is ``grid``, or the coarser
    ``grid_for(sigma_cor)`` (a power-of-two multiple of ``grid``) where ``sigma_cor`` is larger,
    so the scale stays below 2^21. Rows as
    :func:`privdl.mechanisms.correlated.correlated_noise` (all nodes, or ``nodes``), float64."""
    array = as_edge_array(edges, n_nodes)
    rows, lower, upper, keys = incident_edges(edge_keys, array, n_nodes, nodes)
    grid = max(grid, grid_for(sigma_cor))
    out = torch.zeros((len(rows), size), dtype=torch.int64)
    if keys and size:
        if exact:
            k = discrete_gaussian_exact(keys, counter, size, scale=exact_scale(sigma_cor, grid))
        else:
            k = discrete_gaussian_streams(keys, counter, size, scale=sigma_cor / grid)
        lo, up = torch.from_numpy(lower), torch.from_numpy(upper)
        at_lo, at_up = lo >= 0, up >= 0
        out.index_add_(0, lo[at_lo], k[at_lo])
        out.index_add_(0, up[at_up], -k[at_up])
    return (out.to(torch.float64) * grid).to(device)


# -- the exact sampler (noise_mode "secure-exact") ---------------------------------------------
#: Substreams of the exact sampler's words: iteration i reads substream EXACT_BASE + i.
EXACT_BASE = 1 << 31
#: Iterations before giving up (each active entry reads one word per iteration).
EXACT_MAX_ITERATIONS = 1 << 16
#: Proposals with |Y| above this are rejected (their acceptance probability is below e^-1000;
#: it keeps (|Y| - s)^2 within int64).
EXACT_MAX_MAGNITUDE = 1 << 31

# states of the per-entry machine (one word per step)
_U, _D, _V, _SIGN, _INT, _FRAC, _DONE = range(7)


def _uniform_below(w: np.ndarray, m: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """An exact uniform integer in ``[0, m)`` from a 53-bit word ``w`` (``m <= 2^53``): ``(ok,
    w mod m)`` where ``ok`` (the word is below the largest multiple of ``m``); else draw again."""
    limit = (2**53 // m) * m
    return w < limit, np.remainder(w, m)


def discrete_gaussian_exact(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    scale: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Integers from ``N_Z(0, scale^2)`` by exact integer arithmetic: row k a pure function of
    ``(keys[k], counter)``.

    Canonne, Kamath & Steinke 2020, Algorithm 3 with ``sigma = t = scale`` (an integer; any
    ``t > 0`` gives the target law), its discrete Laplace proposals by Algorithm 2 and every
    ``Bernoulli(exp(-gamma))`` by Algorithm 1 with rational ``gamma`` (``floor(gamma)``
    ``Bernoulli(exp(-1))`` trials, then the loop ``Bernoulli(gamma' / K)``, each trial
    ``Bernoulli(n / d) * Bernoulli(1 / K)`` from exact uniform integers). No floating point:
    uniform integers come from 53-bit words of :func:`~privdl.mechanisms.prng.uniform_streams`
    by rejection. Vectorized as a numpy state machine: at iteration i every pending entry reads one
    word, the row's m-th pending entry (in column order) word m of substream ``EXACT_BASE + i``,
    so a row depends on its own key only. Proposals beyond ``EXACT_MAX_MAGNITUDE`` are rejected
    (probability below e^-1000). Returns ``(len(keys), size)`` int64.
    """
    s = int(scale)
    if s < 1 or s > 2**26:  # 2 s^2 <= 2^53: one word draws a uniform below it
        raise PrivacyError(f"the exact discrete Gaussian takes an integer scale in [1, 2^26]; {s}")
    n = len(keys)
    d2 = 2 * s * s  # the acceptance exponent (|Y| - s)^2 / (2 s^2), as z^2 / d2
    total = n * size
    out = np.zeros(total, dtype=np.int64)
    pos = np.arange(total, dtype=np.int64)
    row = pos // max(size, 1)
    zero = np.zeros(total, dtype=np.int64)
    state = np.full(total, _U, dtype=np.int64)
    u, v, y, q, r = zero.copy(), zero.copy(), zero.copy(), zero.copy(), zero.copy()
    # the Bernoulli(exp(-bn / bd)) in progress (bn <= bd): its K and which draw is next
    bn, bd, k, half = zero.copy(), zero + 1, zero + 1, zero.copy()
    tt = s
    for i in range(EXACT_MAX_ITERATIONS):
        if not len(pos):
            return torch.from_numpy(out.reshape(n, size)).to(device)
        slot = np.arange(len(row)) - np.searchsorted(row, row)
        width = int(slot.max()) + 1
        words = uniform_streams(keys, counter, width, substream=EXACT_BASE + i)
        w = (words.numpy().reshape(-1)[row * width + slot] * 2.0**53).astype(np.int64)
        # -- a Bernoulli(exp(-bn/bd)) step for the states that run one (D, V, INT, FRAC)
        bern = (state == _D) | (state == _V) | (state == _INT) | (state == _FRAC)
        # half 0: Bernoulli(bn / bd); half 1: Bernoulli(1 / K)
        ok0, x0 = _uniform_below(w, bd)
        ok1, x1 = _uniform_below(w, k)
        first = bern & (half == 0) & ok0
        second = bern & (half == 1) & ok1
        a_fail = (first & (x0 >= bn)) | (second & (x1 != 0))  # A = 0: the loop ends
        go_on = first & (x0 < bn)  # then Bernoulli(1/K)
        k_up = second & (x1 == 0)  # A = 1: K += 1, back to Bernoulli(bn/bd)
        half = np.where(go_on, 1, np.where(k_up, 0, half))
        k = np.where(k_up, k + 1, k)
        finished = a_fail
        bit = np.remainder(k, 2) == 1  # exp(-gamma): 1 if K is odd
        # -- U: uniform in [0, t), then D = Bernoulli(exp(-U/t))
        ok_u, x_u = _uniform_below(w, tt)
        start_d = (state == _U) & ok_u
        # -- transitions of the finished Bernoullis
        fail = finished & ~bit
        succ = finished & bit
        restart = fail & ((state == _D) | (state == _INT) | (state == _FRAC))
        v_stop = fail & (state == _V)
        to_v = succ & (state == _D)
        v_more = succ & (state == _V)
        int_more = succ & (state == _INT)
        accept = succ & (state == _FRAC)
        # -- the sign: B = Bernoulli(1/2) from the word's low bit; B = 1 with X = 0 restarts
        at_sign = state == _SIGN
        neg = (w & 1) == 1
        sign_restart = at_sign & neg & (y == 0)
        sign_ok = at_sign & ~sign_restart
        mag = y
        too_big = sign_ok & (mag > EXACT_MAX_MAGNITUDE)
        z = mag - s
        zz = z * z
        new_q, new_r = zz // d2, zz % d2
        # apply (order matters only within disjoint masks)
        new_state = state.copy()
        new_state[start_d] = _D
        u = np.where(start_d, x_u, u)
        new_state[restart | sign_restart | too_big] = _U
        new_state[to_v] = _V
        v = np.where(to_v, 0, np.where(v_more, v + 1, v))
        new_state[v_stop] = _SIGN
        y = np.where(v_stop, u + s * v, y)
        keep_sign = sign_ok & ~too_big
        signed = np.where(neg, -mag, mag)
        q = np.where(keep_sign, new_q, np.where(int_more, q - 1, q))
        r = np.where(keep_sign, new_r, r)
        new_state[keep_sign] = _INT
        # INT with q = 0 left moves to FRAC (Bernoulli(exp(-r / d2)))
        y = np.where(keep_sign, signed, y)
        new_state[accept] = _DONE
        # set up the next Bernoulli of every entry that starts one
        enter_d = start_d
        enter_v = to_v | v_more
        enter_int = (keep_sign | int_more) & (q > 0)
        enter_frac = (keep_sign | int_more) & (q == 0)
        new_state[enter_frac] = _FRAC
        fresh = enter_d | enter_v | enter_int | enter_frac
        bn = np.where(enter_d, u, np.where(enter_frac, r, np.where(fresh, 1, bn)))
        bd = np.where(enter_d, tt, np.where(enter_frac, d2, np.where(fresh, 1, bd)))
        k = np.where(fresh, 1, k)
        half = np.where(fresh, 0, half)
        # y holds |Y| until the sign, then the signed Y; INT and FRAC use the magnitude via q, r
        done = new_state == _DONE
        out[pos[done]] = y[done]
        keep = ~done
        pos, row = pos[keep], row[keep]
        state, u, v, y, q, r = (a[keep] for a in (new_state, u, v, y, q, r))
        bn, bd, k, half = (a[keep] for a in (bn, bd, k, half))
    raise PrivacyError(  # pragma: no cover - far beyond any realistic draw
        f"the exact discrete Gaussian sampler did not finish in {EXACT_MAX_ITERATIONS} steps"
    )


def exact_scale(sigma: float, grid: float) -> int:
    """The integer scale of the exact sampler: ``ceil(sigma / grid)`` (noise at least ``sigma``:
    its zCDP, ``Delta^2 / (2 (grid s)^2)``, at most the accountant's)."""
    return math.ceil(sigma / grid)
