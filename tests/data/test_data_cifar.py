"""CIFAR-10 pickle reader on small files written in the standard format, and the synthetic stand-in."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from privdl.data import load_dataset, read_cifar_batch, synthetic_cifar
from privdl.errors import DataError


def _write_batches(root: Path, per_batch: int = 7) -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        obj = {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": []}
        with open(folder / name, "wb") as fh:
            pickle.dump(obj, fh, protocol=2)
        written[name] = (data, labels)
    return written


def test_reader_layout_is_channel_major(tmp_path: Path) -> None:
    written = _write_batches(tmp_path)
    x, y = read_cifar_batch(tmp_path / "cifar-10-batches-py" / "test_batch")
    data, labels = written["test_batch"]
    assert x.shape == (7, 3, 32, 32) and y.tolist() == labels
    # CIFAR row layout: 1024 red, then 1024 green, then 1024 blue values, each row-major 32x32
    for n, c, h, w in [(0, 0, 0, 0), (3, 1, 5, 7), (6, 2, 31, 31)]:
        assert x[n, c, h, w] == data[n, c * 1024 + h * 32 + w]


def test_load_dataset_cifar10_concatenates_batches(tmp_path: Path) -> None:
    written = _write_batches(tmp_path)
    ds = load_dataset("cifar10", data_dir=tmp_path, normalize="none")
    assert ds.x_train.shape == (35, 3, 32, 32) and ds.x_test.shape == (7, 3, 32, 32)
    expect_y = sum((written[f"data_batch_{k}"][1] for k in range(1, 6)), [])
    assert ds.y_train.tolist() == expect_y
    raw = written["data_batch_2"][0].reshape(7, 3, 32, 32).astype(np.float32)
    np.testing.assert_array_equal(ds.x_train[7:14].numpy(), raw)
    paper = load_dataset("cifar10", data_dir=tmp_path)  # Normalize((0.5,)*3, (0.5,)*3)
    np.testing.assert_allclose(paper.x_train[7:14].numpy(), (raw / 255 - 0.5) / 0.5, atol=1e-6)


def test_missing_and_incomplete_cifar(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="CIFAR-10 not found.*--data-dir"):
        load_dataset("cifar10", data_dir=tmp_path)
    _write_batches(tmp_path)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(DataError, match="data_batch_3"):
        load_dataset("cifar10", data_dir=tmp_path)


class _Evil:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo pwned > /dev/null",))


def test_rejects_malformed_and_hostile_pickles(tmp_path: Path) -> None:
    bad = tmp_path / "evil"
    bad.write_bytes(pickle.dumps({b"data": _Evil(), b"labels": []}))
    with pytest.raises(DataError, match="not allowed"):
        read_cifar_batch(bad)
    wrong = tmp_path / "wrong"
    wrong.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DataError, match="3072"):
        read_cifar_batch(wrong)
    trunc = tmp_path / "trunc"
    trunc.write_bytes(
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]})[:50]
    )
    with pytest.raises(DataError, match="cannot read"):
        read_cifar_batch(trunc)


def test_synthetic_cifar_is_seeded_and_learnable() -> None:
    a = synthetic_cifar(600, 400, seed=3)
    b = synthetic_cifar(600, 400, seed=3)
    c = synthetic_cifar(600, 400, seed=4)
    np.testing.assert_array_equal(a["x_train"], b["x_train"])
    assert not np.array_equal(a["x_train"], c["x_train"])
    assert a["x_train"].shape == (600, 3, 32, 32) and a["x_train"].dtype == np.float32
    # nearest class mean (estimated on train) classifies the test split well above chance (10%)
    xtr, ytr = a["x_train"].reshape(600, -1), a["y_train"]
    means = np.stack([xtr[ytr == k].mean(axis=0) for k in range(10)])
    d = ((a["x_test"].reshape(400, 1, -1) - means[None]) ** 2).sum(axis=-1)
    assert (d.argmin(axis=1) == a["y_test"]).mean() > 0.9
    ds = load_dataset("synthetic-cifar10", seed=3, n_train=600, n_test=400)
    assert "SYNTHETIC" in ds.source_note and ds.n_classes == 10
