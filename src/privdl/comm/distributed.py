"""Distributed communicator on ``torch.distributed``: nodes sharded over processes (DESIGN.md).

Each process (rank ``r`` of ``P``) owns a contiguous block of nodes (:func:`shard_ranges`); its
node state has those nodes as leading dimension. The operations mirror
:class:`~privdl.comm.local.LocalCommunicator` so an algorithm is written once:

* ``mix`` / ``push_sum`` (gossip ``x_i <- sum_j W_ij x_j``, DECOR eq. 4; push-sum with a
  column-stochastic ``P_t``, PrivSGP-VR Alg. 1): every rank computes, from the global ``W_t``
  that all ranks know, which of its rows each neighbouring rank needs, and the rows are exchanged
  with **batched point-to-point messages** (``dist.batch_isend_irecv``: one ``isend`` and one
  ``irecv`` per neighbouring rank, all leaves flattened into one message). Only rows that a
  neighbour uses cross the wire; all-to-all would move every rank's rows to every rank.
* ``average`` / ``weighted_sum`` (server aggregation): local partial sums and one ``all_reduce``.
* ``broadcast``: the server value lives on rank ``server`` (0) and is ``dist.broadcast``.

:class:`DistributedKeyTransport` carries DECOR's X25519 public keys between the ranks that own
neighbouring nodes (the per-edge secrets are derived locally by
:func:`~privdl.mechanisms.secrets.agree_edge_secrets`; no secret is ever sent) and records every
payload it carries in ``carried``.

Failures of a peer (a process died, a connection closed, a timeout) surface as
:class:`DistributedError` with one line saying what happened, within the process group timeout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from privdl.comm import wire
from privdl.comm.base import Communicator
from privdl.comm.local import SPARSE_ABOVE, sparse_csr
from privdl.errors import ConfigError, PrivdlError
from privdl.mechanisms.secrets import as_edge_array
from privdl.topology.mixing import MixingMatrix
from privdl.topology.timevarying import ExponentialGraph
from privdl.tree import Tree

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DistributedCommunicator",
    "DistributedError",
    "DistributedKeyTransport",
    "all_gather_objects",
    "backend_name",
    "broadcast_object",
    "init_from_env",
    "shard_ranges",
    "shutdown",
]

#: Seconds a process waits for a peer before it gives up (process group and message timeout).
DEFAULT_TIMEOUT_S = 60.0

Schedule = MixingMatrix | ExponentialGraph | Callable[[int], MixingMatrix]


class DistributedError(PrivdlError):
    """A peer process failed, hung past the timeout, or the process group could not start."""


def shard_ranges(n_nodes: int, world_size: int) -> list[range]:
    """Contiguous, balanced node blocks: rank ``r`` owns ``ranges[r]`` (sizes differ by <= 1)."""
    if world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {world_size}")
    if world_size > n_nodes:
        raise ConfigError(
            f"world size {world_size} exceeds the {n_nodes} nodes of the graph; "
            f"use at most {n_nodes} processes (every process must own at least one node)"
        )
    base, extra = divmod(n_nodes, world_size)
    out, start = [], 0
    for r in range(world_size):
        size = base + (1 if r < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def init_from_env(*, device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
    """Join the process group named by ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``.

    Works under ``torchrun`` and ``privdl launch``. Backend: NCCL for CUDA devices, gloo on CPU.
    Returns ``(rank, world_size)``; a port in use or a peer that never shows up is a one-line
    :class:`~privdl.errors.ConfigError` / :class:`DistributedError`.
    """
    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise ConfigError(
            f"distributed environment incomplete (missing {', '.join(missing)}); "
            "start with 'privdl launch --nproc N' or torchrun"
        )
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    if backend == "nccl":
        # one GPU per local rank where there are enough; ranks share them round-robin otherwise
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local % max(torch.cuda.device_count(), 1))
    try:
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - c10d raises several types; all become one line
        msg = _one_line(exc)
        addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        if "address already in use" in msg.lower() or "EADDRINUSE" in msg:
            raise ConfigError(
                f"port {port} on {addr} is already in use; choose another --master-port"
            ) from None
        raise DistributedError(
            f"could not join the process group at {addr}:{port} within {timeout_s:g}s: {msg}"
        ) from None
    return dist.get_rank(), dist.get_world_size()


def _wire_device() -> torch.device:
    """Where collective buffers live: the current CUDA device under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _as_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        if data
        else (torch.empty(0, dtype=torch.uint8, device=device))
    )


