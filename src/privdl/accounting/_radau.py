"""Certified upper bounds on diag(Sigma^{-1}) by Gauss-Radau quadrature (no factorization).

For Sigma = sigma_cdp^2 I + sigma_cor^2 L (L a graph Laplacian) and every vertex i,
``e_i^T Sigma^{-1} e_i = int 1/x dmu_i(x)`` with ``mu_i`` the spectral measure of Sigma at e_i.
K steps of Lanczos from e_i give the Jacobi matrix T_K and beta_K; the Gauss-Radau rule with one
node prescribed at ``a <= lambda_min(Sigma)`` is ``e_1^T Tr^{-1} e_1`` with ``Tr`` the
(K+1) x (K+1) extension of T_K whose last diagonal entry is ``a + delta_K``,
``(T_K - a I) delta = beta_K^2 e_K`` (Golub & Meurant 2010, *Matrices, Moments and Quadrature
with Applications*, Ch. 6, the Gauss-Radau rule and the sign of its remainder
``f^(2K+1)(eta) / (2K+1)! * int (x - a) prod_j (x - t_j)^2 dmu_i``: for f(x) = 1/x, whose odd
derivatives are negative, the rule with its node at or below the spectrum is an upper bound). Here
``a = sigma_cdp^2`` is exactly lambda_min(Sigma) (L is positive semi-definite and annihilates the
constant vectors), so the bound holds for every graph, connected or not, at any noise ratio.

The Lanczos runs are compiled (numba): one start vector at a time on sparse accumulators, so
after j steps the work is the j-hop ball of the vertex and never a dense column; the vertices
are split over the process's worker threads (the kernel releases the GIL). The block form
(``_lanczos_block``: all start vectors of a block at once, as scipy sparse products) is the
independent oracle the tests compare it with. The number of steps K is chosen by a work budget
(:func:`auto_steps`): the most steps, up to RADAU_STEPS, whose measured ball sizes fit it. Its
looseness and rounding are measured in docs/accounting.md (section 1, ``gauss-radau``).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import scipy.sparse.linalg as sla

#: The most Lanczos steps per start vector (the rule has K + 1 nodes); the looseness shrinks
#: about 5x a step on random 6-regular graphs (docs/accounting.md).
RADAU_STEPS = 6
#: The fewest steps :func:`auto_steps` takes, however large the graph.
RADAU_MIN_STEPS = 3
#: Work budget of :func:`auto_steps`: matrix entries visited by all the Lanczos runs together
#: (the compiled kernel visited about 7e7 a second on the shared 2-core machine under load 6, on
#: random 6-regular graphs of 10^5 nodes: the visits are cache misses; docs/accounting.md).
RADAU_WORK = 2.0e9
#: A column whose beta_j falls below this times the spectrum's scale has exhausted its Krylov
#: space (a small component); its entry is then computed exactly by a sparse solve.
BREAKDOWN = 1e-8


def _lanczos_block(sigma: sp.csr_matrix, cols: np.ndarray, steps: int) -> tuple[np.ndarray, ...]:
    """alpha (b, K) and beta (b, K) of K Lanczos steps from e_c for every c in ``cols``."""
    n = sigma.shape[0]
    b = len(cols)
    q: sp.csr_matrix | np.ndarray = sp.csr_matrix((np.ones(b), (cols, np.arange(b))), shape=(n, b))
    q_prev: sp.csr_matrix | np.ndarray = sp.csr_matrix((n, b))
    beta_prev = np.zeros(b)
    alphas, betas = np.empty((b, steps)), np.empty((b, steps))
    for j in range(steps):
        w = sigma @ q
        if sp.issparse(w):
            alpha = np.asarray(w.multiply(q).sum(axis=0)).ravel()
            w = sp.csr_matrix(w - q @ sp.diags(alpha) - q_prev @ sp.diags(beta_prev))
            if w.nnz > 0.2 * n * b:  # the balls have filled: dense from here
                w, q = w.toarray(), sp.csr_matrix(q).toarray()
        else:
            alpha = np.einsum("ij,ij->j", w, q)
            w -= q * alpha
            w -= q_prev * beta_prev
        if sp.issparse(w):
            beta = np.sqrt(np.asarray(w.multiply(w).sum(axis=0)).ravel())
        else:
            beta = np.sqrt(np.einsum("ij,ij->j", w, w))
        alphas[:, j], betas[:, j] = alpha, beta
        safe = np.where(beta > 0, beta, 1.0)
        q_prev, q = q, (sp.csr_matrix(w @ sp.diags(1.0 / safe)) if sp.issparse(w) else w / safe)
        beta_prev = beta
    return alphas, betas


def _lanczos_rows_py(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    starts: np.ndarray,
    steps: int,
    alphas: np.ndarray,
    betas: np.ndarray,
) -> None:  # pragma: no cover - compiled by numba (run as Python only when numba is absent)
    """Lanczos from e_i for every i in ``starts`` on the symmetric CSR matrix (with its diagonal
    stored): ``alphas[r, j]``, ``betas[r, j]`` of the run from ``starts[r]``.

    Three vectors of length n are kept with the list of their structural nonzeros; the product
    marks new entries with a running stamp, so a step costs the rows of the current support only
    (the support after j steps is the j-hop ball: it contains the last two because the diagonal
    is stored)."""
    n = len(indptr) - 1
    buf = np.zeros((3, n))
    sup = np.empty((3, n), dtype=np.int64)
    size = np.zeros(3, dtype=np.int64)
    stamp = np.full(n, -1, dtype=np.int64)
    counter = 0
    for r in range(len(starts)):
        for b in range(3):  # clear what the last run left
            for t in range(size[b]):
                buf[b, sup[b, t]] = 0.0
            size[b] = 0
        cur, prev, nxt = 0, 1, 2
        i = starts[r]
        buf[cur, i] = 1.0
        sup[cur, 0] = i
        size[cur] = 1
        beta_prev = 0.0
        for j in range(steps):
            counter += 1
            m = 0
            for t in range(size[cur]):  # w = Sigma q on the next ball
                u = sup[cur, t]
                qu = buf[cur, u]
                for p in range(indptr[u], indptr[u + 1]):
                    v = indices[p]
                    if stamp[v] != counter:
                        stamp[v] = counter
                        sup[nxt, m] = v
                        m += 1
                    buf[nxt, v] += data[p] * qu
            size[nxt] = m
            alpha = 0.0
            for t in range(size[cur]):
                u = sup[cur, t]
                alpha += buf[nxt, u] * buf[cur, u]
            for t in range(size[cur]):
                u = sup[cur, t]
                buf[nxt, u] -= alpha * buf[cur, u]
            for t in range(size[prev]):
                u = sup[prev, t]
                buf[nxt, u] -= beta_prev * buf[prev, u]
            ss = 0.0
            for t in range(m):
                x = buf[nxt, sup[nxt, t]]
                ss += x * x
            beta = np.sqrt(ss)
            alphas[r, j] = alpha
            betas[r, j] = beta
            for t in range(size[prev]):
                buf[prev, sup[prev, t]] = 0.0
            size[prev] = 0
            if beta > 0.0:
                inv = 1.0 / beta
                for t in range(m):
                    buf[nxt, sup[nxt, t]] *= inv
            prev, cur, nxt = cur, nxt, prev
            beta_prev = beta


@cache
def _lanczos_rows_jit() -> Any:
    """The compiled :func:`_lanczos_rows_py` (numba ``nogil``, cached on disk)."""
    from privdl.mechanisms.ziggurat import jit

    return jit(_lanczos_rows_py)


def _lanczos_rows(sigma: sp.csr_matrix, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """alpha (n, K) and beta (n, K) of K Lanczos steps from every e_i (compiled, threaded)."""
    from privdl.mechanisms._pool import run_parallel, usable_cpus

    n = sigma.shape[0]
    indptr = np.ascontiguousarray(sigma.indptr, dtype=np.int64)
    indices = np.ascontiguousarray(sigma.indices, dtype=np.int64)
    data = np.ascontiguousarray(sigma.data, dtype=np.float64)
    alphas, betas = np.empty((n, steps)), np.empty((n, steps))
    kernel = _lanczos_rows_jit()
    parts = np.array_split(np.arange(n, dtype=np.int64), max(1, min(n, 4 * usable_cpus())))

    def part(k: int) -> None:
        rows = parts[k]
        if len(rows):
            a, b = alphas[rows[0] : rows[-1] + 1], betas[rows[0] : rows[-1] + 1]
            kernel(indptr, indices, data, rows, steps, a, b)

    run_parallel(part, len(parts))
    return alphas, betas


def lanczos_work(lap: sp.spmatrix, *, seed: int = 0) -> np.ndarray:
    """Estimated matrix entries visited by K = 1 .. RADAU_STEPS compiled Lanczos steps from every
    vertex (entry K-1: K steps).

    The work of K steps from e_i is the number of matrix entries in the rows of the balls of
    radius 0 .. K-1 around i; it is counted exactly on 64 vertices drawn at random (breadth-first
    balls, as sparse products) and scaled to n."""
    n = lap.shape[0]
    a = (sp.csr_matrix(lap) + sp.identity(n, format="csr")).tocsr()  # Sigma's pattern
    row_nnz = np.diff(a.indptr)
    rng = np.random.default_rng(seed)
    sample = rng.choice(n, size=min(n, 64), replace=False)
    pattern = sp.csr_matrix((np.ones(a.nnz), a.indices, a.indptr), shape=a.shape)
    cols = np.arange(len(sample))
    seen = sp.csr_matrix((np.ones(len(sample)), (sample, cols)), shape=(n, len(sample)))
    work = np.zeros(RADAU_STEPS)  # work[j]: entries visited by step j (ball of radius j)
    for j in range(RADAU_STEPS):
        ball = seen.tocsc()
        work[j] = float(row_nnz[ball.indices].sum()) / len(sample) * n
        if j + 1 < RADAU_STEPS:
            seen = (seen + pattern @ seen).tocsr()
            seen.data[:] = 1.0  # a ball: which vertices, not how many paths
    return np.cumsum(work)


def auto_steps(lap: sp.spmatrix, *, budget: float = RADAU_WORK) -> int:
    """The most Lanczos steps K (RADAU_MIN_STEPS <= K <= RADAU_STEPS) whose estimated work
    (:func:`lanczos_work`) fits ``budget``. Only the speed and the tightness depend on it: every
    K gives a certified upper bound."""
    total = lanczos_work(lap)
    fits = [k for k in range(RADAU_MIN_STEPS, RADAU_STEPS + 1) if total[k - 1] <= budget]
    return max(fits) if fits else RADAU_MIN_STEPS


def _radau_values(alphas: np.ndarray, betas: np.ndarray, node: float) -> np.ndarray:
    """e_1^T Tr^{-1} e_1 for every row (batched (K+1) x (K+1) solves)."""
    b, k = alphas.shape
    idx = np.arange(k)
    t = np.zeros((b, k + 1, k + 1))
    t[:, idx, idx] = alphas
    t[:, idx[:-1], idx[:-1] + 1] = betas[:, :-1]
    t[:, idx[:-1] + 1, idx[:-1]] = betas[:, :-1]
    rhs = np.zeros((b, k, 1))
    rhs[:, -1, 0] = betas[:, -1] ** 2
    delta = np.linalg.solve(t[:, :k, :k] - node * np.eye(k), rhs)[:, -1, 0]
    t[:, k, k] = node + delta
    t[:, k, k - 1] = t[:, k - 1, k] = betas[:, -1]
    e1 = np.zeros((b, k + 1, 1))
    e1[:, 0, 0] = 1.0
    return np.asarray(np.linalg.solve(t, e1)[:, 0, 0])


def radau_upper_diagonal(
    lap: sp.spmatrix,
    sigma_cdp: float,
    sigma_cor: float,
    *,
    steps: int = RADAU_STEPS,
    block: int | None = None,
) -> np.ndarray:
    """An upper bound on every diagonal entry of (sigma_cdp^2 I + sigma_cor^2 lap)^{-1}, before
    rounding (the caller rounds up, docs/accounting.md).

    ``block=None`` runs the compiled per-vertex Lanczos; a number runs the block form (all start
    vectors of ``block`` columns at once, scipy sparse products), the tests' oracle."""
    n = lap.shape[0]
    s2 = sigma_cdp**2
    sigma = (s2 * sp.identity(n, format="csr") + sigma_cor**2 * sp.csr_matrix(lap)).tocsr()
    scale = s2 + 2.0 * sigma_cor**2 * float(np.max(lap.diagonal(), initial=0.0))
    out = np.empty(n)
    broken: list[np.ndarray] = []
    runs: Iterable[tuple[np.ndarray, ...]]
    if block is None:
        sigma.sort_indices()
        runs = [(np.arange(n), *_lanczos_rows(sigma, steps))]
    else:
        runs = (
            (cols, *_lanczos_block(sigma, cols, steps))
            for cols in (np.arange(s, min(n, s + block)) for s in range(0, n, block))
        )
    for cols, alphas, betas in runs:
        bad = (betas < BREAKDOWN * scale).any(axis=1)
        good = ~bad
        if good.any():
            out[cols[good]] = _radau_values(alphas[good], betas[good], s2)
        if bad.any():
            broken.append(cols[bad])
    if broken:  # an exhausted Krylov space (a component of at most K vertices): exact solves
        cols = np.concatenate(broken)
        # Sigma is block diagonal over the components: factor only the ones holding these
        # columns, not the whole graph (whose giant component may fill in)
        _, label = csgraph.connected_components(lap, directed=False)
        keep = np.flatnonzero(np.isin(label, label[cols]))
        local = np.searchsorted(keep, cols)
        lu = sla.splu(sp.csc_matrix(sigma[keep][:, keep]))
        rhs = np.zeros((len(keep), len(cols)))
        rhs[local, np.arange(len(cols))] = 1.0
        out[cols] = lu.solve(rhs)[local, np.arange(len(cols))]
    return out
