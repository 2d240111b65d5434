"""Communicators: how nodes exchange messages (gossip, push-sum, server rounds).

``DistributedCommunicator`` and ``DistributedKeyTransport`` are imported on first use, so that
only a run on several processes imports ``torch.distributed``.
"""

from __future__ import annotations

from typing import Any

from privdl.comm.base import Communicator
from privdl.comm.local import LocalCommunicator
from privdl.tree import Tree

__all__ = [
    "Communicator",
    "DistributedCommunicator",
    "DistributedKeyTransport",
    "LocalCommunicator",
    "Tree",
]


def __getattr__(name: str) -> Any:
    if name in ("DistributedCommunicator", "DistributedKeyTransport"):
        from privdl.comm import distributed

        return getattr(distributed, name)
    raise AttributeError(f"module 'privdl.comm' has no attribute {name!r}")
