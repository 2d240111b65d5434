"""DECOR's CPU noise drawn and summed in column blocks (privdl.mechanisms._streamed): the values
of the two-stage path (every stream's row, then the signed sum) bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privdl.mechanisms import _aesni, _pool
from privdl.mechanisms import correlated as corr
from privdl.mechanisms._streamed import streamed_decor_rows
from privdl.mechanisms.secrets import agree_edge_secrets
from privdl.mechanisms.ziggurat import key_array_rows
from privdl.topology import parse_graph

pytestmark = pytest.mark.skipif(not _aesni.active(), reason="the streamed kernel needs AES-NI")


def _draw_inputs(spec: str, nodes):
    topo = parse_graph(spec)
    n = topo.n
    edges = np.asarray(topo.edges, dtype=np.int64)
    keys = agree_edge_secrets(edges, n, seed=3, session_id=spec).edge_keys()
    rows = list(range(n)) if nodes is None else nodes
    own = [bytes([9, r]) * 16 for r in rows]
    return edges, n, keys, own


def _two_stage(plan, counter, size, dtype, sigma_cor, sigma_cdp):
    out = torch.zeros((plan.n_rows, size), dtype=dtype)
    z = torch.from_numpy(key_array_rows(plan.key_array(), counter, size)).to(dtype)
    corr._signed_sum_cpu(
        out, z, plan.lower, plan.upper, sigma_cor, use_cor=sigma_cor > 0,
        node_first=plan.n_edge_streams if sigma_cdp > 0 else -1, cdp_scale=sigma_cdp,
        slots=plan.slots(),
    )  # fmt: skip
    return out


@pytest.mark.parametrize("spec", ["torus:4x4", "star:9", "er:12:0.5:3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sigmas", [(0.7, 0.3), (0.7, 0.0), (0.0, 0.3)])
@pytest.mark.parametrize("nodes", [None, [5, 0, 2]])
def test_streamed_rows_equal_the_two_stage_draw_bitwise(spec, dtype, sigmas, nodes) -> None:
    sigma_cor, sigma_cdp = sigmas
    edges, n, keys, own = _draw_inputs(spec, nodes)
    plan = corr._CpuPlan(keys, edges, n, own, nodes, sigma_cor > 0, sigma_cdp > 0)
    size, counter = 5003, 12
    expected = _two_stage(plan, counter, size, dtype, sigma_cor, sigma_cdp)
    assert expected.abs().min() > 0
    # blocks of 16 and 700 columns cross many stretch boundaries; 2048 is the default; with no
    # margin every stretch first runs out of words and is redone with more
    for block, extra in [(16, 64), (700, 64), (2048, 64), (2048, -(10**9))]:
        got = torch.full((plan.n_rows, size), float("nan"), dtype=dtype)
        streamed_decor_rows(
            plan.key_array(), counter, got.numpy(), plan.slots(), use_cor=sigma_cor > 0,
            cor_scale=sigma_cor, node_first=plan.n_edge_streams if sigma_cdp > 0 else -1,
            cdp_scale=sigma_cdp, block=block, _extra_words=extra,
        )  # fmt: skip
        assert torch.equal(got, expected), (block, extra)


def test_decor_noise_beside_the_compute_is_streamed_with_the_values_of_the_pool(
    monkeypatch,
) -> None:
    """Drawn beside torch's threads (a step's background draw) decor_noise takes the one-thread
    streamed kernel; in the foreground with a pool of 2 the torus's rows are streamed in two
    ranges side by side (28 streams each of 48), and a dense graph whose ranges would redraw
    most edges is split over the pool in two stages. Same values every way."""
    edges, n, keys, own = _draw_inputs("torus:4x4", None)
    size = 70_001  # 48 streams: above the size where the foreground splits the draw
    calls: list[int] = []
    real = corr.streamed_decor_rows
    monkeypatch.setattr(
        corr,
        "streamed_decor_rows",
        lambda keys, *a, **k: (calls.append(len(keys)), real(keys, *a, **k))[1],
    )
    monkeypatch.setattr(corr, "kernel_cpus", lambda: 2)  # the foreground: a pool of 2
    corr._PLAN.clear()
    pooled = corr.decor_noise(keys, edges, n, own, 3, size, sigma_cor=0.5, sigma_cdp=0.2)
    assert sorted(calls) == [28, 28]
    monkeypatch.setattr(corr, "kernel_cpus", _pool.kernel_cpus)
    threads = torch.get_num_threads()
    torch.set_num_threads(_pool.usable_cpus())
    try:
        beside = _pool.beside_compute(
            lambda: corr.decor_noise(keys, edges, n, own, 3, size, sigma_cor=0.5, sigma_cdp=0.2)
        )()
    finally:
        torch.set_num_threads(threads)
    assert sorted(calls) == [28, 28, 48]
    assert pooled is not None and beside is not None and torch.equal(pooled, beside)

    # complete:16 without node noise in four ranges of 4 rows: 54 of its 120 edges each, 1.8x
    # the streams in all (above ROW_GROUP_MAX_REDRAW): the two-stage pool; in two ranges 1.53x
    edges, n, keys, own = _draw_inputs("complete:16", None)
    expected = _two_stage(
        corr._CpuPlan(keys, edges, n, own, None, True, False), 3, 5003, torch.float32, 0.5, 0.0
    )
    for workers, streamed in [(4, []), (2, [92, 92])]:
        calls.clear()
        corr._PLAN.clear()
        monkeypatch.setattr(corr, "kernel_cpus", lambda w=workers: w)
        monkeypatch.setattr(corr, "_PARALLEL_ZIGGURAT_BYTES", 0)  # split even this small draw
        got = corr.decor_noise(keys, edges, n, own, 3, 5003, sigma_cor=0.5, sigma_cdp=0.0)
        assert calls == streamed and torch.equal(got, expected), workers


@pytest.mark.parametrize("spec", ["ring:16", "torus:4x4", "star:9", "er:12:0.5:3"])
@pytest.mark.parametrize("sigmas", [(0.7, 0.3), (0.7, 0.0), (0.0, 0.3)])
@pytest.mark.parametrize("nodes", [None, [5, 0, 2, 7, 3]])
@pytest.mark.parametrize("workers", [2, 3])
def test_row_ranges_streamed_side_by_side_equal_one_streamed_draw(
    monkeypatch, spec, sigmas, nodes, workers
) -> None:
    """The rows split into ranges, each streamed with the streams incident to it (edges
    between ranges drawn by both), give the one-thread streamed draw bit for bit, for all
    nodes and for a shard (rows in any order)."""
    sigma_cor, sigma_cdp = sigmas
    edges, n, keys, own = _draw_inputs(spec, nodes)
    plan = corr._CpuPlan(keys, edges, n, own, nodes, sigma_cor > 0, sigma_cdp > 0)
    size, counter = 5003, 7
    expected = torch.full((plan.n_rows, size), float("nan"))
    streamed_decor_rows(
        plan.key_array(), counter, expected.numpy(), plan.slots(), use_cor=sigma_cor > 0,
        cor_scale=sigma_cor, node_first=plan.n_edge_streams if sigma_cdp > 0 else -1,
        cdp_scale=sigma_cdp,
    )  # fmt: skip
    monkeypatch.setattr(corr, "ROW_GROUP_MAX_REDRAW", 10.0)  # never fall back to two stages
    bounds = [start for start, _, _ in plan.row_groups(workers)] + [plan.n_rows]
    assert len(bounds) == workers + 1 and bounds == sorted(bounds) and bounds[0] == 0
    monkeypatch.setattr(corr, "kernel_cpus", lambda: workers)
    monkeypatch.setattr(corr, "_PARALLEL_ZIGGURAT_BYTES", 0)
    monkeypatch.setattr(corr, "BLOCK_COLUMNS", 100)  # this size counts as long rows
    corr._PLAN.clear()
    got = corr.decor_noise(
        keys, edges, n, own, counter, size, sigma_cor=sigma_cor, sigma_cdp=sigma_cdp,
        nodes=nodes, backend="aes-ziggurat",
    )  # fmt: skip
    assert torch.equal(got, expected)
