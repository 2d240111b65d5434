"""Counter-based generators: a draw that depends only on ``(seed, purpose, t)``.

Every per-step random draw that is not privacy noise (minibatch indices, PrivSGP-VR's sampled
entries, compression masks) comes from :func:`step_generator`, so a run interrupted at step t and
resumed draws exactly what it would have drawn, and a sharded run draws what the simulator does.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["step_generator"]


def step_generator(
    seed: int, purpose: str, t: int, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A generator that depends only on ``(seed, purpose, t)``: batches are resumable."""
    digest = hashlib.sha256(f"privdl/{purpose}/{int(seed)}/{int(t)}".encode()).digest()
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g
