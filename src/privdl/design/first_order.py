"""First-order solver of the noise-design problem (docs/noise-design.md), for large n.

The constraint functions f_{I,i}(x) = [Sigma_I(x)^{-1}]_ii are convex in x = (s^2, w) (X -> [X^{-1}]_ii
is convex on positive-definite matrices and Sigma_I is affine in x) with gradient
d f / d x_a = -(g_a^T N e_i)^2, N = Sigma_I^{-1}, g_a the generator of x_a (e_j for a node, e_u - e_v
for an edge). The solver is the augmented Lagrangian method (Nocedal & Wright, Numerical
Optimization, 2nd ed., Algorithm 17.4, with the inequality form of eq. 17.65) whose subproblems
are solved by L-BFGS-B over x >= 0:

    L(x; lambda, rho) = c.x / c.x0 + (1 / 2 rho) sum_{I,i} [max(0, lambda + rho (f - 1))^2 - lambda^2],

so one evaluation costs one inverse per colluding set and one product N diag(mu) N (O(n^3) for the
eavesdropper). Every iterate is made feasible by scaling (the constraints are homogeneous of
degree -1): x * max f has max f = 1, and the best such point is returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
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


@dataclass(frozen=True)
class ConstraintOracle:
    """Batched f_{I,i} and their mu-weighted gradient over all colluding sets of a problem."""

    problem: Problem
    honest: np.ndarray  # (count, h) honest nodes of each set
    local_u: np.ndarray  # (count, m) local index of each edge's endpoints, -1 outside G[H]
    local_v: np.ndarray

    @classmethod
    def of(cls, problem: Problem) -> ConstraintOracle:
        n, sets = problem.n, problem.sets
        mask = np.ones((len(sets), n), dtype=bool)
        mask[np.arange(len(sets))[:, None], sets] = False
        honest = np.nonzero(mask)[1].reshape(len(sets), -1)
        local = np.cumsum(mask, axis=1) - 1
        u, v = problem.edges[:, 0], problem.edges[:, 1]
        inside = mask[:, u] & mask[:, v]
        return cls(
            problem, honest, np.where(inside, local[:, u], -1), np.where(inside, local[:, v], -1)
        )

    def inverses(self, node_var: np.ndarray, edge_var: np.ndarray) -> np.ndarray:
        """Sigma_I^{-1} for every set, (count, h, h)."""
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
        adj = np.zeros((n, n))
        adj[u, v] = edge_var
        adj[v, u] = edge_var
        stacked = sigma[h[:, :, None], h[:, None, :]]
        cut = adj[h[:, :, None], p.sets[:, None, :]].sum(axis=2)  # weight to the colluders
        rows = np.arange(h.shape[1])
        stacked[:, rows, rows] -= cut
        return np.linalg.inv(stacked)

    def values(self, inv: np.ndarray) -> np.ndarray:
        """f_{I,i} = diag(Sigma_I^{-1}), (count, h)."""
        return np.diagonal(inv, axis1=1, axis2=2).copy()

    def gradient(self, inv: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """sum_{I,i} mu_{I,i} grad f_{I,i} with respect to x = (s^2, w): with G = N diag(sqrt mu),
        -rowsum(G^2) for a node and -|G_u - G_v|^2 for an edge (O(h (h + m)) per set)."""
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
