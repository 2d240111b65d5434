"""Pairwise-cancelling correlated noise and independent noise for DECOR (Alg 1 line 3, Alg 4).

DECOR adds to node i's gradient sum_{j in N_i} v_ij + vbar_i with v_ij = -v_ji ~ N(0, sigma_cor^2 I_d)
fresh at each step t, and vbar_i ~ N(0, sigma_cdp^2 I_d) (paper eq. 3). In matrix form (Alg 4,
DECOR Algorithm 4, App. B.1) N^(t) = K Z^(t) with K the n x |E| signed incidence matrix (+1 at the
lower endpoint, -1 at the upper) and Z^(t) the |E| x d matrix of edge noises z_e^(t) = sigma_cor *
stream(s_e, t). Every z_e is added once and subtracted once, so sum_i N_i = 0 structurally and, per
coordinate, Cov(N) = sigma_cor^2 K K^T = sigma_cor^2 L.

Node-major layout: tensors here are (nodes, size); the paper's X is (d, n), i.e. the transpose.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

from privdl.errors import ConfigError, PrivacyError
from privdl.mechanisms import _aesni
from privdl.mechanisms._edges import incident_edges, row_slots
from privdl.mechanisms._pool import kernel_cpus, run_parallel
from privdl.mechanisms._streamed import BLOCK_COLUMNS, streamed_decor_rows, sum_rows_kernel
from privdl.mechanisms.dealer import DealerCovariance, dealer_noise
from privdl.mechanisms.fused_noise import (
    fused_available,
    fused_decor_noise,
    prefetched_decor_noise,
)
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.mechanisms.prng import (
    _PARALLEL_BYTES as _PARALLEL_ZIGGURAT_BYTES,
)
from privdl.mechanisms.prng import (
    NormalBackend,
    _check_keys,
    normal_streams,
    resolve_backend,
)
from privdl.mechanisms.secrets import as_edge_array
from privdl.mechanisms.ziggurat import batched, jit, key_array_rows

_MAX_THREADS = 8
_PARALLEL_ELEMENTS = 1 << 22  # below this one thread is faster than starting a pool
#: The streamed CPU draw is split over workers by ranges of rows while the ranges draw at most
#: this many times the streams of one draw in all (edges between ranges are drawn by both).
#: Measured (2026-11-28, 2-core EPYC, MNIST MLP rows of 101,770, 4x4 torus: 48 streams, two
#: ranges of 28): one streamed thread 12.9 ms, the two-stage draw on two workers 11.3 ms (its
#: 19.5 MB of rows are written and read back), two ranges streamed side by side 6.2-6.3 ms. From
#: those per-stream costs (0.27 ms streamed, 0.235 ms two-stage per stream and worker) the two
#: break even near 1.7x the streams; 1.6 keeps a margin (not measured on dense graphs).
ROW_GROUP_MAX_REDRAW = 1.6

__all__ = [
    "correlated_noise",
    "decor_noise",
    "incidence_matrix",
    "independent_noise",
    "split_flat",
]


def incidence_matrix(
    edges: Any, n_nodes: int, *, dtype: torch.dtype = torch.float64, sparse: bool = True
) -> torch.Tensor:
    """Signed incidence matrix K (n x |E|): K[u, e] = +1, K[v, e] = -1 for e = (u, v), u < v.

    DECOR Algorithm 4 (App. B.1): N = K Z and K K^T = L, the graph Laplacian. Sparse COO by default.
    """
    array = as_edge_array(edges, n_nodes)
    n_edges = len(array)
    rows = torch.from_numpy(np.concatenate([array[:, 0], array[:, 1]]))
    cols = torch.arange(n_edges).repeat(2)
    values = torch.cat([torch.ones(n_edges, dtype=dtype), -torch.ones(n_edges, dtype=dtype)])
    matrix = torch.sparse_coo_tensor(
        torch.stack([rows, cols]), values, (n_nodes, n_edges), check_invariants=True
    ).coalesce()
    return matrix if sparse else matrix.to_dense()


def _check_sigma(name: str, sigma: float) -> float:
    sigma = float(sigma)
    if not sigma >= 0.0 or sigma == float("inf"):
        raise PrivacyError(f"{name} must be a finite standard deviation >= 0; got {sigma}")
    return sigma


def correlated_noise(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    counter: int,
    size: int,
    *,
    sigma_cor: float,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    nodes: Sequence[int] | None = None,
    backend: NormalBackend = "auto",
) -> torch.Tensor:
    """Rows sum_{j in N_i} v_ij^(t) of N^(t) = K Z^(t) (DECOR Alg 1 line 3, Alg 4).

    ``edge_keys[e]`` is the secret of ``edges[e]`` (u < v); ``counter`` is the iteration t, so the
    noise is fresh at every step. Node u receives +z_e and node v receives -z_e, z_e =
    sigma_cor * normal_streams(s_e, t). With ``nodes`` only those rows are returned and only the
    streams of edges incident to them are generated (what a process owning a shard of nodes
    needs); its rows equal the matching rows of the full computation bit-for-bit, because
    each row is accumulated with the same operations (in float64 when ``dtype`` is float64, else
    float32) in the same order (its incident
    edges in edge order, +z_e where it is the lower endpoint, -z_e where it is the upper one),
    then scaled by sigma_cor and cast. Everything runs on ``device`` (elementwise and gather
    kernels only, so it is deterministic on CUDA too).

    Returns ``(n_nodes or len(nodes), size)`` in ``dtype`` on ``device``.
    """
    sigma_cor = _check_sigma("sigma_cor", sigma_cor)
    array = as_edge_array(edges, n_nodes)
    if len(edge_keys) != len(array):
        raise ConfigError(f"got {len(edge_keys)} edge keys for {len(array)} edges")
    rows, lower, upper, keys = incident_edges(edge_keys, array, n_nodes, nodes)
    device = torch.device(device)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.zeros((len(rows), size), dtype=work, device=device)
    if len(keys) and size and sigma_cor > 0.0:  # sigma_cor = 0 is the LDP baseline: no draw
        z = normal_streams(keys, counter, size, dtype=work, device=device, backend=backend)
        if device.type == "cpu":
            _signed_sum_cpu(out, z.contiguous(), lower, upper, sigma_cor)
        else:
            _accumulate_signed(out, z, lower, upper)
            out.mul_(sigma_cor)
    return out.to(dtype=dtype)


@cache
def _signed_sum_kernel() -> Any:
    """numba, per column block of 2048: the signed sum of
    :func:`privdl.mechanisms._streamed.sum_rows_kernel` over ``z``'s columns ``c0:c1``."""
    global _sum_rows
    _sum_rows = sum_rows_kernel()  # a module global, not a closure: numba then caches kernel

    @jit
    def kernel(
        z, indptr, slot_edge, slot_sign, use_cor, cor_scale, node_first, cdp_scale, out, c0, c1
    ):  # type: ignore[no-untyped-def]
        block = 2048  # columns per pass: the block's z and out rows stay in cache
        for b0 in range(c0, c1, block):
            m = min(b0 + block, c1) - b0
            _sum_rows(
                z, b0, indptr, slot_edge, slot_sign, use_cor, cor_scale, node_first, cdp_scale,
                out, b0, m,
            )  # fmt: skip

    return kernel


