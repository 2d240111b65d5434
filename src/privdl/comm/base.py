"""The communicator: the only way algorithms talk (DESIGN.md, "Communicator").

Node state is a tree (``dict[str, Tensor]``) whose tensors have the nodes this process owns as
leading dimension. An algorithm is written once against this interface and runs on the
single-process simulator (:class:`~privdl.comm.local.LocalCommunicator`) or on a distributed
backend that owns a shard of the nodes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

Tree = dict[str, torch.Tensor]


class Communicator(ABC):
    """Gossip, push-sum and server rounds over ``n_nodes`` nodes."""

    n_nodes: int

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
