"""a9a rebuild from UCI Adult: oracles are LIBSVM's published facts and a slow per-row encoder."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from privdl.data import adult as A
from privdl.errors import DataError


def test_layout_widths_add_to_123() -> None:
    # Platt (1998) / LIBSVM a9a: 5 bins for age, fnlwgt, education-num, hours; 2 for gain/loss.
    widths = dict(A.A9A_LAYOUT)
    assert [widths[c] for c in A.COLUMNS] == [5, 8, 5, 16, 5, 7, 14, 6, 5, 2, 2, 2, 5, 41]
    assert len(A.feature_names()) == 123


def test_row_counts_and_label_balance(a9a: A.A9a) -> None:
    # LIBSVM a9a / a9a.t: 32,561 / 16,281 rows, 123 features; UCI: 7,841 / 3,846 are >50K.
    assert a9a.x_train.shape == (32561, 123) and a9a.x_test.shape == (16281, 123)
    assert a9a.x_train.dtype == np.float32
    assert int((a9a.y_train == 1).sum()) == 7841 and int((a9a.y_test == 1).sum()) == 3846
    assert set(np.unique(a9a.y_train)) == {-1.0, 1.0}
    np.testing.assert_array_equal(a9a.y01_test, (a9a.y_test > 0).astype(np.float32))


def test_first_row_matches_libsvm_a9a(a9a: A.A9a) -> None:
    # The first line of LIBSVM's a9a file (1-based indices): -1 3 11 14 19 39 42 55 64 67 73 75 76 80 83
    expected = [3, 11, 14, 19, 39, 42, 55, 64, 67, 73, 75, 76, 80, 83]
    assert list(np.flatnonzero(a9a.x_train[0]) + 1) == expected
    assert a9a.y_train[0] == -1


def test_missing_values_give_empty_groups(a9a: A.A9a) -> None:
    # adult.names: 30,162 / 15,060 rows are complete, so 2,399 / 1,221 rows have a '?'.
    assert int((a9a.x_train.sum(axis=1) < 14).sum()) == 2399
    assert int((a9a.x_test.sum(axis=1) < 14).sum()) == 1221
    assert a9a.x_train.sum(axis=1).max() == 14
    # Holand-Netherlands (feature 123) occurs once in adult.data and never in adult.test.
    assert a9a.x_train[:, 122].sum() == 1 and a9a.x_test[:, 122].sum() == 0


def _slow_encode_line(line: str, edges: dict[str, np.ndarray]) -> np.ndarray:
    """Independent oracle: encode one raw CSV line by walking the names list."""
    fields = [f.strip() for f in line.split(",")][:14]
    values = dict(zip(A.COLUMNS, fields, strict=True))
    names = A.feature_names()
    row = np.zeros(123, dtype=np.float32)
    for j, name in enumerate(names):
        if "=" in name and not name.endswith(("=0", ">0")):
            col, cat = name.split("=", 1)
            row[j] = float(values[col] == cat)
        elif name.endswith("=0"):
            row[j] = float(float(values[name[:-2]]) == 0)
        elif name.endswith(">0"):
            row[j] = float(float(values[name[:-2]]) != 0)
        else:
            col, q = name.split(":q")
            v, e = float(values[col]), edges[col]
            lower = -np.inf if q == "1" else e[int(q) - 2]
            upper = np.inf if q == "5" else e[int(q) - 1]
            row[j] = float(lower < v <= upper)
    return row


def test_vectorized_encoder_matches_slow_oracle(a9a: A.A9a) -> None:
    text = gzip.decompress(
        (Path(A.__file__).parents[1] / "resources/adult/adult.test.gz").read_bytes()
    ).decode()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("|")]
    rng = np.random.default_rng(0)
    picks = np.concatenate([[0, len(lines) - 1], rng.choice(len(lines), 300, replace=False)])
    for k in picks:
        np.testing.assert_array_equal(
            a9a.x_test[k], _slow_encode_line(lines[k], a9a.bin_upper_edges), err_msg=lines[k]
        )


def test_quantile_edges_simple_cases() -> None:
    np.testing.assert_array_equal(A.quantile_upper_edges(np.arange(1.0, 101.0)), [20, 40, 60, 80])
    # ties are never split and every bin is non-empty
    v = np.array([40.0] * 50 + [10, 20, 30, 50, 60, 70, 80, 90])
    e = A.quantile_upper_edges(v)
    bins = np.searchsorted(e, v, side="left")
    assert np.all(np.diff(e) > 0) and len(np.unique(bins)) == 5
    assert len(np.unique(bins[v == 40])) == 1
    with pytest.raises(DataError):
        A.quantile_upper_edges(np.array([1.0, 2, 3, 1]))


def test_bins_are_roughly_quintiles(a9a: A.A9a) -> None:
    # age and fnlwgt are nearly tie-free: every bin holds 20% +- 3% of the training rows
    for col, start in (("age", 0), ("fnlwgt", 13)):
        share = a9a.x_train[:, start : start + 5].mean(axis=0)
        np.testing.assert_allclose(share, 0.2, atol=0.03, err_msg=col)


def test_parse_handles_test_quirks_and_rejects_garbage() -> None:
    good = "|1x3 Cross validator\n25, Private, 1, 11th, 7, Never-married, Sales, Own-child, Black, Male, 0, 0, 40, ?, >50K.\n\n"
    t = A.parse_adult(good)
    assert len(t) == 1 and t.label[0] == 1 and t.categorical["native-country"][0] == A.MISSING
    with pytest.raises(DataError, match=":2: label"):
        A.parse_adult(good.replace(">50K.", "maybe"))
    with pytest.raises(DataError, match="not a number"):
        A.parse_adult(good.replace("25,", "old,"))
    with pytest.raises(DataError, match="NaN/Inf"):
        A.parse_adult(good.replace("25,", "nan,"))
    with pytest.raises(DataError, match="fields"):
        A.parse_adult("1, 2, 3\n")


def _copy_adult(tmp_path: Path, shared: Callable[[str], Path]) -> Path:
    src = shared("adult")
    dst = tmp_path / "adult"
    dst.mkdir()
    for f in ("adult.data.gz", "adult.test.gz"):
        shutil.copyfile(src / f, dst / f)
    return tmp_path


def test_loads_from_shared_datasets_and_matches_embedded(
    tmp_path: Path, a9a: A.A9a, shared_dataset_dir: Callable[[str], Path]
) -> None:
    root = _copy_adult(tmp_path, shared_dataset_dir)
    from_dir = A.load_a9a(data_dir=root)
    np.testing.assert_array_equal(from_dir.x_train, a9a.x_train)
    np.testing.assert_array_equal(from_dir.y_test, a9a.y_test)


def test_corrupted_adult_file_is_rejected(
    tmp_path: Path, shared_dataset_dir: Callable[[str], Path]
) -> None:
    root = _copy_adult(tmp_path, shared_dataset_dir)
    path = root / "adult" / "adult.test.gz"
    text = gzip.decompress(path.read_bytes()).replace(b"Private", b"Privat3", 1)
    path.unlink()
    (root / "adult" / "adult.test").write_bytes(text)  # plain file, one byte changed
    with pytest.raises(DataError, match="SHA-256"):
        A.load_adult(data_dir=root)
    with pytest.raises(DataError, match="unknown workclass"):
        A.load_adult(data_dir=root, verify=False)


def test_missing_data_dir_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"adult\.data.*not found"):
        A.load_adult(data_dir=tmp_path)


def test_env_data_dir_without_adult_falls_back_to_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIVDL_DATA_DIR", str(tmp_path))
    train, test = A.load_adult()
    assert (len(train), len(test)) == (32561, 16281)
    (tmp_path / "adult.test").write_text("garbage\n")  # now the env dir is used, and rejected
    (tmp_path / "adult.data").write_text("garbage\n")
    with pytest.raises(DataError, match="SHA-256"):
        A.load_adult()


def test_bin_edges_come_from_the_training_file_only(a9a: A.A9a) -> None:
    """No test data in the features: every quantile column's edges are the training file's
    (fitting them on train + test moves fnlwgt's), and the test rows use those same edges."""
    train, test = A.load_adult()
    for col in A.QUANTILE_COLUMNS:
        np.testing.assert_array_equal(
            a9a.bin_upper_edges[col], A.quantile_upper_edges(train.numeric[col])
        )
    both = np.concatenate([train.numeric["fnlwgt"], test.numeric["fnlwgt"]])
    assert not np.array_equal(A.quantile_upper_edges(both), a9a.bin_upper_edges["fnlwgt"])
    np.testing.assert_array_equal(a9a.x_test, A.encode_a9a(test, a9a.bin_upper_edges))


def test_a_second_load_equals_a_fresh_rebuild_in_the_callers_own_arrays() -> None:
    """load_a9a rebuilds once per file contents in a process: a later load equals a rebuild
    made afresh (the uncached function) and hands out copies, so a caller that changes its
    arrays changes no later load."""
    first = A.load_a9a()
    first.x_train[0] = 7.0
    first.y_test[:] = 0.0
    first.bin_upper_edges["age"][0] = -1.0
    second = A.load_a9a()
    (train, train_where), (test, test_where) = A._adult_texts(None, verify=True)
    fresh = A._a9a_of.__wrapped__(train, test, train_where, test_where)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(second, name), getattr(fresh, name))
    assert second.bin_upper_edges.keys() == fresh.bin_upper_edges.keys()
    for col, edges in fresh.bin_upper_edges.items():
        np.testing.assert_array_equal(second.bin_upper_edges[col], edges)
    assert not np.shares_memory(second.x_train, A.load_a9a().x_train)