_sum_rows: Any = None  # set by _signed_sum_kernel


def _signed_sum_cpu(
    out: torch.Tensor,
    z: torch.Tensor,
    lower: np.ndarray,
    upper: np.ndarray,
    scale: float,
    *,
    use_cor: bool = True,
    node_first: int = -1,
    cdp_scale: float = 0.0,
    slots: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """CPU path of :func:`_accumulate_signed` followed by ``out *= scale``, in one pass; with
    ``node_first >= 0`` it also adds ``cdp_scale * z[node_first + r]`` to row r (DECOR's own noise,
    :func:`decor_noise`), and with ``use_cor=False`` the rows are that term alone.

    Same operations in the same order per element (0 + s_1 z_1 + s_2 z_2 + ..., then one
    multiply by ``scale`` in the working dtype, then + the own term), so rows are bit-identical
    whatever other rows are computed; columns are split over the worker pool (elementwise, so the
    split changes nothing).
    """
    if slots is None:
        slots = _slots(lower, upper, out.shape[0])
    indptr, slot_edge, sign = slots
    zn, on = z.numpy(), out.numpy()
    kind = on.dtype.type  # the multiplies happen in the working dtype
    kernel = _signed_sum_kernel()
    size = on.shape[1]
    workers = min(_MAX_THREADS, kernel_cpus()) if on.size >= _PARALLEL_ELEMENTS else 1
    bounds = np.linspace(0, size, workers + 1).astype(np.int64)
    args = (zn, indptr, slot_edge, sign, use_cor, kind(scale), node_first, kind(cdp_scale), on)
    run_parallel(lambda j: kernel(*args, bounds[j], bounds[j + 1]), workers)


def _slots(
    lower: np.ndarray, upper: np.ndarray, n_rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr, slot_edge, sign)`` of :func:`~privdl.mechanisms._edges.row_slots` by row."""
    ends, slot_edge, sign = row_slots(lower, upper)
    return np.searchsorted(ends, np.arange(n_rows + 1)).astype(np.int64), slot_edge, sign


def _accumulate_signed(
    out: torch.Tensor, z: torch.Tensor, lower: np.ndarray, upper: np.ndarray
) -> None:
    """out[row] = sum over the row's incident edges, in edge order, of +z_e (lower) or -z_e (upper).

    ``lower``/``upper`` hold each edge's output row or -1. The loop runs over degree slots (at most
    the maximum degree), not over nodes; every row sees the same sequence of additions
    whatever other rows are computed, which makes node subsets bit-identical to the full result.
    """
    ends, slot_edge, sign = row_slots(lower, upper)
    starts = np.searchsorted(ends, np.arange(out.shape[0]))
    slot = np.arange(len(ends)) - starts[ends]  # position of the edge in its row's list
    for k in range(int(slot.max()) + 1 if len(slot) else 0):
        at = np.flatnonzero(slot == k)
        term = z.index_select(0, torch.from_numpy(slot_edge[at]).to(z.device))
        signs = torch.from_numpy(sign[at]).to(device=z.device, dtype=out.dtype).unsqueeze(1)
        if len(at) == out.shape[0]:  # every row takes part: rows == arange, no scatter needed
            out.addcmul_(signs, term)
        else:
            rows = torch.from_numpy(ends[at]).to(z.device)
            out[rows] = out[rows].addcmul_(signs, term)


def independent_noise(
    node_keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    sigma: float,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    backend: NormalBackend = "auto",
    prefetch: bool = False,
) -> torch.Tensor:
    """Rows vbar_i^(t) ~ N(0, sigma^2 I) from each node's private key (Alg 1 line 3; LDP noise).

    ``counter`` is the iteration t. Returns ``(len(node_keys), size)``. ``prefetch=True`` lets
    the fused CUDA path draw the next iterations too and return a view into that block
    (:func:`privdl.mechanisms.fused_noise.prefetched_decor_noise`; same values): the caller
    must not modify the result in place.
    """
    sigma = _check_sigma("sigma", sigma)
    if sigma == 0.0:
        return torch.zeros((len(node_keys), size), dtype=dtype, device=device)
    if fused_available(device, dtype, backend):  # CUDA: keystream + Box-Muller in two kernels
        n = len(node_keys)
        fused = prefetched_decor_noise if prefetch else fused_decor_noise
        return fused(
            (), (), n, node_keys, counter, size, sigma_cor=0.0, sigma_cdp=sigma, device=device
        )
    work = torch.float64 if dtype == torch.float64 else torch.float32
    noise = normal_streams(node_keys, counter, size, dtype=work, device=device, backend=backend)
    return noise.mul_(sigma).to(dtype=dtype)


def decor_noise(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    node_keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    sigma_cor: float,
    sigma_cdp: float,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    nodes: Sequence[int] | None = None,
    backend: NormalBackend = "auto",
    prefetch: bool = False,
    design: NoiseDesign | DealerCovariance | None = None,
) -> torch.Tensor | None:
    """A DECOR step's noise ``sum_{j in N_i} v_ij + vbar_i`` for the requested rows (Alg 1 line 3,
    eq. 3), or None when both sigmas are 0.

    ``node_keys[r]`` is the private noise key of the r-th requested row (``nodes``, all if None).
    It is :func:`correlated_noise` plus :func:`independent_noise`; on CUDA with the ``chacha20``
    streams in float32 both are made by two fused kernels
    (:func:`privdl.mechanisms.fused_noise.fused_decor_noise`, the same values); there
    ``prefetch=True`` draws the next iterations in the same launches and returns a view into that
    block (:func:`~privdl.mechanisms.fused_noise.prefetched_decor_noise`), not to be modified in
    place.

    ``design`` (:class:`~privdl.mechanisms.noise_design.NoiseDesign`) replaces the two sigmas by a
    variance per node and per edge: edge e's stream is scaled by sqrt(w_e) and node i's own stream
    by s_i (the same streams, so the correlated part still cancels). A uniform design is DECOR's
    scalar noise and gives its values bit for bit; another one takes :func:`_designed_noise`.
    A :class:`~privdl.mechanisms.dealer.DealerCovariance` replaces the whole noise by a trusted
    dealer's ``L xi`` over every node's own stream (simulation only: ``nodes`` must be all).
    """
    if isinstance(design, DealerCovariance):
        design.check_graph(edges, n_nodes)
        if nodes is not None and list(nodes) != list(range(n_nodes)):
            raise ConfigError("the dealer's noise is drawn for all nodes in one process")
        return dealer_noise(
            node_keys, counter, size, dealer=design, dtype=dtype, device=device, backend=backend
        )
    if design is not None:
        design.check_graph(as_edge_array(edges, n_nodes), n_nodes)
        scalar = design.uniform_sigmas
        if scalar is None:
            return _designed_noise(
                edge_keys, edges, n_nodes, node_keys, counter, size, design=design,
                dtype=dtype, device=device, nodes=nodes, backend=backend,
            )  # fmt: skip
        sigma_cdp, sigma_cor = scalar
    sigma_cor = _check_sigma("sigma_cor", sigma_cor)
    sigma_cdp = _check_sigma("sigma_cdp", sigma_cdp)
    if sigma_cor == 0.0 and sigma_cdp == 0.0:
        return None
    if fused_available(device, dtype, backend):
        fused = prefetched_decor_noise if prefetch else fused_decor_noise
        if sigma_cor == 0.0:  # LDP: each row's stream depends on its key alone (no edge rows;
            # D-SGD passes n_nodes = 0, which the row check below would refuse)
            return fused(
                (), (), len(node_keys), node_keys, counter, size, sigma_cor=0.0,
                sigma_cdp=sigma_cdp, device=device,
            )  # fmt: skip
        return fused(
            edge_keys,
            edges,
            n_nodes,
            node_keys,
            counter,
            size,
            sigma_cor=sigma_cor,
            sigma_cdp=sigma_cdp,
            device=device,
            nodes=nodes,
        )
    if torch.device(device).type == "cpu" and dtype in (torch.float32, torch.float64):
        return _decor_noise_cpu(
            edge_keys,
            edges,
            n_nodes,
            node_keys,
            counter,
            size,
            sigma_cor=sigma_cor,
            sigma_cdp=sigma_cdp,
            dtype=dtype,
            nodes=nodes,
            backend=backend,
        )
    flat = None
    if sigma_cdp > 0:
        flat = independent_noise(
            node_keys, counter, size, sigma=sigma_cdp, dtype=dtype, device=device, backend=backend
        )
    if sigma_cor > 0:
        cor = correlated_noise(
            edge_keys,
            edges,
            n_nodes,
            counter,
            size,
            sigma_cor=sigma_cor,
            dtype=dtype,
            device=device,
            nodes=nodes,
            backend=backend,
        )
        flat = cor if flat is None else cor.add_(flat)  # = flat + cor (IEEE + commutes)
    return flat


def _decor_noise_cpu(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    node_keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    sigma_cor: float,
    sigma_cdp: float,
    dtype: torch.dtype,
    nodes: Sequence[int] | None,
    backend: NormalBackend,
) -> torch.Tensor:
    """CPU :func:`decor_noise` in one draw and one pass: the edge and node streams are made by a
    single :func:`normal_streams` call (one batch for the worker pool) and combined by one kernel,
    with the values of ``correlated_noise(...) + independent_noise(...)`` bit for bit (each row is
    a pure function of its key, and the kernel does the composed path's float ops in order)."""
    plan = _cpu_plan(edge_keys, edges, n_nodes, node_keys, nodes, sigma_cor > 0, sigma_cdp > 0)
    if not (size and plan.streams):
        return torch.zeros((plan.n_rows, size), dtype=dtype)
    out = torch.empty((plan.n_rows, size), dtype=dtype)  # the signed sums write every element
    if resolve_backend(backend, "cpu") == "aes-ziggurat" and batched(size):
        # the prepared keys go straight to the kernel normal_streams would call (same rows)
        key_array = plan.key_array()
        big = len(key_array) * size * 4 >= _PARALLEL_ZIGGURAT_BYTES
        workers = min(len(key_array), _MAX_THREADS, kernel_cpus()) if big else 1
        groups = plan.row_groups(workers) if workers > 1 else [(0, plan.n_rows, plan)]
        if len(groups) == workers and size > BLOCK_COLUMNS and _aesni.active():
            # long rows: draw and sum them block by block in cache (short rows gain nothing
            # from blocks and would hold every stream's round keys at once); with several
            # workers each takes a range of rows and the streams incident to it
            on = out.numpy()

            def draw_rows(j: int) -> None:
                start, stop, part = groups[j]
                streamed_decor_rows(
                    part.key_array(), counter, on[start:stop], part.slots(),
                    use_cor=sigma_cor > 0, cor_scale=sigma_cor,
                    node_first=part.n_edge_streams if sigma_cdp > 0 else -1, cdp_scale=sigma_cdp,
                )  # fmt: skip

            run_parallel(draw_rows, len(groups))
            return out
        rows = key_array_rows(key_array, counter, size, workers=workers)
        z = torch.from_numpy(rows).to(dtype=dtype)
    else:
        z = normal_streams(plan.streams, counter, size, dtype=dtype, backend=backend)
    _signed_sum_cpu(
        out,
        z,
        plan.lower,
        plan.upper,
        sigma_cor,
        use_cor=sigma_cor > 0,
        node_first=plan.n_edge_streams if sigma_cdp > 0 else -1,
        cdp_scale=sigma_cdp,
        slots=plan.slots(),
    )
    return out


class _CpuPlan:
    """What a CPU DECOR draw needs besides the step counter, a pure function of the keys, the
    edges and the rows: the incident edges, the streams' keys (checked) as one array, and each
    row's signed slots. Built once and reused while the same keys and edges come back (every
    step of a run: at 10^5 nodes it took seconds a step to rebuild)."""

    def __init__(
        self,
        edge_keys: Sequence[bytes | None],
        edges: Any,
        n_nodes: int,
        node_keys: Sequence[bytes],
        nodes: Sequence[int] | None,
        use_cor: bool,
        use_cdp: bool,
    ) -> None:
        self.lower = self.upper = np.zeros(0, dtype=np.int64)
        keys: list[bytes] = []
        if use_cor:
            array = as_edge_array(edges, n_nodes)
            if len(edge_keys) != len(array):
                raise ConfigError(f"got {len(edge_keys)} edge keys for {len(array)} edges")
            self.rows, self.lower, self.upper, keys = incident_edges(
                edge_keys, array, n_nodes, nodes
            )
            self.n_rows = len(self.rows)
        else:
            self.n_rows = len(node_keys)
            self.rows = np.arange(self.n_rows)  # the node keys' order
        if use_cdp and len(node_keys) != self.n_rows:
            raise ConfigError(f"got {len(node_keys)} node noise keys for {self.n_rows} rows")
        self.n_edge_streams = len(keys)
        self.streams = keys + list(node_keys) if use_cdp else keys
        self.source = (edge_keys, edges, n_nodes, list(node_keys), nodes, use_cor, use_cdp)
        self._edges_copy = np.array(edges, dtype=np.int64).reshape(-1, 2)
        self._key_array: np.ndarray | None = None
        self._slots: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._groups: dict[int, list[tuple[int, int, _CpuPlan]]] = {}

    def matches(
        self,
        edge_keys: Sequence[bytes | None],
        edges: Any,
        n_nodes: int,
        node_keys: Sequence[bytes],
        nodes: Sequence[int] | None,
        use_cor: bool,
        use_cdp: bool,
    ) -> bool:
        """The same inputs: the same (immutable) edge-key tuple object, equal edges, rows and
        node keys (compared by value: cheap next to a rebuild)."""
        keys0, _, n0, node_keys0, nodes0, cor0, cdp0 = self.source
        if not (isinstance(edge_keys, tuple) and edge_keys is keys0):
            return False
        if (n0, cor0, cdp0) != (n_nodes, use_cor, use_cdp) or list(node_keys) != node_keys0:
            return False
        if (nodes0 is None) != (nodes is None) or (
            nodes is not None and list(nodes) != list(nodes0)  # type: ignore[arg-type]
        ):
            return False
        given = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        return bool(np.array_equal(given, self._edges_copy))

    def key_array(self) -> np.ndarray:
        if self._key_array is None:
            checked = _check_keys(self.streams)
            self._key_array = np.frombuffer(b"".join(checked), dtype=np.uint8).reshape(-1, 32)
        return self._key_array

    def slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._slots is None:
            self._slots = _slots(self.lower, self.upper, self.n_rows)
        return self._slots

    def row_groups(self, count: int) -> list[tuple[int, int, _CpuPlan]]:
        """The rows in ``count`` contiguous ranges ``(start, stop, plan of those rows)`` for the
        streamed draw in parallel: each range draws the streams incident to its rows, so an edge
        between two ranges is drawn by both (the same values: a stream is a function of its
        key). Empty (the caller draws otherwise) when there are fewer rows than ranges or when
        the ranges would draw more than :data:`ROW_GROUP_MAX_REDRAW` times the streams in all.
        Each row's slots keep the edge order of the whole plan, so its float ops are the same."""
        cached = self._groups.get(count)
        if cached is not None:
            return cached
        groups: list[tuple[int, int, _CpuPlan]] = []
        if count <= self.n_rows:
            edge_keys, edges, n_nodes, node_keys, _, use_cor, use_cdp = self.source
            bounds = np.linspace(0, self.n_rows, count + 1).astype(np.int64).tolist()
            for start, stop in itertools.pairwise(bounds):
                part = _CpuPlan(
                    edge_keys, edges, n_nodes, node_keys[start:stop],
                    self.rows[start:stop].tolist(), use_cor, use_cdp,
                )  # fmt: skip
                groups.append((start, stop, part))
            drawn = sum(len(part.streams) for _, _, part in groups)
            if drawn > ROW_GROUP_MAX_REDRAW * len(self.streams):
                groups = []
        self._groups[count] = groups
        return groups


_PLAN: list[_CpuPlan] = []  # the last plan (one entry; replaced atomically)


def _cpu_plan(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    node_keys: Sequence[bytes],
    nodes: Sequence[int] | None,
    use_cor: bool,
    use_cdp: bool,
) -> _CpuPlan:
    args = (edge_keys, edges, n_nodes, node_keys, nodes, use_cor, use_cdp)
    last = _PLAN[0] if _PLAN else None
    if last is not None and last.matches(*args):
        return last
    plan = _CpuPlan(*args)
    _PLAN[:] = [plan]
    return plan


def _designed_noise(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    node_keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    design: NoiseDesign,
    dtype: torch.dtype,
    device: torch.device | str,
    nodes: Sequence[int] | None,
    backend: NormalBackend,
) -> torch.Tensor:
    """:func:`decor_noise` for a non-uniform design: the same edge and node streams, each edge's
    scaled by sqrt(w_e) and each node's by s_i before the signed sum (so both endpoints use the
    same scaled stream and the correlated part cancels). Rows are pure functions of their keys,
    so a node subset equals the matching rows of the full result bit for bit. On any device (the
    fused CUDA kernels are not used: they take one scalar sigma per kind)."""
    array = as_edge_array(edges, n_nodes)
    if len(edge_keys) != len(array):
        raise ConfigError(f"got {len(edge_keys)} edge keys for {len(array)} edges")
    active = np.flatnonzero(design.edge_var > 0)  # w_e = 0: that stream is not drawn
    rows, lower, upper, keys = incident_edges(
        [edge_keys[e] for e in active.tolist()], array[active], n_nodes, nodes
    )
    position = np.full(n_nodes, -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    sub = array[active]
    keep_edges = active[(position[sub[:, 0]] >= 0) | (position[sub[:, 1]] >= 0)]
    node_std = design.node_std()[rows]
    own = bool(np.any(node_std > 0))
    if own and len(node_keys) != len(rows):
        raise ConfigError(f"got {len(node_keys)} node noise keys for {len(rows)} rows")
    streams = keys + list(node_keys) if own else list(keys)
    device = torch.device(device)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.zeros((len(rows), size), dtype=work, device=device)
    if not (size and streams):
        return out.to(dtype=dtype)
    z = normal_streams(streams, counter, size, dtype=work, device=device, backend=backend)
    scale = np.concatenate([design.edge_std()[keep_edges], node_std if own else []])
    z.mul_(torch.from_numpy(scale).to(device=device, dtype=work).unsqueeze(1))
    if device.type == "cpu":
        _signed_sum_cpu(
            out, z.contiguous(), lower, upper, 1.0, use_cor=len(keys) > 0,
            node_first=len(keys) if own else -1, cdp_scale=1.0,
        )  # fmt: skip
        return out.to(dtype=dtype)
    _accumulate_signed(out, z[: len(keys)], lower, upper)
    if own:
        out.add_(z[len(keys) :])
    return out.to(dtype=dtype)


def split_flat(
    flat: torch.Tensor, shapes: Mapping[str, Sequence[int]] | Iterable[tuple[str, Sequence[int]]]
) -> dict[str, torch.Tensor]:
    """Split an (n, P) tensor into {name: (n, *shape)} views, in the given order (P must match)."""
    items = list(shapes.items()) if isinstance(shapes, Mapping) else list(shapes)
    sizes = [int(np.prod(shape, dtype=np.int64)) for _, shape in items]
    if flat.ndim != 2 or flat.shape[1] != sum(sizes):
        raise ConfigError(
            f"flat noise has shape {tuple(flat.shape)}; the layer shapes need (n, {sum(sizes)})"
        )
    parts = torch.split(flat, sizes, dim=1)
    return {
        name: part.reshape(flat.shape[0], *shape)
        for (name, shape), part in zip(items, parts, strict=True)
    }
