"""stack_partitions against a slow loop; sample_batches against the sampling laws they claim."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privdl.data import gather_batch, sample_batches, stack_partitions
from privdl.errors import DataError


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_stack_partitions_matches_slow_loop() -> None:
    x = torch.randn(30, 2, 3, generator=_gen(0))
    y = torch.arange(30)
    parts = [np.array([5, 1, 7]), np.array([0]), np.arange(10, 30)]
    st = stack_partitions(x, y, parts)
    assert st.x.shape == (3, 20, 2, 3) and st.counts.tolist() == [3, 1, 20]
    for i, p in enumerate(parts):  # slow oracle
        assert torch.equal(st.x[i, : len(p)], x[torch.from_numpy(p)])
        assert torch.equal(st.y[i, : len(p)], y[torch.from_numpy(p)])
        assert not st.x[i, len(p) :].any() and not st.y[i, len(p) :].any()
    assert st.valid.sum().item() == 24
    with pytest.raises(DataError):
        stack_partitions(x, y, [np.array([0, 30])])


COUNTS = torch.tensor([3, 7, 12, 5])


REPS = 4000  # replicate the 4 nodes so one call gives many independent draws per node type


def _inclusion(index: torch.Tensor, mask: torch.Tensor, m_max: int) -> torch.Tensor:
    """Per node type, how often each local slot was selected (distinctness checked too)."""
    onehot = torch.zeros(index.shape[0], m_max)
    onehot.scatter_add_(1, index, mask.float())
    assert onehot.max() <= 1  # no index twice in one batch
    return onehot.reshape(REPS, 4, m_max).mean(0)


def _check_rates(freq: torch.Tensor, rate: torch.Tensor) -> None:
    for i, m in enumerate(COUNTS.tolist()):
        q = float(rate[i])
        sd = np.sqrt(q * (1 - q) / REPS)
        assert torch.allclose(freq[i, :m], torch.full((m,), q), atol=5 * sd + 1e-9)
        assert freq[i, m:].sum() == 0


def test_without_replacement_is_distinct_and_uniform() -> None:
    b = 3
    counts = COUNTS.repeat(REPS)
    bi = sample_batches(counts, b, generator=_gen(0), m_max=12)
    assert bi.index.shape == (4 * REPS, b) and bi.mask.all()
    _check_rates(_inclusion(bi.index, bi.mask, 12), b / COUNTS.double())


def test_with_replacement_is_uniform_in_range() -> None:
    bi = sample_batches(COUNTS, 20000, generator=_gen(1), scheme="with_replacement")
    for i, m in enumerate(COUNTS.tolist()):
        hist = torch.bincount(bi.index[i], minlength=m).double()
        assert hist.numel() == m
        expected = 20000 / m
        assert ((hist - expected).abs() < 5 * np.sqrt(expected)).all()


def test_poisson_inclusion_rate_and_packing() -> None:
    b = 2
    counts = COUNTS.repeat(REPS)
    bi = sample_batches(counts, b, generator=_gen(1), scheme="poisson", m_max=12)
    size = bi.mask.sum(1)
    assert torch.equal(bi.mask, torch.arange(bi.mask.shape[1])[None] < size[:, None])  # packed
    idx = torch.where(bi.mask, bi.index, 0)
    assert (torch.where(bi.mask, bi.index < counts[:, None], True)).all()
    q = (b / COUNTS.double()).clamp(max=1)
    _check_rates(_inclusion(idx, bi.mask, 12), q)
    mean_size = size.reshape(REPS, 4).double().mean(0)
    assert torch.allclose(mean_size, torch.full((4,), float(b), dtype=torch.float64), atol=0.1)


def test_shuffle_is_a_permutation_per_node() -> None:
    bi = sample_batches(COUNTS, 0, generator=_gen(5), scheme="shuffle")
    assert bi.index.shape == (4, 12)
    for i, m in enumerate(COUNTS.tolist()):
        assert sorted(bi.index[i, :m].tolist()) == list(range(m))
        assert bi.mask[i].sum() == m


def test_same_seed_same_batches_and_gather() -> None:
    a = sample_batches(COUNTS, 3, generator=_gen(9))
    b = sample_batches(COUNTS, 3, generator=_gen(9))
    assert torch.equal(a.index, b.index)
    stacked = torch.arange(4 * 12).reshape(4, 12)
    got = gather_batch(stacked, a.index)
    assert torch.equal(got, torch.stack([stacked[i, a.index[i]] for i in range(4)]))


def test_bad_requests() -> None:
    with pytest.raises(DataError, match="exceeds"):
        sample_batches(COUNTS, 4, generator=_gen(0))
    with pytest.raises(DataError, match="scheme"):
        sample_batches(COUNTS, 1, generator=_gen(0), scheme="bogus")
    with pytest.raises(DataError, match="m_max"):
        sample_batches(COUNTS, 1, generator=_gen(0), m_max=5)
    with pytest.raises(DataError):
        sample_batches(torch.tensor([3, 0]), 1, generator=_gen(0))


def test_shuffle_scheme_is_a_fresh_random_permutation():
    """``shuffle`` draws a uniform permutation of each node's records: the first slot takes all
    10 values about equally often over 400 seeds (and two seeds differ)."""
    from privdl.data.batching import sample_batches

    firsts = [
        int(sample_batches(torch.tensor([10]), 3, generator=torch.Generator().manual_seed(s),
                           scheme="shuffle").index[0, 0])
        for s in range(400)
    ]  # fmt: skip
    counts = np.bincount(firsts, minlength=10)
    assert (counts > 0).all() and counts.max() < 40 + 4 * 6  # 40 +- 4 sd
    a, b = (sample_batches(torch.tensor([10]), 3, generator=torch.Generator().manual_seed(s),
                           scheme="shuffle").index for s in (0, 1))  # fmt: skip
    assert sorted(a[0].tolist()) == list(range(10)) and not torch.equal(a, b)
