"""Partitioners: disjoint + complete (hypothesis), and label-skew behaviour against Dirichlet facts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privdl.data import partition_dirichlet, partition_iid, partition_shards, parts_to_ids
from privdl.errors import DataError


def _assert_exact_cover(parts: list[np.ndarray], n_samples: int) -> None:
    flat = np.concatenate(parts)
    assert flat.dtype == np.int64
    assert np.array_equal(np.sort(flat), np.arange(n_samples))  # each sample exactly once


@st.composite
def _labels_and_parts(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    n_parts = draw(st.integers(1, 12))
    n = draw(st.integers(n_parts, 400))
    n_classes = draw(st.integers(1, 10))
    seed = draw(st.integers(0, 2**32 - 1))
    labels = np.random.default_rng(seed).integers(0, n_classes, n)
    return labels, n_parts, seed


@settings(max_examples=60, deadline=None)
@given(_labels_and_parts())
def test_iid_is_exact_cover_and_balanced(case: tuple[np.ndarray, int, int]) -> None:
    labels, k, seed = case
    parts = partition_iid(labels, k, rng=np.random.default_rng(seed))
    _assert_exact_cover(parts, labels.size)
    sizes = [len(p) for p in parts]
    assert len(parts) == k and max(sizes) - min(sizes) <= 1
    dropped = partition_iid(labels, k, rng=np.random.default_rng(seed), drop_remainder=True)
    assert {len(p) for p in dropped} == {labels.size // k}
    assert np.unique(np.concatenate(dropped)).size == k * (labels.size // k)


@settings(max_examples=60, deadline=None)
@given(_labels_and_parts(), st.integers(1, 4))
def test_shards_is_exact_cover(case: tuple[np.ndarray, int, int], spp: int) -> None:
    labels, k, seed = case
    if k * spp > labels.size:
        with pytest.raises(DataError):
            partition_shards(labels, k, spp, rng=np.random.default_rng(seed))
        return
    parts = partition_shards(labels, k, spp, rng=np.random.default_rng(seed))
    _assert_exact_cover(parts, labels.size)
    assert len(parts) == k


@settings(max_examples=60, deadline=None)
@given(_labels_and_parts(), st.sampled_from([0.05, 0.5, 1.0, 10.0, 1e4]))
def test_dirichlet_is_exact_cover(case: tuple[np.ndarray, int, int], alpha: float) -> None:
    labels, k, seed = case
    parts = partition_dirichlet(labels, k, alpha, rng=np.random.default_rng(seed), min_size=0)
    _assert_exact_cover(parts, labels.size)
    ids = parts_to_ids(parts, labels.size)
    assert ids.min() >= 0 and ids.max() < k


def test_shards_limit_classes_per_part() -> None:
    # Robust-HDP s.5.2: 60 clients x 8 shards of 125 from 60,000 sorted labels -> <= 8 classes each
    labels = np.repeat(np.arange(10), 6000)
    parts = partition_shards(labels, 60, 8, rng=np.random.default_rng(0))
    assert {len(p) for p in parts} == {1000}
    assert max(np.unique(labels[p]).size for p in parts) <= 8
    assert min(np.unique(labels[p]).size for p in parts) >= 1


def test_dirichlet_skew_small_vs_large_alpha() -> None:
    labels = np.repeat(np.arange(10), 1000)
    global_share = np.full(10, 0.1)

    def tv_to_global(alpha: float, seed: int) -> float:
        parts = partition_dirichlet(labels, 20, alpha, rng=np.random.default_rng(seed), min_size=0)
        parts = [p for p in parts if len(p)]  # tiny alpha leaves parts empty
        shares = np.stack([np.bincount(labels[p], minlength=10) / len(p) for p in parts])
        return float(0.5 * np.abs(shares - global_share).sum(axis=1).mean())

    # alpha -> 0: a part is dominated by one class (TV to uniform near 0.9);
    # alpha large: per-part label shares match the global ones up to sampling error.
    assert tv_to_global(0.01, 0) > 0.75
    assert tv_to_global(1e4, 0) < 0.05


def test_dirichlet_mean_share_matches_expectation() -> None:
    # E[p_cj] = 1/n under Dir(alpha 1_n): over many draws each part gets ~N_c/n of each class
    labels = np.repeat(np.arange(4), 500)
    counts = np.zeros((5, 4))
    rng = np.random.default_rng(11)
    draws = 200
    for _ in range(draws):
        parts = partition_dirichlet(labels, 5, 1.0, rng=rng, min_size=0)
        counts += np.stack([np.bincount(labels[p], minlength=4) for p in parts])
    mean = counts / draws
    # sd of a Dir(1,...,1) share with n=5 is sqrt(4/(25*6)) ~ 0.163 -> 0.163*500/sqrt(200) ~ 5.8
    np.testing.assert_allclose(mean, 100.0, atol=4 * 5.8)


def test_dirichlet_min_size_and_errors() -> None:
    labels = np.repeat(np.arange(2), 50)
    unconstrained = [
        min(map(len, partition_dirichlet(labels, 8, 0.5, rng=np.random.default_rng(s), min_size=0)))
        for s in range(20)
    ]
    assert min(unconstrained) < 5  # so the constraint below is binding for some seeds
    for s in range(20):
        parts = partition_dirichlet(labels, 8, 0.5, rng=np.random.default_rng(s), min_size=5)
        assert min(len(p) for p in parts) >= 5
    with pytest.raises(DataError, match="min_size"):
        partition_dirichlet(labels, 8, 0.1, rng=np.random.default_rng(0), min_size=20)
    with pytest.raises(DataError, match="tries"):
        partition_dirichlet(labels, 8, 1e-3, rng=np.random.default_rng(0), min_size=12, max_tries=5)
    with pytest.raises(DataError, match="alpha"):
        partition_dirichlet(labels, 8, 0.0, rng=np.random.default_rng(0))
    with pytest.raises(DataError):
        partition_iid(labels, 101, rng=np.random.default_rng(0))


def test_parts_to_ids_detects_overlap() -> None:
    with pytest.raises(DataError, match="disjoint"):
        parts_to_ids([np.array([0, 1]), np.array([1, 2])], 3)
    ids = parts_to_ids([np.array([2]), np.array([0])], 3)
    assert ids.tolist() == [1, -1, 0]


def test_rng_may_be_an_integer_seed_and_bad_arguments_are_data_errors():
    """``rng=0`` was an AttributeError; ``n_parts=2.5`` was accepted."""
    y = np.arange(40) % 4
    by_seed = partition_iid(y, 4, rng=7)
    by_gen = partition_iid(y, 4, rng=np.random.default_rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(by_seed, by_gen, strict=True))
    with pytest.raises(DataError, match="n_parts must be an integer"):
        partition_iid(y, 2.5, rng=0)
    with pytest.raises(DataError, match="rng must be"):
        partition_dirichlet(y, 4, 1.0, rng="seed")


def test_partitions_are_random_not_the_sorted_order() -> None:
    """On sorted labels an unshuffled split gives one class per part: iid parts must mix the
    classes and differ between seeds; shards are dealt at random, and within a label the order
    is randomised first (so a shard is not simply the first rows of its class)."""
    labels = np.repeat(np.arange(10), 100)
    parts = partition_iid(labels, 10, rng=0)
    assert min(len(np.unique(labels[p])) for p in parts) >= 5
    assert not np.array_equal(parts[0], partition_iid(labels, 10, rng=1)[0])
    first = {tuple(np.unique(labels[partition_shards(labels, 5, 2, rng=s)[0]])) for s in range(10)}
    assert len(first) > 1
    zeros = np.zeros(100, dtype=np.int64)
    blocks = ({*range(50)}, {*range(50, 100)})
    assert any(
        set(partition_shards(zeros, 2, 1, rng=s)[0].tolist()) not in blocks for s in range(5)
    )
