"""Dataset record validation and the load_dataset registry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from privdl.data import DATASET_NAMES, A9a, Dataset, load_dataset
from privdl.errors import DataError, PrivdlError


def _ds(x: torch.Tensor, y: torch.Tensor) -> Dataset:
    return Dataset(x, y, x[:2], y[:2], name="toy", n_classes=3, source_note="test")


def test_nan_and_inf_features_are_rejected() -> None:
    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 2, 0])
    _ds(x, y)
    for bad in (float("nan"), float("inf")):
        x2 = x.clone()
        x2[3, 1] = bad
        with pytest.raises(DataError, match="NaN/Inf"):
            _ds(x2, y)


def test_shape_and_label_checks() -> None:
    with pytest.raises(DataError, match="rows"):
        _ds(torch.zeros(4, 2), torch.tensor([0, 1, 2]))
    with pytest.raises(DataError, match="outside"):
        _ds(torch.zeros(4, 2), torch.tensor([0, 1, 3, 0]))
    with pytest.raises(DataError, match="floating"):
        _ds(torch.zeros(4, 2, dtype=torch.int64), torch.tensor([0, 1, 2, 0]))


def test_to_float64_keeps_values() -> None:
    ds = _ds(
        torch.randn(4, 2, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 0])
    )
    d64 = ds.to_float64()
    assert d64.x_train.dtype == torch.float64 and torch.equal(d64.x_train.float(), ds.x_train)
    assert d64.name == ds.name and torch.equal(d64.y_test, ds.y_test)


def test_adult_alias_and_a9a_conversion(a9a: A9a) -> None:
    ds = load_dataset("adult")
    ref = a9a
    assert ds.name == "a9a" and ds.n_classes == 2 and "REBUILT" in ds.source_note
    np.testing.assert_array_equal(ds.x_test.numpy(), ref.x_test)
    np.testing.assert_array_equal(2 * ds.y_train.numpy() - 1, ref.y_train)


def test_unknown_name_and_bad_normalize(tmp_path: Path) -> None:
    with pytest.raises(PrivdlError, match="unknown dataset"):
        load_dataset("imagenet")
    assert "mnist" in DATASET_NAMES and "adult" in DATASET_NAMES
    with pytest.raises(DataError, match="normalize"):
        load_dataset("synthetic-cifar10", n_train=4, n_test=2, normalize="zscore")


def test_mnist_missing_is_a_one_line_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("mnist", data_dir=tmp_path, download=True)  # PRIVDL_OFFLINE=1 in conftest
    assert "\n" not in str(err.value) and "train-images-idx3-ubyte" in str(err.value)
