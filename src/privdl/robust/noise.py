"""Robust-HDP server side: noise levels from robust PCA, and noise-aware aggregation weights.

Robust-HDP (Malekmohammadi et al., ICML 2024), Algorithm 1 lines 3-6:

    M = [Delta_1 | ... | Delta_n]  (p x n, one column per client)
    (L, S) = RPCA(M);   sigma_hat_i^2 = ||S_{:,i}||_2^2;   w_i = (1/sigma_hat_i^2) / sum_j 1/sigma_hat_j^2

The weights minimise the aggregate noise variance sum_i w_i^2 sigma_i^2 (Eq. 8). Section 3.6 row
chunking: split the rows into Q = floor(p/p') blocks of p' rows (remainder dropped), solve PCP on
each, average the extrapolated estimates (p/p') ||S_q[:,i]||^2 over blocks (``max_blocks=1`` is the
paper's CIFAR setting: the first p' = 200,000 rows only). The paper writes the factor as Q; we use
p/p' (the reference code's factor), which equals Q when p' divides p; it cancels in the weights.

Two schedules (Algorithm 1 and the authors' reference code): the paper re-estimates every round
(``reestimate_every=1``); the reference code estimates once after round 1 and freezes the weights
(``reestimate_every=None``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from privdl.errors import ConfigError
from privdl.robust.rpca import principal_component_pursuit

__all__ = [
    "DegenerateNoiseWarning",
    "NoiseWeightState",
    "estimate_noise_levels",
    "inverse_variance_weights",
    "aggregate_noise",
    "robust_hdp_weights",
]

DEFAULT_CHUNK_ROWS = 200_000


class DegenerateNoiseWarning(RuntimeWarning):
    """An estimated noise level was 0 (or tiny) and was clamped before inverting it."""


def estimate_noise_levels(
    updates: Tensor,
    *,
    chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
    max_blocks: int | None = None,
    method: Literal["ialm", "admm"] = "admm",
    max_iter: int = 5000,
    **pcp_kwargs: Any,
) -> Tensor:
    """Per-client noise variance estimates ``sigma_hat_i^2 = ||S_{:,i}||^2`` (Algorithm 1 line 5).

    Args:
        updates: ``(p, n)`` matrix of model updates, one client per COLUMN, rows in flattened
            parameter order.
        chunk_rows: p' of Section 3.6; ``None`` or ``p <= p'`` solves the full matrix.
        max_blocks: use only the first blocks (the paper uses 1 for CIFAR).
        method, max_iter, pcp_kwargs: passed to :func:`principal_component_pursuit`. The default
            is Candès' fixed-mu ADMM: the fast increasing-mu inexact ALM stops at a feasible but
            non-optimal point on noise-dominated matrices and underestimates noise (see docs).

    Returns:
        ``(n,)`` estimates of the TOTAL update variance (summed over the p coordinates).
    """
    if updates.ndim != 2:
        raise ConfigError(f"updates must be (p, n) with clients as columns, got {updates.shape}")
    p, n = updates.shape
    if n < 2:
        raise ConfigError(f"noise-aware weighting needs at least 2 clients, got {n}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ConfigError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if max_blocks is not None and max_blocks < 1:
        raise ConfigError(f"max_blocks must be >= 1, got {max_blocks}")
    if chunk_rows is None or p <= chunk_rows:
        blocks = [updates]
        scale = 1.0
    else:
        q = p // chunk_rows
        if max_blocks is not None:
            q = min(q, max_blocks)
        blocks = [updates[b * chunk_rows : (b + 1) * chunk_rows] for b in range(q)]
        scale = p / chunk_rows
    total = torch.zeros(n, dtype=updates.dtype, device=updates.device)
    for block in blocks:  # Q is 1 in the paper's runs; blocks are independent problems
        result = principal_component_pursuit(block, method=method, max_iter=max_iter, **pcp_kwargs)
        total = total + scale * (result.sparse**2).sum(0)
    return total / len(blocks)


def inverse_variance_weights(sigma2: Tensor, *, floor_ratio: float = 1e-12) -> Tensor:
    """Eq. 8 optimum ``w_i = (1/sigma_i^2) / sum_j (1/sigma_j^2)``.

    Estimates below ``floor_ratio * max_j sigma_j^2`` are clamped there with a
    :class:`DegenerateNoiseWarning` (a noise-free client would otherwise divide by 0;
    docs/robust-hdp.md).
    """
    if sigma2.ndim != 1 or sigma2.numel() == 0:
        raise ConfigError("sigma2 must be a non-empty 1-D tensor")
    if bool((sigma2 < 0).any()) or not bool(torch.isfinite(sigma2).all()):
        raise ConfigError("noise variances must be finite and >= 0")
    top = sigma2.max()
    if top <= 0:
        raise ConfigError("all noise variances are 0; inverse-variance weights are undefined")
    floor = floor_ratio * top
    if bool((sigma2 < floor).any()):
        warnings.warn(
            "clamped a zero/tiny noise estimate before inverting it",
            DegenerateNoiseWarning,
            stacklevel=2,
        )
        sigma2 = torch.clamp(sigma2, min=floor)
    inv = 1.0 / sigma2
    return inv / inv.sum()


def aggregate_noise(weights: Tensor, sigma2: Tensor) -> Tensor:
    """Variance of the weighted aggregate, ``sum_i w_i^2 sigma_i^2`` (objective of Eq. 8)."""
    return (weights**2 * sigma2).sum()


@dataclass(frozen=True)
class NoiseWeightState:
    """Cached Robust-HDP weights and the round they were estimated at."""

    weights: Tensor
    sigma2: Tensor
    estimated_at: int


def robust_hdp_weights(
    updates: Tensor,
    *,
    round_index: int,
    state: NoiseWeightState | None = None,
    reestimate_every: int | None = 1,
    **estimate_kwargs: Any,
) -> NoiseWeightState:
    """Robust-HDP aggregation weights for this round (Algorithm 1 lines 3-6).

    ``reestimate_every=1`` re-runs RPCA every round (the paper's Algorithm 1);
    ``reestimate_every=None`` estimates once (first call) and reuses the weights forever (the
    reference code's behaviour); ``k`` re-estimates every k rounds. Returns the new state; its
    ``weights`` sum to 1 and are ordered like the columns of ``updates``.
    """
    if reestimate_every is not None and reestimate_every < 1:
        raise ConfigError(f"reestimate_every must be >= 1 or None, got {reestimate_every}")
    if state is not None:
        if state.weights.numel() != updates.shape[1]:
            raise ConfigError("the number of clients changed; pass state=None to re-estimate")
        age = round_index - state.estimated_at
        if reestimate_every is None or age < reestimate_every:
            return state
    sigma2 = estimate_noise_levels(updates, **estimate_kwargs)
    return NoiseWeightState(
        weights=inverse_variance_weights(sigma2), sigma2=sigma2, estimated_at=round_index
    )
