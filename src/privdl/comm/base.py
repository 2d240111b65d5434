"""The communicator: the only way algorithms talk (DESIGN.md, "Communicator").

Node state is a tree (``dict[str, Tensor]``) whose tensors have the nodes this process owns as
leading dimension. An algorithm is written once against this interface and runs on the
single-process simulator (:class:`~privdl.comm.local.LocalCommunicator`) or on a distributed
backend that owns a shard of the nodes (:class:`~privdl.comm.distributed.DistributedCommunicator`).
Every operation has a local version, so neither an algorithm nor the training loop ever asks which
communicator it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from privdl.mechanisms.secrets import KeyTransport
from privdl.tree import Tree

__all__ = ["Communicator", "Tree"]


class Communicator(ABC):
    """Gossip, push-sum and server rounds over ``n_nodes`` nodes, and the loop's collectives."""

    n_nodes: int

    # -- who this process is ------------------------------------------------------------------
    @property
    @abstractmethod
    def owned(self) -> torch.Tensor:
        """Indices (int64) of the nodes this process owns, in the order of the leading dim."""

    @property
    def owned_list(self) -> list[int]:
        """:attr:`owned` as Python ints, read once: ``owned.tolist()`` on a CUDA tensor would wait
        for the GPU at every step (the owned nodes never change)."""
        cached = self.__dict__.get("_owned_list")
        if cached is None:
            cached = self.__dict__["_owned_list"] = self.owned.tolist()
        return list(cached)

    @property
    def rank(self) -> int:
        """This process's rank (0 in the simulator)."""
        return 0

    @property
    def world_size(self) -> int:
        """Number of processes (1 in the simulator)."""
        return 1

    @property
    def is_writer(self) -> bool:
        """Whether this process writes the records (rank 0)."""
        return self.rank == 0

    @property
    def backend(self) -> str | None:
        """The torch.distributed backend (None in the simulator)."""
        return None

    # -- the algorithms' operations ---------------------------------------------------------
    @abstractmethod
    def mix(self, tree: Tree, t: int) -> Tree:
        """Gossip step ``x_i <- sum_j W_ij x_j`` with the mixing matrix of step ``t``."""

    @abstractmethod
    def push_sum(self, tree: Tree, weight: torch.Tensor, t: int) -> tuple[Tree, torch.Tensor]:
        """Push-sum step with column-stochastic ``P_t``: ``x <- P_t x`` and ``w <- P_t w``."""

    @abstractmethod
    def average(self, tree: Tree) -> Tree:
        """Mean over ALL nodes, returned once (no leading node dim): the averaged model."""

    @abstractmethod
    def weighted_sum(self, tree: Tree, weights: torch.Tensor) -> Tree:
        """``sum_i weights_i x_i`` over all nodes (server aggregation); no leading node dim."""

    def broadcast(self, tree: Tree) -> Tree:
        """Copy a server value to every owned node (adds the leading node dim)."""
        k = self.owned.numel()
        return {name: v.unsqueeze(0).expand(k, *v.shape).clone() for name, v in tree.items()}

    @abstractmethod
    def all_gather_nodes(self, tree: Tree) -> Tree:
        """Every node's rows ``(n, ...)`` on every process (evaluation, checkpoints, and a
        server that needs every client's update)."""

    @abstractmethod
    def shard(self, tree: Tree) -> Tree:
        """The owned rows of a full ``(n, ...)`` tree."""

    @abstractmethod
    def key_transport(self, edges: Any, *, record_bytes: int = 32) -> KeyTransport:
        """Carries the public keys of the owned nodes to their neighbours (DECOR's setup)."""

    # -- the loop's collectives (values that are not tensors) ----------------------------------
    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process (the simulator: ``obj`` itself)."""
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order (the simulator: ``[obj]``)."""
        return [obj]
