"""First-order solver of the noise-design problem (docs/noise-design.md), for large n.

The constraint functions f_{I,i}(x) = [Sigma_I(x)^{-1}]_ii are convex in x = (s^2, w) (X -> [X^{-1}]_ii
is convex on positive-definite matrices and Sigma_I is affine in x) with gradient
d f / d x_a = -(g_a^T N e_i)^2, N = Sigma_I^{-1}, g_a the generator of x_a (e_j for a node, e_u - e_v
for an edge). The solver is the augmented Lagrangian method (Nocedal & Wright, Numerical
Optimization, 2nd ed., Algorithm 17.4, with the inequality form of eq. 17.65) whose subproblems
are solved by L-BFGS-B over x >= 0:

    L(x; lambda, rho) = c.x / c.x0 + (1 / 2 rho) sum_{I,i} [max(0, lambda + rho (f - 1))^2 - lambda^2],

so one evaluation costs one inverse per colluding set and one product N diag(mu) N (O(n^3) for the
eavesdropper). Curious users (q = 1) take one inverse in all: deleting vertex j leaves
Sigma_j = Sigma_HH - sum_{k in N(j)} w_jk e_k e_k^T, whose inverse is N = Sigma^{-1} plus a term of
rank deg(j) + 1 (the block inverse of Sigma_HH, P = N - N e_j e_j^T N / N_jj, then Woodbury's
identity for the deg(j) diagonal changes; Golub & Van Loan, Matrix Computations, 4th ed., 2.1.4):

    Sigma_j^{-1} = N + Y_j S_j Y_j^T,   Y_j = [N e_j, P E_K],   S_j = diag(-1 / N_jj, M_j),
    M_j = (I - W_j P_KK)^{-1} W_j,      W_j = diag(w_jk),

so the values and the mu-weighted gradient cost O(n^2 deg) beyond the one inverse (the
:class:`_Deletion` form, :meth:`ConstraintOracle.of` with ``deletion``). Every iterate is made feasible by scaling (the constraints are homogeneous of
degree -1): x * max f has max f = 1, and the best such point is returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import optimize
from scipy.linalg import lapack

from privdl.design.objective import Problem

__all__ = ["ConstraintOracle", "solve_first_order"]

RHO0 = 1.0  # the first penalty weight: larger ones stall L-BFGS-B (ill-conditioned)


def _spd_inverse(sigma: np.ndarray) -> np.ndarray:
    """Inverse of a positive-definite matrix by Cholesky (LAPACK potrf/potri), symmetrized;
    numpy's LU below 300 rows (scipy's threaded potrf costs ~0.1 s a call on a busy machine)."""
    if len(sigma) < 300:
        return np.linalg.inv(sigma)
    factor, info = lapack.dpotrf(sigma, lower=1)
    if info == 0:
        inv, info = lapack.dpotri(factor, lower=1)
    if info != 0:
        return np.linalg.inv(sigma)
    return np.tril(inv) + np.tril(inv, -1).T


#: ``deletion=None`` takes the low-rank curious-user form above this many nodes.
DELETION_FROM = 30
#: Deleted vertices handled at once in the gradient (bounds its (block, |E|, deg + 1) arrays).
DELETION_BLOCK = 64


@dataclass(frozen=True)
class _Deletion:
    """Sigma_j^{-1} = N + Y_j S_j Y_j^T for every deleted vertex j (module docstring)."""

    inv: np.ndarray  # N = Sigma^{-1}, (n, n)
    y: np.ndarray  # (n, n, d + 1): Y_j for every j
    s: np.ndarray  # (n, d + 1, d + 1): S_j


@dataclass(frozen=True)
class ConstraintOracle:
    """Batched f_{I,i} and their mu-weighted gradient over all colluding sets of a problem."""

    problem: Problem
    honest: np.ndarray  # (count, h) honest nodes of each set
    local_u: np.ndarray  # (count, m) local index of each edge's endpoints, -1 outside G[H]
    local_v: np.ndarray
    #: curious users by one inverse (:class:`_Deletion`): (n, d) neighbours of each vertex,
    #: padded with the vertex itself, and the edge index of each (0 for the padding)
    neighbours: np.ndarray | None = None
    neighbour_edge: np.ndarray | None = None

    @classmethod
    def of(cls, problem: Problem, *, deletion: bool | None = None) -> ConstraintOracle:
        """The oracle of ``problem``; ``deletion`` (curious users only): the low-rank form of
        every deleted vertex's inverse (None: above :data:`DELETION_FROM` nodes)."""
        n, sets = problem.n, problem.sets
        curious = sets.shape[1] == 1 and len(sets) == n
        if deletion is None:
            deletion = curious and n > DELETION_FROM
        if deletion and not curious:
            raise ValueError("the deletion form is for curious users (every vertex deleted)")
        extra: dict[str, np.ndarray] = {}
        if deletion:
            extra = dict(zip(("neighbours", "neighbour_edge"), _neighbours(problem), strict=True))
        mask = np.ones((len(sets), n), dtype=bool)
        mask[np.arange(len(sets))[:, None], sets] = False
        honest = np.nonzero(mask)[1].reshape(len(sets), -1)
        local = np.cumsum(mask, axis=1) - 1
        u, v = problem.edges[:, 0], problem.edges[:, 1]
        inside = mask[:, u] & mask[:, v]
        return cls(
            problem, honest, np.where(inside, local[:, u], -1), np.where(inside, local[:, v], -1),
            **extra,
        )  # fmt: skip

    def inverses(self, node_var: np.ndarray, edge_var: np.ndarray) -> np.ndarray | _Deletion:
        """Sigma_I^{-1} for every set, (count, h, h), or their low-rank form (curious users)."""
        p = self.problem
        n = p.n
        u, v = p.edges[:, 0], p.edges[:, 1]
        flat = np.concatenate([u * (n + 1), v * (n + 1), u * n + v, v * n + u])
        sigma = np.bincount(
            flat, np.concatenate([edge_var, edge_var, -edge_var, -edge_var]), minlength=n * n
        ).reshape(n, n)
        sigma[np.arange(n), np.arange(n)] += node_var
        h = self.honest
        if h.shape[1] == n:  # the eavesdropper: one set, nothing deleted
            return _spd_inverse(sigma)[None]
        if self.neighbours is not None:
            return self._deletion(_spd_inverse(sigma), edge_var)
        adj = np.zeros((n, n))
        adj[u, v] = edge_var
        adj[v, u] = edge_var
        stacked = sigma[h[:, :, None], h[:, None, :]]
        cut = adj[h[:, :, None], p.sets[:, None, :]].sum(axis=2)  # weight to the colluders
        rows = np.arange(h.shape[1])
        stacked[:, rows, rows] -= cut
        return np.linalg.inv(stacked)

    def _deletion(self, inv: np.ndarray, edge_var: np.ndarray) -> _Deletion:
        assert self.neighbours is not None and self.neighbour_edge is not None
        nb = self.neighbours
        n, d = nb.shape
        j = np.arange(n)
        weight = np.where(nb != j[:, None], edge_var[self.neighbour_edge], 0.0)  # (n, d)
        col = inv[j, j]
        # P E_K = N[:, K] - N e_j N[j, K] / N_jj, as (j, i, k); zero at the padding (K = j)
        pe = (
            np.transpose(inv[:, nb], (1, 0, 2))
            - inv[:, :, None].transpose(1, 0, 2) * (inv[j[:, None], nb] / col[:, None])[:, None, :]
        )
        p_kk = pe[j[:, None, None], nb[:, :, None], np.arange(d)[None, None, :]]  # (n, d, d)
        lhs = np.eye(d)[None] - weight[:, :, None] * p_kk
        m_j = np.linalg.solve(lhs, weight[:, :, None] * np.eye(d)[None])
        s = np.zeros((n, d + 1, d + 1))
        s[:, 0, 0] = -1.0 / col
        s[:, 1:, 1:] = 0.5 * (m_j + np.transpose(m_j, (0, 2, 1)))
        y = np.concatenate([inv.T[:, :, None], pe], axis=2)  # (j, i, d + 1); Y_j[:, 0] = N e_j
        return _Deletion(inv, y, s)

    def values(self, inv: np.ndarray | _Deletion) -> np.ndarray:
        """f_{I,i} = diag(Sigma_I^{-1}), (count, h)."""
        if isinstance(inv, _Deletion):
            n = len(inv.inv)
            full = np.diag(inv.inv)[None, :] + ((inv.y @ inv.s) * inv.y).sum(axis=2)
            return full[~np.eye(n, dtype=bool)].reshape(n, n - 1)
        return np.diagonal(inv, axis1=1, axis2=2).copy()

    def gradient(self, inv: np.ndarray | _Deletion, mu: np.ndarray) -> np.ndarray:
        """sum_{I,i} mu_{I,i} grad f_{I,i} with respect to x = (s^2, w): with G = N diag(sqrt mu),
        -rowsum(G^2) for a node and -|G_u - G_v|^2 for an edge (O(h (h + m)) per set)."""
        if isinstance(inv, _Deletion):
            return self._deletion_gradient(inv, mu)
        p = self.problem
        grad = np.zeros(p.n + len(p.edges))
        live = np.flatnonzero(mu.any(axis=1))
        if not len(live):
            return grad
        g = inv[live] * np.sqrt(mu[live])[:, None, :]  # (b, h, h)
        np.add.at(grad, self.honest[live].ravel(), -np.einsum("bij,bij->bi", g, g).ravel())
        lu, lv = self.local_u[live], self.local_v[live]
        inside = lu >= 0
        batch = np.arange(len(live))[:, None]
        diff = g[batch, np.where(inside, lu, 0)] - g[batch, np.where(inside, lv, 0)]  # (b, m, h)
        grad[p.n :] -= np.where(inside, np.einsum("bmh,bmh->bm", diff, diff), 0.0).sum(axis=0)
        return grad

    def _deletion_gradient(self, low: _Deletion, mu: np.ndarray) -> np.ndarray:
        """The gradient in the low-rank form: with Q_j = N_j D_j N_j (D_j = diag(mu_j)),
        N_j = N + Y S Y^T, R_j = Y^T D_j N, Z_j = S R_j, V_j = S (Y^T D_j Y) S,

            Q_j[a, b] = [N D_j N]_ab + Z_j[:, a].y_b + y_a.Z_j[:, b] + y_a^T V_j y_b,

        summed over the sets j that keep a (node) or the edge; sum_j N D_j N is one diagonal
        product (D = sum_j D_j) less the terms of the sets that delete them."""
        p = self.problem
        n = p.n
        u, v = p.edges[:, 0], p.edges[:, 1]
        full = np.zeros((n, n))  # MU[j, i], zero at i = j
        full[~np.eye(n, dtype=bool)] = mu.ravel()
        big = low.inv
        total = full.sum(axis=0)
        diff = big[u] - big[v]  # (m, n)
        node = (big**2) @ total - np.einsum("ai,ai->a", full, big**2)
        edge = (diff**2) @ total - np.einsum("ei,ei->e", full[u] + full[v], diff**2)
        live = np.flatnonzero(full.any(axis=1))
        for start in range(0, len(live), DELETION_BLOCK):
            js = live[start : start + DELETION_BLOCK]
            y, s, w = low.y[js], low.s[js], full[js]
            yw = np.transpose(y * w[:, :, None], (0, 2, 1))  # (b, d + 1, n): Y^T D
            z = s @ _times(yw, big)  # S Y^T D N, (b, d + 1, n)
            vv = s @ (yw @ y) @ s
            keep = np.ones((len(js), n))
            keep[np.arange(len(js)), js] = 0.0
            yz = (y * np.transpose(z, (0, 2, 1))).sum(axis=2)
            node += ((2.0 * yz + ((y @ vv) * y).sum(axis=2)) * keep).sum(axis=0)
            dy = y[:, u] - y[:, v]  # (b, m, d + 1)
            dz = np.transpose(z[:, :, u] - z[:, :, v], (0, 2, 1))  # (b, m, d + 1)
            term = 2.0 * (dy * dz).sum(axis=2) + ((dy @ vv) * dy).sum(axis=2)
            edge += (term * keep[:, u] * keep[:, v]).sum(axis=0)
        return -np.concatenate([node, edge])