def broadcast_object(obj: Any, *, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (tensors and plain data) on every rank of the initialised process
    group, sent as :func:`privdl.comm.wire.encode`'s bytes (no pickle on the wire: what a peer
    sends is read as data, never run)."""
    device = _wire_device()
    mine = dist.get_rank() == src
    payload = wire.encode(obj) if mine else b""
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    buf = (
        _as_tensor(payload, device)
        if mine
        else torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    )
    dist.broadcast(buf, src=src)
    return obj if mine else wire.decode(buf.cpu().numpy().tobytes())


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (tensors and plain data), in rank order; sent as
    :func:`privdl.comm.wire.encode`'s bytes, as :func:`broadcast_object`."""
    device = _wire_device()
    payload = wire.encode(obj)
    world = dist.get_world_size()
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8, device=device)
    buf[: len(payload)] = _as_tensor(payload, device)
    bufs = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(bufs, buf)
    me = dist.get_rank()
    return [
        obj if r == me else wire.decode(b[: int(s.item())].cpu().numpy().tobytes())
        for r, (b, s) in enumerate(zip(bufs, sizes, strict=True))
    ]


def backend_name() -> str:
    """The process group's backend (gloo, nccl)."""
    return str(dist.get_backend())


def shutdown() -> None:
    """Leave the process group (after a clean run)."""
    dist.destroy_process_group()


@dataclass(frozen=True)
class _Plan:
    """Who sends which rows to whom for one mixing matrix (computed identically on every rank).

    ``send[q]``: local row positions this rank sends to rank ``q``; ``recv[q]``: global node ids it
    receives from ``q`` (sorted); ``cols``: the global ids of the rows ``block`` multiplies
    (sorted union of owned and received); ``block``: ``W[owned][:, cols]`` or ``None`` for the
    exponential graph (``hop`` set instead).
    """

    send: dict[int, torch.Tensor]
    recv: dict[int, np.ndarray]
    cols: np.ndarray
    block: torch.Tensor | None
    hop: int | None = None


