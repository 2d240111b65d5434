"""Mixing matrices (gossip weights) and their consensus facts.

Each rule is named and none is substituted silently:

- ``decor``: the DECOR paper's weights, ``W_ij = 1/(deg(i)+1)`` for ``j`` a neighbour of ``i`` or
  ``j = i`` (DECOR Section 6, with the self-weight as the authors' reference code has it).
  Row-stochastic; symmetric (hence doubly stochastic) only on regular graphs, so it is refused on
  irregular graphs where double stochasticity is needed.
- ``metropolis``: Metropolis–Hastings, ``W_ij = 1/(1 + max(deg i, deg j))`` on edges, the rest of
  the row on the diagonal. Symmetric and doubly stochastic on any graph.
- ``max-degree``: uniform weights ``1/(d_max + 1)`` on edges, the rest on the diagonal.
- ``average``: ``J = 11^T/n`` (the complete graph's exact averaging; DECOR's CDP baseline).
- ``fdla``: fastest distributed linear averaging (Xiao & Boyd 2004), the ``W`` minimising
  ``||W - J||_2`` over symmetric edge weights with ``W 1 = 1`` (PORTER §5); may have negative
  entries. ``best-constant``: ``I - a L`` with the best single edge weight ``a``.
- ``push-sum``: column-stochastic ``P_ij = 1/(outdeg(j)+1)`` for ``i`` an out-neighbour of ``j``
  or ``i = j`` (row = receiver, column = sender), for stochastic gradient push.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from privdl.errors import GraphError
from privdl.topology.graphs import (
    DENSE_LIMIT,
    SPARSE_FACTS_LIMIT,
    Topology,
    laplacian_gap,
    laplacian_top,
    parse_graph,
)

MIXING_RULES = (
    "decor", "metropolis", "max-degree", "average", "fdla", "best-constant", "push-sum",
)  # fmt: skip


@dataclass(frozen=True, eq=False)
class MixingMatrix:
    """A named gossip matrix ``W`` (n x n, CSR) with its consensus facts.

    Conventions: ``x_new = W @ x`` where the rows of ``x`` are nodes, so row ``i`` of ``W`` holds
    the weights node ``i`` gives to what it receives.
    """

    rule: str
    matrix: sp.csr_matrix

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    def dense(self) -> np.ndarray:
        return self.matrix.toarray()

    @cached_property
    def row_stochastic(self) -> bool:
        return bool(np.allclose(np.asarray(self.matrix.sum(axis=1)).ravel(), 1.0, atol=1e-12))

    @cached_property
    def column_stochastic(self) -> bool:
        return bool(np.allclose(np.asarray(self.matrix.sum(axis=0)).ravel(), 1.0, atol=1e-12))

    @cached_property
    def symmetric(self) -> bool:
        d = self.matrix - self.matrix.T
        return bool(abs(d).max() <= 1e-12) if d.nnz else True

    @property
    def doubly_stochastic(self) -> bool:
        return self.row_stochastic and self.column_stochastic

    @cached_property
    def nonnegative(self) -> bool:
        return bool((self.matrix.data >= -1e-15).all())

    @cached_property
    def _extremes(self) -> tuple[float, float]:
        """``(lambda_2, lambda_min)`` of a symmetric doubly stochastic ``W`` of a connected
        graph, from the Laplacian ``I - W`` (sparse: :func:`laplacian_gap`, Gershgorin)."""
        lap = (sp.identity(self.n, format="csr") - self.matrix).tocsr()
        lam2 = 1.0 - laplacian_gap(lap)
        bound = 1.0 - 2.0 * float(lap.diagonal().max())  # lambda_min >= this (Gershgorin)
        if -bound <= lam2:  # |lambda_min| <= lambda_2 already: lambda_2 decides
            return lam2, max(bound, -lam2)
        return lam2, 1.0 - laplacian_top(lap)

    def _sparse_facts(self) -> bool:
        """Whether the facts come from :meth:`_extremes` (a large symmetric ``W`` whose graph
        is connected: ``W``'s non-zeros, the diagonal aside, form one component)."""
        if self.n < SPARSE_FACTS_LIMIT or not self.symmetric or not self.doubly_stochastic:
            return False
        off = self.matrix - sp.diags(self.matrix.diagonal())
        return int(csgraph.connected_components(off, directed=False)[0]) == 1

    @cached_property
    def consensus_rate(self) -> float | None:
        """``p`` with ``1 - p`` the second-largest eigenvalue of ``W W^T`` (DECOR Assumption 5).

        Then ``||XW - Xbar||_F^2 <= (1 - p)||X - Xbar||_F^2``. That contraction needs a doubly
        stochastic ``W`` (the average is kept and ``1`` is ``W W^T``'s top eigenvector): for
        any other ``W`` (push-sum's column-stochastic ``P``) there is no such ``p`` and this is
        ``None``; push-sum's ratio consensus contracts at ``|lambda_2(P)|`` (``spectral_gap``).
        """
        m = self.matrix
        if not self.doubly_stochastic:
            return None
        if self.n == 1:
            return 1.0
        if self.n <= DENSE_LIMIT:
            vals = np.linalg.eigvalsh((m @ m.T).toarray())
            return float(1.0 - vals[-2])
        if self._sparse_facts():  # W W^T = W^2: its second eigenvalue is max(l2^2, lmin^2)
            lam2, lam_min = self._extremes
            return float(1.0 - max(lam2**2, lam_min**2))
        import scipy.sparse.linalg as spla

        vals = spla.eigsh((m @ m.T).tocsc(), k=2, which="LA", return_eigenvectors=False)
        return float(1.0 - np.sort(vals)[0])

    @cached_property
    def spectral_gap(self) -> float:
        """``1 - |lambda_2(W)|``, the second-largest eigenvalue modulus of ``W`` (symmetric or
        not: for push-sum's ``P`` it is the asymptotic rate of ratio consensus)."""
        if self.n == 1:
            return 1.0
        if self.n <= DENSE_LIMIT:
            a = self.dense()
            vals = np.linalg.eigvalsh(a) if self.symmetric else np.linalg.eigvals(a)
            mod = np.sort(np.abs(vals))
            return float(1.0 - mod[-2])
        if self._sparse_facts():
            lam2, lam_min = self._extremes
            return float(1.0 - max(abs(lam2), abs(lam_min)))
        import scipy.sparse.linalg as spla

        if self.symmetric:
            vals = spla.eigsh(self.matrix.tocsc(), k=2, which="LM", return_eigenvectors=False)
        else:  # eigsh assumes symmetry; push-sum's P is not symmetric
            vals = spla.eigs(self.matrix.tocsc(), k=2, which="LM", return_eigenvectors=False)
        return float(1.0 - np.sort(np.abs(vals))[0])

    def summary(self) -> dict:
        return {
            "rule": self.rule,
            "row_stochastic": self.row_stochastic,
            "column_stochastic": self.column_stochastic,
            "symmetric": self.symmetric,
            "consensus_rate": self.consensus_rate,
            "spectral_gap": self.spectral_gap,
        }


def mixing_matrix(topology: Topology | str, rule: str = "metropolis") -> MixingMatrix:
    """Build the named mixing matrix of ``topology`` (see the module docstring for the rules).

    ``topology`` may also be a graph spec string (``"ring:8"``) or an edge-list file path.
    """
    if isinstance(topology, str):
        topology = parse_graph(topology)
    if not isinstance(topology, Topology):
        raise GraphError(f"mixing_matrix takes a Topology or a graph spec, got {topology!r}")
    n = topology.n
    deg = topology.degrees.astype(float)
    e = topology.edges
    u, v = e[:, 0], e[:, 1]
    if rule == "decor":
        if not topology.is_regular:
            raise GraphError(
                f"the 'decor' weights 1/(deg+1) are not doubly stochastic on the irregular graph "
                f"{topology.name!r}; use --mixing metropolis"
            )
        w_edge_uv = 1.0 / (deg[u] + 1.0)
        w_edge_vu = 1.0 / (deg[v] + 1.0)
        diag = 1.0 / (deg + 1.0)
        return _assemble(rule, n, u, v, w_edge_uv, w_edge_vu, diag)
    if rule == "metropolis":
        w = 1.0 / (1.0 + np.maximum(deg[u], deg[v]))
        return _assemble_symmetric(rule, n, u, v, w)
    if rule == "max-degree":
        w = np.full(u.shape[0], 1.0 / (deg.max(initial=0.0) + 1.0))
        return _assemble_symmetric(rule, n, u, v, w)
    if rule == "average":
        return MixingMatrix(rule, sp.csr_matrix(np.full((n, n), 1.0 / n)))
    if rule == "fdla":
        return fdla_mixing(topology)
    if rule == "best-constant":
        return best_constant_mixing(topology)
    if rule == "push-sum":
        # undirected graph used as a directed one in both directions: column j sends to its
        # neighbours and itself with weight 1/(deg(j)+1)
        cols = np.concatenate([u, v, np.arange(n)])
        rows = np.concatenate([v, u, np.arange(n)])
        data = 1.0 / (deg[cols] + 1.0)
        return MixingMatrix(rule, sp.csr_matrix((data, (rows, cols)), shape=(n, n)))
    raise GraphError(f"unknown mixing rule {rule!r}; choose one of {', '.join(MIXING_RULES)}")


def best_constant_mixing(topology: Topology) -> MixingMatrix:
    """``W = I - a L`` with ``a = 2 / (lambda_2 + lambda_n)`` (Xiao & Boyd 2004, best constant).

    Minimises ``||W - J||_2`` over constant edge weights; the FDLA optimum (PORTER §5) also
    optimises each edge. Symmetric, ``W 1 = 1``, zero off the graph.
    """
    if topology.n == 1:  # nothing to mix (and no lambda_2)
        return MixingMatrix("best-constant", sp.csr_matrix(np.ones((1, 1))))
    lap = topology.laplacian.toarray()
    vals = np.linalg.eigvalsh(lap)
    a = 2.0 / (vals[1] + vals[-1])
    w = np.eye(topology.n) - a * lap
    return MixingMatrix("best-constant", sp.csr_matrix(w))


def fdla_mixing(topology: Topology, *, iterations: int = 2000) -> MixingMatrix:
    """Fastest distributed linear averaging (Xiao & Boyd 2004), the matrix PORTER §5 uses:
    minimise ``||W - J||_2`` over symmetric ``W = I - B diag(w) B^T`` (B: incidence matrix), so
    ``W 1 = 1`` and ``W`` is zero off the graph by construction.

    Solved by a normalised subgradient method from the best-constant weights, keeping the best
    iterate (no SDP solver needed; the objective is convex, and for n = 10 the iterates settle
    within 1e-3 of their limit). The subgradient in ``w_e`` of ``|lambda|`` for the extreme
    eigenpair ``(lambda, q)`` of ``W - J`` is ``-sign(lambda) (q_u - q_v)^2``.
    """
    n, edges = topology.n, topology.edges
    if n == 1:  # nothing to mix
        return MixingMatrix("fdla", sp.csr_matrix(np.ones((1, 1))))
    cols = np.arange(len(edges))
    b = np.zeros((n, len(edges)))
    b[edges[:, 0], cols], b[edges[:, 1], cols] = 1.0, -1.0
    vals = np.linalg.eigvalsh(topology.laplacian.toarray())
    w = np.full(len(edges), 2.0 / (vals[1] + vals[-1]))
    centre = np.eye(n) - 1.0 / n

    def value_and_subgradient(w: np.ndarray) -> tuple[float, np.ndarray]:
        lam, q = np.linalg.eigh(centre - (b * w) @ b.T)
        i = int(np.argmax(np.abs(lam)))
        return float(abs(lam[i])), -np.sign(lam[i]) * (b.T @ q[:, i]) ** 2

    best_w, best = w.copy(), value_and_subgradient(w)[0]
    for k in range(iterations):
        f, g = value_and_subgradient(w)
        if f < best:
            best, best_w = f, w.copy()
        w = w - 0.1 / math.sqrt(k + 1) * g / max(float(np.linalg.norm(g)), 1e-12)
    return MixingMatrix("fdla", sp.csr_matrix(np.eye(n) - (b * best_w) @ b.T))


def _assemble(rule, n, u, v, w_uv, w_vu, diag) -> MixingMatrix:
    rows = np.concatenate([u, v, np.arange(n)])
    cols = np.concatenate([v, u, np.arange(n)])
    data = np.concatenate([w_uv, w_vu, diag])
    return MixingMatrix(rule, sp.csr_matrix((data, (rows, cols)), shape=(n, n)))


def _assemble_symmetric(rule, n, u, v, w) -> MixingMatrix:
    off = np.zeros(n)
    np.add.at(off, u, w)
    np.add.at(off, v, w)
    return _assemble(rule, n, u, v, w, w, 1.0 - off)


def heterogeneity_factor(mixing: MixingMatrix, topology: Topology) -> float:
    """``H_G(W) = sum_{edges {i,k}} ||W_i - W_k||^2 / (2|E|)`` (DECOR eq. 11), columns of ``W``."""
    if topology.num_edges == 0:
        return 0.0
    e = topology.edges
    if mixing.n > DENSE_LIMIT:  # columns of the sparse W: never an n x n array
        wc = mixing.matrix.tocsc()
        d = (wc[:, e[:, 0]] - wc[:, e[:, 1]]).tocsc()
        return float(d.multiply(d).sum() / (2 * e.shape[0]))
    w = mixing.dense()
    diff = w[:, e[:, 0]] - w[:, e[:, 1]]
    return float((diff**2).sum() / (2 * e.shape[0]))
