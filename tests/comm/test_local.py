import numpy as np
import pytest
import torch

from privdl.comm import LocalCommunicator
from privdl.topology import ExponentialGraph, mixing_matrix, parse_graph
from privdl.topology.mixing import MixingMatrix


def _tree(n, gen, dtype=torch.float64):
    return {
        "w": torch.randn(n, 3, 4, generator=gen, dtype=dtype),
        "b": torch.randn(n, 5, generator=gen, dtype=dtype),
    }


def test_mix_equals_numpy_product():
    t = parse_graph("torus:4x4")
    w = mixing_matrix(t, "metropolis")
    comm = LocalCommunicator(w, dtype=torch.float64)
    tree = _tree(16, torch.Generator().manual_seed(0))
    out = comm.mix(tree, 0)
    for k, v in tree.items():
        ref = w.dense() @ v.reshape(16, -1).numpy()
        assert np.allclose(out[k].reshape(16, -1).numpy(), ref, atol=1e-14)


def test_sparse_path_equals_dense(monkeypatch):
    t = parse_graph("regular:300:4:1")
    w = mixing_matrix(t, "metropolis")
    tree = _tree(300, torch.Generator().manual_seed(1))
    sparse = LocalCommunicator(w, dtype=torch.float64)
    assert sparse.matrix(0).layout == torch.sparse_csr
    import privdl.comm.local as local

    monkeypatch.setattr(local, "SPARSE_ABOVE", 10_000)
    dense = LocalCommunicator(w, dtype=torch.float64)
    assert dense.matrix(0).layout == torch.strided
    a, b = sparse.mix(tree, 0), dense.mix(tree, 0)
    for k in tree:
        assert torch.allclose(a[k], b[k], atol=1e-13)


@pytest.mark.parametrize("n", [5, 16])
def test_expo_roll_equals_matrix(n):
    e = ExponentialGraph(n)
    comm = LocalCommunicator(e, dtype=torch.float64)
    tree = _tree(n, torch.Generator().manual_seed(2))
    for t in range(2 * e.period):
        out = comm.mix(tree, t)
        p = e.mixing(t).dense()
        for k, v in tree.items():
            assert np.allclose(
                out[k].reshape(n, -1).numpy(), p @ v.reshape(n, -1).numpy(), atol=1e-14
            )


def test_push_sum_preserves_sums_and_debiases_on_irregular_graph():
    """An irregular directed graph: node 0 sends to {1,2,3}, others to (i+1) mod 5; weights 1/(outdeg+1)."""
    n = 5
    out_nb = {0: [1, 2, 3], 1: [2], 2: [3], 3: [4], 4: [0]}
    p = np.zeros((n, n))
    for j, nbs in out_nb.items():
        for i in [j, *nbs]:
            p[i, j] = 1 / (len(nbs) + 1)
    m = MixingMatrix("custom", __import__("scipy.sparse", fromlist=["csr_matrix"]).csr_matrix(p))
    assert m.column_stochastic and not m.row_stochastic
    comm = LocalCommunicator(lambda t: m, n_nodes=n, dtype=torch.float64)
    x = {"x": torch.arange(n, dtype=torch.float64).reshape(n, 1) * 3.0 + 1.0}
    w = torch.ones(n, dtype=torch.float64)
    target = x["x"].mean()
    for t in range(200):
        x, w = comm.push_sum(x, w, t)
        assert torch.isclose(w.sum(), torch.tensor(float(n), dtype=torch.float64))
        assert torch.isclose(x["x"].sum(), target * n)
    assert (w - 1).abs().max() > 0.05  # weights drift: de-biasing is exercised
    z = x["x"][:, 0] / w
    assert torch.allclose(z, target.expand(n), atol=1e-10)
    assert (x["x"][:, 0] - target).abs().max() > 0.05  # raw x do not converge to the mean


def test_average_and_weighted_sum():
    comm = LocalCommunicator(
        mixing_matrix(parse_graph("ring:4"), "metropolis"), dtype=torch.float64
    )
    tree = _tree(4, torch.Generator().manual_seed(3))
    avg = comm.average(tree)
    ws = comm.weighted_sum(tree, torch.full((4,), 0.25, dtype=torch.float64))
    for k in tree:
        assert torch.allclose(avg[k], tree[k].mean(0))
        assert torch.allclose(ws[k], avg[k])
    b = comm.broadcast(avg)
    assert b["w"].shape == tree["w"].shape


def test_one_node_with_unit_weight_mixes_to_the_same_values_without_a_product():
    """complete:1 (DP-SGD with a trusted aggregator) has W = [[1]]: mix returns the leaves
    themselves, equal as numbers to the product W @ x, NaN and inf included (the product may
    turn -0.0 into +0.0, an equal number: the BLAS sums from +0)."""
    comm = LocalCommunicator(mixing_matrix(parse_graph("complete:1"), "decor"))
    x = torch.tensor([[-0.0, float("nan"), float("inf"), 1e-45, -3.5]])
    tree = {"a": x, "b": torch.randn(1, 2, 3)}
    mixed = comm.mix(tree, 0)
    for k, v in tree.items():
        assert mixed[k] is v
        product = comm._apply(v, 0)  # the general path: W @ x
        torch.testing.assert_close(product, v, rtol=0, atol=0, equal_nan=True)
    two = LocalCommunicator(mixing_matrix(parse_graph("complete:2"), "decor"))
    y = {"a": torch.tensor([[1.0, 2.0], [3.0, 5.0]])}
    assert two.mix(y, 0)["a"] is not y["a"]
    assert torch.allclose(two.mix(y, 0)["a"], torch.tensor([[2.0, 3.5], [2.0, 3.5]]))
