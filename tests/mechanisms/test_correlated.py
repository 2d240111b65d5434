"""Correlated noise N = K Z (DECOR Alg 4): cancellation, covariance sigma^2 L, Lemma 8, freshness."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch

from privdl.errors import ConfigError, GraphError, PrivacyError
from privdl.mechanisms.correlated import (
    correlated_noise,
    decor_noise,
    incidence_matrix,
    independent_noise,
    split_flat,
)
from privdl.mechanisms.prng import normal_streams
from privdl.mechanisms.secrets import agree_edge_secrets, node_noise_keys


def _edges(graph: nx.Graph) -> np.ndarray:
    return np.array(sorted(tuple(sorted(e)) for e in graph.edges()), dtype=np.int64)


GRAPHS = {
    "ring": nx.cycle_graph(16),
    "torus": nx.convert_node_labels_to_integers(nx.grid_2d_graph(4, 4, periodic=True)),
    "complete": nx.complete_graph(16),
    "random": nx.gnp_random_graph(12, 0.4, seed=3),
    "star": nx.star_graph(6),
}


def _setup(name: str, seed: int = 0):
    graph = GRAPHS[name]
    edges = _edges(graph)
    secrets = agree_edge_secrets(edges, graph.number_of_nodes(), seed=seed, session_id=name)
    return graph, edges, secrets.edge_keys()


def _uniform_self_mixing(graph: nx.Graph) -> np.ndarray:
    """W_ij = 1/(deg(i)+1) for j in N_i or j = i (paper Section 6, diagonal as in the authors' reference code; regular graphs)."""
    adjacency = nx.to_numpy_array(graph, nodelist=range(graph.number_of_nodes()))
    return (adjacency + np.eye(len(adjacency))) / (adjacency.sum(1, keepdims=True) + 1)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_noise_sums_to_zero_over_nodes_at_every_step(name: str) -> None:
    graph, edges, keys = _setup(name)
    n = graph.number_of_nodes()
    for t in range(3):
        noise = correlated_noise(keys, edges, n, t, 2001, sigma_cor=3.0, dtype=torch.float64)
        assert noise.abs().max() > 1.0
        assert noise.sum(0).abs().max() <= 1e-12 * noise.abs().max()


@pytest.mark.parametrize("name", ["ring", "random", "star"])
def test_matches_slow_per_node_loop_and_dense_incidence_product(name: str) -> None:
    graph, edges, keys = _setup(name)
    n, size, sigma = graph.number_of_nodes(), 257, 0.7
    noise = correlated_noise(keys, edges, n, 4, size, sigma_cor=sigma, dtype=torch.float64)
    # slow oracle: each node regenerates v_ij from the edge's key, sign by index order
    slow = torch.zeros(n, size, dtype=torch.float64)
    index = {tuple(e): k for k, e in enumerate(edges.tolist())}
    for i in range(n):
        for j in sorted(graph.neighbors(i)):
            z = (
                sigma
                * normal_streams(
                    [keys[index[(min(i, j), max(i, j))]]], 4, size, dtype=torch.float64
                )[0]
            )
            slow[i] += z if i < j else -z
    torch.testing.assert_close(noise, slow, rtol=1e-12, atol=1e-12)
    z_all = sigma * normal_streams(keys, 4, size, dtype=torch.float64)
    dense = incidence_matrix(edges, n, sparse=False) @ z_all
    torch.testing.assert_close(noise, dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_incidence_gram_is_the_laplacian(name: str) -> None:
    graph = GRAPHS[name]
    n = graph.number_of_nodes()
    k = incidence_matrix(_edges(graph), n, sparse=False).numpy()
    laplacian = nx.laplacian_matrix(graph, nodelist=range(n)).toarray()
    np.testing.assert_array_equal(k @ k.T, laplacian)
    assert np.all(k.sum(0) == 0)


@pytest.mark.parametrize("name", ["torus", "random"])
def test_covariance_per_coordinate_is_sigma2_laplacian(name: str) -> None:
    graph, edges, keys = _setup(name, seed=1)
    n, samples, sigma = graph.number_of_nodes(), 40_000, 1.5
    noise = correlated_noise(keys, edges, n, 0, samples, sigma_cor=sigma, dtype=torch.float64)
    cov_hat = (noise @ noise.T / samples).numpy()  # mean is 0 by construction
    cov = sigma**2 * nx.laplacian_matrix(graph, nodelist=range(n)).toarray()
    # Wishart: Var(S_ij) = (C_ii C_jj + C_ij^2) / samples; 6 standard deviations entrywise
    sd = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / samples)
    assert np.all(np.abs(cov_hat - cov) <= 6 * sd + 1e-12)
    degrees = np.array([graph.degree(i) for i in range(n)])
    np.testing.assert_array_equal(np.diag(cov), sigma**2 * degrees)  # Var(node i) = deg(i) sigma^2


@pytest.mark.parametrize("name", ["ring", "torus", "complete"])
def test_expected_frobenius_norm_is_2_E_d_sigma2(name: str) -> None:
    graph, edges, keys = _setup(name, seed=2)
    n, d, sigma = graph.number_of_nodes(), 5000, 0.5
    noise = correlated_noise(keys, edges, n, 1, d, sigma_cor=sigma, dtype=torch.float64)
    m = len(edges)
    # ||N||_F^2 = 2 sigma^2 chi^2_{|E| d}: mean 2|E|d sigma^2, sd 2 sigma^2 sqrt(2|E|d)
    value = float(noise.pow(2).sum())
    assert abs(value - 2 * m * d * sigma**2) <= 6 * 2 * sigma**2 * math.sqrt(2 * m * d)


@pytest.mark.parametrize(
    ("name", "expected"), [("ring", 32 / 9 * 10), ("torus", 76.8), ("complete", 0.0)]
)
def test_lemma8_noise_after_gossip(name: str, expected: float) -> None:
    """E||N W||_F^2 = d sigma^2 sum_edges ||W_u - W_v||^2 (Lemma 8, App. B.4); values for d = 10."""
    graph, edges, keys = _setup(name, seed=3)
    n, d, reps = 16, 10, 2000
    w = _uniform_self_mixing(graph)
    assert np.allclose(w, w.T) and np.allclose(w.sum(1), 1)
    closed = d * sum(np.sum((w[u] - w[v]) ** 2) for u, v in edges.tolist())
    assert closed == pytest.approx(expected, abs=1e-9)
    noise = correlated_noise(keys, edges, n, 7, d * reps, sigma_cor=1.0, dtype=torch.float64)
    mixed = torch.from_numpy(w) @ noise  # node-major: (N W)^T = W N for symmetric W
    estimate = float(mixed.pow(2).sum()) / reps
    # per coordinate the quadratic form z^T A z, A = K^T W^2 K: mean tr A, variance 2 tr(A^2)
    k = incidence_matrix(edges, n, sparse=False).numpy()
    a = k.T @ w @ w @ k
    sd = math.sqrt(2 * np.trace(a @ a) * d * reps) / reps
    assert abs(estimate - expected) <= 6 * sd + 1e-9


def test_fresh_noise_every_step() -> None:
    graph, edges, keys = _setup("torus")
    steps = [
        correlated_noise(keys, edges, 16, t, 5000, sigma_cor=1.0, dtype=torch.float64)
        for t in range(3)
    ]
    for a, b in [(steps[0], steps[1]), (steps[1], steps[2])]:
        assert not torch.equal(a, b)
        corr = np.corrcoef(a.numpy().ravel(), b.numpy().ravel())[0, 1]
        assert abs(corr) < 5 / math.sqrt(a.numel())


@pytest.mark.parametrize("backend", ["aes-ziggurat", "chacha20", "torch"])
@pytest.mark.parametrize("nodes", [[0], [5, 2], [15, 0, 7, 8], list(range(16))])
def test_node_subset_equals_rows_of_full_bitwise(backend: str, nodes: list[int]) -> None:
    _, edges, keys = _setup("torus", seed=8)
    full = correlated_noise(
        keys, edges, 16, 3, 333, sigma_cor=2.0, dtype=torch.float64, backend=backend
    )
    part = correlated_noise(
        keys, edges, 16, 3, 333, sigma_cor=2.0, dtype=torch.float64, nodes=nodes, backend=backend
    )
    assert torch.equal(part, full[nodes])


def test_sharded_processes_reproduce_single_process_noise() -> None:
    """Each 'process' knows only its incident edges' secrets; rows still match the simulator."""
    graph, edges, keys = _setup("ring", seed=6)
    full = correlated_noise(keys, edges, 16, 9, 100, sigma_cor=1.0, dtype=torch.float64)
    for shard in (list(range(0, 8)), list(range(8, 16))):
        owned = set(shard)
        own_keys = [
            k if owned & set(e) else None for k, e in zip(keys, edges.tolist(), strict=True)
        ]
        rows = correlated_noise(
            own_keys, edges, 16, 9, 100, sigma_cor=1.0, dtype=torch.float64, nodes=shard
        )
        assert torch.equal(rows, full[shard])


def test_both_endpoints_derive_opposite_contributions() -> None:
    edges = np.array([[3, 9]])
    secrets_3 = agree_edge_secrets(edges, 12, seed=1).edge_keys()
    secrets_9 = agree_edge_secrets(edges, 12, seed=1).edge_keys()
    at_3 = correlated_noise(
        secrets_3, edges, 12, 2, 50, sigma_cor=1.0, dtype=torch.float64, nodes=[3]
    )
    at_9 = correlated_noise(
        secrets_9, edges, 12, 2, 50, sigma_cor=1.0, dtype=torch.float64, nodes=[9]
    )
    assert torch.equal(at_3, -at_9) and at_3.abs().min() > 0


def test_float32_output_and_zero_sigma() -> None:
    _, edges, keys = _setup("ring")
    x64 = correlated_noise(keys, edges, 16, 0, 64, sigma_cor=1.0, dtype=torch.float64)
    x32 = correlated_noise(keys, edges, 16, 0, 64, sigma_cor=1.0)
    assert x32.dtype == torch.float32 and torch.equal(x32, x64.float())
    assert torch.count_nonzero(correlated_noise(keys, edges, 16, 0, 64, sigma_cor=0.0)) == 0


def test_input_errors() -> None:
    _, edges, keys = _setup("ring")
    with pytest.raises(PrivacyError):
        correlated_noise(keys, edges, 16, 0, 8, sigma_cor=-1.0)
    with pytest.raises(ConfigError):
        correlated_noise(keys[:-1], edges, 16, 0, 8, sigma_cor=1.0)
    with pytest.raises(GraphError):
        correlated_noise(keys, edges, 16, 0, 8, sigma_cor=1.0, nodes=[16])
    missing = [None] + keys[1:]
    with pytest.raises(PrivacyError, match="no secret"):
        correlated_noise(missing, edges, 16, 0, 8, sigma_cor=1.0, nodes=[0])
    rows = correlated_noise(missing, edges, 16, 0, 8, sigma_cor=1.0, nodes=[5])  # edge (0,1) unused
    assert rows.shape == (1, 8)


def test_independent_noise_scale_and_streams() -> None:
    keys = node_noise_keys(range(4), seed=0)
    noise = independent_noise(keys, 5, 30_000, sigma=2.5, dtype=torch.float64)
    torch.testing.assert_close(noise, 2.5 * normal_streams(keys, 5, 30_000, dtype=torch.float64))
    std = noise.std(dim=1).numpy()
    assert np.all(np.abs(std - 2.5) < 5 * 2.5 / math.sqrt(2 * 30_000))
    assert not torch.equal(
        noise, independent_noise(keys, 6, 30_000, sigma=2.5, dtype=torch.float64)
    )


def test_split_flat_into_layer_shapes() -> None:
    flat = torch.arange(3 * 17, dtype=torch.float64).reshape(3, 17)
    parts = split_flat(flat, {"w": (3, 4), "b": (5,)})
    assert parts["w"].shape == (3, 3, 4) and parts["b"].shape == (3, 5)
    for i in range(3):
        assert torch.equal(parts["w"][i].reshape(-1), flat[i, :12])
        assert torch.equal(parts["b"][i], flat[i, 12:])
    with pytest.raises(ConfigError):
        split_flat(flat, {"w": (4, 4)})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_agrees_with_cpu_and_keeps_subsets_bitwise() -> None:
    _, edges, keys = _setup("torus", seed=12)
    cpu = correlated_noise(
        keys, edges, 16, 2, 4001, sigma_cor=1.3, dtype=torch.float64, backend="chacha20"
    )
    gpu = correlated_noise(  # "auto" is chacha20 on CUDA
        keys, edges, 16, 2, 4001, sigma_cor=1.3, dtype=torch.float64, device="cuda"
    )
    # the streams are float32 numbers (layout v2): CUDA's and SLEEF's float32 libm differ by ulps
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)
    assert gpu.sum(0).abs().max() <= 1e-12 * gpu.abs().max()
    part = correlated_noise(
        keys, edges, 16, 2, 4001, sigma_cor=1.3, dtype=torch.float64, device="cuda", nodes=[9, 1]
    )
    assert torch.equal(part, gpu[[9, 1]])


