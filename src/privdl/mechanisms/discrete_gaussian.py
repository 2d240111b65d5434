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

import torch

from privdl.errors import PrivacyError
from privdl.mechanisms._edges import incident_edges
from privdl.mechanisms.prng import uniform_streams
from privdl.mechanisms.secrets import as_edge_array

__all__ = [
    "GRID_BITS",
    "discrete_gaussian_streams",
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
) -> torch.Tensor:
    """``gamma N_Z(0, (sigma/gamma)^2)`` rows in float64 on the grid of :func:`grid_for`."""
    grid = grid_for(sigma)
    k = discrete_gaussian_streams(keys, counter, size, scale=sigma / grid, device=device)
    return k.to(torch.float64) * grid


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
) -> torch.Tensor:
    """DECOR's correlated noise on the grid: rows ``sum_{j in N_i} +-gamma K_ij`` (DECOR Alg 1
    line 3, eq. 3, with ``K_e ~ N_Z(0, (sigma_cor / gamma)^2)`` drawn from edge e's secret by
    :func:`discrete_gaussian_streams` at ``counter``; ``+`` at an edge's lower endpoint, ``-``
    at its upper one), summed as integers, so the rows cancel exactly over the graph. Rows as
    :func:`privdl.mechanisms.correlated.correlated_noise` (all nodes, or ``nodes``), float64."""
    array = as_edge_array(edges, n_nodes)
    rows, lower, upper, keys = incident_edges(edge_keys, array, n_nodes, nodes)
    out = torch.zeros((len(rows), size), dtype=torch.int64)
    if keys and size:
        k = discrete_gaussian_streams(keys, counter, size, scale=sigma_cor / grid)
        lo, up = torch.from_numpy(lower), torch.from_numpy(upper)
        at_lo, at_up = lo >= 0, up >= 0
        out.index_add_(0, lo[at_lo], k[at_lo])
        out.index_add_(0, up[at_up], -k[at_up])
    return (out.to(torch.float64) * grid).to(device)
