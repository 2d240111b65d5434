"""Per-node stacked local datasets and vectorized per-node minibatch index sampling.

The engine keeps every node's local dataset in one padded tensor (n, m_max, ...) with the true
sizes m_i in ``counts``, so one kernel serves all nodes (DESIGN.md: no Python loop over nodes).
``sample_batches`` draws every node's minibatch indices at once:

* ``"without_replacement"`` — B distinct local indices per node, uniformly (DECOR Figs 1b-1c batch
  64; PORTER's b-sample minibatches): random keys on valid slots, ``topk`` of the smallest.
* ``"with_replacement"`` — B i.i.d. uniform local indices (PrivSGP-VR Alg 1 xi_i^k, SGD theory).
* ``"poisson"`` — each local sample joins independently with rate q_i = B / m_i (the subsampled
  Gaussian of Abadi et al.; the rate an RDP accountant uses). Batches have random sizes:
  returned left-packed with a validity mask.
* ``"shuffle"`` — one uniformly random permutation of each node's local indices (an epoch order),
  shape (n, m_max) with a mask; the caller walks it in chunks of B.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from privdl.errors import DataError

SCHEMES = ("without_replacement", "with_replacement", "poisson", "shuffle")


class StackedData(NamedTuple):
    """Padded per-node data: x (n, m_max, ...), y (n, m_max, ...), counts (n,) int64.

    Padding rows are zeros; ``valid[i, j]`` is True for j < counts[i].
    """

    x: torch.Tensor
    y: torch.Tensor
    counts: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        """(n, m_max) bool mask of real (non-padding) rows."""
        m_max = self.x.shape[1]
        return torch.arange(m_max, device=self.counts.device)[None, :] < self.counts[:, None]


class BatchIndex(NamedTuple):
    """Local row indices (n, L) int64 into the stacked data and a (n, L) bool mask of real ones."""

    # a field named index shadows tuple.index: fine at runtime, which typeshed cannot express
    index: torch.Tensor  # type: ignore[assignment]
    mask: torch.Tensor


def padded_index(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Global sample index per (node, slot), padded with 0, and the part sizes."""
    counts = np.array([len(p) for p in parts], dtype=np.int64)
    n = counts.size
    m_max = int(counts.max()) if n else 0
    flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]) if n else np.zeros(0)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rows = np.repeat(np.arange(n), counts)
    cols = np.arange(flat.size) - np.repeat(starts, counts)
    table = np.zeros((n, m_max), dtype=np.int64)
    table[rows, cols] = flat
    return table, counts


def stack_partitions(x: torch.Tensor, y: torch.Tensor, parts: Sequence[np.ndarray]) -> StackedData:
    """Gather each part's samples into padded per-node tensors (n, m_max, ...) plus counts (n,)."""
    if len(parts) == 0:
        raise DataError("stack_partitions needs at least one part")
    if x.shape[0] != y.shape[0]:
        raise DataError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    table, counts = padded_index(parts)
    if counts.min() < 1:
        raise DataError("every part must hold at least one sample")
    if table.max() >= x.shape[0] or table.min() < 0:
        raise DataError("partition index out of range for the dataset")
    index = torch.from_numpy(table).to(x.device)
    cnt = torch.from_numpy(counts).to(x.device)
    valid = torch.arange(table.shape[1], device=x.device)[None, :] < cnt[:, None]
    xs = x[index] * valid.reshape(*valid.shape, *([1] * (x.dim() - 1))).to(x.dtype)
    ys = torch.where(valid.reshape(*valid.shape, *([1] * (y.dim() - 1))), y[index], 0).to(y.dtype)
    return StackedData(x=xs, y=ys, counts=cnt)


def sample_batches(
    counts: torch.Tensor,
    batch_size: int,
    *,
    generator: torch.Generator,
    scheme: str = "without_replacement",
    m_max: int | None = None,
) -> BatchIndex:
    """Draw every node's minibatch indices at once (no loop over nodes).

    ``counts`` (n,) are the local sizes m_i; ``m_max`` defaults to max(counts) (pass the stacked
    width to keep shapes fixed). Fixed-size schemes return (n, B) indices with an all-True mask;
    ``"poisson"`` returns (n, L), L = largest realised batch, left-packed and masked;
    ``"shuffle"`` returns (n, m_max) permutations, masked beyond m_i.
    """
    if scheme not in SCHEMES:
        raise DataError(f"unknown sampling scheme {scheme!r}; expected one of {SCHEMES}")
    counts = torch.as_tensor(counts, dtype=torch.int64)
    if counts.dim() != 1 or counts.numel() == 0 or int(counts.min()) < 1:
        raise DataError("counts must be a non-empty 1-D tensor of positive local sizes")
    width = int(counts.max()) if m_max is None else int(m_max)
    if width < int(counts.max()):
        raise DataError(f"m_max={width} is smaller than the largest local size {int(counts.max())}")
    if scheme != "shuffle" and batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    n = counts.numel()
    dev = counts.device
    gen_dev = generator.device

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=generator, device=gen_dev).to(dev)

    if scheme == "with_replacement":
        u = rand(n, batch_size)
        index = torch.minimum((u * counts[:, None]).long(), counts[:, None] - 1)
        return BatchIndex(index, torch.ones_like(index, dtype=torch.bool))
    valid = torch.arange(width, device=dev)[None, :] < counts[:, None]
    keys = rand(n, width).masked_fill(~valid, 2.0)  # padding sorts last
    if scheme == "without_replacement":
        if batch_size > int(counts.min()):
            raise DataError(
                f"batch_size={batch_size} exceeds the smallest local dataset ({int(counts.min())})"
            )
        index = torch.topk(keys, batch_size, dim=1, largest=False, sorted=True).indices
        return BatchIndex(index, torch.ones_like(index, dtype=torch.bool))
    if scheme == "shuffle":
        index = torch.argsort(keys, dim=1)
        return BatchIndex(index, valid)
    # poisson: sample j joins with probability q_i = B / m_i (capped at 1)
    rate = (batch_size / counts.to(torch.float64)).clamp(max=1.0)
    join = (rand(n, width).to(torch.float64) < rate[:, None]) & valid
    sizes = join.sum(dim=1)
    length = int(sizes.max())
    # selected slots first (keys in [0,1)), then the rest (keys in [2,3)), random order inside
    order = torch.argsort(keys.clamp(max=1.0) + 2.0 * (~join), dim=1)[:, :length]
    mask = torch.arange(length, device=dev)[None, :] < sizes[:, None]
    return BatchIndex(order, mask)


def gather_batch(stacked: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``stacked[i, index[i, k]]`` for every node i: (n, m_max, ...) -> (n, L, ...)."""
    rows = torch.arange(stacked.shape[0], device=stacked.device)[:, None]
    return stacked[rows, index]
