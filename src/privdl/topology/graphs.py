"""Communication graphs: construction from spec strings, and their spectral facts.

A :class:`Topology` is an undirected simple graph on nodes ``0..n-1``. Time-varying directed
graphs (PrivSGP-VR's exponential graph) live in :mod:`privdl.topology.timevarying`.

Spec strings: ``ring:16``, ``path:8``, ``star:8``, ``complete:16``, ``torus:4x4``, ``grid:4x4``,
``er:10:0.8:SEED``, ``regular:50:6:SEED``, ``expo:16`` (time-varying, see
:func:`privdl.topology.parse_topology`), or the path of an edge-list file with one ``u v`` pair of
0-based integers per line (``#`` starts a comment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import networkx as nx
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse import csgraph

from privdl.errors import GraphError

#: Above this many nodes, spectral quantities use sparse eigen-solvers instead of dense ones.
DENSE_LIMIT = 2000
#: The largest graph privdl builds: a graph is a networkx graph (about 1 kB a node and an edge)
#: plus a node's state per node; larger ones are refused before anything is allocated.
MAX_NODES = 1_000_000
MAX_EDGES = 5_000_000


@dataclass(frozen=True, eq=False)
class Topology:
    """An undirected simple graph on nodes ``0..n-1`` with its spectral facts.

    ``edges`` is an ``(|E|, 2)`` integer array with ``u < v`` in each row, sorted; it fixes the
    orientation used for pairwise-cancelling noise (DECOR Algorithm 4: +1 at the lower endpoint).
    """

    name: str
    graph: nx.Graph = field(repr=False)

    def __post_init__(self) -> None:
        n = self.graph.number_of_nodes()
        if n < 1:
            raise GraphError(f"graph {self.name!r} has no nodes")
        if set(self.graph.nodes) != set(range(n)):
            raise GraphError(f"graph {self.name!r}: nodes must be the integers 0..{n - 1}")
        if any(u == v for u, v in self.graph.edges):
            raise GraphError(f"graph {self.name!r} has a self-loop")

    @property
    def n(self) -> int:
        """Number of nodes."""
        return self.graph.number_of_nodes()

    @cached_property
    def edges(self) -> np.ndarray:
        """Undirected edges as a sorted ``(|E|, 2)`` int64 array with ``u < v``."""
        e = np.array([sorted(uv) for uv in self.graph.edges], dtype=np.int64).reshape(-1, 2)
        order = np.lexsort((e[:, 1], e[:, 0]))
        return e[order]

    @property
    def num_edges(self) -> int:
        return int(self.edges.shape[0])

    @cached_property
    def degrees(self) -> np.ndarray:
        """Degree of every node (neighbours, the node itself excluded)."""
        deg = np.zeros(self.n, dtype=np.int64)
        np.add.at(deg, self.edges.ravel(), 1)
        return deg

    @cached_property
    def adjacency(self) -> sp.csr_matrix:
        """Symmetric 0/1 adjacency matrix (CSR)."""
        e = self.edges
        rows = np.concatenate([e[:, 0], e[:, 1]])
        cols = np.concatenate([e[:, 1], e[:, 0]])
        data = np.ones(rows.shape[0])
        return sp.csr_matrix((data, (rows, cols)), shape=(self.n, self.n))

    @cached_property
    def laplacian(self) -> sp.csr_matrix:
        """Graph Laplacian ``L = D - A`` (CSR)."""
        return (sp.diags(self.degrees.astype(float)) - self.adjacency).tocsr()

    @cached_property
    def incidence(self) -> sp.csr_matrix:
        """Signed incidence matrix ``K`` (n x |E|): +1 at the lower endpoint, -1 at the upper.

        ``K K^T = L`` (DECOR Algorithm 4, App. B.1).
        """
        e = self.edges
        m = e.shape[0]
        rows = np.concatenate([e[:, 0], e[:, 1]])
        cols = np.concatenate([np.arange(m), np.arange(m)])
        data = np.concatenate([np.ones(m), -np.ones(m)])
        return sp.csr_matrix((data, (rows, cols)), shape=(self.n, m))

    @cached_property
    def is_connected(self) -> bool:
        return self.n == 1 or nx.is_connected(self.graph)

    @cached_property
    def is_regular(self) -> bool:
        return bool(np.all(self.degrees == self.degrees[0]))

    @cached_property
    def algebraic_connectivity(self) -> float:
        """Second-smallest eigenvalue of the Laplacian, a(G) (0 for a disconnected graph)."""
        if self.n == 1:
            return 0.0
        if not self.is_connected:
            return 0.0
        if self.n >= SPARSE_FACTS_LIMIT:
            return laplacian_gap(self.laplacian)
        eig = laplacian_spectrum(self.laplacian, k=2)
        return float(max(eig[1], 0.0))

    def neighbours(self, i: int) -> np.ndarray:
        """Sorted neighbours of node ``i``."""
        a = self.adjacency
        return np.sort(a.indices[a.indptr[i] : a.indptr[i + 1]])

    def require_connected(self, what: str = "this algorithm") -> None:
        """Raise :class:`GraphError` unless the graph is connected."""
        if not self.is_connected:
            ncomp = nx.number_connected_components(self.graph)
            raise GraphError(
                f"graph {self.name!r} is disconnected ({ncomp} components); {what} needs a "
                "connected graph"
            )

    def summary(self) -> dict:
        """The facts ``privdl graph --json`` prints."""
        deg = self.degrees
        return {
            "name": self.name,
            "n": self.n,
            "edges": self.num_edges,
            "connected": bool(self.is_connected),
            "regular": bool(self.is_regular),
            "algebraic_connectivity": self.algebraic_connectivity,
            "degree_min": int(deg.min()) if deg.size else 0,
            "degree_max": int(deg.max()) if deg.size else 0,
            "degree_mean": float(deg.mean()) if deg.size else 0.0,
        }


#: From this many nodes on, the spectral facts come from :func:`laplacian_gap` (Lanczos on
#: the deflated operator, then shift-invert through the grounded Laplacian): no dense matrix and
#: no slow convergence for graphs whose gap is tiny (a ring of 10^5 nodes: 4e-9).
SPARSE_FACTS_LIMIT = 30_000


def laplacian_gap(lap: sp.spmatrix) -> float:
    """The smallest non-zero eigenvalue of the (weighted) Laplacian ``lap`` of a connected
    graph (symmetric, rows summing to zero, non-positive off-diagonal): the algebraic
    connectivity (Fiedler 1973). Lanczos (ARPACK) on ``c I - lap`` restricted to the
    complement of the constant vector converges fast where the gap is large (expanders);
    where it does not within a bounded number of steps, shift-invert with the grounded
    Laplacian (``lap`` without node 0's row and column, positive definite for a connected
    graph) as the inverse on that complement (sparse LU: fast on rings, paths and lattices)."""
    n = lap.shape[0]
    lap = sp.csr_matrix(lap, dtype=float)
    ones = np.full(n, 1.0 / math.sqrt(n))

    def deflate(x: np.ndarray) -> np.ndarray:
        return x - ones * (ones @ x)

    c = 2.0 * float(lap.diagonal().max())  # >= the largest eigenvalue (Gershgorin)
    top = spla.LinearOperator(
        (n, n), matvec=lambda x: deflate(c * x - lap @ deflate(x)), dtype=float
    )
    v0 = deflate(np.random.default_rng(0).standard_normal(n))
    # a long graph (node 0's eccentricity far above log n: rings, paths, lattices) has a tiny
    # gap (a(G) >= 4 / (n diam), Mohar 1991) and small separators: straight to the sparse LU
    hops = csgraph.shortest_path(abs(lap), indices=0, unweighted=True, directed=False)
    ecc = float(hops[np.isfinite(hops)].max())
    if ecc <= 4 * math.log2(n):
        try:
            val = spla.eigsh(top, k=1, which="LA", v0=v0, maxiter=400, ncv=24, tol=1e-7,
                             return_eigenvectors=False)  # fmt: skip
            return float(max(c - val[0], 0.0))
        except spla.ArpackNoConvergence:
            pass
    grounded = spla.splu(lap[1:, 1:].tocsc())

    def inverse(x: np.ndarray) -> np.ndarray:  # lap^+ on the complement of the constants
        y = np.zeros(n)
        y[1:] = grounded.solve(deflate(x)[1:])
        return deflate(y)

    op = spla.LinearOperator((n, n), matvec=inverse, dtype=float)
    val = spla.eigsh(op, k=1, which="LA", v0=v0, tol=1e-10, return_eigenvectors=False)
    return float(1.0 / val[0])


def laplacian_top(lap: sp.spmatrix) -> float:
    """The largest eigenvalue of a symmetric matrix ``lap`` (Lanczos)."""
    v0 = np.random.default_rng(0).standard_normal(lap.shape[0])
    try:
        val = spla.eigsh(sp.csr_matrix(lap, dtype=float), k=1, which="LA", v0=v0, maxiter=50,
                         ncv=24, tol=1e-9, return_eigenvectors=False)  # fmt: skip
    except spla.ArpackNoConvergence as exc:  # a cluster at the top: its Ritz value is accurate
        if not len(exc.eigenvalues):
            raise
        val = exc.eigenvalues
    return float(np.max(val))


def laplacian_spectrum(lap: sp.spmatrix, *, k: int | None = None) -> np.ndarray:
    """Smallest ``k`` eigenvalues of a symmetric PSD matrix (all of them if ``k`` is None)."""
    n = lap.shape[0]
    if k is None or n <= DENSE_LIMIT:
        vals = np.linalg.eigvalsh(lap.toarray())
        return vals if k is None else vals[:k]
    # shift-invert near zero; the Laplacian is singular so shift slightly below 0
    vals = spla.eigsh(lap.tocsc(), k=k, sigma=-1e-3, which="LM", return_eigenvectors=False)
    return np.sort(vals)


# ----------------------------------------------------------------------------------------------
# constructors


def _from_edges(name: str, n: int, edges) -> Topology:
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((int(u), int(v)) for u, v in edges if u != v)
    return Topology(name=name, graph=g)


def ring(n: int) -> Topology:
    """Cycle C_n (n >= 3; n = 2 gives a single edge)."""
    _check_n(n, 2, "ring")
    return _from_edges(f"ring:{n}", n, [(i, (i + 1) % n) for i in range(n)])


def path(n: int) -> Topology:
    _check_n(n, 1, "path")
    return _from_edges(f"path:{n}", n, [(i, i + 1) for i in range(n - 1)])


def star(n: int) -> Topology:
    """Star with centre 0 and ``n - 1`` leaves."""
    _check_n(n, 1, "star")
    return _from_edges(f"star:{n}", n, [(0, i) for i in range(1, n)])


def complete(n: int) -> Topology:
    _check_n(n, 1, "complete")
    return _from_edges(f"complete:{n}", n, [(i, j) for i in range(n) for j in range(i + 1, n)])


def _lattice(rows: int, cols: int, *, periodic: bool) -> Topology:
    kind = "torus" if periodic else "grid"
    if rows < 1 or cols < 1:
        raise GraphError(f"{kind}: dimensions must be positive, got {rows}x{cols}")
    edges = []
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            if c + 1 < cols or (periodic and cols > 2):
                edges.append((i, r * cols + (c + 1) % cols))
            if r + 1 < rows or (periodic and rows > 2):
                edges.append((i, ((r + 1) % rows) * cols + c))
    return _from_edges(f"{kind}:{rows}x{cols}", rows * cols, edges)


def torus(rows: int, cols: int) -> Topology:
    """2-D torus (periodic grid), nodes in row-major order; the DECOR paper's "grid"."""
    return _lattice(rows, cols, periodic=True)


