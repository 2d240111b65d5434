"""Federated learning with heterogeneous DP clients: Robust-HDP and its Table 1 baselines.

Robust-HDP (Malekmohammadi, Yu & Cao, ICML 2024, Algorithm 1): a server and ``clients``, each
with its own epsilon (``budgets``); one step is one global round of
:class:`~privdl.algorithms.federated.FederatedRounds`. A :class:`FederatedRecipe` instance is one
aggregation rule (``aggregator``: Robust-HDP's robust-PCA noise estimates, WeiAvg, PFA, DPFedAvg,
minEps, or non-private FedAvg).

* Data: the task's dataset split over ``clients`` by ``partition``; each client trains on its
  part. The server model is evaluated on the dataset's test split (``accuracy``) and on the first
  20,000 training samples (``loss``), as a Flower server would; the paper's metric (the mean of
  each client's accuracy on its own held-out 20%) is the reproductions'.
* Privacy: client ``i``'s noise multiplier ``z_i`` is the smallest that the run's accountant
  certifies for ``eps_i`` over all rounds (Poisson rate ``b_i/N_i``, ``E_i = K ceil(N_i/b_i)``
  local steps a round, Algorithm 1 / Eq. 1; add/remove, example-level, against the server). The
  accountant is the run's ``accountant``: ``tightest`` (default: the smaller of dp-accounting's
  PLD and RDP, labelled with the one that won) or ``rdp`` (privdl 0.1's, and what a run saved
  before the choice existed resumes with), as in the gossip family
  (:func:`privdl.privacy.accountant_of`); each client is accounted by the accountant that
  calibrated it. ``calibration.json`` lists every client's ``z_i`` beside the reference code's
  ``z_i`` for the same target (labelled nominal). Each metrics row carries the largest epsilon
  any client has spent so far (``privacy``) and every client's (``client_epsilons``), counting
  only the rounds it took part in.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field, field_validator

from privdl.accounting.clients import ClientAccountant, server_budget
from privdl.algorithms.aggregators import build_aggregator
from privdl.algorithms.federated import ClientData, FederatedRounds, FederatedState
from privdl.config import CommonConfig
from privdl.errors import ConfigError
from privdl.privacy import accountant_of, target_delta
from privdl.recipes.base import Recipe, Run
from privdl.robust import RPCANotConvergedWarning
from privdl.robust.table3 import BATCH_SIZES_20, EPS_LISTS_20
from privdl.robust.trainer import FederatedConfig, no_gossip, plan_clients
from privdl.tree import Tree

__all__ = [
    "FEDERATED_GRAPH",
    "FederatedRecipe",
    "FederatedRunConfig",
    "ServerTopology",
    "federated_clients",
]

#: What ``calibration.json`` says of the clients' z_i, by the run's accountant.
_CALIBRATION_TEXT = {
    "tightest": "z_i: smallest certified by the tightest accountant (the smaller of "
    "dp-accounting's PLD, pessimistic discretisation, and RDP) for eps_i over all rounds",
    "rdp": "z_i: smallest certified by dp-accounting RDP for eps_i over all rounds",
}

#: What a federated run records in place of a graph.
FEDERATED_GRAPH = "server"

#: Options of other families, and why a federated run has none of them.
_FOREIGN = {
    "graph": "clients talk to a server: give --clients N",
    "mixing": "the server weights the updates itself",
    "sigma": "each client's noise is calibrated to its epsilon: give --epsilon or budgets",
    "sigma_cor": "there is no correlated noise",
    "adversary": "it is accounted against the server that sees each client's updates "
    "(example-level)",
    "lr_decay": "the local step size is constant (Eq. 1)",
    "weight_decay": "Eq. 1 has none",
    "noise_backend": "client noise comes from the run's torch generator (key_source os: from "
    "each client's own key with the default backend)",
    "clip_kind": "clipping is hard per-sample clipping (Eq. 1)",
    "sampling": "local batches are Poisson samples (what the accountant assumes)",
    "noise_mode": "no secure mode for the clients: their example-level accounting rests on "
    "Poisson subsampling amplification, proved for the continuous Gaussian, not the discrete "
    "one (docs/security.md s.4)",
    "gamma": "it is PORTER's consensus step",
    "block_size": "it is PrivSGP-VR's SAGA block",
    "compressor": "updates are sent uncompressed",
}
#: The values a federated run sets itself (a value given must be this one).
_RESOLVED = {"graph": FEDERATED_GRAPH, "sampling": "poisson", "clip_kind": "hard"}


class FederatedRunConfig(CommonConfig):
    """Options of the federated family (steps are rounds)."""

    graph: str = Field(default=FEDERATED_GRAPH, description="Federated runs: always 'server'.")
    clients: int | None = Field(
        default=None, ge=1, description="Federated: number of clients (default 20)."
    )
    budgets: str | None = Field(
        default=None,
        description="Federated: each client's epsilon, Dist1..Dist9 (the Robust-HDP paper's "
        "lists) or a comma list (one value: every client).",
    )
    local_epochs: int = Field(
        default=1, ge=1, description="Federated: local epochs K per round (default 1)."
    )
    clients_per_round: int | None = Field(
        default=None, ge=1, description="Federated: clients sampled per round."
    )
    # None: estimate once after round 1 and freeze, as the reference code; 1: every round, the
    # paper's Algorithm 1
    reestimate_every: int | None = Field(
        default=None, ge=1, description="Robust-HDP: re-estimate the noise every N rounds."
    )

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v: Any) -> Any:
        """A list of epsilons (Python, TOML) is the comma list the CLI takes."""
        if isinstance(v, list | tuple) and all(
            isinstance(e, int | float) and not isinstance(e, bool) for e in v
        ):
            return ",".join(repr(float(e)) for e in v)
        return v


def federated_clients(cfg: Any) -> tuple[int, list[float] | None, list[int]]:
    """A federated run's clients: their number, each one's epsilon (None: non-private FedAvg)
    and each one's expected batch size. ``budgets="DistK"`` is the Robust-HDP paper's list K
    (20 clients, Table 12) with the paper's batch sizes; a comma list gives one epsilon per
    client (one value: every client); ``epsilon`` alone gives every client that budget."""
    spec = (cfg.budgets or "").strip()
    dist = {k.lower(): k for k in EPS_LISTS_20}.get(spec.lower())
    if dist is not None:
        n = cfg.clients or len(EPS_LISTS_20[dist])
        if n != len(EPS_LISTS_20[dist]):
            raise ConfigError(
                f"budgets {dist} is the paper's list of {len(EPS_LISTS_20[dist])} clients; "
                f"got clients={n}"
            )
        return n, [float(e) for e in EPS_LISTS_20[dist]], [int(b) for b in BATCH_SIZES_20]
    eps: list[float] | None = None
    if spec:
        try:
            eps = [float(v) for v in spec.split(",")]
        except ValueError:
            eps = []
        if not eps or not all(math.isfinite(e) and e > 0 for e in eps):
            raise ConfigError(
                f"budgets {spec!r}: expected Dist1..Dist9 or a comma list of positive epsilons"
            )
    elif cfg.epsilon is not None:
        eps = [float(cfg.epsilon)]
    n = cfg.clients or (len(eps) if eps is not None and len(eps) > 1 else 20)
    if eps is not None and len(eps) == 1:
        eps = eps * n
    if eps is not None and len(eps) != n:
        raise ConfigError(f"budgets gives {len(eps)} epsilons for {n} clients")
    return n, eps, [cfg.batch_size] * n


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


class FederatedRecipe(Recipe):
    """One aggregation rule of heterogeneous-DP federated learning (module docstring).

    ``aggregator``: the server's rule (:func:`privdl.algorithms.aggregators.build_aggregator`);
    ``private``: whether clients clip and add noise (FedAvg: no); ``estimates_noise``: whether the
    rule estimates the clients' noise by robust PCA (``reestimate_every`` applies, and the records
    say when the RPCA did not converge); ``min_clients``: how many clients every round needs
    (an estimate of a client's noise needs the others' updates)."""

    config_model: ClassVar[type[CommonConfig]] = FederatedRunConfig
    family: ClassVar[str] = "the federated algorithms"
    party: ClassVar[str] = "client"
    shared_sampling: ClassVar[bool] = True
    replicated: ClassVar[bool] = True

    def __init__(
        self,
        *,
        aggregator: str,
        private: bool = True,
        estimates_noise: bool = False,
        min_clients: int = 1,
    ) -> None:
        self.aggregator = aggregator
        self.private = private
        self.estimates_noise = estimates_noise
        self.min_clients = min_clients

    # -- configuration ----------------------------------------------------------------------
    def foreign(self, key: str, algorithm: str, owners: str) -> str:
        why = _FOREIGN.get(key, f"it applies to {owners}")
        return f"{key} does not apply to {algorithm} ({why})"

    def resolve(self, cfg: Any, given: Mapping[str, Any]) -> Any:
        """Check a federated run's options and fill in what it sets itself."""
        alg = cfg.algorithm
        if cfg.task == "least-squares":
            raise ConfigError(f"{alg} trains a model on a dataset: pick a supervised task")
        for key, value in _RESOLVED.items():
            # a value given must be the one the run uses (so an explicit
            # sampling=without_replacement, the default elsewhere, is refused too)
            if key in given and given[key] is not None and given[key] != value:
                raise ConfigError(self.foreign(key, alg, ""))
        if cfg.clip_mode == "batch_mean":
            raise ConfigError(f"{alg} clips per sample: use clip_mode per_sample")
        if cfg.reestimate_every is not None and not self.estimates_noise:
            raise ConfigError(
                f"reestimate_every is Robust-HDP's (its noise re-estimation), not {alg}'s"
            )
        if cfg.budgets and cfg.epsilon is not None:
            raise ConfigError("give either budgets (one epsilon per client) or epsilon, not both")
        n, eps, batch_sizes = federated_clients(cfg)
        default_b = type(cfg).model_fields["batch_size"].default
        given_b = given.get("batch_size", default_b)
        if given_b != default_b and batch_sizes != [cfg.batch_size] * n:
            raise ConfigError(
                f"budgets {cfg.budgets} comes with the paper's batch sizes: drop batch_size"
            )
        if not self.private:
            if eps is not None or cfg.clip is not None:
                raise ConfigError(f"{alg} is non-private: drop epsilon, budgets and clip")
        else:
            if eps is None:
                raise ConfigError(
                    f"{alg} needs each client's budget: --budgets E1,E2,... (or Dist1..Dist9), "
                    "or --epsilon E for every client"
                )
            if cfg.clip is None:
                raise ConfigError(f"{alg} needs a clipping threshold (--clip C; the paper uses 3)")
        if cfg.clients_per_round is not None and cfg.clients_per_round > n:
            raise ConfigError(f"clients_per_round={cfg.clients_per_round} exceeds the {n} clients")
        if min(n, cfg.clients_per_round or n) < self.min_clients:
            raise ConfigError(
                f"{alg} estimates each client's noise from the others' updates: it needs at "
                f"least {self.min_clients} clients in every round (clients and "
                f"clients_per_round >= {self.min_clients})"
            )
        return cfg.model_copy(update={**_RESOLVED, "clients": n})

    # -- construction -----------------------------------------------------------------------
    def n_nodes(self, cfg: Any) -> int:
        return federated_clients(cfg)[0]

    def topology(self, cfg: Any) -> tuple[Any, Any]:
        return ServerTopology(self.n_nodes(cfg), cfg.clients_per_round), no_gossip

    def _aggregator_options(self, cfg: Any) -> dict[str, Any]:
        return {"reestimate_every": cfg.reestimate_every} if self.estimates_noise else {}

    def _config(self, cfg: Any, *, loss: str, calibration: str | None = None) -> FederatedConfig:
        """The trainer's config; ``calibration`` defaults to the run's accountant."""
        n, eps, batch_sizes = federated_clients(cfg)
        return FederatedConfig(
            batch_sizes=tuple(batch_sizes),
            lr=cfg.lr,
            rounds=cfg.steps,
            epsilons=None if eps is None else tuple(eps),
            delta=target_delta(cfg),
            clip_norm=cfg.clip if cfg.clip is not None else 1.0,  # FedAvg: unused
            local_epochs=cfg.local_epochs,
            clients_per_round=cfg.clients_per_round,
            loss=loss,
            calibration=calibration or accountant_of(cfg),  # type: ignore[arg-type]
            accountant=accountant_of(cfg),  # type: ignore[arg-type]
        )

    def algorithm(self, cfg: Any, topology: Any, task: Any) -> FederatedRounds:
        """The rounds with every client's ``z_i`` calibrated by the run's accountant."""
        n, eps, batch_sizes = federated_clients(cfg)
        counts = task.data.counts.cpu().numpy()
        if eps is not None and np.any(np.asarray(batch_sizes) >= counts):
            raise ConfigError(
                f"every client's batch size must be below its number of samples (smallest "
                f"client: {int(counts.min())} samples); lower batch_size or use fewer clients"
            )
        fcfg = self._config(cfg, loss=task.loss_name)
        aggregator = build_aggregator(self.aggregator, **self._aggregator_options(cfg))
        plan = plan_clients(
            counts, num_parameters=task.model.num_parameters(), config=fcfg, aggregator=aggregator
        )
        return plan.algorithm(fcfg, aggregator)

    def oracle(self, cfg: Any, task: Any, algorithm: Any, nodes: list[int]) -> ClientData:
        return ClientData.from_stacked(
            task.model,
            task.data,
            rows=torch.as_tensor(nodes, dtype=torch.int64),
            batch_sizes=np.asarray(algorithm.batch_sizes, float),
            loss=task.loss_name,
        )

    def initial_params(self, cfg: Any, task: Any) -> Tree:
        """``theta^0``: one draw of the model under the run's ``seed``."""
        return {k: v[:1] for k, v in task.init_params(seed=cfg.seed).items()}

    # -- the loop's steps -------------------------------------------------------------------
    def advance(self, run: Run, state: FederatedState) -> tuple[FederatedState, Any]:
        """One global round (Algorithm 1 lines 1-7); the server's weights and whether its
        robust PCA converged are kept for the records."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RPCANotConvergedWarning)
            state, info = run.algorithm.step(state, run.oracle, run.comm)
        run.notes["weights"] = [round(float(w), 6) for w in info["weights"]]
        if any(issubclass(w.category, RPCANotConvergedWarning) for w in caught):
            run.notes["rpca_not_converged"] = True
        return state, info

    def gather(self, run: Run, state: FederatedState) -> tuple[Tree, dict[str, torch.Tensor]]:
        return state.params, {}  # the server's model: the same on every process

    def metrics(self, run: Run, state: FederatedState, params: Tree) -> dict[str, Any]:
        row = dict(run.task.evaluate(params))
        accountant = _client_accountant(run)
        budgets = accountant.budgets(state.participated.cpu().numpy()) if accountant else []
        if budgets:
            eps = [b["accounted"]["epsilon"] if b["accounted"] else 0.0 for b in budgets]
            worst = int(np.argmax(eps))
            spent = budgets[worst]["accounted"] or server_budget(0.0, target_delta(run.cfg))
            notes = f"largest of the {len(eps)} clients' epsilons (client {worst})"
            seeded = (  # a simulation: the clients' noise and batches come from one generator
                "noise and sampling from the seed: a reproducible simulation; whoever knows the "
                "seed can rebuild the noise, so the guarantee holds only against an adversary "
                "who does not"
                if run.cfg.key_source != "os"
                else "each client's noise and batches from its own OS key, held only by the "
                "process that runs it: the server cannot rebuild them (the OS-seeded shared "
                "generator draws only the participants)"
                if run.comm.world_size > 1
                else "each client's noise and batches from its own OS key; one process runs "
                "every client and the server here and its checkpoint keeps the keys (under "
                "privdl launch each rank keeps its own clients' keys: the server cannot "
                "rebuild them)"
            )
            row["privacy"] = {
                **spent,
                "notes": "; ".join(filter(None, (notes, spent["notes"], seeded))),
            }
            row["client_epsilons"] = [round(e, 6) for e in eps]
        if "weights" in run.notes:  # the server's weights w_i of the last round
            row["weights"] = run.notes["weights"]
        if self.estimates_noise and run.notes.get("rpca_not_converged"):
            row["rpca_converged"] = False
        return row

    def checkpoint(self, run: Run, state: FederatedState, params: Tree, tensors: dict) -> dict:
        return {
            "params": {k: v.detach().cpu() for k, v in state.theta.items()},
            "t": state.round,
            "state": {
                "participated": state.participated.cpu(),
                "generator": state.generator.get_state(),
            },
            "aggregator": run.algorithm.aggregator.state_dict(),
        }

    def restore(self, run: Run, state: FederatedState, ckpt: dict[str, Any]) -> FederatedState:
        state.generator.set_state(ckpt["state"]["generator"])
        run.algorithm.aggregator.load_state_dict(ckpt.get("aggregator", {}))
        return replace(
            state,
            theta={k: v.to(run.device) for k, v in ckpt["params"].items()},
            round=int(ckpt["t"]),
            participated=ckpt["state"]["participated"],
        )

    def calibration_record(self, run: Run) -> dict[str, Any] | None:
        """Every client's target, batch size, local steps and ``z_i``, with the reference
        code's ``z_i`` for the same target beside it (nominal) and the epsilon our ``z_i``
        spends over all rounds (accounted)."""
        accountant = _client_accountant(run)
        if accountant is None:
            return None
        counts = run.task.data.counts.cpu().numpy()
        reference = plan_clients(
            counts,
            num_parameters=run.task.model.num_parameters(),
            config=self._config(run.cfg, loss=run.task.loss_name, calibration="reference"),
            aggregator=build_aggregator(self.aggregator, **self._aggregator_options(run.cfg)),
        ).noise_multipliers
        alg = run.algorithm
        clients = []
        for b, z_ref in zip(accountant.budgets(), reference, strict=True):
            i = b["client"]
            clients.append(
                {
                    "client": i,
                    "target_epsilon": b["target_epsilon"],
                    "batch_size": float(alg.batch_sizes[i]),
                    "num_samples": int(alg.num_samples[i]),
                    "local_steps": int(alg.local_steps[i]),
                    "noise_multiplier": b["noise_multiplier"],
                    "noise_multiplier_nominal": float(z_ref),
                    "accounted": b["accounted"],
                }
            )
        return {
            "delta": target_delta(run.cfg),
            "calibration": _CALIBRATION_TEXT[accountant_of(run.cfg)],
            "nominal": "noise_multiplier_nominal: the Robust-HDP code's accountant (classic "
            "conversion, 2-decimal z) for the same eps_i",
            "clients": clients,
        }


def _client_accountant(run: Run) -> ClientAccountant | None:
    """Each client's accountant for a built run (cached in its notes)."""
    if "client_accountant" not in run.notes:
        alg: FederatedRounds = run.algorithm
        acc = None
        if alg.private:
            _, eps, _ = federated_clients(run.cfg)
            targets = alg.aggregator.noise_epsilon(np.asarray(eps, float))
            acc = ClientAccountant(
                noise_multipliers=np.asarray(alg.noise_multipliers, float),
                batch_sizes=np.asarray(alg.batch_sizes, float),
                num_samples=np.asarray(alg.num_samples, np.int64),
                local_steps=np.asarray(alg.local_steps, np.int64),
                rounds=run.cfg.steps,
                delta=target_delta(run.cfg),
                targets=targets,
                reported=np.asarray(alg.reported_epsilons, float),
                calibration=accountant_of(run.cfg),
                accountant=accountant_of(run.cfg),
            )
        run.notes["client_accountant"] = acc
    return run.notes["client_accountant"]
