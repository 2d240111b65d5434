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

and as Y_j = N U_j T_j (U_j = [e_j, E_K], T_j = [[1, -N_jK / N_jj], [0, I]]) this is
Sigma_j^{-1} = N + N U_j A_j U_j^T N with A_j = T_j S_j T_j^T of size deg(j) + 1, which needs
only N[J_j, J_j] (J_j = {j} + K). Every value is then f_{j,i} = N_ii + N[i, J_j] A_j N[J_j, i]
(O(n^2 deg^2) for all n (n - 1) pairs) and Sigma_j^{-1} e_i = N v_ji with v_ji sparse (deg + 2
entries), so the mu-weighted gradient over all pairs is read off N V N, V = sum mu_ji v_ji v_ji^T
(one dense product N V; :meth:`ConstraintOracle._deletion_gradient`): O(n^3) in all, the cost of
the inverse, whatever the number of active constraints (the :class:`_Deletion` form,
:meth:`ConstraintOracle.of` with ``deletion``). Every iterate is made feasible by scaling (the constraints are homogeneous of
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

__all__ = ["ConstraintOracle", "WorkingSetOracle", "solve_first_order"]

RHO0 = 1.0  # the first penalty weight: larger ones stall L-BFGS-B (ill-conditioned)


def _sigma(problem: Problem, node_var: np.ndarray, edge_var: np.ndarray) -> np.ndarray:
    """Sigma = diag(s^2) + B diag(w) B^T as a dense (n, n) array (one scatter of the edges)."""
    n = problem.n
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    flat = np.concatenate([u * (n + 1), v * (n + 1), u * n + v, v * n + u])
    sigma = np.bincount(
        flat, np.concatenate([edge_var, edge_var, -edge_var, -edge_var]), minlength=n * n
    ).reshape(n, n)
    sigma[np.arange(n), np.arange(n)] += node_var
    return sigma


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


@dataclass(frozen=True)
class _Deletion:
    """Sigma_j^{-1} = N + N U_j A_j U_j^T N for every deleted vertex j (module docstring), with
    the rows B[j, i] = N[i, J_j] and BA[j, i] = A_j N[J_j, i] (N_j e_i = N (e_i + U_j BA[j, i]))."""

    inv: np.ndarray  # N = Sigma^{-1}, (n, n)
    cols: np.ndarray  # (n, d + 1): J_j = [j, N(j)] (padded with j)
    b: np.ndarray  # (n, n, d + 1)
    ba: np.ndarray  # (n, n, d + 1)


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
        sigma = _sigma(p, node_var, edge_var)
        h = self.honest
        if h.shape[1] == n:  # the eavesdropper: one set, nothing deleted
            return _spd_inverse(sigma)[None]
        if self.neighbours is not None:
            return self._deletion(_spd_inverse(sigma), edge_var)
        u, v = p.edges[:, 0], p.edges[:, 1]
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
        cols, col, ratio, m_j = _deletion_blocks(inv, nb, edge_var, self.neighbour_edge)
        s = np.zeros((n, d + 1, d + 1))
        s[:, 0, 0] = -1.0 / col
        s[:, 1:, 1:] = m_j
        t = np.zeros((n, d + 1, d + 1))  # Y_j = N U_j T_j, T_j = [[1, -r_j^T], [0, I]]
        t[:, 0, 0] = 1.0
        t[:, 0, 1:] = -ratio
        t[:, 1:, 1:] = np.eye(d)[None]
        a = t @ s @ np.transpose(t, (0, 2, 1))
        a = 0.5 * (a + np.transpose(a, (0, 2, 1)))
        b = inv[:, cols].transpose(1, 0, 2)  # B[j, i, k] = N[i, J_j[k]]
        return _Deletion(inv, cols, b, b @ a)

    def values(self, inv: np.ndarray | _Deletion) -> np.ndarray:
        """f_{I,i} = diag(Sigma_I^{-1}), (count, h)."""
        if isinstance(inv, _Deletion):
            n = len(inv.inv)
            full = np.diag(inv.inv)[None, :] + (inv.b * inv.ba).sum(axis=2)
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
        """The gradient in the low-rank form: N_j e_i = N v_ji with v_ji = e_i + U_j BA[j, i]
        (d + 2 non-zeros), so sum_{j,i} mu_ji N_j e_i e_i^T N_j = N V N with

            V = diag(sum_j mu_j) + X + X^T + sum_j U_j G_j U_j^T,
            X[i, J_j] += mu_ji BA[j, i],  G_j = sum_i mu_ji BA[j, i] BA[j, i]^T,

        one product N V and its entries on the pattern of Sigma (O(n^3) in all, O(n^2 deg^2)
        beyond it). Row j of N_j is zero, so the nodes need no correction; an edge (j, v) of a
        deleted j is not in Sigma_j and its term sum_i mu_ji [N_j]_vi^2 is taken off, with the
        rows N_j[J_j] = B[j]^T + N[J_j, J_j] BA[j]^T."""
        p = self.problem
        n = p.n
        u, v = p.edges[:, 0], p.edges[:, 1]
        full = np.zeros((n, n))  # MU[j, i], zero at i = j
        full[~np.eye(n, dtype=bool)] = mu.ravel()
        cols, big = low.cols, low.inv
        r = cols.shape[1]
        z = full[:, :, None] * low.ba  # (j, i, k)
        select = sp.csr_matrix(
            (np.ones(n * r), (cols.ravel(), np.arange(n * r))), shape=(n, n * r)
        )  # fmt: skip
        zt = np.transpose(z, (0, 2, 1))  # (j, k, i)
        xt = np.asarray(select @ zt.reshape(n * r, n))  # X^T
        g = zt @ low.ba  # G_j
        blocks = np.bincount(
            (cols[:, :, None] * n + cols[:, None, :]).ravel(), g.ravel(), minlength=n * n
        ).reshape(n, n)
        vv = xt + xt.T + blocks
        vv[np.arange(n), np.arange(n)] += full.sum(axis=0)
        nv = big @ vv
        node = np.einsum("ab,ab->a", nv, big)
        edge = node[u] + node[v] - 2.0 * np.einsum("eb,eb->e", nv[u], big[v])
        block = big[cols[:, :, None], cols[:, None, :]]  # N[J_j, J_j]
        rows = np.transpose(low.b, (0, 2, 1)) + block @ np.transpose(low.ba, (0, 2, 1))
        own = ((rows[:, 1:] ** 2) @ full[:, :, None])[:, :, 0]  # (j, neighbour slot)
        real = cols[:, 1:] != np.arange(n)[:, None]
        assert self.neighbour_edge is not None
        edge -= np.bincount(
            self.neighbour_edge[real], own[real], minlength=len(edge)
        )  # fmt: skip
        return -np.concatenate([node, edge])


def _deletion_blocks(
    inv: np.ndarray, nb: np.ndarray, edge_var: np.ndarray, neighbour_edge: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For every deleted vertex j (module docstring): J_j = [j, K_j] (n, d + 1), N_jj, r_j =
    N[j, K] / N_jj and the symmetric M_j = (I - W_j P_KK)^{-1} W_j with P_KK = N_KK - N_Kj r_j^T
    and W_j the weights of j's edges (zero at the padding)."""
    n, d = nb.shape
    j = np.arange(n)
    cols = np.concatenate([j[:, None], nb], axis=1)
    weight = np.where(nb != j[:, None], edge_var[neighbour_edge], 0.0)  # (n, d)
    block = inv[cols[:, :, None], cols[:, None, :]]  # N[J_j, J_j], (n, d + 1, d + 1)
    col = block[:, 0, 0]
    ratio = block[:, 0, 1:] / col[:, None]
    p_kk = block[:, 1:, 1:] - block[:, 1:, :1] * ratio[:, None, :]
    lhs = np.eye(d)[None] - weight[:, :, None] * p_kk
    m_j = np.linalg.solve(lhs, weight[:, :, None] * np.eye(d)[None])
    return cols, col, ratio, 0.5 * (m_j + np.transpose(m_j, (0, 2, 1)))


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


#: ``solve_first_order`` solves curious users over a working set of pairs (j, i) above this many
#: nodes (:class:`WorkingSetOracle`), checking every pair at each round's point.
WORKING_SET_FROM = 100
#: pairs added per working-set round: those within this fraction of the largest constraint ...
WORKING_SET_MARGIN = 0.02
#: ... at most this many per node and round (the largest first)
WORKING_SET_ADD = 4


@dataclass
class _Run:
    """The augmented Lagrangian's state across calls (working-set rounds share it)."""

    ref: np.ndarray  # variable scaling: y = x / ref
    weights: np.ndarray
    obj0: float
    lower: np.ndarray
    started: float
    max_seconds: float | None
    evaluations: int = 0
    outer: int = 0

    def out_of_time(self) -> bool:
        return (
            self.max_seconds is not None and time.perf_counter() - self.started > self.max_seconds
        )


def _augmented_lagrangian(
    oracle: Any,  # ConstraintOracle or WorkingSetOracle (the same three methods)
    run: _Run,
    y: np.ndarray,
    lam: np.ndarray,
    *,
    rtol: float,
    max_outer: int,
    max_inner: int,
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, bool]:
    """Algorithm 17.4 (module docstring) on ``oracle``'s constraints from ``y`` and multipliers
    ``lam``: (last y, lam, best value, best y scaled to max f = 1, converged)."""
    n = oracle.problem.n
    ref, weights, obj0 = run.ref, run.weights, run.obj0
    bounds = list(zip(run.lower, [None] * len(run.lower), strict=True))

    def feasible(y: np.ndarray) -> tuple[float, np.ndarray]:
        fmax = float(oracle.values(oracle.inverses(*np.split(y * ref, [n]))).max())
        return float(weights @ y) * fmax / obj0, y * fmax

    best_val, best_y = feasible(y)
    rho = RHO0 if not lam.any() else RHO0 * 25.0

    def lagrangian(y: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal best_val, best_y
        run.evaluations += 1
        inv = oracle.inverses(*np.split(y * ref, [n]))
        f = oracle.values(inv)
        fmax = float(f.max())
        if float(weights @ y) * fmax / obj0 < best_val:  # every iterate, made feasible by scaling
            best_val, best_y = float(weights @ y) * fmax / obj0, y * fmax
        mu = np.maximum(0.0, lam + rho * (f - 1.0))
        value = float(weights @ y) / obj0 + float((mu**2 - lam**2).sum()) / (2.0 * rho)
        if run.out_of_time():  # a zero gradient ends L-BFGS-B at once (its line search included)
            return value, np.zeros_like(y)
        grad = weights / obj0 + oracle.gradient(inv, mu) * ref
        return value, grad

    def callback(intermediate_result: object) -> None:
        if run.out_of_time():
            raise StopIteration

    violation = np.inf
    converged = False
    for outer in range(1, max_outer + 1):
        run.outer += 1
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
        if run.out_of_time():
            break
        if new_violation > 0.25 * max(violation, 0.0):
            rho = min(rho * 5.0, 1e8)
        violation = new_violation
    return y, lam, best_val, best_y, converged


def solve_first_order(
    problem: Problem,
    start: tuple[np.ndarray, np.ndarray],
    *,
    rtol: float = 1e-7,
    max_outer: int = 60,
    max_inner: int = 400,
    max_seconds: float | None = None,
    working_set: bool | None = None,
    deletion: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(s^2, w) minimizing c.x subject to max f <= 1, from the feasible ``start`` (DECOR's best
    scalar pair, say). Returns the best point found, scaled to max f = 1, and solver facts
    (``converged`` is False when ``max_seconds`` ran out first: the point is feasible, not
    optimal).

    ``working_set`` (curious users; None: above :data:`WORKING_SET_FROM` nodes): solve over the
    pairs (j, i) with i a neighbour of j and those within :data:`WORKING_SET_MARGIN` of the
    largest constraint at the start (:class:`WorkingSetOracle`); at each round's solution every
    pair is evaluated (one inverse and the low-rank form of every deletion) and the binding ones
    are added. The relaxation's optimum is the problem's once no pair outside the set exceeds the
    set's largest (to ``rtol``); the point returned is scaled by the largest over all pairs.

    ``deletion``: the constraints of every pair by the low-rank deletion form (as
    :meth:`ConstraintOracle.of`; None: above :data:`DELETION_FROM` nodes)."""
    run_started = time.perf_counter()
    oracle = ConstraintOracle.of(problem, deletion=deletion)
    n = problem.n
    coef = np.concatenate([problem.a, problem.c])
    x0 = np.concatenate(start).astype(np.float64)
    ref = np.where(x0 > 0, x0, max(float(x0.max()), 1.0))
    run = _Run(
        ref, coef * ref, float((coef * ref).sum()),
        np.concatenate([np.full(n, 1e-8), np.zeros(len(coef) - n)]), run_started, max_seconds,
    )  # fmt: skip
    y = x0 / ref
    curious = problem.sets.shape[1] == 1 and len(problem.sets) == n
    if working_set is None:
        working_set = curious and n > WORKING_SET_FROM
    if working_set and not curious:
        raise ValueError("the working set is for curious users (every vertex deleted)")
    facts: dict[str, Any] = {}
    if not working_set:
        count, h = oracle.honest.shape
        _, _, best_val, best_y, converged = _augmented_lagrangian(
            oracle, run, y, np.zeros((count, h)), rtol=rtol, max_outer=max_outer,
            max_inner=max_inner,
        )  # fmt: skip
    else:
        best_val, best_y, converged, facts = _working_set(
            problem, oracle, run, y, rtol=rtol, max_outer=max_outer, max_inner=max_inner
        )
    x = best_y * ref
    return (
        x[:n],
        x[n:],
        {
            "outer": run.outer,
            "evaluations": run.evaluations,
            "objective": best_val * run.obj0,
            "converged": converged,
            "seconds": time.perf_counter() - run_started,
            **facts,
        },
    )


def _working_set(
    problem: Problem,
    full: ConstraintOracle,
    run: _Run,
    y: np.ndarray,
    *,
    rtol: float,
    max_outer: int,
    max_inner: int,
) -> tuple[float, np.ndarray, bool, dict[str, Any]]:
    """The working-set rounds of :func:`solve_first_order` (its docstring)."""
    n = problem.n
    nb, _ = _neighbours(problem)
    chosen = np.zeros((n, n), dtype=bool)  # chosen[j, i]: the pair (j, i) is in the set
    chosen[np.repeat(np.arange(n), nb.shape[1]), nb.ravel()] = True
    off = ~np.eye(n, dtype=bool)

    def every_pair(y: np.ndarray) -> np.ndarray:
        values = np.zeros((n, n))
        values[off] = full.values(full.inverses(*np.split(y * run.ref, [n]))).ravel()
        return values

    def add(values: np.ndarray, above: float) -> int:
        cand = np.where(~chosen & off & (values >= above), values, -np.inf)
        top = np.argsort(-cand, axis=1)[:, :WORKING_SET_ADD]
        rows = np.repeat(np.arange(n), top.shape[1])
        take = np.isfinite(cand[rows, top.ravel()])
        chosen[rows[take], top.ravel()[take]] = True
        return int(take.sum())

    values = every_pair(y)
    add(values, (1.0 - WORKING_SET_MARGIN) * float(values.max()))
    chosen[~off] = False
    best_val = float(run.weights @ y) * float(values.max()) / run.obj0
    best_y = y * float(values.max())
    lam_of: dict[tuple[int, int], float] = {}
    converged, rounds = False, 0
    while not run.out_of_time():
        rounds += 1
        jj, ii = np.nonzero(chosen)
        oracle = WorkingSetOracle.of(problem, jj, ii)
        lam = np.zeros((1, len(jj)))
        for k, pair in enumerate(zip(jj.tolist(), ii.tolist(), strict=True)):
            lam[0, k] = lam_of.get(pair, 0.0)
        y, lam, _, set_y, set_converged = _augmented_lagrangian(
            oracle, run, y, lam, rtol=rtol, max_outer=max_outer, max_inner=max_inner
        )
        lam_of = dict(zip(zip(jj.tolist(), ii.tolist(), strict=True), lam[0].tolist(), strict=True))
        values = every_pair(set_y)  # the set's best point, max over the set = 1
        fmax = float(values.max())
        value = float(run.weights @ set_y) * fmax / run.obj0
        if value < best_val:
            best_val, best_y = value, set_y * fmax
        if not set_converged:
            break
        if fmax <= 1.0 + rtol:
            converged = True
            break
        if not add(values, min(1.0, (1.0 - WORKING_SET_MARGIN) * fmax)):
            break
    return best_val, best_y, converged, {"working_set": int(chosen.sum()), "rounds": rounds}


@dataclass(frozen=True)
class _Pairs:
    """The working-set form at one point: N = Sigma^{-1} and, per pair p = (j, i), the sparse
    r_p with Sigma_j^{-1} e_i = N r_p (:class:`WorkingSetOracle`)."""

    inv: np.ndarray  # (n, n)
    values: np.ndarray  # (p,) f_{j,i}
    coef: np.ndarray  # (p, d + 2): r_p's entries at (i, j, K_j)


@dataclass(frozen=True)
class WorkingSetOracle:
    """Curious users (every vertex j deleted) over a working set of pairs (j, i) only.

    With P_iK = N_iK - N_ij N_jK / N_jj and t_p = M_j P_Ki (M_j as in the module docstring),

        f_{j,i} = N_ii - N_ij^2 / N_jj + P_iK t_p,
        Sigma_j^{-1} e_i = N r_p,  r_p = e_i + E_K t_p - e_j (N_ji + N_jK t_p) / N_jj,

    so the values cost O(p deg + n deg^3) beyond the one inverse and the mu-weighted gradient one
    product of N with the sparse (n, p) matrix of the r_p (deg + 2 entries each): O(n p deg),
    against O(n^2 deg) per deleted vertex over all pairs. The solver checks every pair at its
    points (:meth:`ConstraintOracle.values`) and adds those that bind (:func:`solve_first_order`)."""

    problem: Problem
    neighbours: np.ndarray  # (n, d) as ConstraintOracle's, padded with the vertex itself
    neighbour_edge: np.ndarray
    deleted: np.ndarray  # (p,) j
    kept: np.ndarray  # (p,) i

    @classmethod
    def of(cls, problem: Problem, deleted: np.ndarray, kept: np.ndarray) -> WorkingSetOracle:
        nb, ed = _neighbours(problem)
        return cls(problem, nb, ed, np.asarray(deleted, np.int64), np.asarray(kept, np.int64))

    def inverses(self, node_var: np.ndarray, edge_var: np.ndarray) -> _Pairs:
        p = self.problem
        n = p.n
        sigma = _sigma(p, node_var, edge_var)
        inv = _spd_inverse(sigma)
        nb = self.neighbours
        _, col, _, m_j = _deletion_blocks(inv, nb, edge_var, self.neighbour_edge)
        njk = inv[np.arange(n)[:, None], nb]  # (n, d) N_jK
        j, i = self.deleted, self.kept
        nij = inv[i, j]
        p_ik = inv[i[:, None], nb[j]] - nij[:, None] * njk[j] / col[j, None]  # (p, d)
        t = np.einsum("pkl,pl->pk", m_j[j], p_ik)
        values = inv[i, i] - nij**2 / col[j] + np.einsum("pk,pk->p", p_ik, t)
        coef = np.concatenate(
            [
                np.ones((len(j), 1)),
                (-(nij + np.einsum("pk,pk->p", njk[j], t)) / col[j])[:, None],
                t,
            ],
            axis=1,
        )
        return _Pairs(inv, values, coef)

    def values(self, inv: _Pairs) -> np.ndarray:
        """f_{j,i} of the working set, (1, p)."""
        return inv.values[None]

    def gradient(self, inv: _Pairs, mu: np.ndarray) -> np.ndarray:
        """sum_p mu_p grad f_p: with c_p = sqrt(mu_p) Sigma_j^{-1} e_i (zero at j), -sum c_p^2
        for a node and -sum (c_p[u] - c_p[v])^2 over the pairs whose j is not an end of the edge."""
        p = self.problem
        n = p.n
        grad = np.zeros(n + len(p.edges))
        weight = mu.ravel()
        live = np.flatnonzero(weight > 0)
        if not len(live):
            return grad
        j, i = self.deleted[live], self.kept[live]
        nb = self.neighbours[j]
        rows = np.concatenate([i[:, None], j[:, None], nb], axis=1)  # (b, d + 2)
        data = inv.coef[live] * np.sqrt(weight[live])[:, None]
        data[:, 2:] *= nb != j[:, None]  # the padding
        u, v = p.edges[:, 0], p.edges[:, 1]
        for start in range(0, len(live), 512):
            sl = slice(start, start + 512)
            b = len(rows[sl])
            r_t = sp.csr_matrix(
                (data[sl].ravel(), (np.repeat(np.arange(b), rows.shape[1]), rows[sl].ravel())),
                shape=(b, n),
            )
            c = np.asarray(r_t @ inv.inv)  # (b, n): c_p^T (N symmetric)
            c[np.arange(b), j[sl]] = 0.0
            grad[:n] -= (c**2).sum(axis=0)
            grad[n:] -= ((c[:, u] - c[:, v]) ** 2).sum(axis=0)
            # the edges (j, k) of each pair's deleted vertex: their term was c_p[k]^2
            k = self.neighbours[j[sl]]
            real = k != j[sl][:, None]
            np.add.at(
                grad,
                n + self.neighbour_edge[j[sl]][real],
                (c[np.arange(b)[:, None], k] ** 2)[real],
            )
        return grad