def grid(rows: int, cols: int) -> Topology:
    """2-D grid without wrap-around, nodes in row-major order."""
    return _lattice(rows, cols, periodic=False)


def _check_seed(seed: int, kind: str) -> None:
    # networkx seeds Python's random.Random, which takes |seed|: -1 would silently draw seed 1's graph
    if int(seed) < 0:
        raise GraphError(f"{kind}: SEED must be a non-negative integer, got {seed}")


def erdos_renyi(n: int, p: float, seed: int, *, require_connected: bool = True) -> Topology:
    """G(n, p) with a seeded generator; refuses a disconnected draw when connectivity is required."""
    _check_n(n, 1, "er")
    _check_seed(seed, "er")
    if not 0.0 < p <= 1.0:
        raise GraphError(f"er: edge probability must be in (0, 1], got {p}")
    g = nx.gnp_random_graph(n, p, seed=int(seed))
    topo = Topology(name=f"er:{n}:{p}:{seed}", graph=g)
    if require_connected and not topo.is_connected:
        raise GraphError(
            f"er:{n}:{p}:{seed} drew a disconnected graph; choose another seed or a larger p"
        )
    return topo


def random_regular(n: int, d: int, seed: int) -> Topology:
    """Uniform random d-regular graph on n nodes (seeded)."""
    _check_n(n, 2, "regular")
    _check_seed(seed, "regular")
    if not 0 <= d < n or (n * d) % 2:
        raise GraphError(f"regular:{n}:{d}: need 0 <= d < n and n*d even")
    g = nx.random_regular_graph(d, n, seed=int(seed))
    return Topology(name=f"regular:{n}:{d}:{seed}", graph=g)


