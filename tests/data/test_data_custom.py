"""User-supplied data: the accepted forms agree, per-node splits, validation, fingerprint, and the
partitioning SupervisedTask does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset, TensorDataset

from privdl.data.custom import UserData, partition_parts, user_data
from privdl.data.partition import partition_dirichlet, partition_iid, partition_shards
from privdl.errors import ConfigError, DataError


def _xy(n: int = 12, shape: tuple[int, ...] = (3,), classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g)
    y = torch.arange(n) % classes
    return x, y


class _MapDS(TorchDataset):
    """A custom map-style Dataset returning (numpy x, python int y)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x.numpy(), y.tolist()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class _Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(2), 0


def _same(a: UserData, b: UserData) -> None:
    for k in ("x_train", "y_train", "x_test", "y_test"):
        ta, tb = getattr(a.dataset, k), getattr(b.dataset, k)
        assert ta.dtype == tb.dtype and torch.equal(ta, tb), k
    assert a.dataset.n_classes == b.dataset.n_classes
    assert a.fingerprint == b.fingerprint


def test_tensors_and_numpy_give_the_same_dataset() -> None:
    x, y = _xy(shape=(2, 3))
    a = user_data((x, y))
    b = user_data([x.numpy(), y.numpy().astype(np.int32)])
    _same(a, b)
    assert a.parts is None and a.n_nodes is None
    assert a.dataset.x_train.dtype == torch.float32 and a.dataset.y_train.dtype == torch.int64
    assert a.dataset.input_shape == (2, 3)
    x[0, 0, 0] = 99.0  # the record does not alias the caller's tensor
    assert a.dataset.x_train[0, 0, 0] != 99.0


def test_feature_dtypes() -> None:
    x, y = _xy()
    ints = user_data((np.arange(12 * 3, dtype=np.uint8).reshape(12, 3), y))
    assert ints.dataset.x_train.dtype == torch.float32
    assert ints.dataset.x_train[1, 0] == 3.0  # cast, not rescaled
    assert user_data((x.double(), y)).dataset.x_train.dtype == torch.float64


def test_torch_datasets_match_tensors() -> None:
    x, y = _xy(shape=(2, 2))
    ref = user_data((x, y))
    _same(ref, user_data(TensorDataset(x, y)))
    _same(ref, user_data(_MapDS(x, y)))


def test_per_node_lists_record_parts() -> None:
    nodes = [_xy(n, seed=s) for n, s in ((5, 1), (3, 2), (7, 3))]
    mixed = [nodes[0], TensorDataset(*nodes[1]), _MapDS(*nodes[2])]
    ud = user_data(mixed)
    assert ud.n_nodes == 3 and ud.dataset.x_train.shape == (15, 3)
    for part, (xn, yn) in zip(ud.parts, nodes, strict=True):
        assert part.dtype == np.int64
        assert torch.equal(ud.dataset.x_train[part], xn)
        assert torch.equal(ud.dataset.y_train[part], yn)
    assert ud.node_parts(3, "dirichlet:0.5", seed=0) is ud.parts
    with pytest.raises(ConfigError, match="3 per-node datasets but the run has 4 nodes"):
        ud.node_parts(4, seed=0)


def test_per_node_dtypes_promote_to_float64() -> None:
    (x1, y1), (x2, y2) = _xy(4), _xy(4, seed=1)
    ud = user_data([(x1, y1), (x2.double(), y2)])
    assert ud.dataset.x_train.dtype == torch.float64


def test_eval_data_is_the_test_split() -> None:
    (x, y), (xe, ye) = _xy(12), _xy(6, seed=5)
    ud = user_data((x, y), eval_data=TensorDataset(xe, ye))
    assert torch.equal(ud.dataset.x_test, xe) and torch.equal(ud.dataset.y_test, ye)
    assert "6 user-supplied eval examples" in ud.dataset.source_note
    same = user_data((x, y))
    assert torch.equal(same.dataset.x_test, x) and torch.equal(same.dataset.y_test, y)
    assert "test split IS the training data" in same.dataset.source_note


