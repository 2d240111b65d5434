"""Graph helpers for the SecRDP accountant: validated edge arrays and induced Laplacians.

The accountant needs the Laplacian of the INDUCED subgraph G[H] left after deleting the colluders
(DECOR Algorithm 3, Appendix A; docs/accounting.md section 6): degrees are recomputed inside G[H].
It is not the principal sub-block of L(G).
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp

from privdl.errors import GraphError


def edge_array(graph: nx.Graph) -> tuple[int, np.ndarray]:
    """Return ``(n, edges)`` for an undirected graph with nodes ``0..n-1``; edges is ``(m, 2)``.

    Accepts a ``networkx.Graph`` or any object with a ``.graph`` attribute holding one (the
    platform's Topology objects).
    """
    if not isinstance(graph, nx.Graph) and isinstance(getattr(graph, "graph", None), nx.Graph):
        graph = graph.graph
    if not isinstance(graph, nx.Graph):
        raise GraphError(f"expected a networkx.Graph, got {type(graph).__name__}")
    if graph.is_directed():
        raise GraphError("the SecRDP accountant needs an undirected graph")
    n = graph.number_of_nodes()
    if n == 0:
        raise GraphError("the graph has no nodes")
    if set(graph.nodes) != set(range(n)):
        raise GraphError("graph nodes must be the integers 0..n-1")
    if nx.number_of_selfloops(graph) > 0:
        raise GraphError("the graph has self-loops")
    edges = np.asarray(list(graph.edges()), dtype=np.int64).reshape(-1, 2)
    return n, edges


def shift_invariant(n: int, edges: np.ndarray) -> bool:
    """True when the cyclic shift ``i -> i + 1 (mod n)`` maps the edge set onto itself: the graph
    is circulant in its labelling (a ring, a complete graph, ``C_n(1, 2)``, ...). The shifts are
    then automorphisms acting transitively on the vertices, so any vertex set can be moved to one
    containing vertex 0 without changing what the accountant computes on it. O(m log m)."""
    if n <= 1:
        return True
    e = np.sort(edges, axis=1)
    shifted = np.sort((edges + 1) % n, axis=1)
    return bool(
        np.array_equal(np.sort(e[:, 0] * n + e[:, 1]), np.sort(shifted[:, 0] * n + shifted[:, 1]))
    )


def translation_shape(n: int, edges: np.ndarray) -> tuple[int, int] | None:
    """``(r, c)`` with ``r c = n`` when the translations of the row-major ``r x c`` layout
    (vertex ``i`` at ``(i // c, i % c)``; ``(a, b) -> (a + 1, b)`` and ``(a, b) -> (a, b + 1)``,
    both mod the shape) are automorphisms; None when no such shape exists. ``(1, n)`` is the
    circulant case of :func:`shift_invariant` and is tried first; then every divisor ``c`` of
    ``n``, so a torus ``r x c`` in row-major order is found. The translations then form the group
    ``Z_r x Z_c`` acting simply transitively on the vertices (the graph is a Cayley graph of it,
    Sabidussi 1958), so every vertex set can be moved onto one containing vertex 0 and every
    diagonal entry of a matrix built from the Laplacian alone is the same. Each candidate is
    screened on vertex 0's neighbours, then checked on the whole edge set (O(m log m))."""
    if n <= 1:
        return (1, max(n, 1))
    e = np.sort(edges, axis=1)
    codes = np.sort(e[:, 0] * n + e[:, 1])
    src = np.concatenate([edges[:, 0], edges[:, 1]])
    dst = np.concatenate([edges[:, 1], edges[:, 0]])[np.argsort(src, kind="stable")]
    ptr = np.searchsorted(np.sort(src), np.arange(n + 1))

    def neighbours(v: int) -> np.ndarray:
        return np.sort(dst[ptr[v] : ptr[v + 1]])

    zero = neighbours(0)

    def automorphism(move) -> bool:  # type: ignore[no-untyped-def]
        if not np.array_equal(np.sort(move(zero)), neighbours(int(move(np.zeros(1, np.int64))[0]))):
            return False
        image = np.sort(move(edges), axis=1)
        return bool(np.array_equal(codes, np.sort(image[:, 0] * n + image[:, 1])))

    for c in [n] + [c for c in range(n // 2, 1, -1) if n % c == 0]:

        def along(x: np.ndarray, c: int = c) -> np.ndarray:
            return (x // c) * c + (x % c + 1) % c

        def across(x: np.ndarray, c: int = c) -> np.ndarray:
            return (x + c) % n

        if automorphism(along) and (c == n or automorphism(across)):
            return (n // c, c)
    return None


def laplacian(n: int, edges: np.ndarray, keep: np.ndarray | None = None) -> sp.csr_matrix:
    """Laplacian of the graph induced on ``keep`` (a boolean mask; None = all nodes).

    Nodes are relabelled to ``0..|keep|-1`` in increasing order. Edges with an endpoint outside
    ``keep`` are dropped, so the degrees are those of G[H] (DECOR Algorithm 3).
    """
    if keep is None:
        keep = np.ones(n, dtype=bool)
    new_id = np.cumsum(keep) - 1
    mask = keep[edges[:, 0]] & keep[edges[:, 1]] if len(edges) else np.zeros(0, dtype=bool)
    u = new_id[edges[mask, 0]]
    v = new_id[edges[mask, 1]]
    h = int(keep.sum())
    adj = sp.coo_matrix((np.ones(len(u)), (u, v)), shape=(h, h))
    adj = (adj + adj.T).tocsr()
    deg = np.asarray(adj.sum(axis=1)).ravel()
    return (sp.diags(deg) - adj).tocsr()


def neighbour_lists(n: int, edges: np.ndarray) -> list[np.ndarray]:
    """Sorted neighbour arrays of every node."""
    adj = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    adj = (adj + adj.T).tocsr()
    adj.sort_indices()
    return [adj.indices[adj.indptr[i] : adj.indptr[i + 1]] for i in range(n)]


def algebraic_connectivity(lap: sp.spmatrix) -> float:
    """Second-smallest Laplacian eigenvalue a(G) (0 for a disconnected graph, 0 for one node)."""
    h = lap.shape[0]
    if h <= 1:
        return 0.0
    eig = np.linalg.eigvalsh(lap.toarray())
    return float(max(eig[1], 0.0))
