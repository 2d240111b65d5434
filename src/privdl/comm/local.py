"""Single-process communicator: every node lives in this process; mixing is a matrix product."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from privdl.comm.base import Communicator
from privdl.mechanisms.secrets import LocalKeyTransport
from privdl.topology.mixing import MixingMatrix
from privdl.topology.timevarying import ExponentialGraph
from privdl.tree import Tree

#: Above this many nodes the mixing matrix is applied as a sparse CSR product.
SPARSE_ABOVE = 256

Schedule = MixingMatrix | ExponentialGraph | Callable[[int], MixingMatrix]


def sparse_csr(matrix: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scipy sparse matrix as a torch sparse CSR tensor (the product of a mixing matrix above
    :data:`SPARSE_ABOVE` nodes, here and in the distributed communicator's blocks)."""
    csr = matrix.tocsr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        return torch.sparse_csr_tensor(
            torch.from_numpy(csr.indptr.astype(np.int64)),
            torch.from_numpy(csr.indices.astype(np.int64)),
            torch.from_numpy(csr.data),
            size=csr.shape,
            dtype=dtype,
            device=device,
        )


class LocalCommunicator(Communicator):
    """Simulates ``n`` nodes in one process with dense or sparse products of ``W`` (or ``P_t``).

    ``schedule`` is a static :class:`MixingMatrix`, the :class:`ExponentialGraph` (applied as
    ``(x + roll(x, h))/2`` without building a matrix), or any callable ``t -> MixingMatrix``.
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        n_nodes: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.schedule = schedule
        if isinstance(schedule, MixingMatrix | ExponentialGraph):
            self.n_nodes = schedule.n
        elif n_nodes is None:
            raise ValueError("n_nodes is required with a callable schedule")
        else:
            self.n_nodes = int(n_nodes)
        self.device = torch.device(device)
        self.dtype = dtype
        self._static = self._to_torch(schedule) if isinstance(schedule, MixingMatrix) else None
        # one node with W = [[1]] (``complete:1``, DP-SGD with a trusted aggregator): the product
        # is 1.0 * x, equal to x as a number (the BLAS may give +0.0 for -0.0), so mixing
        # returns the tree untouched
        self._identity = (  # (one node is always below SPARSE_ABOVE: a dense 1 x 1 W)
            self._static is not None and self.n_nodes == 1 and float(self._static[0, 0]) == 1.0
        )
        self._owned = torch.arange(self.n_nodes, device=self.device)

    @property
    def owned(self) -> torch.Tensor:
        return self._owned

    def _to_torch(self, m: MixingMatrix) -> torch.Tensor:
        if m.n > SPARSE_ABOVE:
            return sparse_csr(m.matrix, dtype=self.dtype, device=self.device)
        return torch.as_tensor(m.dense(), dtype=self.dtype, device=self.device)

    def matrix(self, t: int) -> torch.Tensor:
        """The mixing matrix of step ``t`` as a torch tensor (dense or sparse CSR)."""
        if self._static is not None:
            return self._static
        if isinstance(self.schedule, ExponentialGraph):
            m = self.schedule.mixing(t)
        else:
            m = self.schedule(t)  # type: ignore[operator]  # a callable t -> MixingMatrix
        return self._to_torch(m)

    def _apply(self, x: torch.Tensor, t: int) -> torch.Tensor:
        if isinstance(self.schedule, ExponentialGraph):
            if self.n_nodes == 1:
                return x
            h = self.schedule.hop(t)
            return 0.5 * (x + torch.roll(x, shifts=h, dims=0))
        w = self.matrix(t)
        flat = x.reshape(x.shape[0], -1)
        if w.dtype != flat.dtype:
            w = w.to(flat.dtype)
        out = w @ flat
        return out.reshape(x.shape)

    def mix(self, tree: Tree, t: int) -> Tree:
        if self._identity:
            return dict(tree)
        return {k: self._apply(v, t) for k, v in tree.items()}

    def push_sum(self, tree: Tree, weight: torch.Tensor, t: int) -> tuple[Tree, torch.Tensor]:
        return self.mix(tree, t), self._apply(weight, t)

    def average(self, tree: Tree) -> Tree:
        return {k: v.mean(dim=0) for k, v in tree.items()}

    def weighted_sum(self, tree: Tree, weights: torch.Tensor) -> Tree:
        out = {}
        for k, v in tree.items():
            w = weights.to(v.dtype).reshape(-1, *([1] * (v.dim() - 1)))
            out[k] = (w * v).sum(dim=0)
        return out

    def all_gather_nodes(self, tree: Tree) -> Tree:
        """Every node lives here: the tree itself."""
        return tree

    def shard(self, tree: Tree) -> Tree:
        """Every node is owned here: the tree itself."""
        return tree

    def key_transport(self, edges: Any, *, record_bytes: int = 32) -> LocalKeyTransport:
        """An in-process board of public keys over all nodes."""
        return LocalKeyTransport(edges, self.n_nodes)
