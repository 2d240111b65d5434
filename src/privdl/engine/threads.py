"""Torch's intra-op thread count, set for a block of small-tensor work and restored after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["one_thread"]


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the caller's count. For work made of many
    small tensors (audits of a few hundred canaries, gossip rounds of 10 x 124): on a shared
    2-core machine the thread pool's hand-offs cost more than the work (measured: an example-level
    audit took 17 s of CPU against 4 s with one thread, the same numbers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