def from_edge_list(path_like: str | Path) -> Topology:
    """Read an edge-list file: one ``u v`` pair of 0-based integers per line.

    Self-loops, duplicate edges, non-integer entries and gaps in the ids (every node 0..n-1 must
    be on an edge) are refused.
    """
    p = Path(path_like)
    if not p.is_file():
        raise GraphError(f"edge-list file {str(p)!r} not found")
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        raise GraphError(
            f"edge-list file {str(p)!r} is not text (one 'u v' pair per line)"
        ) from None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2:
            raise GraphError(f"{p}:{lineno}: expected two integers 'u v', got {raw.strip()!r}")
        try:
            u, v = int(parts[0]), int(parts[1])
        except ValueError:
            raise GraphError(f"{p}:{lineno}: non-integer node in {raw.strip()!r}") from None
        if u < 0 or v < 0:
            raise GraphError(f"{p}:{lineno}: node indices must be >= 0")
        if u == v:
            raise GraphError(f"{p}:{lineno}: self-loop {u}-{v} is not allowed")
        key = (min(u, v), max(u, v))
        if key in seen:
            raise GraphError(f"{p}:{lineno}: duplicate edge {key[0]}-{key[1]}")
        seen.add(key)
        pairs.append(key)
    if not pairs:
        raise GraphError(f"edge-list file {str(p)!r} has no edges")
    n = max(max(e) for e in pairs) + 1
    nodes = {u for e in pairs for u in e}
    if len(nodes) < n:  # a gap: isolated nodes, a 1-based file, or an id far beyond the rest
        missing = sorted(set(range(min(n, len(nodes) + 5))) - nodes)[:5]
        raise GraphError(
            f"{p}: node ids must be 0..n-1 with every node on an edge; {len(nodes)} nodes listed "
            f"but the largest id is {n - 1} (missing e.g. {', '.join(map(str, missing))})"
        )
    return _from_edges(str(p), n, pairs)


