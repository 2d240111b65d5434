"""The Robust-HDP trainer: calibrated clients, the federated rounds and their accountant in one.

:class:`FederatedDPSGD` composes what a ``privdl run robust-hdp`` composes through its recipe
(:mod:`privdl.recipes.federated`) for the reproductions and tests that drive rounds by hand: the
clients' noise multipliers (:func:`privdl.accounting.clients.client_noise_multipliers`), the
protocol algorithm :class:`~privdl.algorithms.federated.FederatedRounds`, its data oracle
:class:`~privdl.algorithms.federated.ClientData` and a communicator (the single-process simulator
unless one is given), and each client's accounted budget
(:class:`~privdl.accounting.clients.ClientAccountant`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from privdl.accounting.clients import (
    CLIENT_ACCOUNTANTS,
    CLIENT_CALIBRATIONS,
    ClientAccountant,
    client_noise_multipliers,
)
from privdl.algorithms.aggregators import Aggregator
from privdl.algorithms.base import Keys
from privdl.algorithms.federated import ClientData, FederatedRounds, FederatedState
from privdl.comm.base import Communicator
from privdl.comm.local import LocalCommunicator
from privdl.data.batching import StackedData
from privdl.errors import ConfigError, PrivacyError
from privdl.models.base import StackedModel
from privdl.tree import Tree

__all__ = ["FederatedConfig", "FederatedDPSGD", "federated_communicator", "no_gossip"]


def no_gossip(t: int) -> Any:
    """The schedule of a federated communicator: server rounds only, no mixing matrix."""
    raise ConfigError("federated learning has no gossip schedule")


def federated_communicator(n_clients: int, *, dtype: torch.dtype = torch.float32) -> Communicator:
    """A single-process communicator for server rounds (no gossip schedule)."""
    return LocalCommunicator(no_gossip, n_nodes=n_clients, dtype=dtype)


@dataclass(frozen=True)
class FederatedConfig:
    """Client-side hyper-parameters (Robust-HDP Section 3 and 5.1; names from the paper).

    ``epsilons=None`` is non-private FedAvg (no clipping, no noise). ``reported_epsilons`` is what
    the server is told (default: the true ones; the paper's Fig. 5 falsification). ``sampling="full"`` uses
    every local sample once per step (``b_i = N_i``; for oracles); ``"poisson"`` is DP-SGD's.

    ``calibration`` chooses how ``z_i`` is found for ``eps_i``: ``"tightest"`` (the default,
    what a new ``privdl run`` uses) is the smallest ``z_i`` whose tightest certified epsilon
    (the smaller of dp-accounting's PLD and RDP) over all ``E`` rounds is at most ``eps_i``;
    ``"rdp"`` the smallest dp-accounting's RDP accountant certifies (privdl 0.1's, what
    ``accountant: rdp`` and saved runs without that field use); ``"reference"`` is the
    Robust-HDP code's accountant (classic RDP conversion, its bisection, ``z_decimals``
    rounding), whose ``eps_i`` is NOMINAL (``nominal:robust-hdp-code``): the paper's setting,
    so the reproductions ask for it. ``accountant`` (``"tightest"`` or ``"rdp"``; default: the
    one that calibrated, ``tightest`` for ``"reference"``) certifies each client's spent budget
    (:class:`~privdl.accounting.clients.ClientAccountant`); a ``z_i`` is never accounted by
    another accountant than the one that calibrated it.
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
    calibration: Literal["tightest", "rdp", "reference"] = "tightest"
    accountant: Literal["tightest", "rdp"] | None = None

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
        if self.calibration not in CLIENT_CALIBRATIONS:
            raise ConfigError(
                f"calibration must be one of {', '.join(CLIENT_CALIBRATIONS)}, "
                f"got {self.calibration!r}"
            )
        if self.accountant is not None and self.accountant not in CLIENT_ACCOUNTANTS:
            raise ConfigError(
                f"accountant must be one of {', '.join(CLIENT_ACCOUNTANTS)}, got {self.accountant!r}"
            )
        if self.calibration != "reference" and self.calibration != self.client_accountant:
            # a z_i calibrated by one accountant and accounted by a looser one would be
            # recorded above its target: each client is accounted as it was calibrated
            raise ConfigError(
                f"calibration {self.calibration!r} needs accountant {self.calibration!r} "
                f"(got {self.accountant!r})"
            )

    @property
    def client_accountant(self) -> str:
        """The accountant that certifies each client's spent budget: ``accountant`` if given,
        else the one that calibrated it (``tightest`` for the reference calibration)."""
        if self.accountant is not None:
            return self.accountant
        return "tightest" if self.calibration == "reference" else self.calibration

    @property
    def private(self) -> bool:
        return self.epsilons is not None


