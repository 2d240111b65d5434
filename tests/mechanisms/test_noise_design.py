"""Edge-wise noise designs (docs/noise-design.md): data, JSON, and DECOR's generator rescaled."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest
import torch

from privdl.errors import ConfigError
from privdl.mechanisms.correlated import decor_noise
from privdl.mechanisms.noise_design import NoiseDesign, load_design, save_design
from privdl.mechanisms.prng import normal_streams
from privdl.mechanisms.secrets import agree_edge_secrets, node_noise_keys


def _setup(n: int = 12, p: float = 0.4, seed: int = 3):
    graph = nx.gnp_random_graph(n, p, seed=seed)
    edges = np.array(sorted(tuple(sorted(e)) for e in graph.edges()), dtype=np.int64)
    edge_keys = agree_edge_secrets(edges, n, seed=seed, session_id="design").edge_keys()
    return edges, edge_keys, node_noise_keys(range(n), seed=seed)


def _random_design(edges: np.ndarray, n: int, seed: int = 0) -> NoiseDesign:
    rng = np.random.default_rng(seed)
    return NoiseDesign(rng.uniform(0.1, 2.0, n), rng.uniform(0.0, 5.0, len(edges)), edges)


def test_uniform_design_is_bit_identical_to_decor() -> None:
    edges, edge_keys, node_keys = _setup()
    design = NoiseDesign.uniform(edges, 12, sigma_cdp=0.7, sigma_cor=3.1)
    for dtype in (torch.float32, torch.float64):
        want = decor_noise(
            edge_keys, edges, 12, node_keys, 5, 301, sigma_cor=3.1, sigma_cdp=0.7, dtype=dtype
        )
        got = decor_noise(
            edge_keys, edges, 12, node_keys, 5, 301, sigma_cor=0.0, sigma_cdp=0.0,
            dtype=dtype, design=design,
        )  # fmt: skip
        assert got is not None and want is not None
        assert torch.equal(got, want)


def test_designed_noise_matches_independent_per_node_sum() -> None:
    edges, edge_keys, node_keys = _setup()
    n, size, t = 12, 257, 4
    design = _random_design(edges, n)
    got = decor_noise(
        edge_keys, edges, n, node_keys, t, size, sigma_cor=0.0, sigma_cdp=0.0,
        dtype=torch.float64, design=design,
    )  # fmt: skip
    assert got is not None
    want = np.zeros((n, size))
    for e, (u, v) in enumerate(edges):
        if design.edge_var[e] > 0:
            z = normal_streams([edge_keys[e]], t, size, dtype=torch.float64)[0].numpy()
            want[u] += np.sqrt(design.edge_var[e]) * z
            want[v] -= np.sqrt(design.edge_var[e]) * z
    own = normal_streams(node_keys, t, size, dtype=torch.float64).numpy()
    want += np.sqrt(design.node_var)[:, None] * own
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    # the node-subset rows equal the full rows bit for bit
    sub = [3, 7, 0]
    part = decor_noise(
        edge_keys, edges, n, [node_keys[i] for i in sub], t, size, sigma_cor=0.0,
        sigma_cdp=0.0, dtype=torch.float64, design=design, nodes=sub,
    )  # fmt: skip
    assert part is not None and torch.equal(part, got[sub])


def test_designed_correlated_part_cancels_and_has_the_design_covariance() -> None:
    edges, edge_keys, node_keys = _setup(n=8, p=0.6, seed=1)
    n = 8
    rng = np.random.default_rng(2)
    design = NoiseDesign(np.zeros(n), rng.uniform(0.2, 3.0, len(edges)), edges)
    noise = decor_noise(
        edge_keys, edges, n, node_keys, 0, 200_000, sigma_cor=0.0, sigma_cdp=0.0,
        dtype=torch.float64, design=design,
    )  # fmt: skip
    assert noise is not None
    assert noise.sum(0).abs().max() <= 1e-12 * noise.abs().max()
    full = NoiseDesign(rng.uniform(0.5, 1.5, n), design.edge_var, edges)
    noise = decor_noise(
        edge_keys, edges, n, node_keys, 1, 200_000, sigma_cor=0.0, sigma_cdp=0.0,
        dtype=torch.float64, design=full,
    )  # fmt: skip
    assert noise is not None
    cov = np.cov(noise.numpy())
    scale = np.sqrt(np.outer(np.diag(full.covariance()), np.diag(full.covariance())))
    assert np.max(np.abs(cov - full.covariance()) / scale) < 0.02


def test_json_round_trip_and_one_line_errors(tmp_path) -> None:
    edges, _, _ = _setup()
    design = _random_design(edges, 12)
    path = tmp_path / "d.json"
    save_design(design, path)
    back = load_design(path)
    assert np.array_equal(back.node_var, design.node_var)
    assert np.array_equal(back.edge_var, design.edge_var)
    assert np.array_equal(back.edges, design.edges)
    data = json.loads(path.read_text())
    for change, match in [
        ({"format": "x"}, "format"),
        ({"edge_var": data["edge_var"][:-1]}, "entries"),
        ({"node_var": [-1.0] * 12}, ">= 0"),
        ({"extra": 1}, "unknown keys"),
        ({"edges": [[1, 0]] + data["edges"][1:]}, "u < v"),
    ]:
        path.write_text(json.dumps({**data, **change}))
        with pytest.raises(ConfigError, match=match) as err:
            load_design(path)
        assert "\n" not in str(err.value)
    path.write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_design(path)


def test_design_for_another_graph_is_refused() -> None:
    edges, edge_keys, node_keys = _setup()
    design = _random_design(edges[:-1], 12)
    with pytest.raises(ConfigError, match="another edge set"):
        decor_noise(
            edge_keys, edges, 12, node_keys, 0, 8, sigma_cor=0.0, sigma_cdp=0.0, design=design
        )