def _check_n(n: int, minimum: int, kind: str) -> None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise GraphError(f"{kind}: the number of nodes must be an integer, got {n!r}")
    if n < minimum:
        raise GraphError(f"{kind}: need at least {minimum} nodes, got {n}")


def _ints(kind: str, parts: list[str], count: int, spec: str) -> list[int]:
    if len(parts) != count:
        raise GraphError(f"bad graph spec {spec!r}: {kind} takes {count} field(s)")
    try:
        return [int(x) for x in parts]
    except ValueError:
        raise GraphError(f"bad graph spec {spec!r}: expected integers") from None


def parse_graph(spec: str) -> Topology:
    """Build a static :class:`Topology` from a spec string or an edge-list file path."""
    if not isinstance(spec, str) or not spec.strip():
        raise GraphError("empty graph spec")
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    builders = {
        "ring": lambda: ring(*_ints(kind, parts, 1, spec)),
        "path": lambda: path(*_ints(kind, parts, 1, spec)),
        "star": lambda: star(*_ints(kind, parts, 1, spec)),
        "complete": lambda: complete(*_ints(kind, parts, 1, spec)),
        "torus": lambda: torus(*_dims(parts, spec)),
        "grid": lambda: grid(*_dims(parts, spec)),
        "er": lambda: _er(parts, spec),
        "regular": lambda: random_regular(*_ints(kind, parts, 3, spec)),
    }
    if kind in builders and rest:
        _check_size(kind, parts, spec)
        return builders[kind]()
    if kind == "expo":
        raise GraphError(
            f"{spec!r} is a time-varying directed graph; use it where push-sum is supported"
        )
    if Path(spec).exists():
        return from_edge_list(spec)
    if kind not in builders and ("/" in spec or "." in spec or ":" not in spec):
        raise GraphError(f"graph {spec!r}: no such edge-list file (and not a graph spec)")
    raise GraphError(
        f"unknown graph spec {spec!r}; expected ring:N, path:N, star:N, complete:N, torus:RxC, "
        "grid:RxC, er:N:P:SEED, regular:N:D:SEED, expo:N or an edge-list file"
    )


