"""diag(Sigma^{-1}) at any noise ratio, against a 60-digit oracle and closed forms.

The SecRDP value is dominated, when sigma_cor >> sigma_cdp, by the component-constant directions
that a plain float64 inverse of Sigma loses. These tests would fail for the plain inverse (and
did: the curious-user value on a 16-ring was 25x too small at sigma_cor / sigma_cdp = 1e5).
"""

from __future__ import annotations

import itertools
import warnings

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.accounting import PrivacyWarning, decor_step_rdp
from privdl.accounting._graph import edge_array, laplacian
from privdl.accounting._sigma_inverse import (
    deflate,
    deletion_maxima,
    sigma_inverse_diagonal,
)

mpmath = pytest.importorskip("mpmath")


def mp_sigma_inverse_diagonal(graph: nx.Graph, nodes: list[int], s: float, c: float) -> list:
    """diag((s^2 I + c^2 L_H)^{-1}) in 60-digit arithmetic (independent of numpy's LAPACK)."""
    sub = graph.subgraph(nodes)
    order = sorted(sub)
    lap = nx.laplacian_matrix(sub, nodelist=order).toarray()
    with mpmath.workdps(60):
        m = mpmath.matrix(len(order), len(order))
        for i, j in itertools.product(range(len(order)), repeat=2):
            m[i, j] = mpmath.mpf(c) ** 2 * int(lap[i, j]) + (mpmath.mpf(s) ** 2 if i == j else 0)
        inv = m**-1
        return [inv[i, i] for i in range(len(order))]


def mp_step_rdp(graph: nx.Graph, s: float, c: float, q: int) -> float:
    """Algorithm 3 by enumeration, every inverse in 60 digits."""
    n = graph.number_of_nodes()
    best = 0
    for colluders in itertools.combinations(range(n), q):
        rest = [u for u in range(n) if u not in colluders]
        best = max(best, max(mp_sigma_inverse_diagonal(graph, rest, s, c)))
    return float(2 * best)


GRAPHS = {
    "ring10": nx.cycle_graph(10),
    "path7": nx.path_graph(7),  # every inner vertex an articulation point
    "star7": nx.star_graph(6),  # the curious centre leaves six isolated vertices
    "barbell": nx.barbell_graph(4, 2),
    "gnp": nx.gnp_random_graph(10, 0.35, seed=3),
}
METHODS = {0: ("dense", "sparse-selinv"), 1: ("dense+lowrank", "sparse-selinv", "naive")}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("ratio", [1e-2, 1.0, 1e4, 1e8, 1e12])
@pytest.mark.parametrize("q", [0, 1])
def test_every_method_matches_the_60_digit_oracle(name, ratio, q):
    graph = GRAPHS[name]
    exact = mp_step_rdp(graph, 1.0, ratio, q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        for method in METHODS[q]:
            got = decor_step_rdp(graph, sigma_cdp=1.0, sigma_cor=ratio, adversary=q, method=method)
            assert got.step_rdp == pytest.approx(exact, rel=1e-12), method


def test_collusion_two_low_rank_matches_the_oracle_at_a_large_ratio():
    graph = GRAPHS["gnp"]
    exact = mp_step_rdp(graph, 0.3, 3e5, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        got = decor_step_rdp(graph, sigma_cdp=0.3, sigma_cor=3e5, adversary=2)
    assert got.method == "dense+lowrank"
    assert got.step_rdp == pytest.approx(exact, rel=1e-12)


def test_curious_ring_regression():
    """The case that exposed the bug: ring:16, curious, sigma_cor / sigma_cdp = 1e5. Deleting one
    vertex leaves a path of 15, so the value is at least 2 / (15 sigma_cdp^2)."""
    got = decor_step_rdp(nx.cycle_graph(16), sigma_cdp=1.0, sigma_cor=1e5, adversary="curious")
    assert got.step_rdp >= 2 / 15
    assert got.step_rdp == pytest.approx(mp_step_rdp(nx.cycle_graph(16), 1.0, 1e5, 1), rel=1e-12)


@pytest.mark.parametrize("ratio", [0.5, 30.0, 1e3, 1e7])
def test_large_sparse_torus_matches_the_spectral_closed_form(ratio):
    """Both sparse branches (plain selected inversion while cond(Sigma) <= n, grounded beyond)
    against Alg 2's vertex-transitive closed form (1/n) sum_k 1/(s^2 + c^2 lambda_k), lambda_0 = 0 exactly."""
    side = 40
    graph = nx.convert_node_labels_to_integers(nx.grid_2d_graph(side, side, periodic=True))
    lam = 2 - 2 * np.cos(2 * np.pi * np.arange(side) / side)
    eigs = (lam[:, None] + lam[None, :]).ravel()
    closed = float(np.mean(1.0 / (1.0 + ratio**2 * eigs)))
    n, edges = edge_array(graph)
    diag = sigma_inverse_diagonal(laplacian(n, edges), 1.0, ratio, sparse=True)
    assert np.allclose(diag, closed, rtol=1e-10, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(3, 14),
    p=st.floats(0.15, 0.9),
    seed=st.integers(0, 10_000),
    log_ratio=st.floats(-2, 12),
)
def test_deflated_and_grounded_diagonals_agree_and_respect_the_sandwich(n, p, seed, log_ratio):
    """Two independent stable forms agree, and 1/(m_i s^2) <= diag_i <= 1/s^2 (Sigma >= s^2 I and
    Sigma^{-1} >= P / s^2), on graphs with isolated vertices and several components too."""
    graph = nx.gnp_random_graph(n, p, seed=seed)
    n, edges = edge_array(graph)
    lap = laplacian(n, edges)
    c = 10.0**log_ratio
    dense = sigma_inverse_diagonal(lap, 1.0, c)
    grounded = sigma_inverse_diagonal(lap, 1.0, c, sparse=True)
    assert np.allclose(dense, grounded, rtol=1e-9, atol=0)
    sizes = deflate(lap, 1.0, c)
    lower = 1.0 / sizes.sizes[sizes.labels]
    assert np.all(dense >= lower * (1 - 1e-12)) and np.all(dense <= 1 + 1e-12)


@pytest.mark.parametrize("name", ["path7", "barbell", "star7", "gnp"])
@pytest.mark.parametrize("ratio", [0.7, 1e6])
def test_every_deletion_matches_its_own_inverse(name, ratio):
    """Per vertex, not only the maximum: the Woodbury update (batched for ordinary vertices, one
    at a time for articulation points) equals a fresh deflated inverse of G - v."""
    graph = GRAPHS[name]
    n, edges = edge_array(graph)
    best, arg = deletion_maxima(laplacian(n, edges), 0.8, ratio)
    for v in range(n):
        keep = np.ones(n, dtype=bool)
        keep[v] = False
        diag = sigma_inverse_diagonal(laplacian(n, edges, keep), 0.8, ratio)
        others = np.flatnonzero(keep)
        assert best[v] == pytest.approx(diag.max(), rel=1e-10)
        assert diag[list(others).index(arg[v])] == pytest.approx(diag.max(), rel=1e-10)


def test_an_edgeless_sparse_sigma_is_diagonal():
    lap = sp.csr_matrix((4, 4))
    assert np.allclose(sigma_inverse_diagonal(lap, 2.0, 5.0, sparse=True), 0.25, rtol=1e-15)
