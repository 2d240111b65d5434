"""Communication graphs and their mixing matrices."""

from privdl.errors import GraphError
from privdl.topology.graphs import (
    MAX_NODES,
    Topology,
    complete,
    erdos_renyi,
    from_edge_list,
    grid,
    parse_graph,
    path,
    random_regular,
    ring,
    star,
    torus,
)
from privdl.topology.mixing import MIXING_RULES, MixingMatrix, heterogeneity_factor, mixing_matrix
from privdl.topology.timevarying import ExponentialGraph


def parse_topology(spec: str) -> Topology | ExponentialGraph:
    """Parse a static graph spec or ``expo:N`` (time-varying directed exponential graph)."""
    s = spec.strip() if isinstance(spec, str) else spec
    if isinstance(s, str) and s.startswith("expo:"):
        parts = s.split(":")[1:]
        try:
            n = int(parts[0])
        except (ValueError, IndexError):
            raise GraphError(f"bad graph spec {spec!r}: expected expo:N") from None
        if n > MAX_NODES:
            raise GraphError(
                f"graph {spec[:60]!r} has {n} nodes; privdl builds graphs of at most "
                f"{MAX_NODES} nodes"
            )
        variant = parts[1] if len(parts) > 1 else "forward"
        if variant == "sgp" or variant == "forward":
            return ExponentialGraph(n, variant=variant)
        raise GraphError(f"bad graph spec {spec!r}: expected expo:N or expo:N:sgp")
    return parse_graph(s)


__all__ = [
    "MIXING_RULES",
    "ExponentialGraph",
    "MixingMatrix",
    "Topology",
    "complete",
    "erdos_renyi",
    "from_edge_list",
    "grid",
    "heterogeneity_factor",
    "mixing_matrix",
    "parse_graph",
    "parse_topology",
    "path",
    "random_regular",
    "ring",
    "star",
    "torus",
]