@pytest.mark.parametrize("spec", ["torus:4x4", "er:12:0.5:3", "star:9"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nodes", [None, [3, 0, 5]])
def test_cpu_kernel_equals_the_torch_accumulation_bitwise(spec, dtype, nodes) -> None:
    """The fused CPU kernel (numba, columns over threads) vs slot-by-slot torch ops then scale."""
    from privdl.mechanisms import correlated as cm
    from privdl.mechanisms.secrets import as_edge_array
    from privdl.topology import parse_graph

    topo = parse_graph(spec)
    array = as_edge_array(topo.edges, topo.n)
    rows = np.arange(topo.n) if nodes is None else np.asarray(nodes)
    position = np.full(topo.n, -1)
    position[rows] = np.arange(len(rows))
    lower, upper = position[array[:, 0]], position[array[:, 1]]
    needed = np.flatnonzero((lower >= 0) | (upper >= 0))
    gen = torch.Generator().manual_seed(len(spec))
    z = torch.randn(len(needed), 300_001 if nodes is None else 777, generator=gen, dtype=dtype)
    expected = torch.zeros(len(rows), z.shape[1], dtype=dtype)
    cm._accumulate_signed(expected, z, lower[needed], upper[needed])
    expected.mul_(0.37)
    got = torch.empty_like(expected)
    cm._signed_sum_cpu(got, z, lower[needed], upper[needed], 0.37)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("backend", ["aes-ziggurat", "chacha20", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sigmas", [(0.7, 0.3), (0.7, 0.0), (0.0, 0.3)])
@pytest.mark.parametrize("nodes", [None, [9, 2, 4]])
def test_cpu_decor_noise_equals_the_composed_draws_bitwise(backend, dtype, sigmas, nodes) -> None:
    """decor_noise's one-call CPU path (one batch of streams, one fused kernel) gives
    correlated_noise(...) + independent_noise(...) exactly, whole or for a subset of nodes."""
    from privdl.mechanisms.correlated import decor_noise

    _, edges, keys = _setup("torus", seed=4)
    sigma_cor, sigma_cdp = sigmas
    rows = list(range(16)) if nodes is None else nodes
    own = [bytes([7, r]) * 16 for r in rows]  # a node's private key, 32 bytes
    size = 70_001 if nodes is None else 4099  # the larger one is split over worker threads
    kw = {"dtype": dtype, "backend": backend}
    got = decor_noise(
        keys, edges, 16, own, 5, size, sigma_cor=sigma_cor, sigma_cdp=sigma_cdp, nodes=nodes, **kw
    )
    cor = correlated_noise(keys, edges, 16, 5, size, sigma_cor=sigma_cor, nodes=nodes, **kw)
    ind = independent_noise(own, 5, size, sigma=sigma_cdp, **kw)
    if sigma_cor == 0:
        expected = ind
    elif sigma_cdp == 0:
        expected = cor
    else:
        expected = cor + ind
    assert got.dtype == dtype and torch.equal(got, expected)
    assert got.abs().min() > 0  # the sum really was formed (no zero rows left behind)


def test_cpu_decor_noise_refuses_node_keys_that_do_not_match_the_rows() -> None:
    from privdl.mechanisms.correlated import decor_noise

    _, edges, keys = _setup("ring")
    with pytest.raises(ConfigError, match="node noise keys"):
        decor_noise(keys, edges, 16, [b"k" * 32] * 3, 0, 10, sigma_cor=1.0, sigma_cdp=1.0)


def test_noise_block_length_fits_the_budget() -> None:
    from privdl.mechanisms.fused_noise import block_steps

    # DECOR MNIST on torus:4x4: 16 rows x 101,770 floats, 32 edge + 16 node streams
    per_step = 4 * 16 * 101_770 + 12 * 50_886 * 48
    assert block_steps(streams=48, rows=16, size=101_770, budget=10 * per_step) == 10
    assert block_steps(streams=48, rows=16, size=101_770, budget=10 * per_step - 1) == 9
    assert block_steps(streams=48, rows=16, size=101_770, budget=1) == 1  # at least one step
    assert block_steps(streams=1, rows=1, size=10, budget=2**30) == 32  # at most 32


def test_cpu_plan_reuse_gives_the_rows_of_a_fresh_draw_and_follows_changed_inputs() -> None:
    # the CPU path keeps its plan (incident edges, key array, slots) while the same edge-key
    # tuple, edges, rows and node keys come back; anything else rebuilds it
    from privdl.mechanisms import correlated as cor

    edges = np.array([(i, (i + 1) % 12) for i in range(12)])
    edges = np.sort(edges, axis=1)
    secrets = tuple(agree_edge_secrets(edges, 12, seed=3).edge_keys())
    nkeys = node_noise_keys(range(12), seed=3)
    kw = dict(sigma_cor=2.0, sigma_cdp=0.5, backend="aes-ziggurat")

    def fresh(*args, **extra):
        cor._PLAN.clear()
        return decor_noise(*args, **kw, **extra)

    first = decor_noise(secrets, edges, 12, nkeys, 4, 9, **kw)
    again = decor_noise(secrets, edges, 12, nkeys, 5, 9, **kw)  # reused plan, next step
    assert torch.equal(again, fresh(secrets, edges, 12, nkeys, 5, 9))
    assert torch.equal(first, fresh(secrets, edges, 12, nkeys, 4, 9))
    other = tuple(agree_edge_secrets(edges, 12, seed=4).edge_keys())  # new keys: new rows
    assert not torch.equal(decor_noise(other, edges, 12, nkeys, 4, 9, **kw), first)
    shard = decor_noise(secrets, edges, 12, nkeys[3:6], 4, 9, nodes=[3, 4, 5], **kw)
    assert torch.equal(shard, first[3:6])
    listed = list(secrets)  # a mutable list is never trusted from one call to the next
    decor_noise(listed, edges, 12, nkeys, 4, 9, **kw)
    listed[0] = other[0]
    assert torch.equal(
        decor_noise(listed, edges, 12, nkeys, 4, 9, **kw), fresh(listed, edges, 12, nkeys, 4, 9)
    )