def test_n_classes_inferred_and_given() -> None:
    x, y = _xy(12, classes=3)
    assert user_data((x, y)).dataset.n_classes == 3
    ye = torch.full((2,), 5)
    assert user_data((x, y), eval_data=(x[:2], ye)).dataset.n_classes == 6  # eval labels count
    assert user_data((x, y), n_classes=10).dataset.n_classes == 10
    with pytest.raises(DataError, match=r"train data has label 2 >= n_classes=2"):
        user_data((x, y), n_classes=2)
    with pytest.raises(DataError, match=r"eval data has label 5 >= n_classes=4"):
        user_data((x, y), eval_data=(x[:2], ye), n_classes=4)
    with pytest.raises(ConfigError, match="n_classes must be a positive integer"):
        user_data((x, y), n_classes=0)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda x, y: (x[:, 0], y), DataError, r"X must have shape \(N, \*input_shape\)"),
        (lambda x, y: (x, y[:-1]), DataError, "X has 12 examples but y has 11"),
        (lambda x, y: (x, y.float()), DataError, "integer class labels, got dtype torch.float32"),
        (lambda x, y: (x, y[:, None]), DataError, r"y must have shape \(N,\)"),
        (lambda x, y: (x, y - 1), DataError, "negative label -1"),
        (lambda x, y: (x.index_fill(0, torch.tensor([3]), float("nan")), y), DataError, "NaN/Inf"),
        (lambda x, y: (x.index_fill(0, torch.tensor([3]), float("inf")), y), DataError, "NaN/Inf"),
        (lambda x, y: (x[:0], y[:0]), DataError, "train data is empty"),
        (lambda x, y: TensorDataset(x[:0], y[:0]), DataError, "train data is empty"),
        (lambda x, y: _MapDS(x[:0], y[:0]), DataError, "train data is empty"),
        (lambda x, y: [], DataError, "empty list"),
        (lambda x, y: [(x, y), (x[:0], y[:0])], DataError, "node 1 has no examples"),
        (lambda x, y: [(x, y), (x[:, :2], y)], DataError, r"node 1: examples have shape \(2,\)"),
        (lambda x, y: _Stream(), ConfigError, "IterableDataset cannot be used"),
        (lambda x, y: (x, y.tolist()), ConfigError, "must be an \\(X, y\\) pair"),
        (lambda x, y: {"x": x, "y": y}, ConfigError, "got a dict"),
        (lambda x, y: (x.numpy().astype(object), y), DataError, "unsupported numpy dtype"),
    ],
)
def test_bad_input_raises(make, error, match) -> None:
    x, y = _xy(12)
    with pytest.raises(error, match=match):
        user_data(make(x, y))


def test_bad_eval_data_raises() -> None:
    x, y = _xy(12)
    with pytest.raises(ConfigError, match="eval_data must be .* \\(not per-node\\)"):
        user_data((x, y), eval_data=[(x, y), (x, y)])
    with pytest.raises(DataError, match=r"eval data examples have shape \(2,\)"):
        user_data((x, y), eval_data=(x[:, :2], y))
    with pytest.raises(DataError, match="eval data is empty"):
        user_data((x, y), eval_data=(x[:0], y[:0]))


def test_bad_dataset_items_raise() -> None:
    class Triples(TorchDataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int):
            return torch.zeros(2), 0, "extra"

    class Ragged(TorchDataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            return torch.zeros(2 + (i == 2)), 0

    with pytest.raises(DataError, match=r"item 0 must be an \(x, y\) pair"):
        user_data(Triples())
    with pytest.raises(DataError, match=r"item 2's x has shape \(3,\)"):
        user_data(Ragged())


def test_fingerprint() -> None:
    x, y = _xy(12)
    fp = user_data((x, y)).fingerprint
    assert len(fp) == 64 and fp == user_data((x.clone(), y.clone())).fingerprint
    x2 = x.clone()
    x2[5, 1] += 1e-3
    y2 = y.clone()
    y2[0] = 2
    variants = [
        user_data((x2, y)),
        user_data((x, y2)),
        user_data((x.double(), y)),
        user_data((x, y), eval_data=(x[:4], y[:4])),
        user_data((x, y), n_classes=4),
        user_data([(x[:6], y[:6]), (x[6:], y[6:])]),
        user_data([(x[:5], y[:5]), (x[5:], y[5:])]),
    ]
    prints = {fp} | {v.fingerprint for v in variants}
    assert len(prints) == len(variants) + 1
    ud = user_data((x, y))
    ud.check_fingerprint(fp)
    with pytest.raises(ConfigError, match="the data differs from the run's"):
        ud.check_fingerprint(variants[0].fingerprint)


@pytest.mark.parametrize("spec", ["iid", "dirichlet:0.5", "shards:2"])
def test_partition_parts_matches_supervised_task(spec: str) -> None:
    labels = np.random.default_rng(7).integers(0, 10, 300)
    n_nodes, seed = 6, 3
    rng = np.random.default_rng(seed)  # as SupervisedTask.__post_init__ draws them
    if spec == "iid":
        expected = partition_iid(labels, n_nodes, rng=rng)
    elif spec.startswith("dirichlet"):
        expected = partition_dirichlet(labels, n_nodes, 0.5, rng=rng)
    else:
        expected = partition_shards(labels, n_nodes, 2, rng=rng)
    got = partition_parts(labels, n_nodes, spec, seed=seed)
    assert len(got) == n_nodes
    for g, e in zip(got, expected, strict=True):
        assert np.array_equal(g, e)
    again = partition_parts(torch.from_numpy(labels), n_nodes, spec, seed=seed)
    assert all(np.array_equal(g, a) for g, a in zip(got, again, strict=True))
    other = partition_parts(labels, n_nodes, spec, seed=seed + 1)
    assert not all(np.array_equal(g, o) for g, o in zip(got, other, strict=True))
    ud = user_data((torch.zeros(300, 1), torch.from_numpy(labels)))
    assert all(
        np.array_equal(g, a) for g, a in zip(got, ud.node_parts(6, spec, seed=3), strict=True)
    )


@pytest.mark.parametrize("spec", ["random", "dirichlet", "dirichlet:x", "shards:-1", "iid:2"])
def test_partition_parts_rejects_unknown_spec(spec: str) -> None:
    with pytest.raises(ConfigError, match="partition"):
        partition_parts(np.zeros(10, dtype=np.int64), 2, spec, seed=0)
