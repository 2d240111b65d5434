"""Heterogeneous-DP federated learning: local DP-SGD on every client, weighted server rounds.

Robust-HDP (Malekmohammadi, Yu & Cao, ICML 2024), Algorithm 1, with the baselines of Table 1.
Round e (all clients, or ``clients_per_round`` of them drawn uniformly without replacement):

1. the server broadcasts ``theta^e`` (``Communicator.broadcast``);
2. every participating client i runs ``E_i = K ceil(N_i/b_i)`` DP-SGD steps (Eq. 1)
   ``theta <- theta - eta_l (1/b_i) [ sum_{j in B} clip(grad l_j, c) + N(0, c^2 z_i^2 I_p) ]``
   with Poisson sampling at rate ``q_i = b_i/N_i`` and the expected batch size ``b_i`` as the
   denominator (Opacus semantics, as the authors' reference code runs it; docs/robust-hdp.md), and
   uploads ``Delta_i = theta_{i,E_i} - theta^e``;
3. the server forms ``M = [Delta_1 | ... | Delta_k]`` and an :class:`Aggregator` gives weights;
   ``theta^{e+1} = theta^e + sum_i w_i Delta_i`` (line 7; ``Communicator.weighted_sum``).

All clients run at once: parameters are stacked ``(n, ...)``, heterogeneous batch sizes are
masks, clients that finished their ``E_i`` steps (or sit the round out) are frozen by a 0/1
factor. :class:`FederatedRounds` follows the algorithm protocol (:mod:`privdl.algorithms.base`):
it is given each client's noise multiplier ``z_i`` (calibrated by the recipe,
:mod:`privdl.recipes.federated`, which also accounts each client's epsilon) and owns no data:
the clients' local data is the oracle, :class:`ClientData`.

Random draws per local step, in this order (tests replay them): ``rand(n, m_max)`` for Poisson
sampling, then ``randn(n, *shape)`` for each parameter in model order, from one generator on the
data's device (``torch.Generator(device=data.x.device)``; CUDA and CPU streams differ).

Keyed clients (``key_source = "os"``, docs/security.md s.1): each client's Poisson sampling and
noise come instead from its own 32-byte key (``FederatedState.noise_keys``, OS randomness, held
only by the process that runs the client): local step k of round e uses counter
``e 2^32 + k``, keyed uniforms (substream 0, :func:`~privdl.mechanisms.prng.uniform_streams`)
for the batch and keyed normals (substream 1 + j for the j-th parameter,
:func:`~privdl.mechanisms.prng.normal_streams`) for the noise. The shared generator then draws
only the participants, which the server learns anyway; nothing that reaches the server (the
broadcast seed, its checkpoint's generator state, the gathered updates) rebuilds a client's
noise.

Sharded (``torch.distributed``, docs/distributed.md): with a communicator that owns a shard of
the clients, every process holds the same config and its clients' data, and runs the local steps
of the clients it owns (``comm.owned``) only. In a seeded run every process
draws the full ``(n, ...)`` tensors above from the same seeded generator and keeps its rows, so a
client's draws do not depend on the sharding and the round equals the simulator's (cost: the
draws of all n clients on every process, O(n (m_max + p)) per local step, small next to the
owned clients' gradients). The server's update matrix M is gathered with ``all_gather_nodes``;
every process runs the aggregator on it, rank 0's (the server's) weights are broadcast, and the
aggregate is ``weighted_sum`` (local partial sums plus one all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privdl.algorithms.aggregators import AggregationInput, Aggregator
from privdl.algorithms.base import Keys, StepInfo
from privdl.comm.base import Communicator
from privdl.data.batching import StackedData
from privdl.engine.grads import ClipSpec, node_gradients
from privdl.engine.losses import correct, per_sample_loss
from privdl.errors import ConfigError
from privdl.mechanisms.prng import normal_streams, uniform_streams
from privdl.models.base import StackedModel
from privdl.tree import Tree, flatten, unflatten

__all__ = [
    "ClientData",
    "FederatedRounds",
    "FederatedState",
    "batch_size_buckets",
    "evaluate_clients",
    "flatten_tree",
    "split_train_test",
]


def flatten_tree(tree: Tree, *, leading: bool = True) -> Tensor:
    """``(n, p)`` (or ``(p,)``) in parameter order: the rows of Robust-HDP's M after transpose."""
    if leading:
        return flatten(tree)
    return torch.cat([v.reshape(-1) for v in tree.values()])