def _check_size(kind: str, parts: list[str], spec: str) -> None:
    """Refuse a spec whose graph exceeds :data:`MAX_NODES` / :data:`MAX_EDGES` from its numbers
    alone (before a node is built: ``ring:10000000`` would take gigabytes first)."""
    try:
        if kind in ("torus", "grid"):
            r, c = _dims(parts, spec)
            n, m = r * c, 2 * r * c
        else:
            n = int(parts[0])
            if kind == "complete":
                m = n * (n - 1) // 2
            elif kind == "er":
                m = int(n * (n - 1) / 2 * min(max(float(parts[1]), 0.0), 1.0))
            elif kind == "regular":
                m = n * int(parts[1]) // 2
            else:
                m = n
    except (ValueError, IndexError, OverflowError):
        return  # malformed: the builder says what is wrong
    if n > MAX_NODES:
        raise GraphError(
            f"graph {spec[:60]!r} has {n} nodes; privdl builds graphs of at most {MAX_NODES} nodes"
        )
    if m > MAX_EDGES:
        raise GraphError(
            f"graph {spec[:60]!r} has about {m} edges; privdl builds graphs of at most "
            f"{MAX_EDGES} edges"
        )


def _dims(parts: list[str], spec: str) -> tuple[int, int]:
    if len(parts) != 1 or "x" not in parts[0]:
        raise GraphError(f"bad graph spec {spec!r}: expected RxC, e.g. torus:4x4")
    a, _, b = parts[0].partition("x")
    try:
        return int(a), int(b)
    except ValueError:
        raise GraphError(f"bad graph spec {spec!r}: expected integers RxC") from None


def _er(parts: list[str], spec: str) -> Topology:
    if len(parts) != 3:
        raise GraphError(f"bad graph spec {spec!r}: expected er:N:P:SEED")
    try:
        n, p, seed = int(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise GraphError(f"bad graph spec {spec!r}: expected er:N:P:SEED with numbers") from None
    if not math.isfinite(p):
        raise GraphError(f"bad graph spec {spec!r}: p must be finite")
    return erdos_renyi(n, p, seed)
