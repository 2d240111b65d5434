"""Robust-HDP noise estimation and weights against known noise levels and Eq. 8's optimum."""

from __future__ import annotations

import pytest
import torch

from privdl.errors import ConfigError
from privdl.robust.noise import (
    DegenerateNoiseWarning,
    aggregate_noise,
    estimate_noise_levels,
    inverse_variance_weights,
    robust_hdp_weights,
)


def _noise(p: int, stds: torch.Tensor, seed: int, signal: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(p, stds.numel(), generator=g, dtype=torch.float64) * stds
    if signal:
        u = torch.randn(p, 1, generator=g, dtype=torch.float64)
        v = torch.randn(1, stds.numel(), generator=g, dtype=torch.float64)
        M = M + signal * u @ v
    return M


def test_pure_gaussian_noise_variance_within_5_percent() -> None:
    """Equal pure noise (Robust-HDP Section 3.1): the mean estimate is within 5% of p s^2 (its sampling sd is
    sqrt(2/(p n)) = 1%), and each column keeps >= 90% of its realised noise energy ||M_i||^2."""
    p, s = 2000, 0.05
    M = _noise(p, torch.full((10,), s), seed=0)
    sigma2 = estimate_noise_levels(M)
    assert abs((sigma2 / (p * s**2)).mean().item() - 1) < 0.05
    ratio = sigma2 / (M**2).sum(0)
    assert ((ratio > 0.9) & (ratio <= 1.0 + 1e-9)).all(), ratio


def test_equal_noise_gives_uniform_weights() -> None:
    """Equal noise + weak rank-1 signal: max |w_i - 1/n| <= 0.01."""
    st = robust_hdp_weights(_noise(2000, torch.full((10,), 0.05), seed=1, signal=0.002),
                            round_index=1)  # fmt: skip
    assert torch.isclose(st.weights.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert (st.weights - 0.1).abs().max() <= 0.01


def test_heterogeneous_noise_near_oracle() -> None:
    """Heterogeneous noise, weak low-rank signal (smaller): estimated weights' aggregate noise within 5% of the oracle minimum,
    and the noisiest client gets the smallest weight."""
    stds = torch.tensor([0.02, 0.05, 0.1, 0.2] * 2, dtype=torch.float64)
    true = 2000 * stds**2
    st = robust_hdp_weights(_noise(2000, stds, seed=2, signal=0.005), round_index=1)
    oracle = aggregate_noise(inverse_variance_weights(true), true)
    assert aggregate_noise(st.weights, true) <= 1.05 * oracle
    assert set(torch.argsort(st.sigma2).tolist()[:2]) == {0, 4} and st.weights[[3, 7]].max() < 0.02


def test_chunking_matches_full_matrix() -> None:
    """Section 3.6: Q = 3 blocks of p' rows, averaged with the p/p' factor, estimate the same
    totals as the full matrix (pure noise, so each block sees the same per-row variance)."""
    stds = torch.tensor([0.02, 0.05, 0.1, 0.2] * 2, dtype=torch.float64)
    M = _noise(3000, stds, seed=3)
    full = estimate_noise_levels(M, chunk_rows=None)
    chunked = estimate_noise_levels(M, chunk_rows=1000)
    first = estimate_noise_levels(M, chunk_rows=1000, max_blocks=1)
    torch.testing.assert_close(chunked, full, rtol=0.05, atol=0)
    torch.testing.assert_close(first, full, rtol=0.15, atol=0)


def test_inverse_variance_weights_closed_form() -> None:
    """Optimum of Eq. 8 (Section 3.3), scale invariance, minimum 1/sum(1/s) <= uniform's noise."""
    s = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    w = inverse_variance_weights(s)
    torch.testing.assert_close(w, torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64) / 15)
    torch.testing.assert_close(inverse_variance_weights(3.7 * s), w)
    torch.testing.assert_close(aggregate_noise(w, s), 1 / (1 / s).sum())
    assert aggregate_noise(w, s) <= aggregate_noise(torch.full((4,), 0.25, dtype=s.dtype), s)
    with pytest.warns(DegenerateNoiseWarning):
        w0 = inverse_variance_weights(torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert w0[0] > 0.999
    with pytest.raises(ConfigError):
        inverse_variance_weights(torch.zeros(3))


def test_schedules_per_round_and_frozen() -> None:
    stds = torch.tensor([0.05, 0.1, 0.2, 0.1], dtype=torch.float64)
    M1, M2 = _noise(1000, stds, seed=4), _noise(1000, stds.flip(0), seed=5)
    st1 = robust_hdp_weights(M1, round_index=1)
    frozen = robust_hdp_weights(M2, round_index=2, state=st1, reestimate_every=None)
    assert frozen is st1  # reference code: estimated once, reused
    fresh = robust_hdp_weights(M2, round_index=2, state=st1, reestimate_every=1)
    assert fresh.estimated_at == 2 and fresh.weights[0] < st1.weights[0]  # paper: every round
    with pytest.raises(ConfigError):
        robust_hdp_weights(M1, round_index=1, reestimate_every=0)
    with pytest.raises(ConfigError):
        estimate_noise_levels(torch.ones(10, 1))