@dataclass(frozen=True)
class ClientPlan:
    """Every client's numbers for a run (arrays of length n): expected batch size ``b_i``
    (``N_i`` with full batches), ``N_i``, local steps ``E_i = K ceil(N_i/b_i)`` (Eq. 7), the
    epsilon its noise is calibrated to (the aggregator's choice: minEps uses the smallest),
    ``z_i``, the epsilon it reports, and its update variance (Eq. 7 with Eq. 3)."""

    batch_sizes: np.ndarray
    num_samples: np.ndarray
    local_steps: np.ndarray
    noise_epsilons: np.ndarray | None
    noise_multipliers: np.ndarray
    reported_epsilons: np.ndarray
    update_variance: np.ndarray

    def algorithm(self, config: FederatedConfig, aggregator: Aggregator) -> FederatedRounds:
        """The protocol algorithm that runs these clients."""
        return FederatedRounds(
            lr=config.lr,
            clip_norm=config.clip_norm,
            noise_multipliers=tuple(float(z) for z in self.noise_multipliers),
            batch_sizes=tuple(float(v) for v in self.batch_sizes),
            num_samples=tuple(int(m) for m in self.num_samples),
            local_steps=tuple(int(e) for e in self.local_steps),
            reported_epsilons=tuple(float(e) for e in self.reported_epsilons),
            update_variance=tuple(float(v) for v in self.update_variance),
            aggregator=aggregator,
            private=config.private,
            clients_per_round=config.clients_per_round,
            sampling=config.sampling,
        )

    def accountant(self, config: FederatedConfig) -> ClientAccountant | None:
        """Each client's accounted budget after the rounds it joined, by ``config.accountant``
        (None without privacy)."""
        if not config.private or self.noise_epsilons is None:
            return None
        return ClientAccountant(
            noise_multipliers=self.noise_multipliers,
            batch_sizes=self.batch_sizes,
            num_samples=self.num_samples,
            local_steps=self.local_steps,
            rounds=config.rounds,
            delta=config.delta,
            targets=self.noise_epsilons,
            reported=self.reported_epsilons,
            calibration=config.calibration,
            accountant=config.client_accountant,
        )


def plan_clients(
    counts: np.ndarray, *, num_parameters: int, config: FederatedConfig, aggregator: Aggregator
) -> ClientPlan:
    """Calibrate every client of ``config`` (``counts``: each client's N_i)."""
    n = len(counts)
    if len(config.batch_sizes) != n:
        raise ConfigError(f"{len(config.batch_sizes)} batch sizes for {n} clients")
    counts = np.asarray(counts).astype(np.int64)
    b = counts.astype(float) if config.sampling == "full" else np.asarray(config.batch_sizes, float)
    if config.private and np.any(b >= counts):
        raise PrivacyError("every batch size must be smaller than its client's data size")
    local_steps = config.local_epochs * np.ceil(counts / b).astype(np.int64)
    noise_epsilons: np.ndarray | None = None
    z = np.zeros(n)
    if config.private:
        noise_epsilons = aggregator.noise_epsilon(np.asarray(config.epsilons, float))
        z = client_noise_multipliers(
            noise_epsilons,
            batch_sizes=b,
            num_samples=counts,
            local_steps=local_steps,
            local_epochs=config.local_epochs,
            rounds=config.rounds,
            delta=config.delta,
            calibration=config.calibration,
            z_decimals=config.z_decimals,
        )
    reported = np.asarray(config.reported_epsilons or config.epsilons or np.ones(n), float)
    c, p = config.clip_norm, num_parameters
    variance = local_steps * config.lr**2 * p * c**2 * z**2 / b**2
    return ClientPlan(b, counts, local_steps, noise_epsilons, z, reported, variance)


