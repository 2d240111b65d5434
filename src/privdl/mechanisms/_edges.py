"""Edge and row bookkeeping shared by the correlated-noise paths (DECOR Alg 1 line 3, Alg 4).

Which edges touch the requested rows (:func:`incident_edges`) and, per output row, the ordered
``(edge, sign)`` slots it accumulates (:func:`row_slots`): +z_e at an edge's lower endpoint, -z_e at
its upper one, in edge order. The CPU and torch paths of :mod:`privdl.mechanisms.correlated` and
the fused CUDA path of :mod:`privdl.mechanisms.fused_noise` build on the same tables, which is what
makes their rows agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privdl.errors import GraphError, PrivacyError

__all__ = ["incident_edges", "row_slots"]


def incident_edges(
    edge_keys: Sequence[bytes | None],
    array: np.ndarray,
    n_nodes: int,
    nodes: Sequence[int] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[bytes]]:
    """The requested rows (all nodes if ``nodes`` is None) and the edges incident to them, in
    edge order: each such edge's output row at its lower and at its upper endpoint (-1 where that
    endpoint is not requested) and its secret. ``array`` is the checked ``(|E|, 2)`` edge array."""
    if nodes is None:
        rows = np.arange(n_nodes)
    else:
        rows = np.asarray(list(nodes), dtype=np.int64).reshape(-1)
        if np.any(rows < 0) or np.any(rows >= n_nodes) or len(np.unique(rows)) != len(rows):
            raise GraphError(f"nodes must be distinct indices in [0, {n_nodes})")
    position = np.full(n_nodes, -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    lower, upper = position[array[:, 0]], position[array[:, 1]]
    needed = np.flatnonzero((lower >= 0) | (upper >= 0))
    keys = [edge_keys[e] for e in needed.tolist()]
    if any(key is None for key in keys):
        missing = array[needed[[k is None for k in keys]][0]].tolist()
        raise PrivacyError(f"no secret for edge {tuple(missing)} incident to a requested node")
    return rows, lower[needed], upper[needed], keys  # type: ignore[return-value]


def row_slots(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, edge, sign) of every edge end that lands in an output row, by row then edge index.

    ``lower``/``upper`` hold each edge's output row or -1; the sign is +1 at the lower endpoint.
    """
    ends = np.concatenate([lower, upper])
    slot_edge = np.concatenate([np.arange(len(lower)), np.arange(len(upper))]).astype(np.int64)
    sign = np.concatenate([np.ones(len(lower), np.int8), -np.ones(len(upper), np.int8)])
    keep = ends >= 0
    ends, slot_edge, sign = ends[keep], slot_edge[keep], sign[keep]
    order = np.lexsort((slot_edge, ends))
    return ends[order], slot_edge[order], sign[order]
