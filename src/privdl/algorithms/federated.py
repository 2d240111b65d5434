"""Heterogeneous-DP federated learning: local DP-SGD on every client, weighted server rounds.

Robust-HDP (Malekmohammadi, Yu & Cao, ICML 2024), Algorithm 1, with the baselines of Table 1.
Round e (all clients, or ``clients_per_round`` of them drawn uniformly without replacement):

1. the server broadcasts ``theta^e`` (``Communicator.broadcast``);
2. every participating client i runs ``E_i = K ceil(N_i/b_i)`` DP-SGD steps (Eq. 1)
   ``theta <- theta - eta_l (1/b_i) [ sum_{j in B} clip(grad l_j, c) + N(0, c^2 z_i^2 I_p) ]``
   with Poisson sampling at rate ``q_i = b_i/N_i`` and the expected batch size ``b_i`` as the
   denominator (Opacus semantics, spec §1 and A7), and uploads ``Delta_i = theta_{i,E_i} - theta^e``;
3. the server forms ``M = [Delta_1 | ... | Delta_k]`` and an :class:`Aggregator` gives weights;
   ``theta^{e+1} = theta^e + sum_i w_i Delta_i`` (line 7; ``Communicator.weighted_sum``).

All clients run at once: parameters are stacked ``(n, ...)``, heterogeneous batch sizes are
masks, clients that finished their ``E_i`` steps (or sit the round out) are frozen by a 0/1
factor. The noise multiplier ``z_i`` comes from the reference accountant
(:func:`privdl.accounting.nominal.robust_hdp_noise_multipliers`, ``eps_i, delta, b_i, N_i, K,
E``); each client's epsilon is then certified by dp-accounting's RDP accountant
(:meth:`FederatedDPSGD.client_budgets`; threat model "server", example-level).

Random draws per local step, in this order (tests replay them): ``rand(n, m_max)`` for Poisson
sampling, then ``randn(n, *shape)`` for each parameter in model order, from one generator on the
data's device (``torch.Generator(device=data.x.device)``; CUDA and CPU streams differ).

Sharded (``torch.distributed``, docs/distributed.md): with a
:class:`~privdl.comm.distributed.DistributedCommunicator` every process holds the same data and
config, and runs the local steps of the clients it owns (``comm.owned``) only. Every process
draws the full ``(n, ...)`` tensors above from the same seeded generator and keeps its rows, so a
client's draws do not depend on the sharding and the round equals the simulator's (cost: the
draws of all n clients on every process, O(n (m_max + p)) per local step, small next to the
owned clients' gradients). The server's update matrix M is gathered with ``all_gather_nodes``;
every process runs the aggregator on it, rank 0's (the server's) weights are broadcast, and the
aggregate is ``weighted_sum`` (local partial sums plus one all-reduce).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.dpsgd import (
    calibrate_noise_multipliers,
    epsilons_from_curves,
    poisson_rdp_curves,
)
from privdl.accounting.nominal import robust_hdp_noise_multipliers
from privdl.algorithms.aggregators import AggregationInput, Aggregator
from privdl.comm.base import Communicator, Tree
from privdl.comm.local import LocalCommunicator
from privdl.data.batching import StackedData
from privdl.engine.grads import ClipSpec, node_gradients
from privdl.engine.losses import correct, per_sample_loss
from privdl.errors import ConfigError, PrivacyError
from privdl.models.base import StackedModel

__all__ = [
    "FederatedConfig",
    "FederatedDPSGD",
    "FederatedState",
    "batch_size_buckets",
    "evaluate_clients",
    "federated_communicator",
    "flatten_tree",
    "split_train_test",
]


@dataclass(frozen=True)
class FederatedConfig:
    """Client-side hyper-parameters (spec §1, §5.1; names from the paper).

    ``epsilons=None`` is non-private FedAvg (no clipping, no noise). ``reported_epsilons`` is what
    the server is told (default: the true ones; spec §6 falsification). ``sampling="full"`` uses
    every local sample once per step (``b_i = N_i``; for oracles); ``"poisson"`` is DP-SGD's.

    ``calibration`` chooses how ``z_i`` is found for ``eps_i``: ``"rdp"`` (the default) is the
    smallest ``z_i`` that dp-accounting's RDP accountant certifies for ``eps_i`` over all ``E``
    rounds (what ``privdl run`` uses); ``"reference"`` is the Robust-HDP code's accountant
    (classic RDP conversion, its bisection, ``z_decimals`` rounding), whose ``eps_i`` is
    NOMINAL (``nominal:robust-hdp-code``): the paper's setting, so the reproductions ask for it.
    """

    batch_sizes: tuple[int, ...]
    lr: float
    rounds: int
    epsilons: tuple[float, ...] | None = None
    reported_epsilons: tuple[float, ...] | None = None
    delta: float = 1e-4
    clip_norm: float = 3.0
    local_epochs: int = 1
    clients_per_round: int | None = None
    sampling: Literal["poisson", "full"] = "poisson"
    z_decimals: int | None = 2
    loss: str = "cross_entropy"
    calibration: Literal["reference", "rdp"] = "rdp"

    def __post_init__(self) -> None:
        n = len(self.batch_sizes)
        if n < 1 or any(int(b) < 1 for b in self.batch_sizes):
            raise ConfigError("batch_sizes must be a non-empty list of positive integers")
        for name in ("epsilons", "reported_epsilons"):
            v = getattr(self, name)
            if v is not None and (len(v) != n or any(not e > 0 for e in v)):
                raise PrivacyError(f"{name} must hold one positive value per client ({n})")
        if self.reported_epsilons is not None and self.epsilons is None:
            raise PrivacyError("reported_epsilons need epsilons (a private run)")
        if not self.lr > 0 or self.rounds < 1 or self.local_epochs < 1:
            raise ConfigError("need lr > 0, rounds >= 1 and local_epochs >= 1")
        if not self.clip_norm > 0:
            raise PrivacyError(f"clip_norm must be > 0, got {self.clip_norm}")
        if self.clients_per_round is not None and not 1 <= self.clients_per_round <= n:
            raise ConfigError(f"clients_per_round must be in [1, {n}]")
        if self.sampling not in ("poisson", "full"):
            raise ConfigError(f"sampling must be poisson or full, got {self.sampling!r}")
        if self.epsilons is not None and self.sampling != "poisson":
            raise PrivacyError("private runs need Poisson sampling (what the accountant assumes)")
        if self.calibration not in ("reference", "rdp"):
            raise ConfigError(f"calibration must be reference or rdp, got {self.calibration!r}")

    @property
    def private(self) -> bool:
        return self.epsilons is not None


@dataclass
class FederatedState:
    """Server model ``theta`` (no node dim), round counter, per-client participation, RNG."""

    theta: Tree
    round: int
    participated: Tensor
    generator: torch.Generator
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def t(self) -> int:
        """The rounds done (a run's step counter, as the decentralized states' ``t``)."""
        return self.round


def no_gossip(t: int) -> Any:
    """The schedule of a federated communicator: server rounds only, no mixing matrix."""
    raise ConfigError("federated learning has no gossip schedule")


def federated_communicator(n_clients: int, *, dtype: torch.dtype = torch.float32) -> Communicator:
    """A single-process communicator for server rounds (no gossip schedule)."""
    return LocalCommunicator(no_gossip, n_nodes=n_clients, dtype=dtype)


def flatten_tree(tree: Tree, *, leading: bool = True) -> Tensor:
    """``(n, p)`` (or ``(p,)``) in parameter order: the rows of Robust-HDP's M after transpose."""
    if leading:
        return torch.cat([v.reshape(v.shape[0], -1) for v in tree.values()], dim=1)
    return torch.cat([v.reshape(-1) for v in tree.values()])


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


