import math
from functools import reduce

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.errors import GraphError
from privdl.topology import (
    ExponentialGraph,
    Topology,
    heterogeneity_factor,
    mixing_matrix,
    parse_graph,
)


def _random_topology(n, p, seed):
    g = nx.gnp_random_graph(n, p, seed=seed)
    return Topology(name="random", graph=g)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 25),
    p=st.floats(0.1, 1.0),
    seed=st.integers(0, 10_000),
    rule=st.sampled_from(["metropolis", "max-degree"]),
)
def test_symmetric_rules_are_doubly_stochastic_on_any_graph(n, p, seed, rule):
    t = _random_topology(n, p, seed)
    w = mixing_matrix(t, rule)
    a = w.dense()
    assert w.symmetric and w.doubly_stochastic and w.nonnegative
    assert np.allclose(a.sum(0), 1) and np.allclose(a.sum(1), 1) and np.allclose(a, a.T)
    off = (a > 0) & ~np.eye(n, dtype=bool)
    assert np.array_equal(off, t.adjacency.toarray() > 0)  # support = the graph's edges


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 25), p=st.floats(0.1, 1.0), seed=st.integers(0, 10_000))
def test_push_sum_is_column_stochastic(n, p, seed):
    t = _random_topology(n, p, seed)
    w = mixing_matrix(t, "push-sum")
    assert w.column_stochastic and w.nonnegative
    assert np.all(np.diag(w.dense()) > 0)


def test_decor_rule_refused_on_irregular_graph():
    with pytest.raises(GraphError, match="irregular"):
        mixing_matrix(parse_graph("star:5"), "decor")


@pytest.mark.parametrize(
    ("spec", "weight", "p", "h", "wj"),
    [
        ("ring:16", 1 / 3, 0.0989187, 1 / 9, 13 / 3),
        ("torus:4x4", 1 / 5, 0.64, 0.12, 2.2),
        ("complete:16", 1 / 16, 1.0, 0.0, 0.0),
    ],
)
def test_decor_paper_matrices(spec, weight, p, h, wj):
    """DECOR Section 6 matrices: p (Assumption 5), H_G(W) (eq. 11) and ||W - J||_F^2."""
    t = parse_graph(spec)
    w = mixing_matrix(t, "decor")
    a = w.dense()
    assert np.allclose(a[a > 0], weight)
    assert math.isclose(w.consensus_rate, p, abs_tol=1e-6)
    assert math.isclose(heterogeneity_factor(w, t), h, abs_tol=1e-12)
    assert math.isclose(float(((a - 1 / 16) ** 2).sum()), wj, abs_tol=1e-12)


@pytest.mark.parametrize("spec", ["ring:12", "torus:4x4", "er:20:0.3:4", "path:9"])
def test_gossip_converges_at_the_predicted_rate(spec):
    """||X_t - Xbar|| contracts at |lambda_2(W)| per step: bound and asymptotic tightness."""
    t = parse_graph(spec)
    w = mixing_matrix(t, "metropolis")
    a = w.dense()
    lam = 1 - w.spectral_gap
    rng = np.random.default_rng(0)
    x = rng.standard_normal((t.n, 3))
    xbar = x.mean(0)
    dev0 = np.linalg.norm(x - xbar)
    steps = 60
    for _ in range(steps):
        x = a @ x
    assert np.allclose(x.mean(0), xbar)  # average preserved
    dev = np.linalg.norm(x - xbar)
    assert dev <= lam**steps * dev0 * (1 + 1e-9)
    ratio = np.linalg.norm(a @ x - xbar) / dev  # one more step: ratio -> |lambda_2|
    assert ratio == pytest.approx(lam, rel=0.05)
    # consensus rate p: squared contraction bounded by (1 - p)
    assert np.linalg.norm(a @ x - xbar) ** 2 <= (1 - w.consensus_rate) * dev**2 * (1 + 1e-9)


def test_average_rule_is_J():
    w = mixing_matrix(parse_graph("ring:7"), "average")
    assert np.allclose(w.dense(), 1 / 7) and w.consensus_rate == pytest.approx(1.0)


@pytest.mark.parametrize(
    "n,hops",
    [(16, [1, 2, 4, 8]), (50, [1, 2, 4, 8, 16, 32]), (3, [1, 2]), (2, [1]), (25, [1, 2, 4, 8, 16])],
)
def test_expo_hops(n, hops):
    assert list(ExponentialGraph(n).hops) == hops