class DistributedCommunicator(Communicator):
    """Gossip, push-sum and server rounds between processes that each own a shard of nodes.

    ``schedule`` is the same object the simulator takes (a static :class:`MixingMatrix`, the
    :class:`ExponentialGraph`, or a callable ``t -> MixingMatrix``); every rank must pass the same
    one. ``rank``/``world_size`` default to the initialised process group.
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        n_nodes: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        server: int = 0,
    ) -> None:
        if not dist.is_initialized():
            raise DistributedError("torch.distributed is not initialised; call init_from_env()")
        self.schedule = schedule
        if isinstance(schedule, MixingMatrix | ExponentialGraph):
            self.n_nodes = schedule.n
        elif n_nodes is None:
            raise ConfigError("n_nodes is required with a callable schedule")
        else:
            self.n_nodes = int(n_nodes)
        self._rank = dist.get_rank() if rank is None else int(rank)
        self._world_size = dist.get_world_size() if world_size is None else int(world_size)
        self.shards = shard_ranges(self.n_nodes, self.world_size)
        self.owner = np.repeat(np.arange(self.world_size), [len(s) for s in self.shards])
        self.device = torch.device(device)
        self.dtype = dtype
        self.timeout = timedelta(seconds=timeout_s)
        self.server = server
        mine = self.shards[self.rank]
        self._owned = torch.arange(mine.start, mine.stop, device=self.device)
        self._plans: dict[Any, _Plan] = {}

    @property
    def owned(self) -> torch.Tensor:
        return self._owned

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def backend(self) -> str | None:
        return backend_name()

    # ----------------------------------------------------------------- plans
    def _plan(self, t: int) -> _Plan:
        if isinstance(self.schedule, ExponentialGraph):
            hop = 0 if self.n_nodes == 1 else self.schedule.hop(t)
            key: Any = ("hop", hop)
            if key not in self._plans:
                self._plans[key] = self._expo_plan(hop)
            return self._plans[key]
        if isinstance(self.schedule, MixingMatrix):
            key = "static"
            if key not in self._plans:
                self._plans[key] = self._matrix_plan(self.schedule)
            return self._plans[key]
        return self._matrix_plan(self.schedule(t))  # time-varying callable: planned each step

    def _routes(self, needs: Callable[[range], np.ndarray]) -> tuple[dict, dict, np.ndarray]:
        """Send/receive lists from ``needs(shard) -> sorted global rows that shard reads``."""
        me, mine = self.rank, self.shards[self.rank]
        send: dict[int, torch.Tensor] = {}
        recv: dict[int, np.ndarray] = {}
        cols = needs(mine)
        for q, shard in enumerate(self.shards):
            if q == me:
                continue
            theirs = needs(shard)
            out = theirs[(theirs >= mine.start) & (theirs < mine.stop)] - mine.start
            if out.size:
                send[q] = torch.from_numpy(out).to(self.device)
            inc = cols[(cols >= shard.start) & (cols < shard.stop)]
            if inc.size:
                recv[q] = inc
        return send, recv, cols

    def _matrix_plan(self, m: MixingMatrix) -> _Plan:
        if m.n != self.n_nodes:
            raise ConfigError(f"mixing matrix has {m.n} nodes, the communicator {self.n_nodes}")
        csr = m.matrix.tocsr()

        def needs(shard: range) -> np.ndarray:
            rows = csr[shard.start : shard.stop]
            return np.union1d(np.unique(rows.indices), np.arange(shard.start, shard.stop))

        send, recv, cols = self._routes(needs)
        mine = self.shards[self.rank]
        sub = csr[mine.start : mine.stop][:, cols]
        if self.n_nodes > SPARSE_ABOVE:  # sparse as the simulator's: a dense block of a random
            # graph's shard is (n / ranks) x n (37 GiB at 10^5 nodes on 2 ranks)
            sub.sort_indices()
            block = sparse_csr(sub, dtype=self.dtype, device=self.device)
        else:
            block = torch.as_tensor(sub.toarray(), dtype=self.dtype, device=self.device)
        return _Plan(send, recv, cols, block)

    def _expo_plan(self, hop: int) -> _Plan:
        n = self.n_nodes

        def needs(shard: range) -> np.ndarray:
            return np.union1d((np.arange(shard.start, shard.stop) - hop) % n, np.array(shard))

        send, recv, cols = self._routes(needs)
        return _Plan(send, recv, cols, None, hop=hop)

    # ------------------------------------------------------------- exchange
    def _fail(self, what: str, exc: BaseException) -> DistributedError:
        return DistributedError(
            f"rank {self.rank}: {what} failed, a peer process died or stopped answering "
            f"(timeout {self.timeout.total_seconds():g}s; a slow peer, e.g. key set-up on a "
            f"large graph, needs a longer `privdl launch --timeout`): {_one_line(exc)}"
        )

    def _exchange(self, flat: torch.Tensor, plan: _Plan, t: int) -> torch.Tensor:
        """Rows ``cols`` of the global ``(n, P)`` matrix: owned rows plus what peers sent."""
        mine = self.shards[self.rank]
        ext = torch.empty((len(plan.cols), flat.shape[1]), dtype=flat.dtype, device=flat.device)
        own_pos = np.searchsorted(plan.cols, np.arange(mine.start, mine.stop))
        ext[torch.from_numpy(own_pos).to(flat.device)] = flat
        ops, bufs = [], {}
        for q, idx in plan.send.items():
            ops.append(dist.P2POp(dist.isend, flat.index_select(0, idx).contiguous(), q))
        for q, rows in plan.recv.items():
            bufs[q] = torch.empty((len(rows), flat.shape[1]), dtype=flat.dtype, device=flat.device)
            ops.append(dist.P2POp(dist.irecv, bufs[q], q))
        if ops:
            try:
                for work in dist.batch_isend_irecv(ops):
                    work.wait(self.timeout)
            except Exception as exc:  # noqa: BLE001 - gloo/NCCL raise RuntimeError subclasses
                raise self._fail(f"gossip at step {t}", exc) from None
        for q, rows in plan.recv.items():
            pos = torch.from_numpy(np.searchsorted(plan.cols, rows)).to(flat.device)
            ext[pos] = bufs[q]
        return ext

    def _apply(self, flat: torch.Tensor, t: int) -> torch.Tensor:
        plan = self._plan(t)
        if self.world_size == 1 and plan.block is None and plan.hop == 0:
            return flat
        ext = self._exchange(flat, plan, t)
        if plan.block is None:  # exponential graph: (x_i + x_{i-h}) / 2, as the simulator
            if plan.hop == 0:
                return flat
            src = (self._owned.cpu().numpy() - plan.hop) % self.n_nodes
            pos = torch.from_numpy(np.searchsorted(plan.cols, src)).to(flat.device)
            return 0.5 * (flat + ext.index_select(0, pos))
        block = plan.block if plan.block.dtype == flat.dtype else plan.block.to(flat.dtype)
        return block @ ext

    def _mix_flat(self, tree: Tree, t: int, extra: torch.Tensor | None = None) -> tuple:
        leaves = list(tree.values())
        k = self._owned.numel()
        dtypes = {v.dtype for v in leaves} | ({extra.dtype} if extra is not None else set())
        if len(dtypes) > 1:  # mixed dtypes: one message per leaf
            out = {
                name: self._apply(v.reshape(k, -1), t).reshape(v.shape) for name, v in tree.items()
            }
            w = None if extra is None else self._apply(extra.reshape(k, 1), t).reshape(extra.shape)
            return out, w
        parts = [v.reshape(k, -1) for v in leaves]
        if extra is not None:
            parts.append(extra.reshape(k, 1))
        mixed = self._apply(torch.cat(parts, dim=1), t)
        out, start = {}, 0
        for name, v in tree.items():
            size = v[0].numel()
            out[name] = mixed[:, start : start + size].reshape(v.shape)
            start += size
        w = None if extra is None else mixed[:, start].reshape(extra.shape)
        return out, w

    # ------------------------------------------------------------ interface
    def mix(self, tree: Tree, t: int) -> Tree:
        """``x_i <- sum_j W_ij x_j`` for the owned rows (DECOR eq. 4); one message per peer."""
        return self._mix_flat(tree, t)[0]

    def push_sum(self, tree: Tree, weight: torch.Tensor, t: int) -> tuple[Tree, torch.Tensor]:
        """Push-sum: ``x <- P_t x``, ``w <- P_t w`` (weights travel in the same message)."""
        out, w = self._mix_flat(tree, t, extra=weight)
        return out, w

    def _all_reduce(self, x: torch.Tensor, what: str) -> torch.Tensor:
        try:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        except Exception as exc:  # noqa: BLE001
            raise self._fail(what, exc) from None
        return x

    def average(self, tree: Tree) -> Tree:
        """Mean over all ``n`` nodes on every rank (local sums, one all-reduce per leaf)."""
        return {
            k: self._all_reduce(v.sum(dim=0), "average") / self.n_nodes for k, v in tree.items()
        }

    def weighted_sum(self, tree: Tree, weights: torch.Tensor) -> Tree:
        """``sum_i weights_i x_i`` over all nodes; ``weights`` has ``n`` (global) or owned length."""
        if weights.numel() == self.n_nodes and self.n_nodes != self._owned.numel():
            weights = weights.to(self.device)[self._owned]
        if weights.numel() != self._owned.numel():
            raise ConfigError(
                f"weights must have {self.n_nodes} (all) or {self._owned.numel()} (owned) entries"
            )
        out = {}
        for k, v in tree.items():
            w = weights.to(v.dtype).reshape(-1, *([1] * (v.dim() - 1)))
            out[k] = self._all_reduce((w * v).sum(dim=0), "weighted_sum")
        return out

    def broadcast(self, tree: Tree) -> Tree:
        """The server's (rank ``server``) value, copied to every owned node of every rank."""
        k = self._owned.numel()
        out = {}
        for name, v in tree.items():
            buf = v.contiguous().clone()
            try:
                dist.broadcast(buf, src=self.server)
            except Exception as exc:  # noqa: BLE001
                raise self._fail("broadcast", exc) from None
            out[name] = buf.unsqueeze(0).expand(k, *buf.shape).clone()
        return out

    def all_gather_nodes(self, tree: Tree) -> Tree:
        """Every node's rows on every rank: ``(n, ...)`` leaves (for evaluation and checkpoints)."""
        size = max(len(s) for s in self.shards)
        out = {}
        for name, v in tree.items():
            pad = torch.zeros((size, *v.shape[1:]), dtype=v.dtype, device=v.device)
            pad[: v.shape[0]] = v
            bufs = [torch.empty_like(pad) for _ in range(self.world_size)]
            try:
                dist.all_gather(bufs, pad)
            except Exception as exc:  # noqa: BLE001
                raise self._fail("all_gather", exc) from None
            out[name] = torch.cat([b[: len(s)] for b, s in zip(bufs, self.shards, strict=True)])
        return out

    def shard(self, tree: Tree) -> Tree:
        """The owned rows of a full ``(n, ...)`` tree."""
        mine = self.shards[self.rank]
        return {k: v[mine.start : mine.stop].clone() for k, v in tree.items()}

    def key_transport(self, edges: Any, *, record_bytes: int = 32) -> DistributedKeyTransport:
        """Public keys to the ranks that own neighbouring nodes (batched point-to-point);
        ``record_bytes`` per node (96: a key and its Ed25519 signature)."""
        return DistributedKeyTransport(self, edges, record_bytes=record_bytes)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (plain data on the wire, :mod:`privdl.comm.wire`)."""
        try:
            return broadcast_object(obj)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("broadcast", exc) from None

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        try:
            return all_gather_objects(obj)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("all_gather", exc) from None


class DistributedKeyTransport:
    """DECOR's key transport between ranks: public keys only (paper s.2; docs/secrets.md section 1).

    Ranks publish the X25519 public keys of their owned nodes; on the first ``collect`` each rank
    sends, to every rank owning a neighbour of one of its nodes, the keys of its nodes adjacent to
    that rank (``(m, 32)`` uint8, nodes in increasing order, so no ids need to travel) and
    receives theirs (batched point-to-point). ``carried`` records every payload:
    ``(direction, from_rank, to_rank, bytes)``. ``record_bytes``: what each node publishes (32:
    its key; 96: its key and signature, docs/security.md s.3).
    """

    KEY_BYTES = 32

    def __init__(
        self, comm: DistributedCommunicator, edges: Any, *, record_bytes: int = KEY_BYTES
    ) -> None:
        self.comm = comm
        self.record_bytes = int(record_bytes)
        array = as_edge_array(edges, comm.n_nodes)
        self.neighbours: dict[int, list[int]] = {i: [] for i in range(comm.n_nodes)}
        for u, v in array.tolist():
            self.neighbours[u].append(v)
            self.neighbours[v].append(u)
        self._board: dict[int, bytes] = {}
        self._done = False
        self.carried: list[tuple[str, int, int, bytes]] = []

    def publish(self, node: int, public_bytes: bytes) -> None:
        if len(public_bytes) != self.record_bytes:
            raise PrivdlError(f"public keys are {self.record_bytes} bytes; got {len(public_bytes)}")
        self._board[int(node)] = bytes(public_bytes)

    def _boundary(self, src: range, dst: range) -> list[int]:
        """Nodes of ``src`` with a neighbour in ``dst``, increasing."""
        return [i for i in src if any(dst.start <= j < dst.stop for j in self.neighbours[i])]

    def _exchange(self) -> None:
        comm, me = self.comm, self.comm.rank
        mine = comm.shards[me]
        missing = [i for i in mine if i not in self._board]
        if missing:
            raise PrivdlError(f"rank {me}: nodes {missing[:5]} did not publish a public key")
        ops, bufs = [], {}
        for q, shard in enumerate(comm.shards):
            if q == me:
                continue
            out_nodes = self._boundary(mine, shard)
            if out_nodes:
                payload = b"".join(self._board[i] for i in out_nodes)
                self.carried.append(("send", me, q, payload))
                data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
                data = data.reshape(-1, self.record_bytes).to(comm.device)  # NCCL: device tensors
                ops.append(dist.P2POp(dist.isend, data, q))
            in_nodes = self._boundary(shard, mine)
            if in_nodes:
                buf = torch.empty(
                    (len(in_nodes), self.record_bytes), dtype=torch.uint8, device=comm.device
                )
                bufs[q] = (in_nodes, buf)
                ops.append(dist.P2POp(dist.irecv, bufs[q][1], q))
        if ops:
            try:
                for work in dist.batch_isend_irecv(ops):
                    work.wait(comm.timeout)
            except Exception as exc:  # noqa: BLE001
                raise comm._fail("public-key exchange", exc) from None
        for q, (nodes, buf) in bufs.items():
            payload = bytes(buf.cpu().numpy().tobytes())
            self.carried.append(("recv", q, me, payload))
            for k, i in enumerate(nodes):
                self._board[i] = payload[k * self.record_bytes : (k + 1) * self.record_bytes]
        self._done = True

    def collect(self, node: int) -> Mapping[int, bytes]:
        if not self._done:
            self._exchange()
        return {j: self._board[j] for j in self.neighbours[int(node)]}