@functools.lru_cache(maxsize=4096)
def _noise_multiplier(
    eps: float,
    batch_size: float,
    num_samples: int,
    local_epochs: int,
    rounds: int,
    delta: float,
    decimals: int | None,
) -> float:
    """One client's ``z_i`` from the reference accountant (a bisection; cached: experiments
    build many trainers with the same clients)."""
    return float(
        robust_hdp_noise_multipliers(
            [eps],
            [batch_size],
            num_samples=num_samples,
            local_epochs=local_epochs,
            rounds=rounds,
            delta=delta,
            decimals=decimals,
        )[0]
    )


def server_budget(
    epsilon: float, delta: float, *, accountant: str = "rdp", nominal: bool = False, notes: str = ""
) -> dict[str, Any]:
    """A client's labelled (eps, delta): example-level, add/remove (Poisson sampling), against
    the server that sees its updates (Robust-HDP's threat model)."""
    return PrivacyBudget(
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        neighbouring="add_remove",
        unit="example",
        threat_model="server",
        nominal=nominal,
        notes=notes,
    ).to_dict()


class FederatedDPSGD:
    """Heterogeneous DP federated training (Robust-HDP Algorithm 1 and its baselines)."""

    def __init__(
        self,
        model: StackedModel,
        data: StackedData,
        *,
        config: FederatedConfig,
        aggregator: Aggregator,
        comm: Communicator | None = None,
    ) -> None:
        n = data.counts.numel()
        if len(config.batch_sizes) != n:
            raise ConfigError(f"{len(config.batch_sizes)} batch sizes for {n} clients")
        if comm is not None and comm.n_nodes != n:
            raise ConfigError(f"the communicator has {comm.n_nodes} nodes for {n} clients")
        self.model, self.data, self.config, self.aggregator = model, data, config, aggregator
        self.n = n
        self.comm = comm if comm is not None else federated_communicator(n, dtype=data.x.dtype)
        self.device = data.x.device
        self._counts = data.counts.to(self.device)
        #: the global ids of the clients this process runs (all of them in the simulator)
        self.rows = self.comm.owned.to(self.device)
        self.sharded = self.rows.numel() != n
        self._x = data.x.index_select(0, self.rows) if self.sharded else data.x
        self._y = data.y.index_select(0, self.rows) if self.sharded else data.y
        counts = data.counts.cpu().numpy().astype(np.int64)
        b = (
            counts.astype(float)
            if config.sampling == "full"
            else np.asarray(config.batch_sizes, float)
        )
        if config.private and np.any(b >= counts):
            raise PrivacyError("every batch size must be smaller than its client's data size")
        self.num_samples = counts
        self.batch_sizes = b
        #: E_i = K ceil(N_i / b_i) local steps per round (Eq. 7)
        self.local_steps = config.local_epochs * np.ceil(counts / b).astype(np.int64)
        self.noise_epsilons: np.ndarray | None = None
        self.noise_multipliers = np.zeros(n)
        if config.private:
            eps = np.asarray(config.epsilons, float)
            self.noise_epsilons = aggregator.noise_epsilon(eps)
            if config.calibration == "rdp":  # all clients in one vectorised bisection
                self.noise_multipliers = calibrate_noise_multipliers(
                    target_epsilons=self.noise_epsilons,
                    sampling_rates=b / counts,
                    steps=self.local_steps * config.rounds,
                    delta=config.delta,
                )
            else:
                self.noise_multipliers = np.array(
                    [
                        _noise_multiplier(
                            float(e),
                            float(bb),
                            int(m),
                            config.local_epochs,
                            config.rounds,
                            config.delta,
                            config.z_decimals,
                        )
                        for e, bb, m in zip(self.noise_epsilons, b, counts, strict=True)
                    ]
                )  # setup only: one (cached) bisection per distinct client
        self._rdp_curves: np.ndarray | None = None
        self.reported_epsilons = np.asarray(
            config.reported_epsilons or config.epsilons or np.ones(n), float
        )
        #: the held clients (positions in ``rows``) in batch-size classes: each local step
        #: computes one class at a time, padded to that class's widest Poisson batch. On a CPU
        #: (compute-bound) this saves the padded work; on a GPU, where a local step of the
        #: MNIST CNN is launch-bound, one class keeps one launch sequence per step (same values
        #: either way, tested)
        held_b = self.batch_sizes[self.rows.cpu().numpy()]
        self._buckets = (
            batch_size_buckets(held_b)
            if self.device.type == "cpu"
            else [torch.arange(len(held_b), dtype=torch.int64)]
        )

    # ------------------------------------------------------------------ closed forms
    def true_update_variance(self) -> np.ndarray:
        """Eq. 7 with Eq. 3 (effective clipping): ``K ceil(N/b) eta^2 p c^2 z^2 / b^2``."""
        c, p = self.config.clip_norm, self.model.num_parameters()
        return (
            self.local_steps
            * self.config.lr**2
            * p
            * c**2
            * self.noise_multipliers**2
            / self.batch_sizes**2
        )

    def client_budgets(self, participated: Tensor | np.ndarray | None = None) -> list[dict]:
        """Every client's (eps, delta): its target ``eps_i`` and the epsilon dp-accounting's RDP
        accountant certifies for ``participated`` rounds (default all E), threat model "server",
        example-level, add/remove, Poisson sampling. With ``calibration="reference"`` the target
        is also given as ``nominal`` (the budget the code's accountant claims for its ``z_i``);
        with ``"rdp"`` there is no nominal figure (``nominal`` is None): the target is what the
        accountant certifies over all E rounds."""
        cfg = self.config
        if not cfg.private:
            return []
        rounds = (
            np.full(self.n, cfg.rounds)
            if participated is None
            else np.asarray(torch.as_tensor(participated).cpu())
        )
        if self._rdp_curves is None:  # one step's RDP of every client, computed once
            self._rdp_curves = poisson_rdp_curves(
                self.batch_sizes / self.num_samples, self.noise_multipliers
            )
        spent_steps = rounds * self.local_steps
        eps = epsilons_from_curves(self._rdp_curves, spent_steps, cfg.delta)
        out = []
        for i in range(self.n):  # reporting only, not a hot path
            z, q = float(self.noise_multipliers[i]), self.batch_sizes[i] / self.num_samples[i]
            steps = int(spent_steps[i])
            accounted = (
                server_budget(
                    float(eps[i]),
                    cfg.delta,
                    notes=f"poisson sampling q={q:.6g}, z={z:.6g}, T={steps}; RDP curve by "
                    "privdl's series (dp-accounting's to 1e-9), dp-accounting's conversion",
                )
                if steps > 0
                else None
            )
            target = None
            if cfg.calibration == "reference":
                target = server_budget(
                    float(self.noise_epsilons[i]),
                    cfg.delta,
                    accountant="nominal:robust-hdp-code",
                    nominal=True,
                    notes=f"z={z} from the reference accountant, T=K E N/b, rounded",
                )
            out.append(
                {
                    "client": i,
                    "noise_multiplier": z,
                    "target_epsilon": float(self.noise_epsilons[i]),
                    "reported_epsilon": float(self.reported_epsilons[i]),
                    "nominal": target,
                    "accounted": accounted,
                }
            )
        return out

    # ------------------------------------------------------------------ training
    def init(self, params: Tree, *, seed: int) -> FederatedState:
        """Server state from one model's ``params`` (no node dim) or a stacked copy of it."""
        shapes = self.model.param_shapes()
        theta = {k: (v[0] if v.dim() > len(shapes[k]) else v).clone() for k, v in params.items()}
        gen = torch.Generator(device=self.data.x.device).manual_seed(seed)
        return FederatedState(theta, 0, torch.zeros(self.n, dtype=torch.int64), gen)

    def _participants(self, gen: torch.Generator) -> Tensor:
        k = self.config.clients_per_round
        if k is None or k == self.n:
            return torch.ones(self.n, dtype=torch.bool)
        chosen = torch.randperm(self.n, generator=gen, device=gen.device)[:k].cpu()
        return torch.zeros(self.n, dtype=torch.bool).index_fill_(0, chosen, True)

    def _batch(self, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Poisson batches (q_i = b_i / N_i) of all clients, left-packed ``(n, N_max)`` with a
        mask, and each client's batch size ``(n,)``. No value is read back to the host here: on
        a GPU the caller reads the one width it needs (one sync per local step)."""
        counts = self._counts
        width = self.data.x.shape[1]
        valid = torch.arange(width, device=counts.device)[None, :] < counts[:, None]
        if self.config.sampling == "full":
            return torch.arange(width, device=counts.device).expand(self.n, width), valid, counts
        u = torch.rand(self.n, width, generator=gen, device=gen.device).to(counts.device)
        rate = torch.as_tensor(self.batch_sizes / self.num_samples, device=counts.device)
        join = (u.double() < rate[:, None]) & valid
        order = torch.argsort((~join).to(torch.int8), dim=1, stable=True)
        return order, torch.gather(join, 1, order), join.sum(1)

    def local_updates(self, theta: Tree, active: Tensor, gen: torch.Generator) -> Tree:
        """``Delta_i`` of the clients this process runs (``self.rows``; all in the simulator),
        stacked ``(len(rows), ...)``; 0 for inactive clients. ``active`` has all n clients.

        The loop runs the largest ``E_i`` of all active clients and draws every client's batch
        and noise at every local step (see the module docstring), so ``gen`` advances the same
        way on every process whatever clients it owns.
        """
        cfg, dev, rows = self.config, self.device, self.rows
        start = self.comm.broadcast(theta)
        params = {k: v.clone() for k, v in start.items()}
        dtype = next(iter(params.values())).dtype
        b = torch.as_tensor(self.batch_sizes, dtype=dtype, device=dev)[rows]
        z_all = torch.as_tensor(self.noise_multipliers, dtype=dtype, device=dev)
        noise_scale = (cfg.clip_norm * z_all[rows] / b).reshape(-1, 1)
        steps = torch.as_tensor(self.local_steps)  # host-side bookkeeping: no GPU reads
        clip = ClipSpec("per_sample", cfg.clip_norm) if cfg.private else ClipSpec()
        act, rows_host = active.cpu(), rows.cpu()
        for k in range(int(steps[act].max()) if bool(act.any()) else 0):
            # gradients only for the clients still running (E_i differs: b_i = 128 stops after
            # 19 steps, b_i = 16 runs 150); every client's batch and noise are still drawn, so
            # the generator advances the same way whatever is computed
            running = (act & (k < steps))[rows_host]
            index, mask, sizes = self._batch(gen)
            if self.sharded:
                index, mask, sizes = index[rows], mask[rows], sizes[rows]
            noise = {}
            if cfg.private:  # all n clients' noise, then the held rows (sharding-free)
                for name, v in params.items():
                    z = torch.randn(
                        (self.n, *v.shape[1:]), generator=gen, device=gen.device, dtype=dtype
                    ).to(dev)
                    noise[name] = z[rows] if self.sharded else z
            if not bool(running.any()):
                continue
            sizes_host = sizes.cpu()  # the one GPU read of the step
            for bucket in self._buckets:  # a few batch-size classes, not a loop over clients
                members = bucket[running[bucket]]
                if not len(members):
                    continue
                width = max(1, int(sizes_host[members].max()))  # batches are left-packed
                live = members.to(dev)
                at = live[:, None]
                idx = index[live, :width]
                xb, yb = self._x[at, idx], self._y[at, idx]
                sub = {name: v[live] for name, v in params.items()}
                g = node_gradients(
                    self.model,
                    sub,
                    xb,
                    yb,
                    loss=cfg.loss,
                    clip=clip,
                    mask=mask[live, :width],
                    denominator=b[live],
                ).grads
                for name, v in params.items():
                    step = g[name]
                    if cfg.private:
                        shape = (-1,) + (1,) * (v.dim() - 1)
                        step = step + noise[name][live] * noise_scale[live].reshape(shape)
                    v.index_add_(0, live, step, alpha=-cfg.lr)
        return {k: params[k] - start[k] for k in params}

    def step(self, state: FederatedState) -> tuple[FederatedState, dict[str, Any]]:
        """One global round (Algorithm 1 lines 1-7). Returns the new state and round info."""
        gen = state.generator
        active = self._participants(gen)
        own = self.local_updates(state.theta, active, gen)
        # the server needs every client's column of M (Algorithm 1 line 3): gather the shards
        deltas = self.comm.all_gather_nodes(own) if self.sharded else own  # type: ignore[attr-defined]
        ids = torch.nonzero(active).flatten()
        dtype = next(iter(deltas.values())).dtype
        dev = self.device
        flat = flatten_tree({k: v[ids.to(v.device)] for k, v in deltas.items()})
        sel = ids.numpy()
        sigma2 = torch.as_tensor(
            self.true_update_variance()[sel], dtype=torch.float64, device=flat.device
        )
        m = flat.T
        result = self.aggregator(
            AggregationInput(
                updates=m,
                clients=ids,
                round_index=state.round,
                reported_eps=torch.as_tensor(
                    self.reported_epsilons[sel], dtype=dtype, device=flat.device
                ),
                num_samples=torch.as_tensor(self.num_samples[sel], dtype=dtype, device=flat.device),
                true_sigma2=sigma2 if self.config.private else None,
            )
        )
        weights = torch.zeros(self.n, dtype=dtype, device=dev)
        weights[ids.to(dev)] = result.weights.to(dtype=dtype, device=dev)
        if self.sharded:  # the server's (rank 0's) weights are the ones every process applies
            weights = self.comm.broadcast({"w": weights})["w"][0]
        if result.updates is not m:  # PFA replaced some updates
            full = flatten_tree(deltas).clone()
            full[ids.to(full.device)] = result.updates.T.to(full.dtype)
            deltas = _unflatten_stacked(full, deltas)
            own = {k: v.index_select(0, self.rows) for k, v in deltas.items()}
        agg = self.comm.weighted_sum(own, weights)
        theta = {k: state.theta[k] + agg[k] for k in state.theta}
        extra = {k: v.cpu() if torch.is_tensor(v) else v for k, v in result.info.items()}
        info = {"round": state.round, "weights": weights.cpu(), "participants": ids, **extra}
        new = replace(
            state, theta=theta, round=state.round + 1, participated=state.participated + active
        )
        return new, info

    def run(self, state: FederatedState, rounds: int | None = None) -> FederatedState:
        """``rounds`` global rounds (default: the configured E)."""
        for _ in range(self.config.rounds if rounds is None else rounds):
            state, info = self.step(state)
            state.history.append({"round": info["round"], "weights": info["weights"].tolist()})
        return state


def _unflatten_stacked(flat: Tensor, like: Tree) -> Tree:
    out, start = {}, 0
    for k, v in like.items():
        size = math.prod(v.shape[1:])
        out[k] = flat[:, start : start + size].reshape(v.shape)
        start += size
    return out


@torch.no_grad()
def evaluate_clients(
    model: StackedModel, theta: Tree, test: StackedData, *, loss: str = "cross_entropy"
) -> dict[str, Tensor]:
    """The global model on every client's own test set: per-client loss and accuracy ``(n,)``
    (spec §5.1 metric: the unweighted mean of these accuracies). One batched pass over clients."""
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
    """Each client's first ``train_fraction`` of indices train, the rest test (spec §5.2)."""
    if not 0 < train_fraction < 1:
        raise ConfigError(f"train_fraction must be in (0, 1), got {train_fraction}")
    cut = [int(round(train_fraction * len(p))) for p in parts]
    return [p[:c] for p, c in zip(parts, cut, strict=True)], [
        p[c:] for p, c in zip(parts, cut, strict=True)
    ]
