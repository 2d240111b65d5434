import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.errors import GraphError
from privdl.topology import parse_graph, parse_topology


@pytest.mark.parametrize(
    ("spec", "n", "edges"),
    [
        ("ring:16", 16, 16),
        ("path:8", 8, 7),
        ("star:8", 8, 7),
        ("complete:16", 16, 120),
        ("torus:4x4", 16, 32),
        ("grid:4x4", 16, 24),
        ("regular:50:6:3", 50, 150),
    ],
)
def test_spec_sizes(spec, n, edges):
    t = parse_graph(spec)
    assert t.n == n
    assert t.num_edges == edges
    assert (t.edges[:, 0] < t.edges[:, 1]).all()
    assert t.degrees.sum() == 2 * edges


def test_torus_matches_networkx_periodic_grid():
    t = parse_graph("torus:4x5")
    ref = nx.convert_node_labels_to_integers(
        nx.grid_2d_graph(4, 5, periodic=True), ordering="sorted"
    )
    assert nx.is_isomorphic(t.graph, ref)
    assert set(map(tuple, t.edges.tolist())) == {tuple(sorted(e)) for e in ref.edges}


@pytest.mark.parametrize("n", [3, 5, 16, 31])
def test_algebraic_connectivity_closed_forms(n):
    assert math.isclose(
        parse_graph(f"ring:{n}").algebraic_connectivity,
        2 * (1 - math.cos(2 * math.pi / n)),
        rel_tol=1e-9,
    )
    assert math.isclose(parse_graph(f"complete:{n}").algebraic_connectivity, n, rel_tol=1e-9)
    assert math.isclose(parse_graph(f"star:{n}").algebraic_connectivity, 1.0, rel_tol=1e-9)
    assert math.isclose(
        parse_graph(f"path:{n}").algebraic_connectivity,
        2 * (1 - math.cos(math.pi / n)),
        rel_tol=1e-9,
    )


def test_laplacian_and_incidence():
    t = parse_graph("torus:3x4")
    k = t.incidence.toarray()
    assert np.allclose(k @ k.T, t.laplacian.toarray())
    assert np.allclose(k.sum(axis=0), 0)  # +1 and -1 per edge
    assert (k[t.edges[:, 0], np.arange(t.num_edges)] == 1).all()


def test_er_seeded_and_refuses_disconnected():
    a = parse_graph("er:10:0.8:1")
    b = parse_graph("er:10:0.8:1")
    assert np.array_equal(a.edges, b.edges)
    assert not np.array_equal(a.edges, parse_graph("er:10:0.8:2").edges)
    with pytest.raises(GraphError, match="disconnected"):
        parse_graph("er:30:0.01:0")


@pytest.mark.parametrize(
    "spec",
    [
        "ring",
        "ring:x",
        "torus:4",
        "er:10:0.5",
        "regular:5:3:1",
        "blah:4",
        "",
        "ring:1",
        "er:10:1.5:0",
        "er:10:0.8:-1",  # networkx would read -1 as seed 1 and draw that graph
        "regular:10:4:-3",
    ],
)
def test_bad_specs(spec):
    with pytest.raises(GraphError):
        parse_graph(spec)


def test_edge_list_file(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("# a triangle plus a tail\n0 1\n1 2\n2 0\n2 3\n")
    t = parse_graph(str(p))
    assert t.n == 4 and t.num_edges == 4 and t.is_connected


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("0 0\n", "self-loop"),
        ("0 1\n1 0\n", "duplicate"),
        ("0 1.5\n", "non-integer"),
        ("0 a\n", "non-integer"),
        ("0 1 2\n", "two integers"),
        ("", "no edges"),
        ("0 1\n1 99999999999\n", "node ids must be 0..n-1"),  # hung building 1e11 nodes
        ("1 2\n2 3\n3 1\n", "missing e.g. 0"),  # a 1-based file left node 0 isolated
        ("0 1\n5 6\n", "missing e.g. 2, 3, 4"),
        (b"\x00\x01\x02\xff\xfe", "is not text"),  # was a UnicodeDecodeError traceback
    ],
)
def test_edge_list_rejects(tmp_path, text, msg):
    p = tmp_path / "bad.txt"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(GraphError, match=msg):
        parse_graph(str(p))


def test_disconnected_edge_list_reports():
    t = parse_graph("grid:1x1")
    assert t.n == 1


def test_disconnected_requirement(tmp_path):
    p = tmp_path / "two.txt"
    p.write_text("0 1\n2 3\n")
    t = parse_graph(str(p))
    assert not t.is_connected and t.algebraic_connectivity == 0.0
    with pytest.raises(GraphError, match="disconnected"):
        t.require_connected()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 30), p=st.floats(0.2, 1.0), seed=st.integers(0, 10_000))
def test_algebraic_connectivity_matches_networkx(n, p, seed):
    g = nx.gnp_random_graph(n, p, seed=seed)
    if not nx.is_connected(g):
        return
    t = parse_graph(f"er:{n}:{p}:{seed}")
    ref = nx.algebraic_connectivity(g, method="tracemin_lu", tol=1e-12)
    assert math.isclose(t.algebraic_connectivity, ref, rel_tol=1e-6, abs_tol=1e-9)


def test_expo_spec():
    e = parse_topology("expo:16")
    assert e.hops == (1, 2, 4, 8)
    with pytest.raises(GraphError):
        parse_graph("expo:16")


def test_builders_refuse_a_non_integer_size():
    """``ring('16')`` was a TypeError from a comparison deep inside."""
    from privdl.errors import GraphError
    from privdl.topology import ring

    for bad in ("16", 16.0, True):
        with pytest.raises(GraphError, match="must be an integer"):
            ring(bad)


@pytest.mark.parametrize("n", [2, 4, 5, 8, 12, 16, 33])
def test_expo_sgp_variant_hops(n):
    """The SGP code's hop list: +1, -1, +2, -2, +4, ... modulo n, zero and repeats dropped, up
    to the largest power of two below n; named and parsed as ``expo:N:sgp``."""
    from privdl.topology.timevarying import ExponentialGraph

    want: list[int] = []
    k = 1
    while k < n:
        for h in (k % n, (-k) % n):
            if h and h not in want:
                want.append(h)
        k *= 2
    e = ExponentialGraph(n, "sgp")
    assert list(e.hops) == want
    parsed = parse_topology(f"expo:{n}:sgp")
    assert parsed.variant == "sgp" and list(parsed.hops) == want and parsed.name == f"expo:{n}:sgp"