@dataclass
class FederatedState:
    """Server model ``theta`` (no node dim), round counter, per-client participation, RNG;
    ``noise_keys``: the held clients' own stream keys (``key_source = "os"``; empty in a seeded
    run, whose clients draw from ``generator``)."""

    theta: Tree
    round: int
    participated: Tensor
    generator: torch.Generator
    history: list[dict[str, Any]] = field(default_factory=list)
    noise_keys: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def t(self) -> int:
        """The rounds done (a run's step counter, as the decentralized states' ``t``)."""
        return self.round

    @property
    def params(self) -> Tree:
        """The server's model as one row (what the loop evaluates and checkpoints)."""
        return {k: v.unsqueeze(0) for k, v in self.theta.items()}


BUCKET_RATIO = 1.5


def batch_size_buckets(batch_sizes: np.ndarray, *, ratio: float = BUCKET_RATIO) -> list[Tensor]:
    """Clients grouped by expected batch size: sorted, a new class starts where ``b`` exceeds
    ``ratio`` times the class's smallest. Returns index tensors (ascending within a class).

    A local step pads each class to its own widest Poisson batch instead of every client to
    the widest of all: with the Robust-HDP list (b in {16, 32, 64, 128}) the padded samples fall
    from 2.25x to 1.25x the real ones. The number of classes is at most
    ``1 + log(max b / min b) / log(ratio)`` (4 here, 1 for equal batch sizes), whatever the
    number of clients.
    """
    b = np.asarray(batch_sizes, float)
    order = np.argsort(b, kind="stable")
    buckets: list[list[int]] = []
    low = None
    for i in order:  # setup only: once per trainer
        if low is None or b[i] > ratio * low:
            buckets.append([])
            low = b[i]
        buckets[-1].append(int(i))
    return [torch.as_tensor(sorted(c), dtype=torch.int64) for c in buckets]