class FederatedDPSGD:
    """Heterogeneous DP federated training (Robust-HDP Algorithm 1 and its baselines).

    ``init(params, seed=)`` and ``step(state)`` run :class:`FederatedRounds` on the clients'
    data; ``client_budgets(participated)`` gives each client's accounted (eps, delta).
    """

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
        if comm is not None and comm.n_nodes != n:
            raise ConfigError(f"the communicator has {comm.n_nodes} nodes for {n} clients")
        self.model, self.data, self.config, self.aggregator = model, data, config, aggregator
        self.n = n
        self.comm = comm if comm is not None else federated_communicator(n, dtype=data.x.dtype)
        self.device = data.x.device
        #: the global ids of the clients this process runs (all of them in the simulator)
        self.rows = self.comm.owned.to(self.device)
        self.sharded = self.rows.numel() != n
        self.plan = plan_clients(
            data.counts.cpu().numpy(),
            num_parameters=model.num_parameters(),
            config=config,
            aggregator=aggregator,
        )
        self.num_samples = self.plan.num_samples
        self.batch_sizes = self.plan.batch_sizes
        #: E_i = K ceil(N_i / b_i) local steps per round (Eq. 7)
        self.local_steps = self.plan.local_steps
        self.noise_epsilons = self.plan.noise_epsilons
        self.noise_multipliers = self.plan.noise_multipliers
        self.reported_epsilons = self.plan.reported_epsilons
        self.oracle = ClientData.from_stacked(
            model, data, rows=self.rows, batch_sizes=self.batch_sizes, loss=config.loss
        )
        self.algorithm = self.plan.algorithm(config, aggregator)
        self.accountant = self.plan.accountant(config)

    def true_update_variance(self) -> np.ndarray:
        """Eq. 7 with Eq. 3 (effective clipping): ``K ceil(N/b) eta^2 p c^2 z^2 / b^2``."""
        return self.plan.update_variance

    def client_budgets(self, participated: Tensor | np.ndarray | None = None) -> list[dict]:
        """Every client's (eps, delta) (:meth:`ClientAccountant.budgets`); [] without privacy."""
        if self.accountant is None:
            return []
        if participated is not None:
            participated = np.asarray(torch.as_tensor(participated).cpu())
        return self.accountant.budgets(participated)

    def init(self, params: Tree, *, seed: int) -> FederatedState:
        """Server state from one model's ``params`` (no node dim) or a stacked copy of it."""
        return self.algorithm.init(params, self.oracle, self.comm, keys=Keys.from_seed(seed))

    def local_updates(self, theta: Tree, active: Tensor, gen: torch.Generator) -> Tree:
        """The held clients' ``Delta_i`` (:meth:`FederatedRounds.local_updates`)."""
        return self.algorithm.local_updates(theta, active, gen, self.oracle, self.comm)

    def step(self, state: FederatedState) -> tuple[FederatedState, dict[str, Any]]:
        """One global round (Algorithm 1 lines 1-7). Returns the new state and round info."""
        return self.algorithm.step(state, self.oracle, self.comm)

    def run(self, state: FederatedState, rounds: int | None = None) -> FederatedState:
        """``rounds`` global rounds (default: the configured E)."""
        for _ in range(self.config.rounds if rounds is None else rounds):
            state, info = self.step(state)
            state.history.append({"round": info["round"], "weights": info["weights"].tolist()})
        return state