@pytest.mark.parametrize("n", [2, 8, 16, 32, 64])
def test_expo_exact_average_after_one_period_for_powers_of_two(n):
    e = ExponentialGraph(n)
    for start in (0, 3):
        prod = reduce(
            lambda acc, k: e.mixing(k).dense() @ acc, range(start, start + e.period), np.eye(n)
        )
        assert np.abs(prod - 1 / n).max() < 1e-14


@pytest.mark.parametrize("n,dev,iters", [(25, 0.0225, 35), (50, 0.01125, 41), (100, 0.005625, 47)])
def test_expo_non_power_of_two(n, dev, iters):
    """PrivSGP-VR's exponential graph (App. D): deviation after one period and iterations to reach 1e-6."""
    e = ExponentialGraph(n)
    prod = np.eye(n)
    k = 0
    while True:
        prod = e.mixing(k).dense() @ prod
        k += 1
        if k == e.period:
            assert np.abs(prod - 1 / n).max() == pytest.approx(dev, rel=1e-9)
        if np.abs(prod - 1 / n).max() <= 1e-6:
            break
    assert k == iters


def test_expo_matrices_doubly_stochastic():
    e = ExponentialGraph(12)
    for k in range(e.period):
        w = e.mixing(k)
        assert w.doubly_stochastic
        a = w.dense()
        assert np.allclose(np.diag(a), 0.5) and ((a > 0).sum(0) == 2).all()


@pytest.mark.parametrize("spec", ["ring:12", "torus:4x4", "er:20:0.3:4", "path:9", "star:8"])
def test_fdla_and_best_constant_rules(spec):
    """Both are symmetric with ``W 1 = 1`` and the graph's support; FDLA minimises
    ``||W - J||_2`` over such matrices, so it is no worse than any other symmetric rule."""
    t = parse_graph(spec)
    j = np.full((t.n, t.n), 1.0 / t.n)
    rates = {}
    for rule in ("fdla", "best-constant", "metropolis", "max-degree"):
        w = mixing_matrix(t, rule)
        a = w.dense()
        assert w.rule == rule and w.symmetric and np.allclose(a.sum(1), 1.0)
        off = ~np.eye(t.n, dtype=bool) & (t.adjacency.toarray() == 0)
        assert np.all(a[off] == 0)
        rates[rule] = np.linalg.norm(a - j, 2)
    assert rates["fdla"] <= min(rates.values()) + 1e-9
    assert rates["best-constant"] <= rates["max-degree"] + 1e-9  # same family, best constant


@pytest.mark.parametrize("rule", ["fdla", "best-constant", "metropolis"])
def test_one_node_graph_mixes_to_itself(rule):
    """FDLA and best-constant indexed the second eigenvalue of a 1x1 Laplacian (IndexError)."""
    w = mixing_matrix(parse_graph("complete:1"), rule)
    assert w.dense().tolist() == [[1.0]]


def test_mixing_matrix_takes_a_spec_and_refuses_other_things():
    assert np.array_equal(
        mixing_matrix("ring:8").dense(), mixing_matrix(parse_graph("ring:8")).dense()
    )
    with pytest.raises(GraphError, match="Topology or a graph spec"):
        mixing_matrix(5)


@pytest.mark.parametrize("spec", ["star:9", "path:7", "er:12:0.3:1"])
def test_push_sum_facts(spec, monkeypatch):
    """Push-sum's P is column-stochastic, not doubly: no consensus rate p (its contraction bound
    needs a doubly stochastic W: a made-up p was reported); the spectral gap is 1 - |lambda_2(P)|,
    the rate at which P^t approaches its limit v 1^T, alike from the dense and the sparse solver."""
    import privdl.topology.mixing as mixing

    t = parse_graph(spec)
    w = mixing_matrix(t, "push-sum")
    assert w.column_stochastic and not w.row_stochastic and w.consensus_rate is None
    assert w.summary()["consensus_rate"] is None
    a = w.dense()
    vals, vecs = np.linalg.eig(a)
    v = np.real(vecs[:, np.argmax(np.real(vals))])
    limit = np.outer(v / v.sum(), np.ones(t.n))
    pt = np.linalg.matrix_power(a, 40)
    ratio = np.linalg.norm(a @ pt - limit, 2) / np.linalg.norm(pt - limit, 2)
    assert ratio == pytest.approx(1 - w.spectral_gap, rel=0.02)
    monkeypatch.setattr(mixing, "DENSE_LIMIT", 2)  # the large-graph (sparse solver) branch
    sparse = mixing_matrix(t, "push-sum")
    assert sparse.spectral_gap == pytest.approx(w.spectral_gap, abs=1e-9)
