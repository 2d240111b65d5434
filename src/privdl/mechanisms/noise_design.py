"""An edge-wise noise design for DECOR: a variance per node and a variance per edge.

DECOR (Allouah et al., ICML 2024, eq. 3, Algorithm 4) adds to node i's gradient
``sum_{j in N_i} v_ij + vbar_i`` with one correlated variance ``sigma_cor^2`` on every edge and one
independent variance ``sigma_cdp^2`` at every node. A design keeps the same generator (each edge's
secret stream, +z_e at the lower endpoint and -z_e at the upper one) and only rescales it: the edge
stream of e by ``sqrt(w_e)`` and node i's own stream by ``s_i``. Per coordinate the noise then has
covariance

    Sigma = diag(s^2) + B diag(w) B^T        (B the signed n x |E| incidence matrix),

its correlated part still sums to zero over the nodes, and both endpoints of an edge derive the
same stream from the secret they share. Uniform values ``s_i = sigma_cdp``, ``w_e = sigma_cor^2``
are DECOR itself (docs/noise-design.md).

``edge_var`` follows the graph's canonical edge order: the sorted ``(u < v)`` rows of
:attr:`privdl.topology.graphs.Topology.edges`, the order DECOR's noise generator uses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privdl.errors import ConfigError
from privdl.mechanisms.dealer import DEALER_FORMAT, DealerCovariance

__all__ = ["FORMAT", "NoiseDesign", "load_design", "save_design"]

#: The ``format`` tag of a saved design (JSON).
FORMAT = "privdl-noise-design/1"


def _as_vector(name: str, values: Any, length: int | None) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ConfigError(f"noise design: {name} must be a list of numbers") from None
    if length is not None and len(array) != length:
        raise ConfigError(f"noise design: {name} has {len(array)} entries, expected {length}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ConfigError(f"noise design: {name} must hold finite variances >= 0")
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class NoiseDesign:
    """Per-node independent variances ``node_var`` (s_i^2, shape (n,)) and per-edge correlated
    variances ``edge_var`` (w_e, shape (|E|,), canonical edge order) on the graph ``edges``.

    ``metadata`` is free JSON-ready information (how it was made: threat model, target, solver).
    """

    node_var: np.ndarray
    edge_var: np.ndarray
    edges: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        node_var = _as_vector("node_var", self.node_var, None)
        n = len(node_var)
        if n == 0:
            raise ConfigError("noise design: node_var is empty")
        try:
            edges = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        except (TypeError, ValueError):
            raise ConfigError("noise design: edges must be pairs of node indices") from None
        if len(edges) and (
            np.any(edges[:, 0] >= edges[:, 1]) or edges.min() < 0 or edges.max() >= n
        ):
            raise ConfigError(f"noise design: edges must be pairs u < v of nodes in [0, {n})")
        if len(edges) > 1:
            order = np.lexsort((edges[:, 1], edges[:, 0]))
            if not np.array_equal(order, np.arange(len(edges))) or np.any(
                np.all(np.diff(edges, axis=0) == 0, axis=1)
            ):
                raise ConfigError("noise design: edges must be sorted and distinct (u < v rows)")
        edges.setflags(write=False)
        edge_var = _as_vector("edge_var", self.edge_var, len(edges))
        object.__setattr__(self, "node_var", node_var)
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "edge_var", edge_var)
        object.__setattr__(self, "metadata", dict(self.metadata))

    @classmethod
    def uniform(
        cls, edges: Any, n_nodes: int, *, sigma_cdp: float, sigma_cor: float
    ) -> NoiseDesign:
        """DECOR's own noise as a design: ``s_i^2 = sigma_cdp^2``, ``w_e = sigma_cor^2``."""
        array = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        return cls(
            np.full(n_nodes, float(sigma_cdp) ** 2),
            np.full(len(array), float(sigma_cor) ** 2),
            array,
            {"kind": "decor-scalar", "sigma_cdp": float(sigma_cdp), "sigma_cor": float(sigma_cor)},
        )

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.node_var)

    @property
    def uniform_sigmas(self) -> tuple[float, float] | None:
        """``(sigma_cdp, sigma_cor)`` when every node and every edge share one variance (DECOR's
        scalar noise; sqrt(x^2) = x exactly in binary floating point), else None."""
        node, edge = self.node_var, self.edge_var
        if np.any(node != node[0]) or (len(edge) and np.any(edge != edge[0])):
            return None
        return math.sqrt(float(node[0])), math.sqrt(float(edge[0])) if len(edge) else 0.0

    def node_std(self) -> np.ndarray:
        """s_i, the scale of node i's own stream."""
        return np.sqrt(self.node_var)

    def edge_std(self) -> np.ndarray:
        """sqrt(w_e), the scale of edge e's shared stream."""
        return np.sqrt(self.edge_var)

    def covariance(self) -> np.ndarray:
        """The per-coordinate covariance diag(s^2) + B diag(w) B^T, dense (n x n)."""
        sigma = np.diag(self.node_var.copy())
        u, v = self.edges[:, 0], self.edges[:, 1]
        np.add.at(sigma, (u, u), self.edge_var)
        np.add.at(sigma, (v, v), self.edge_var)
        np.add.at(sigma, (u, v), -self.edge_var)
        np.add.at(sigma, (v, u), -self.edge_var)
        return sigma

    def scaled(self, factor: float) -> NoiseDesign:
        """Every variance times ``factor`` (the eps-certificate is monotone in it)."""
        return NoiseDesign(
            self.node_var * factor, self.edge_var * factor, self.edges, self.metadata
        )

    def check_graph(self, edges: Any, n_nodes: int) -> None:
        """Refuse a design made for another graph (one line)."""
        array = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        if n_nodes != self.n or not np.array_equal(np.sort(array, axis=1), self.edges):
            raise ConfigError(
                f"noise design is for a graph with {self.n} nodes and {len(self.edges)} edges, "
                f"not this one ({n_nodes} nodes, {len(array)} edges or another edge set)"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what :func:`save_design` writes)."""
        return {
            "format": FORMAT,
            "n": self.n,
            "edges": self.edges.tolist(),
            "node_var": self.node_var.tolist(),
            "edge_var": self.edge_var.tolist(),
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: Any) -> NoiseDesign:
        """Validate and build (one-line :class:`ConfigError` on anything wrong)."""
        if not isinstance(data, dict):
            raise ConfigError("noise design: expected a JSON object")
        if data.get("format") != FORMAT:
            raise ConfigError(
                f"noise design: format must be {FORMAT!r}, got {data.get('format')!r}"
            )
        missing = {"n", "edges", "node_var", "edge_var"} - set(data)
        if missing:
            raise ConfigError(f"noise design: missing keys {sorted(missing)}")
        unknown = set(data) - {"format", "n", "edges", "node_var", "edge_var", "metadata"}
        if unknown:
            raise ConfigError(f"noise design: unknown keys {sorted(unknown)}")
        design = cls(data["node_var"], data["edge_var"], data["edges"], data.get("metadata") or {})
        if design.n != data["n"]:
            raise ConfigError(f"noise design: n = {data['n']} but node_var has {design.n} entries")
        return design


def save_design(design: NoiseDesign, path: str | Path) -> None:
    """Write ``design`` as JSON (floats round-trip exactly)."""
    Path(path).write_text(json.dumps(design.to_dict(), indent=1) + "\n")


def load_design(path: str | Path) -> NoiseDesign | DealerCovariance:
    """Read a design written by :func:`save_design`, or a trusted dealer's covariance
    (:class:`~privdl.mechanisms.dealer.DealerCovariance`, its own format tag; one-line errors)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"noise design {str(path)!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"noise design {str(path)!r} is not JSON: {exc.msg}") from None
    if isinstance(data, dict) and data.get("format") == DEALER_FORMAT:
        return DealerCovariance.from_dict(data)
    return NoiseDesign.from_dict(data)
