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

All n start vectors run at once, in blocks of columns (sparse while the Lanczos vectors are local:
after j steps a column lives on the j-hop ball of its vertex; dense once that fills), so there is
no Python loop over vertices. Its looseness and rounding are measured in docs/accounting.md
(section 1, ``gauss-radau``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import scipy.sparse.linalg as sla

#: Lanczos steps per start vector (the rule has RADAU_STEPS + 1 nodes); the looseness shrinks
#: about 5x a step on random 6-regular graphs (docs/accounting.md).
RADAU_STEPS = 6
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
    block: int = 2048,
) -> np.ndarray:
    """An upper bound on every diagonal entry of (sigma_cdp^2 I + sigma_cor^2 lap)^{-1}, before
    rounding (the caller rounds up, docs/accounting.md)."""
    n = lap.shape[0]
    s2 = sigma_cdp**2
    sigma = (s2 * sp.identity(n, format="csr") + sigma_cor**2 * sp.csr_matrix(lap)).tocsr()
    scale = s2 + 2.0 * sigma_cor**2 * float(np.max(lap.diagonal(), initial=0.0))
    out = np.empty(n)
    broken: list[np.ndarray] = []
    for start in range(0, n, block):
        cols = np.arange(start, min(n, start + block))
        alphas, betas = _lanczos_block(sigma, cols, steps)
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