@dataclass
class ClientData:
    """The oracle of a federated run: the held clients' local data and the model they train.

    ``x``, ``y``: the rows of the clients this process runs (``rows``, global ids; all of them in
    the simulator), padded ``(k, m_max, ...)``; ``counts``: every client's ``N_i`` (all ``n``).
    :meth:`poisson_batches` draws every client's batch (so the generator advances the same way
    whatever a process holds); :meth:`gradients` clips the held clients' per-sample gradients.
    The held clients are grouped in batch-size classes (:func:`batch_size_buckets`): a local step
    computes one class at a time, padded to that class's widest Poisson batch. On a CPU
    (compute-bound) this saves the padded work; on a GPU, where a local step of the MNIST CNN is
    launch-bound, one class keeps one launch sequence per step (same values either way, tested).
    """

    model: StackedModel
    x: Tensor
    y: Tensor
    counts: Tensor
    rows: Tensor
    loss: str = "cross_entropy"
    buckets: list[Tensor] = field(default_factory=list)

    @classmethod
    def from_stacked(
        cls,
        model: StackedModel,
        data: StackedData,
        *,
        rows: Tensor | None = None,
        batch_sizes: np.ndarray | None = None,
        loss: str = "cross_entropy",
    ) -> ClientData:
        """The oracle of clients ``rows`` (default all) of the stacked data."""
        n = data.counts.numel()
        dev = data.x.device
        rows = torch.arange(n) if rows is None else torch.as_tensor(rows, dtype=torch.int64)
        rows = rows.to(dev)
        sharded = rows.numel() != n
        x = data.x.index_select(0, rows) if sharded else data.x
        y = data.y.index_select(0, rows) if sharded else data.y
        b = data.counts.cpu().numpy().astype(float) if batch_sizes is None else batch_sizes
        held_b = np.asarray(b, float)[rows.cpu().numpy()]
        buckets = (
            batch_size_buckets(held_b)
            if dev.type == "cpu"
            else [torch.arange(len(held_b), dtype=torch.int64)]
        )
        return cls(model, x, y, data.counts.to(dev), rows, loss, buckets)

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def n_clients(self) -> int:
        return int(self.counts.numel())

    def poisson_batches(
        self, gen: torch.Generator, rates: np.ndarray | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Poisson batches (``q_i = b_i / N_i``) of ALL clients, left-packed ``(n, N_max)`` with a
        mask, and each client's batch size ``(n,)`` (``rates=None``: every sample, in order). No
        value is read back to the host here: on a GPU the caller reads the one width it needs
        (one sync per local step)."""
        counts = self.counts
        n, width = self.n_clients, self.x.shape[1]
        if rates is None:
            return _packed(None, counts, None, width)
        u = torch.rand(n, width, generator=gen, device=gen.device).to(counts.device)
        return _packed(u, counts, torch.as_tensor(rates, device=counts.device), width)

    def keyed_batches(
        self, keys: tuple[bytes, ...], counter: int, rates: np.ndarray | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Poisson batches of the HELD clients (``rows``), each from its own key ``keys[r]``
        (uniforms of :func:`~privdl.mechanisms.prng.uniform_streams`, substream 0)."""
        counts = self.counts.index_select(0, self.rows)
        width = self.x.shape[1]
        if rates is None:
            return _packed(None, counts, None, width)
        u = uniform_streams(keys, counter, width, substream=0, device=counts.device)
        rate = torch.as_tensor(np.asarray(rates, float), device=counts.device)[self.rows]
        return _packed(u, counts, rate, width)

    def gradients(
        self,
        params: Tree,
        live: Tensor,
        index: Tensor,
        mask: Tensor,
        *,
        clip: ClipSpec,
        denominator: Tensor,
    ) -> Tree:
        """Summed clipped per-sample gradients over ``denominator`` of the held clients at
        positions ``live`` on their batches ``index`` (``(len(live), width)``)."""
        at = live[:, None]
        xb, yb = self.x[at, index], self.y[at, index]
        return node_gradients(
            self.model, params, xb, yb, loss=self.loss, clip=clip, mask=mask,
            denominator=denominator,
        ).grads  # fmt: skip


def _packed(
    u: Tensor | None, counts: Tensor, rate: Tensor | None, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample j of client i joins where ``u[i, j] < rate[i]`` (``u=None``: every sample);
    left-packed indices, their mask and each client's batch size."""
    valid = torch.arange(width, device=counts.device)[None, :] < counts[:, None]
    if u is None or rate is None:
        return torch.arange(width, device=counts.device).expand(len(counts), width), valid, counts
    join = (u.double() < rate[:, None]) & valid
    order = torch.argsort((~join).to(torch.int8), dim=1, stable=True)
    return order, torch.gather(join, 1, order), join.sum(1)


#: Bits of the local step in a keyed stream's counter ``round 2^32 + step``.
_STEP_BITS = 32


@dataclass(frozen=True)
class FederatedRounds:
    """Robust-HDP Algorithm 1 (and its baselines, by ``aggregator``) as a privdl algorithm.

    Per client ``i`` (tuples of length ``n``): ``noise_multipliers`` ``z_i``, expected batch size
    ``batch_sizes`` ``b_i`` (``N_i`` with ``sampling="full"``), ``num_samples`` ``N_i``,
    ``local_steps`` ``E_i = K ceil(N_i/b_i)``, the epsilon it reports to the server
    (``reported_epsilons``, what WeiAvg and minEps weight by) and the variance of its update
    (``update_variance``, Eq. 7, which only the oracle aggregator reads). ``private=False`` is
    FedAvg (no clipping, no noise). The aggregator's estimates (Robust-HDP's) are its own state,
    checkpointed by the recipe with ``aggregator.state_dict()``.
    """

    lr: float
    clip_norm: float
    noise_multipliers: tuple[float, ...]
    batch_sizes: tuple[float, ...]
    num_samples: tuple[int, ...]
    local_steps: tuple[int, ...]
    reported_epsilons: tuple[float, ...]
    update_variance: tuple[float, ...]
    aggregator: Aggregator = field(compare=False)
    private: bool = True
    clients_per_round: int | None = None
    sampling: str = "poisson"

    @property
    def n(self) -> int:
        return len(self.batch_sizes)

    def init(
        self, params: Tree, oracle: ClientData, comm: Communicator, *, keys: Keys
    ) -> FederatedState:
        """Server state from one model's ``params`` (no node dim, or one stacked row); the
        clients' generator (batches, noise, participation) seeded by ``keys.sampling_seed``."""
        if comm.n_nodes != self.n or oracle.n_clients != self.n:
            raise ConfigError(
                f"{self.n} clients, but the communicator has {comm.n_nodes} nodes and the data "
                f"{oracle.n_clients} clients"
            )
        shapes = oracle.model.param_shapes()
        theta = {k: (v[0] if v.dim() > len(shapes[k]) else v).clone() for k, v in params.items()}
        gen = torch.Generator(device=oracle.device).manual_seed(keys.sampling_seed)
        # key_source = "os": each held client's own key; nobody else can rebuild its draws
        own = keys.node_noise_keys(comm.owned_list) if keys.source == "os" else ()
        return FederatedState(theta, 0, torch.zeros(self.n, dtype=torch.int64), gen, noise_keys=own)

    def _participants(self, gen: torch.Generator) -> Tensor:
        k = self.clients_per_round
        if k is None or k == self.n:
            return torch.ones(self.n, dtype=torch.bool)
        chosen = torch.randperm(self.n, generator=gen, device=gen.device)[:k].cpu()
        return torch.zeros(self.n, dtype=torch.bool).index_fill_(0, chosen, True)

    def local_updates(
        self,
        theta: Tree,
        active: Tensor,
        gen: torch.Generator,
        oracle: ClientData,
        comm: Communicator,
        *,
        keys: tuple[bytes, ...] = (),
        round_index: int = 0,
    ) -> Tree:
        """``Delta_i`` of the clients this process runs (``comm.owned``; all in the simulator),
        stacked ``(len(rows), ...)``; 0 for inactive clients. ``active`` has all n clients.

        The loop runs the largest ``E_i`` of all active clients and draws every client's batch
        and noise at every local step (see the module docstring), so ``gen`` advances the same
        way on every process whatever clients it owns. With ``keys`` (one per held client) the
        batches and noise come from the clients' own keyed streams at counter
        ``round_index 2^32 + step`` instead, and ``gen`` is not used.
        """
        dev, rows = oracle.device, oracle.rows
        sharded = rows.numel() != self.n
        start = comm.broadcast(theta)
        params = {k: v.clone() for k, v in start.items()}
        dtype = next(iter(params.values())).dtype
        b = torch.as_tensor(np.asarray(self.batch_sizes, float), dtype=dtype, device=dev)[rows]
        z_all = torch.as_tensor(np.asarray(self.noise_multipliers, float), dtype=dtype, device=dev)
        noise_scale = (self.clip_norm * z_all[rows] / b).reshape(-1, 1)
        steps = torch.as_tensor(np.asarray(self.local_steps, np.int64))  # host-side bookkeeping
        clip = ClipSpec("per_sample", self.clip_norm) if self.private else ClipSpec()
        rates = (
            None
            if self.sampling == "full"
            else np.asarray(self.batch_sizes, float) / np.asarray(self.num_samples, float)
        )
        act, rows_host = active.cpu(), rows.cpu()
        for k in range(int(steps[act].max()) if bool(act.any()) else 0):
            # gradients only for the clients still running (E_i differs: b_i = 128 stops after
            # 19 steps, b_i = 16 runs 150); every client's batch and noise are still drawn, so
            # the generator advances the same way whatever is computed
            running = (act & (k < steps))[rows_host]
            noise = {}
            if keys:  # each held client's own streams (docs/security.md s.1)
                counter = (round_index << _STEP_BITS) + k
                index, mask, sizes = oracle.keyed_batches(keys, counter, rates)
                if self.private:
                    for j, (name, v) in enumerate(params.items()):
                        size = int(np.prod(v.shape[1:]))
                        z = normal_streams(
                            keys, counter, size, substream=1 + j, dtype=dtype, device=dev
                        )
                        noise[name] = z.reshape(len(keys), *v.shape[1:])
            else:
                index, mask, sizes = oracle.poisson_batches(gen, rates)
                if sharded:
                    index, mask, sizes = index[rows], mask[rows], sizes[rows]
            if self.private and not keys:  # all n clients' noise, then the held rows
                for name, v in params.items():
                    z = torch.randn(
                        (self.n, *v.shape[1:]), generator=gen, device=gen.device, dtype=dtype
                    ).to(dev)
                    noise[name] = z[rows] if sharded else z
            if not bool(running.any()):
                continue
            sizes_host = sizes.cpu()  # the one GPU read of the step
            for bucket in oracle.buckets:  # a few batch-size classes, not a loop over clients
                members = bucket[running[bucket]]
                if not len(members):
                    continue
                width = max(1, int(sizes_host[members].max()))  # batches are left-packed
                live = members.to(dev)
                sub = {name: v[live] for name, v in params.items()}
                g = oracle.gradients(
                    sub, live, index[live, :width], mask[live, :width], clip=clip,
                    denominator=b[live],
                )  # fmt: skip
                for name, v in params.items():
                    step = g[name]
                    if self.private:
                        shape = (-1,) + (1,) * (v.dim() - 1)
                        step = step + noise[name][live] * noise_scale[live].reshape(shape)
                    v.index_add_(0, live, step, alpha=-self.lr)
        return {k: params[k] - start[k] for k in params}

    def step(
        self, state: FederatedState, oracle: ClientData, comm: Communicator
    ) -> tuple[FederatedState, StepInfo]:
        """One global round (Algorithm 1 lines 1-7). ``info``: the server's ``weights`` (all n),
        the ``participants`` and what the aggregator reports (e.g. its RPCA's convergence)."""
        gen = state.generator
        active = self._participants(gen)
        if state.noise_keys and len(state.noise_keys) != oracle.rows.numel():
            raise ConfigError(
                f"{len(state.noise_keys)} client keys for {oracle.rows.numel()} held clients"
            )
        if state.noise_keys and max(self.local_steps) >= 1 << _STEP_BITS:
            raise ConfigError(f"keyed clients take fewer than 2^{_STEP_BITS} local steps a round")
        own = self.local_updates(
            state.theta, active, gen, oracle, comm, keys=state.noise_keys, round_index=state.round
        )
        rows = oracle.rows
        sharded = rows.numel() != self.n
        # the server needs every client's column of M (Algorithm 1 line 3): gather the shards
        deltas = comm.all_gather_nodes(own) if sharded else own
        ids = torch.nonzero(active).flatten()
        dtype = next(iter(deltas.values())).dtype
        dev = oracle.device
        flat = flatten_tree({k: v[ids.to(v.device)] for k, v in deltas.items()})
        sel = ids.numpy()
        sigma2 = torch.as_tensor(
            np.asarray(self.update_variance, float)[sel], dtype=torch.float64, device=flat.device
        )
        m = flat.T
        result = self.aggregator(
            AggregationInput(
                updates=m,
                clients=ids,
                round_index=state.round,
                reported_eps=torch.as_tensor(
                    np.asarray(self.reported_epsilons, float)[sel], dtype=dtype, device=flat.device
                ),
                num_samples=torch.as_tensor(
                    np.asarray(self.num_samples, np.int64)[sel], dtype=dtype, device=flat.device
                ),
                true_sigma2=sigma2 if self.private else None,
            )
        )
        weights = torch.zeros(self.n, dtype=dtype, device=dev)
        weights[ids.to(dev)] = result.weights.to(dtype=dtype, device=dev)
        if sharded:  # the server's (rank 0's) weights are the ones every process applies
            weights = comm.broadcast({"w": weights})["w"][0]
        if result.updates is not m:  # PFA replaced some updates
            full = flatten_tree(deltas).clone()
            full[ids.to(full.device)] = result.updates.T.to(full.dtype)
            deltas = unflatten(full, deltas)
            own = {k: v.index_select(0, rows) for k, v in deltas.items()}
        agg = comm.weighted_sum(own, weights)
        theta = {k: state.theta[k] + agg[k] for k in state.theta}
        extra = {k: v.cpu() if torch.is_tensor(v) else v for k, v in result.info.items()}
        info = {"round": state.round, "weights": weights.cpu(), "participants": ids, **extra}
        new = replace(
            state, theta=theta, round=state.round + 1, participated=state.participated + active
        )
        return new, info


@torch.no_grad()
def evaluate_clients(
    model: StackedModel, theta: Tree, test: StackedData, *, loss: str = "cross_entropy"
) -> dict[str, Tensor]:
    """The global model on every client's own test set: per-client loss and accuracy ``(n,)``
    (Robust-HDP Section 4.1 metric: the unweighted mean of these accuracies). One batched pass over
    clients."""
    n, width = test.counts.numel(), test.x.shape[1]
    params = {k: v.unsqueeze(0).expand(n, *v.shape) for k, v in theta.items()}
    valid = test.valid.to(test.x.device)
    dtype = next(iter(theta.values())).dtype
    loss_sum = torch.zeros(n, dtype=dtype)
    hits = torch.zeros(n, dtype=dtype)
    chunk = max(1, 8192 // n)
    for s in range(0, width, chunk):
        xb, yb, m = (
            test.x[:, s : s + chunk].to(dtype),
            test.y[:, s : s + chunk],
            valid[:, s : s + chunk],
        )
        out = model.forward(params, xb)
        loss_sum += (per_sample_loss(out, yb, loss) * m).sum(1).cpu()
        hits += (correct(out, yb, loss).to(dtype) * m).sum(1).cpu()
    cnt = test.counts.cpu().to(dtype)
    return {"loss": loss_sum / cnt, "accuracy": hits / cnt}


def split_train_test(
    parts: list[np.ndarray], *, train_fraction: float = 0.8
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's first ``train_fraction`` of indices train, the rest test
    (the authors' reference code's 80/20 split; Robust-HDP App. B.1, Table 6)."""
    if not 0 < train_fraction < 1:
        raise ConfigError(f"train_fraction must be in (0, 1), got {train_fraction}")
    cut = [int(round(train_fraction * len(p))) for p in parts]
    return [p[:c] for p, c in zip(parts, cut, strict=True)], [
        p[c:] for p, c in zip(parts, cut, strict=True)
    ]
