"""``privdl run`` for the federated algorithms: Robust-HDP (Malekmohammadi, Yu & Cao, ICML 2024,
Algorithm 1) and its Table 1 baselines WeiAvg, PFA, DPFedAvg, minEps and FedAvg.

A :class:`FederatedRun` is what :func:`privdl.runner.build` returns for them: the same steps as
a decentralized run's :class:`~privdl.runner.Built` (``init_state``, ``advance``, ``eval_row``,
``checkpoint``, ``restore``), so the runner's loop, records, progress bar, checkpoints, resume
and ``--seeds`` serve both. One step is one global round of
:class:`~privdl.algorithms.federated.FederatedDPSGD`.

* Data: the task's dataset split over ``clients`` by ``partition`` (iid, dirichlet:ALPHA,
  shards:K); each client trains on its part. The server model is evaluated on the dataset's test
  split (``accuracy``) and on the first 20,000 training samples (``loss``), as a Flower server
  would; the paper's metric (the mean of each client's accuracy on its own held-out 20%) is the
  reproductions' (``privdl reproduce robust-hdp-mnist``).
* Privacy: every client ``i`` has its own ``eps_i`` (``budgets``). Its noise multiplier ``z_i`` is
  the smallest that dp-accounting's RDP accountant certifies for ``eps_i`` over all rounds
  (Poisson rate ``b_i/N_i``, ``E_i = K ceil(N_i/b_i)`` local steps a round, add/remove,
  example-level, against the server); ``calibration.json`` lists every client's ``z_i`` beside
  the reference code's ``z_i`` for the same target (labelled nominal: more noise than the
  guarantee needs, since its classic conversion is looser). Each metrics row carries the largest
  epsilon any client has spent so far (``privacy``) and every client's (``client_epsilons``),
  counting only the rounds it took part in.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from privdl.algorithms.aggregators import build_aggregator
from privdl.algorithms.federated import (
    FederatedConfig,
    FederatedDPSGD,
    FederatedState,
    server_budget,
)
from privdl.comm.base import Communicator, Tree
from privdl.config import RunConfig, federated_clients
from privdl.errors import ConfigError
from privdl.privacy import DEFAULT_DELTA
from privdl.robust import RPCANotConvergedWarning


@dataclass(frozen=True)
class ServerTopology:
    """Clients around one server (what ``summary.json`` says in place of a graph)."""

    n: int
    clients_per_round: int | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "kind": "server",
            "clients": self.n,
            "clients_per_round": self.clients_per_round or self.n,
        }


@dataclass
class FederatedRun:
    """The composed parts of a federated run (see the module docstring)."""

    cfg: RunConfig
    task: Any
    trainer: FederatedDPSGD
    topology: ServerTopology
    rpca_converged: bool = field(default=True, init=False)
    last_weights: list[float] | None = field(default=None, init=False)
    # key_source "os": the seed of the clients' generator (noise, batches, participation), drawn
    # from the OS by init_state unless given (a launched run broadcasts rank 0's draw)
    noise_seed: int | None = field(default=None, init=False)

    # -- the steps the runner's loop calls ---------------------------------------------------
    def initial_params(self) -> Tree:
        """``theta^0``: one draw of the model under the run's ``seed``."""
        return {k: v[:1] for k, v in self.task.init_params(seed=self.cfg.seed).items()}

    def init_state(self, params: Tree) -> FederatedState:
        """The clients' generator seeded by the run's seed, or (``key_source = "os"``) by the OS;
        its state is checkpointed either way, so a resumed run draws what it would have."""
        if self.cfg.key_source != "os":
            return self.trainer.init(params, seed=self.cfg.seed)
        if self.noise_seed is None:
            from privdl.runner import sampling_seed

            self.noise_seed = sampling_seed()
        return self.trainer.init(params, seed=self.noise_seed)

    def advance(self, state: FederatedState) -> FederatedState:
        """One global round (Algorithm 1 lines 1-7)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RPCANotConvergedWarning)
            state, info = self.trainer.step(state)
        self.last_weights = [round(float(w), 6) for w in info["weights"]]
        if any(issubclass(w.category, RPCANotConvergedWarning) for w in caught):
            self.rpca_converged = False
        return state

    def eval_row(self, state: FederatedState, wall: float) -> dict[str, Any]:
        row: dict[str, Any] = {"step": state.round, "wall_time": round(wall, 4)}
        row.update(self.task.evaluate({k: v.unsqueeze(0) for k, v in state.theta.items()}))
        budgets = self.trainer.client_budgets(state.participated)
        if budgets:
            eps = [b["accounted"]["epsilon"] if b["accounted"] else 0.0 for b in budgets]
            worst = int(np.argmax(eps))
            spent = budgets[worst]["accounted"] or server_budget(0.0, self.trainer.config.delta)
            notes = f"largest of the {len(eps)} clients' epsilons (client {worst})"
            seeded = (  # a simulation: the clients' noise and batches come from one generator
                "noise and sampling from the seed: a reproducible simulation; whoever knows the "
                "seed can rebuild the noise, so the guarantee holds only against an adversary "
                "who does not"
                if self.cfg.key_source != "os"
                else "noise and sampling from a generator seeded by the OS"
            )
            row["privacy"] = {
                **spent,
                "notes": "; ".join(filter(None, (notes, spent["notes"], seeded))),
            }
            row["client_epsilons"] = [round(e, 6) for e in eps]
        if self.last_weights is not None:  # the server's weights w_i of the last round
            row["weights"] = self.last_weights
        if self.cfg.algorithm == "robust-hdp" and not self.rpca_converged:
            row["rpca_converged"] = False
        return row

    def checkpoint(self, state: FederatedState, *, wall: float) -> dict[str, Any]:
        return {
            "params": {k: v.detach().cpu() for k, v in state.theta.items()},
            "t": state.round,
            "wall_time": wall,
            "state": {
                "participated": state.participated.cpu(),
                "generator": state.generator.get_state(),
            },
            "aggregator": self.trainer.aggregator.state_dict(),
        }

    def restore(self, state: FederatedState, ckpt: dict[str, Any]) -> FederatedState:
        dev = self.trainer.device
        state.generator.set_state(ckpt["state"]["generator"])
        self.trainer.aggregator.load_state_dict(ckpt.get("aggregator", {}))
        return replace(
            state,
            theta={k: v.to(dev) for k, v in ckpt["params"].items()},
            round=int(ckpt["t"]),
            participated=ckpt["state"]["participated"],
        )

    # -- records -----------------------------------------------------------------------------
    def calibration(self) -> dict[str, Any] | None:
        """Every client's target, batch size, local steps and ``z_i``, with the reference
        code's ``z_i`` for the same target beside it (nominal) and the epsilon our ``z_i``
        spends over all rounds (accounted)."""
        tr = self.trainer
        if not tr.config.private:
            return None
        ref = FederatedDPSGD(
            self.task.model,
            self.task.data,
            config=replace(tr.config, calibration="reference"),
            aggregator=build_aggregator(self.cfg.algorithm, **_aggregator_options(self.cfg)),
        ).noise_multipliers
        clients = []
        for b, z_ref in zip(tr.client_budgets(), ref, strict=True):
            i = b["client"]
            clients.append(
                {
                    "client": i,
                    "target_epsilon": b["target_epsilon"],
                    "batch_size": float(tr.batch_sizes[i]),
                    "num_samples": int(tr.num_samples[i]),
                    "local_steps": int(tr.local_steps[i]),
                    "noise_multiplier": b["noise_multiplier"],
                    "noise_multiplier_nominal": float(z_ref),
                    "accounted": b["accounted"],
                }
            )
        return {
            "delta": tr.config.delta,
            "calibration": "z_i: smallest certified by dp-accounting RDP for eps_i over all rounds",
            "nominal": "noise_multiplier_nominal: the Robust-HDP code's accountant (classic "
            "conversion, 2-decimal z) for the same eps_i",
            "clients": clients,
        }


def _aggregator_options(cfg: RunConfig) -> dict[str, Any]:
    if cfg.algorithm == "robust-hdp":
        return {"reestimate_every": cfg.reestimate_every}
    return {}


def build_federated(cfg: RunConfig, *, comm: Communicator | None = None) -> FederatedRun:
    """Task, clients and trainer of a federated ``cfg`` (its options are checked by
    :func:`privdl.config.make_config`). ``comm``: a
    :class:`~privdl.comm.distributed.DistributedCommunicator` for a sharded run (this process
    runs the clients it owns; ``privdl launch``), else the single-process simulator."""
    from privdl.tasks import build_task

    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but CUDA is not available on this machine")
    n, eps, batch_sizes = federated_clients(cfg)
    task = build_task(cfg)
    counts = task.data.counts.cpu().numpy()
    if eps is not None and np.any(np.asarray(batch_sizes) >= counts):
        raise ConfigError(
            f"every client's batch size must be below its number of samples (smallest client: "
            f"{int(counts.min())} samples); lower batch_size or use fewer clients"
        )
    fcfg = FederatedConfig(
        batch_sizes=tuple(batch_sizes),
        lr=cfg.lr,
        rounds=cfg.steps,
        epsilons=None if eps is None else tuple(eps),
        delta=cfg.delta if cfg.delta is not None else DEFAULT_DELTA,
        clip_norm=cfg.clip if cfg.clip is not None else 1.0,  # FedAvg: unused
        local_epochs=cfg.local_epochs,
        clients_per_round=cfg.clients_per_round,
        loss=task.loss_name,
        calibration="rdp",
    )
    trainer = FederatedDPSGD(
        task.model,
        task.data,
        config=fcfg,
        aggregator=build_aggregator(cfg.algorithm, **_aggregator_options(cfg)),
        comm=comm,
    )
    return FederatedRun(cfg, task, trainer, ServerTopology(n, cfg.clients_per_round))