def _times(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ right`` for a batch ``left`` (b, r, n) and a dense (n, n) ``right``; as a sparse
    product where ``left`` is mostly zero (few active constraints: mu_ji = 0)."""
    flat = left.reshape(-1, left.shape[2])
    if np.count_nonzero(flat) > 0.1 * flat.size:
        return left @ right
    return np.asarray(sp.csr_matrix(flat) @ right).reshape(left.shape[0], left.shape[1], -1)


def _neighbours(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) neighbours of every vertex padded with the vertex itself, and their edge indices."""
    n, edges = problem.n, problem.edges
    ends = np.concatenate([edges[:, 0], edges[:, 1]])
    other = np.concatenate([edges[:, 1], edges[:, 0]])
    index = np.concatenate([np.arange(len(edges))] * 2)
    order = np.argsort(ends, kind="stable")
    ends, other, index = ends[order], other[order], index[order]
    degree = np.bincount(ends, minlength=n)
    d = max(int(degree.max()) if len(degree) else 0, 1)
    slot = np.arange(len(ends)) - np.repeat(np.cumsum(degree) - degree, degree)
    nb = np.repeat(np.arange(n)[:, None], d, axis=1)
    ed = np.zeros((n, d), dtype=np.int64)
    nb[ends, slot] = other
    ed[ends, slot] = index
    return nb, ed


def solve_first_order(
    problem: Problem,
    start: tuple[np.ndarray, np.ndarray],
    *,
    rtol: float = 1e-7,
    max_outer: int = 60,
    max_inner: int = 400,
    max_seconds: float | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(s^2, w) minimizing c.x subject to max f <= 1, from the feasible ``start`` (DECOR's best
    scalar pair, say). Returns the best point found, scaled to max f = 1, and solver facts
    (``converged`` is False when ``max_seconds`` ran out first: the point is feasible, not
    optimal)."""
    started = time.perf_counter()
    oracle = ConstraintOracle.of(problem)
    n = problem.n
    coef = np.concatenate([problem.a, problem.c])
    x0 = np.concatenate(start).astype(np.float64)
    ref = np.where(x0 > 0, x0, max(float(x0.max()), 1.0))  # variable scaling: y = x / ref
    weights = coef * ref
    obj0 = float(weights.sum())
    count, h = oracle.honest.shape
    lam = np.zeros((count, h))
    rho = RHO0
    lower = np.concatenate([np.full(n, 1e-8), np.zeros(len(coef) - n)])
    bounds = list(zip(lower, [None] * len(lower), strict=True))
    y = x0 / ref

    def feasible(y: np.ndarray) -> tuple[float, np.ndarray]:
        fmax = float(oracle.values(oracle.inverses(*np.split(y * ref, [n]))).max())
        return float(weights @ y) * fmax / obj0, y * fmax

    best_val, best_y = feasible(y)
    evaluations = 0

    def out_of_time() -> bool:
        return max_seconds is not None and time.perf_counter() - started > max_seconds

    def lagrangian(y: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal evaluations, best_val, best_y
        evaluations += 1
        inv = oracle.inverses(*np.split(y * ref, [n]))
        f = oracle.values(inv)
        fmax = float(f.max())
        if float(weights @ y) * fmax / obj0 < best_val:  # every iterate, made feasible by scaling
            best_val, best_y = float(weights @ y) * fmax / obj0, y * fmax
        mu = np.maximum(0.0, lam + rho * (f - 1.0))
        value = float(weights @ y) / obj0 + float((mu**2 - lam**2).sum()) / (2.0 * rho)
        if out_of_time():  # a zero gradient ends L-BFGS-B at once (its line search included)
            return value, np.zeros_like(y)
        grad = weights / obj0 + oracle.gradient(inv, mu) * ref
        return value, grad

    def callback(intermediate_result: object) -> None:
        if out_of_time():
            raise StopIteration

    violation = np.inf
    outer, converged = 0, False
    for outer in range(1, max_outer + 1):  # noqa: B007 - reported below
        found = optimize.minimize(
            lagrangian, y, jac=True, method="L-BFGS-B", bounds=bounds,
            options={"maxiter": max_inner, "ftol": 1e-15, "gtol": 1e-11}, callback=callback,
        )  # fmt: skip
        y = found.x
        f = oracle.values(oracle.inverses(*np.split(y * ref, [n])))
        lam = np.maximum(0.0, lam + rho * (f - 1.0))
        new_violation = float(np.max(f) - 1.0)
        value, scaled = feasible(y)
        improved = value < best_val * (1.0 - rtol)
        if value < best_val:
            best_val, best_y = value, scaled
        if abs(new_violation) < rtol and not improved and outer > 2:
            converged = True
            break
        if out_of_time():
            break
        if new_violation > 0.25 * max(violation, 0.0):
            rho = min(rho * 5.0, 1e8)
        violation = new_violation
    x = best_y * ref
    return (
        x[:n],
        x[n:],
        {
            "outer": outer,
            "evaluations": evaluations,
            "objective": best_val * obj0,
            "converged": converged,
            "seconds": time.perf_counter() - started,
        },
    )
