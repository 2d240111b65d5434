"""Communicators: how nodes exchange messages (gossip, push-sum, server rounds)."""

from privdl.comm.base import Communicator, Tree
from privdl.comm.distributed import DistributedCommunicator, DistributedKeyTransport
from privdl.comm.local import LocalCommunicator

__all__ = [
    "Communicator",
    "DistributedCommunicator",
    "DistributedKeyTransport",
    "LocalCommunicator",
    "Tree",
]
