"""The noise-design problem: residual-noise objective, privacy constraints, DECOR's scalar optimum.

Noise with covariance Sigma (per coordinate) added at every node and gossiped K times by W leaves
the variance sum_{k=1..K} tr(W^k Sigma W^k^T) = tr(M Sigma), M = sum_k (W^k)^T W^k, in the
models (the one-step objective of Whisper D-SGD, arXiv 2501.14644, eq. (8), summed over the K
steps the noise keeps being mixed; docs/noise-design.md). For the edge-wise design
Sigma = diag(s^2) + B diag(w) B^T it is linear:

    tr(M Sigma) = sum_i a_i s_i^2 + sum_e c_e w_e,   a_i = M_ii,  c_e = M_uu + M_vv - 2 M_uv.

The privacy constraint of a threat model is [Sigma_I^{-1}]_ii <= b for every colluding set I it
names and every honest i (:mod:`privdl.accounting.design`), b = eps_step / (2 C^2). Both sides
are homogeneous (the constraint of degree -1 in (s^2, w)), so the problem is solved at b = 1 and
scaled by 1/b.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from privdl.accounting.secrdp import Adversary, decor_step_rdp, parse_adversary
from privdl.errors import PrivacyError
from privdl.topology.graphs import Topology

__all__ = ["Problem", "best_scalar", "colluding_sets", "make_problem", "residual_matrix"]


def residual_matrix(mixing: np.ndarray, horizon: int) -> np.ndarray:
    """M = sum_{k=1..K} (W^k)^T W^k (dense), by one eigendecomposition when W is symmetric."""
    if horizon < 1:
        raise PrivacyError(f"the horizon K must be >= 1 gossip step, got {horizon}")
    w = np.asarray(mixing, dtype=np.float64)
    if np.allclose(w, w.T, rtol=0, atol=1e-14):
        lam, vec = np.linalg.eigh(0.5 * (w + w.T))
        sq = lam**2
        total = np.array([float(horizon) if abs(x - 1.0) < 1e-15 else x * (1 - x**horizon) / (1 - x)
                          for x in sq])  # fmt: skip
        return (vec * total) @ vec.T
    power, out = np.eye(len(w)), np.zeros_like(w)
    for _ in range(horizon):
        power = w @ power
        out += power.T @ power
    return out


def colluding_sets(n: int, adversary: Adversary, *, max_subsets: int, force: bool) -> np.ndarray:
    """Every colluding set the threat model names, as rows of a (count, q) int array."""
    q = adversary.q
    if adversary.kind == "ldp":
        raise PrivacyError("the LDP threat model has no correlated noise to design")
    if q >= n:
        raise PrivacyError(f"collusion level q = {q} must be smaller than n = {n}")
    count = math.comb(n, q)
    if count > max_subsets and not force:
        raise PrivacyError(f"q = {q} needs {count} colluding sets (> {max_subsets}); use --force")
    return np.array(list(itertools.combinations(range(n), q)), dtype=np.int64).reshape(count, q)


@dataclass(frozen=True)
class Problem:
    """minimize a.s + c.w subject to [Sigma_I^{-1}]_ii <= 1 for every row I of ``sets``."""

    n: int
    edges: np.ndarray  # (m, 2), canonical order
    a: np.ndarray  # (n,) node coefficients M_ii
    c: np.ndarray  # (m,) edge coefficients
    sets: np.ndarray  # (count, q) colluding sets
    adversary: str

    def objective(self, node_var: np.ndarray, edge_var: np.ndarray) -> float:
        """tr(M Sigma) of the design."""
        return float(self.a @ node_var + self.c @ edge_var)


def make_problem(
    topology: Topology,
    mixing: np.ndarray,
    *,
    horizon: int,
    adversary: str | Adversary,
    max_subsets: int = 100_000,
    force: bool = False,
) -> Problem:
    """The design problem of ``topology`` gossiped by ``mixing`` over ``horizon`` steps."""
    adv = parse_adversary(adversary)
    m_res = residual_matrix(mixing, horizon)
    u, v = topology.edges[:, 0], topology.edges[:, 1]
    a = np.diag(m_res).copy()
    c = m_res[u, u] + m_res[v, v] - 2.0 * m_res[u, v]
    sets = colluding_sets(topology.n, adv, max_subsets=max_subsets, force=force)
    return Problem(topology.n, topology.edges, a, np.maximum(c, 0.0), sets, adv.label)


#: :func:`best_scalar` searches log r on a coarser grid above this many nodes (curious users and
#: colluders only; the eavesdropper's g(r) is cheap after one eigendecomposition).
COARSE_SCALAR_FROM = 100


def _scalar_g_eavesdropper(topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    lam, vec = np.linalg.eigh(topology.laplacian.toarray())
    return np.maximum(lam, 0.0), vec**2


def best_scalar(topology: Topology, problem: Problem) -> tuple[float, float, float]:
    """DECOR's best scalar pair for the same objective at b = 1: ``(s^2, c^2, objective)``.

    By homogeneity s^2 = g(r) with r = c^2 / s^2 and g(r) = max_I max_i [(I + r L_H)^{-1}]_ii
    (DECOR's accountant at sigma_cdp = 1, sigma_cor = sqrt(r)); the objective is
    (sum a + r sum c) g(r), minimized over log r on a grid and then by Brent's method.
    """
    sa, sc = float(problem.a.sum()), float(problem.c.sum())
    if problem.adversary == "eavesdropper":
        lam, vec2 = _scalar_g_eavesdropper(topology)

        def g(r: float) -> float:
            return float(np.max(vec2 @ (1.0 / (1.0 + r * lam))))
    else:

        def g(r: float) -> float:
            step = decor_step_rdp(
                topology.graph, sigma_cdp=1.0, sigma_cor=math.sqrt(r), clip=1.0,
                adversary=problem.adversary, force=True,
            )  # fmt: skip
            return step.step_rdp / 2.0

    seen: dict[float, float] = {}
    # curious users and colluders on large graphs: each g(r) is an O(n^3) accountant call, so a
    # coarser grid and search (log r to 1e-3: the objective is flat there, about 1e-7 relative)
    coarse = problem.adversary != "eavesdropper" and problem.n > COARSE_SCALAR_FROM
    search = g
    if coarse and problem.adversary == "curious":
        # the search by the designer's one-inverse deletion form (privdl.design.first_order);
        # the pair returned is evaluated by the accountant (g below), which is the certificate
        from privdl.design.first_order import ConstraintOracle

        oracle = ConstraintOracle.of(problem, deletion=True)
        ones, edge_ones = np.ones(problem.n), np.ones(len(problem.edges))

        def search(r: float) -> float:
            return float(oracle.values(oracle.inverses(ones, r * edge_ones)).max())

    def value(log_r: float) -> float:
        r = 10.0**log_r
        if r not in seen:
            seen[r] = search(r)
        return (sa + r * sc) * seen[r]

    grid = np.linspace(-4.0, 8.0, 13 if coarse else 25)
    values = [value(x) for x in grid]
    k = int(np.argmin(values))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    found = optimize.minimize_scalar(value, bounds=(lo, hi), method="bounded",
                                     options={"xatol": 1e-3 if coarse else 1e-6})  # fmt: skip
    candidates = [(sa * g(0.0), 0.0), (values[k], 10.0 ** grid[k])]
    if found.success:
        candidates.append((float(found.fun), 10.0 ** float(found.x)))
    _, r = min(candidates)
    s2 = seen[r] if r in seen and search is g else g(r)
    return s2, r * s2, (sa + r * sc) * s2
