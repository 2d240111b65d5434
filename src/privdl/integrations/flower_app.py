"""Flower's Message API on both sides: a heterogeneous-DP strategy and a DP-SGD ClientApp.

Optional extra: ``pip install "privdl[flower]"`` (flwr with its simulation engine). ``flwr`` is
imported only when :data:`HDPStrategy` or :func:`dp_client_app` is first used; the numeric parts
(:func:`aggregate_arrays`, :class:`DPClient`) need no flwr.

Server (:data:`HDPStrategy`, a subclass of ``flwr.serverapp.strategy.FedAvg``; run it with
``strategy.start(grid=grid, initial_arrays=..., num_rounds=...)`` inside a ``ServerApp``): every
round it keeps the global arrays it sends (``theta^e``), forms ``Delta_i = theta_i - theta^e``
from the clients' replies and aggregates them with one of privdl's federated aggregators
(:mod:`privdl.algorithms.aggregators`): ``robust-hdp`` (default: Robust-HDP, Malekmohammadi, Yu &
Cao, ICML 2024, Algorithm 1 lines 3-7, weights ``w_i ∝ 1/sigma_hat_i^2`` from robust PCA, which
needs the updates only), ``weiavg`` and ``pfa`` (by the epsilon each client reports), ``dpfedavg``
/ ``fedavg`` / ``mineps`` (by data size). The new global model is
``theta^{e+1} = theta^e + sum_i w_i Delta_i``. ``oracle`` needs the true update variances, which
a Flower server does not have, and is refused.

Client (:func:`dp_client_app`, a ``flwr.clientapp.ClientApp``; or :class:`DPClient` in your own
ClientApp): each client trains with privdl's DP-SGD engine (the local steps of
:class:`privdl.algorithms.federated.FederatedRounds`: per-sample clipping at ``clip``, Poisson
sampling at ``q_i = b_i/N_i``, Gaussian noise ``N(0, clip^2 z_i^2 I)`` per step, ``E_i =
K ceil(N_i/b_i)`` steps a round), with ``z_i`` calibrated to the client's own ``eps_i`` over the
``rounds`` rounds it may take part in (:func:`privdl.accounting.clients.client_noise_multipliers`,
default calibration ``"tightest"``), and accounts what it has spent after each round with
:class:`privdl.accounting.clients.ClientAccountant`. A client refuses to train beyond the rounds
its noise was calibrated for. Its reply carries:

* ``arrays``: its trained parameters (an ``ArrayRecord``, keys = privdl parameter names);
* ``metrics`` (``MetricRecord``): ``num-examples``, ``epsilon`` (accounted so far), ``delta``,
  ``epsilon-target``, ``noise-multiplier``, ``sampling-rate``, ``local-steps``, ``rounds-spent``;
* ``privacy`` (``ConfigRecord``): the same epsilon with its labels, ``accountant``, ``delta``,
  ``neighbouring`` (``add_remove``), ``unit`` (``example``), ``threat-model`` (``server``: the
  server sees each client's update), ``nominal`` and ``notes``.

The strategy records every round in :attr:`HDPStrategy.history` (each client's node id, weight,
noise estimate and labelled epsilon) and returns metrics ``weight/<node>``, ``epsilon/<node>``
and ``epsilon-max``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from privdl.accounting.clients import ClientAccountant, client_noise_multipliers
from privdl.algorithms.aggregators import (
    AggregationInput,
    Aggregator,
    DataSizeAvg,
    OracleAvg,
    RobustHDP,
    build_aggregator,
)
from privdl.algorithms.federated import ClientData, FederatedRounds
from privdl.data.batching import StackedData
from privdl.engine.losses import correct, per_sample_loss
from privdl.errors import ConfigError, PrivacyError
from privdl.integrations.flower import require_flwr
from privdl.models.base import StackedModel
from privdl.robust.trainer import federated_communicator

__all__ = [
    "AggregateOutcome",
    "DPClient",
    "aggregate_arrays",
    "dp_client_app",
    "make_aggregator",
]  # + HDPStrategy (lazy: needs flwr)

Arrays = Mapping[str, np.ndarray]


def make_aggregator(aggregator: str | Aggregator = "robust-hdp", **options: Any) -> Aggregator:
    """A privdl aggregator by name (or as given) that a Flower server can run (not ``oracle``)."""
    agg = build_aggregator(aggregator, **options) if isinstance(aggregator, str) else aggregator
    if isinstance(agg, OracleAvg):
        raise ConfigError(
            "the oracle aggregator needs the true update variances, which a Flower server does "
            "not have; choose robust-hdp, weiavg, pfa, dpfedavg, mineps or fedavg"
        )
    return agg


@dataclass(frozen=True)
class AggregateOutcome:
    """One server step: the new global arrays, the weights and what the aggregator reports."""

    arrays: dict[str, np.ndarray]
    weights: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


def _flat(arrays: Arrays, keys: Sequence[str]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in keys])


def aggregate_arrays(
    global_arrays: Arrays,
    client_arrays: Sequence[Arrays],
    *,
    aggregator: Aggregator,
    client_ids: Sequence[int],
    round_index: int,
    num_examples: Sequence[float],
    reported_epsilons: Sequence[float] | None = None,
) -> AggregateOutcome:
    """``theta + sum_i w_i Delta_i`` with ``aggregator``'s weights (needs no flwr).

    ``client_arrays[i]`` must have the keys and shapes of ``global_arrays``; the updates
    ``Delta_i`` are formed in float64 in the order of the keys of ``global_arrays``
    (Algorithm 1 line 3). ``reported_epsilons`` is what WeiAvg, PFA and minEps read. A lone
    client of Robust-HDP gets weight 1 (robust PCA needs two columns). The new arrays keep the
    global arrays' dtypes and shapes.
    """
    k = len(client_arrays)
    if k == 0:
        raise ConfigError("aggregation needs at least one client update")
    if len(client_ids) != k or len(num_examples) != k:
        raise ConfigError("need one client id and one example count per client update")
    keys = list(global_arrays)
    shapes = {name: np.shape(global_arrays[name]) for name in keys}
    for arrays in client_arrays:
        if set(arrays) != set(keys) or any(np.shape(arrays[n]) != shapes[n] for n in keys):
            raise ConfigError(
                "a client returned arrays whose names or shapes differ from the global"
            )
    if aggregator.uses_reported_eps and reported_epsilons is None:
        raise ConfigError(f"aggregator {aggregator.name} needs the epsilon each client reports")
    theta = _flat(global_arrays, keys)
    clients = np.stack([_flat(arrays, keys) for arrays in client_arrays])
    updates = torch.from_numpy(clients - theta[None, :]).T.contiguous()  # (p, k): line 3
    eps = np.ones(k) if reported_epsilons is None else np.asarray(reported_epsilons, float)
    if k == 1 and isinstance(aggregator, RobustHDP):
        weights, used, info = np.ones(1), updates, {"sigma2_hat": np.full(1, np.nan)}
    else:
        result = aggregator(
            AggregationInput(
                updates=updates,
                clients=torch.as_tensor([int(c) for c in client_ids], dtype=torch.int64),
                round_index=int(round_index),
                reported_eps=torch.as_tensor(eps, dtype=torch.float64),
                num_samples=torch.as_tensor(np.asarray(num_examples, float), dtype=torch.float64),
            )
        )
        weights = result.weights.double().cpu().numpy()
        used = result.updates.double().cpu()  # PFA projects some updates
        info = {
            name: v.detach().cpu().numpy() if torch.is_tensor(v) else v
            for name, v in result.info.items()
        }
    new_flat = theta + used.numpy() @ weights  # line 7
    out, start = {}, 0
    for name in keys:
        size = int(np.prod(shapes[name]))
        dtype = np.asarray(global_arrays[name]).dtype
        out[name] = new_flat[start : start + size].reshape(shapes[name]).astype(dtype)
        start += size
    return AggregateOutcome(out, weights, info)


class DPClient:
    """One federated client's calibrated DP-SGD, with privdl's engine and accountant (no flwr).

    Args:
        model: a privdl :class:`~privdl.models.base.StackedModel` (e.g. ``build_model("mlp",
            ...)``); the parameters exchanged are its ``param_shapes()`` names.
        x, y: the client's training examples (``N_i`` rows; ``y`` class indices for
            ``cross_entropy``).
        epsilon, delta: the client's own budget, example-level, add/remove neighbouring,
            against the server, over all ``rounds`` rounds.
        clip: per-sample clipping norm ``c``; ``lr``: local step size ``eta_l``;
            ``batch_size``: expected Poisson batch ``b_i`` (rate ``b_i/N_i``);
            ``local_epochs``: ``K`` (``E_i = K ceil(N_i/b_i)`` steps a round).
        rounds: how many rounds the client may train; its noise is calibrated for all of them
            and :meth:`train` refuses more.
        calibration: how ``z_i`` is found (``"tightest"``, ``"rdp"`` or ``"reference"``, whose
            epsilon is nominal); accountant: how the spent epsilon is certified (``"tightest"``
            or ``"rdp"``).
        x_eval, y_eval: optional local evaluation data (:meth:`evaluate`).
    """

    def __init__(
        self,
        model: StackedModel,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        epsilon: float,
        delta: float,
        clip: float,
        lr: float,
        batch_size: float,
        rounds: int,
        local_epochs: int = 1,
        calibration: str = "tightest",
        accountant: str = "tightest",
        loss: str = "cross_entropy",
        x_eval: torch.Tensor | None = None,
        y_eval: torch.Tensor | None = None,
    ) -> None:
        n = int(x.shape[0])
        if n < 1 or int(y.shape[0]) != n:
            raise ConfigError("a client needs at least one example and one label per example")
        if not 0 < batch_size <= n:
            raise ConfigError(f"batch_size must be in (0, {n}], got {batch_size}")
        if rounds < 1 or local_epochs < 1:
            raise ConfigError("rounds and local_epochs must be >= 1")
        if not (epsilon > 0 and 0 < delta < 1):
            raise PrivacyError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
        self.model, self.loss = model, loss
        self.x, self.y = x, y
        #: the parameters' dtype: the features', float32 for a model that reads indices
        self.dtype = x.dtype if x.is_floating_point() else torch.float32
        self.x_eval, self.y_eval = x_eval, y_eval
        self.num_examples = n
        self.epsilon, self.delta = float(epsilon), float(delta)
        self.clip, self.lr, self.batch_size = float(clip), float(lr), float(batch_size)
        self.rounds = int(rounds)
        self.local_steps = int(local_epochs) * math.ceil(n / batch_size)
        self.noise_multiplier = float(
            client_noise_multipliers(
                np.array([self.epsilon]),
                batch_sizes=np.array([self.batch_size]),
                num_samples=np.array([n]),
                local_steps=np.array([self.local_steps]),
                local_epochs=int(local_epochs),
                rounds=self.rounds,
                delta=self.delta,
                calibration=calibration,  # type: ignore[arg-type]
            )[0]
        )
        self.accountant = ClientAccountant(
            noise_multipliers=np.array([self.noise_multiplier]),
            batch_sizes=np.array([self.batch_size]),
            num_samples=np.array([n]),
            local_steps=np.array([self.local_steps]),
            rounds=self.rounds,
            delta=self.delta,
            targets=np.array([self.epsilon]),
            reported=np.array([self.epsilon]),
            calibration=calibration,
            accountant=accountant,
        )
        self._rounds_algo = FederatedRounds(
            lr=self.lr,
            clip_norm=self.clip,
            noise_multipliers=(self.noise_multiplier,),
            batch_sizes=(self.batch_size,),
            num_samples=(n,),
            local_steps=(self.local_steps,),
            reported_epsilons=(self.epsilon,),
            update_variance=(0.0,),  # only the oracle aggregator reads it
            aggregator=DataSizeAvg(),  # not used: the server aggregates
        )

    @property
    def sampling_rate(self) -> float:
        return self.batch_size / self.num_examples

    def _params(self, arrays: Arrays) -> dict[str, torch.Tensor]:
        shapes = self.model.param_shapes()
        if set(arrays) != set(shapes):
            raise ConfigError(
                f"the server sent arrays {sorted(arrays)}, the model has {sorted(shapes)}"
            )
        out = {}
        for name, shape in shapes.items():
            a = torch.as_tensor(np.asarray(arrays[name]), dtype=self.dtype)
            if tuple(a.shape) != tuple(shape):
                raise ConfigError(f"array {name!r} has shape {tuple(a.shape)}, want {shape}")
            out[name] = a
        return out

    def budget(self, rounds_spent: int) -> dict[str, Any]:
        """The labelled (eps, delta) certified after ``rounds_spent`` rounds of local training
        (``server_budget`` keys: epsilon, delta, accountant, neighbouring, unit, threat_model,
        nominal, notes); epsilon 0 before the first round."""
        entry = self.accountant.budgets(participated=[int(rounds_spent)])[0]
        if entry["accounted"] is not None:
            return dict(entry["accounted"])
        return {
            "epsilon": 0.0,
            "delta": self.delta,
            "accountant": self.accountant.accountant,
            "neighbouring": "add_remove",
            "unit": "example",
            "threat_model": "server",
            "nominal": False,
            "notes": "no local step taken yet",
        }

    def train(
        self, arrays: Arrays, *, rounds_spent: int, seed: int | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """One round of local DP-SGD from the global ``arrays``; returns the trained arrays and
        the labelled budget spent after this round (``rounds_spent + 1`` rounds in all).

        ``seed`` seeds the round's Poisson sampling and noise (a reproducible simulation: whoever
        knows it can rebuild the noise); ``None`` draws it from the operating system.
        """
        if rounds_spent >= self.rounds:
            raise PrivacyError(
                f"this client's noise was calibrated for {self.rounds} rounds at epsilon "
                f"{self.epsilon:g}; it has trained {rounds_spent} and refuses another"
            )
        theta = {name: v[None] for name, v in self._params(arrays).items()}
        data = StackedData(self.x[None], self.y[None], torch.tensor([self.num_examples]))
        oracle = ClientData.from_stacked(
            self.model, data, batch_sizes=np.array([self.batch_size]), loss=self.loss
        )
        gen = torch.Generator().manual_seed(secrets.randbits(63) if seed is None else int(seed))
        delta = self._rounds_algo.local_updates(
            {name: v[0] for name, v in theta.items()},
            torch.ones(1, dtype=torch.bool),
            gen,
            oracle,
            federated_communicator(1, dtype=self.dtype),
        )
        new = {name: (theta[name][0] + delta[name][0]).numpy() for name in theta}
        return new, self.budget(rounds_spent + 1)

    @torch.no_grad()
    def evaluate(self, arrays: Arrays) -> dict[str, float]:
        """Mean loss and accuracy of ``arrays`` on the client's evaluation data (its training
        data when none was given: then not a held-out estimate)."""
        x = self.x if self.x_eval is None else self.x_eval
        y = self.y if self.y_eval is None else self.y_eval
        params = {name: v[None] for name, v in self._params(arrays).items()}
        out = self.model.forward(params, x[None])
        loss = per_sample_loss(out, y[None], self.loss)
        acc = correct(out, y[None], self.loss)
        return {"loss": float(loss.mean()), "accuracy": float(acc.double().mean())}


# ---------------------------------------------------------------------------------------------
# the flwr side (built on first use)


def _budget_record(budget: Mapping[str, Any]) -> dict[str, Any]:
    """A labelled budget as ConfigRecord values (strings, floats, bools)."""
    return {
        "epsilon": float(budget["epsilon"]),
        "delta": float(budget["delta"]),
        "accountant": str(budget["accountant"]),
        "neighbouring": str(budget["neighbouring"]),
        "unit": str(budget["unit"]),
        "threat-model": str(budget["threat_model"]),
        "nominal": bool(budget["nominal"]),
        "notes": str(budget.get("notes", "")),
    }


STATE_KEY = "privdl-dp"
#: Added to a seeded client app's budget notes (docs/security.md s.1).
SEEDED_NOTE = (
    "client noise seeded by (seed, node, round): whoever knows the seed can rebuild it, so the "
    "server threat model holds only if the server does not know the seed (seed=None: OS randomness)"
)


def _joined(notes: str, note: str) -> str:
    return f"{notes}; {note}" if notes else note


def dp_client_app(setup: Callable[[Any], DPClient], *, seed: int | None = None) -> Any:
    """A ``flwr.clientapp.ClientApp`` whose train step is :meth:`DPClient.train`.

    ``setup(context)`` returns the node's :class:`DPClient` (cache it per partition: its noise
    calibration runs once). The rounds a node has trained are kept in ``context.state`` (what
    the accountant composes). ``seed`` makes the run a reproducible simulation (each round's
    generator seeded by ``(seed, node, round)``); ``None`` (default) uses OS randomness.
    Evaluate messages get ``loss`` and ``accuracy`` (:meth:`DPClient.evaluate`).
    """
    require_flwr()
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def _arrays(msg: Any) -> dict[str, np.ndarray]:
        records = list(msg.content.array_records.values())
        if len(records) != 1:
            raise ConfigError(f"expected one ArrayRecord from the server, got {len(records)}")
        return {name: records[0][name].numpy() for name in records[0].keys()}

    @app.train()
    def train(msg: Any, context: Any) -> Any:
        client = setup(context)
        config: Any = next(iter(msg.content.config_records.values()), {})
        server_round = int(config.get("server-round", 0))
        state = context.state.config_records.get(STATE_KEY)
        spent = int(state["rounds"]) if state is not None else 0
        round_seed = None
        if seed is not None:
            seq = np.random.SeedSequence([seed, int(context.node_id), server_round])
            round_seed = int(seq.generate_state(1, np.uint64)[0]) % 2**63
        new, budget = client.train(_arrays(msg), rounds_spent=spent, seed=round_seed)
        if seed is not None:  # the label holds against a server that does not know the seed
            budget = {**budget, "notes": _joined(budget.get("notes", ""), SEEDED_NOTE)}
        context.state[STATE_KEY] = ConfigRecord({"rounds": spent + 1})
        metrics = MetricRecord(
            {
                "num-examples": client.num_examples,
                "epsilon": float(budget["epsilon"]),
                "delta": float(budget["delta"]),
                "epsilon-target": client.epsilon,
                "noise-multiplier": client.noise_multiplier,
                "sampling-rate": client.sampling_rate,
                "local-steps": client.local_steps,
                "rounds-spent": spent + 1,
            }
        )
        content = RecordDict(
            {
                "arrays": ArrayRecord(
                    {name: Array(np.ascontiguousarray(v)) for name, v in new.items()}
                ),
                "metrics": metrics,
                "privacy": ConfigRecord(_budget_record(budget)),
            }
        )
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Any, context: Any) -> Any:
        client = setup(context)
        got = client.evaluate(_arrays(msg))
        metrics = MetricRecord({"num-examples": client.num_examples, **got})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def _strategy_class() -> type:
    """Build :data:`HDPStrategy` on first use (subclass of ``flwr.serverapp.strategy.FedAvg``)."""
    require_flwr()
    from flwr.app import Array, ArrayRecord, MetricRecord
    from flwr.serverapp.strategy import FedAvg

    class HDPStrategy(FedAvg):
        """FedAvg's node sampling and evaluation with a privdl aggregator's weights.

        Args:
            aggregator: a name of :data:`privdl.algorithms.aggregators.AGGREGATORS` but
                ``oracle`` (default ``"robust-hdp"``), or an :class:`Aggregator`.
            aggregator_options: passed to the aggregator (Robust-HDP: ``reestimate_every``,
                and :func:`privdl.robust.estimate_noise_levels`'s ``max_iter``, ...).
            epsilon_key: the reply metric WeiAvg, PFA and minEps weight by (the epsilon each
                client reports; default ``"epsilon-target"``, as :func:`dp_client_app` sends).
            keep_updates: also keep each round's ``Delta`` matrix in :attr:`history` (tests).
            **fedavg_kwargs: ``FedAvg``'s (``fraction_train``, ``min_train_nodes``, ...).
        """

        def __init__(
            self,
            *,
            aggregator: str | Aggregator = "robust-hdp",
            aggregator_options: dict[str, Any] | None = None,
            epsilon_key: str = "epsilon-target",
            keep_updates: bool = False,
            **fedavg_kwargs: Any,
        ) -> None:
            super().__init__(**fedavg_kwargs)
            self.aggregator = make_aggregator(aggregator, **(aggregator_options or {}))
            self.epsilon_key = epsilon_key
            self.keep_updates = keep_updates
            self.current_arrays: dict[str, np.ndarray] | None = None
            self.client_index: dict[int, int] = {}
            self.history: list[dict[str, Any]] = []

        def __repr__(self) -> str:
            return f"HDPStrategy(aggregator={self.aggregator.name!r})"

        def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Any:
            # theta^e, the reference of every Delta_i this round
            self.current_arrays = {name: arrays[name].numpy() for name in arrays.keys()}
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round: int, replies: Any) -> tuple[Any, Any]:
            if self.current_arrays is None:
                raise ConfigError(
                    "HDPStrategy needs the global arrays of this round: configure_train sets them"
                )
            ok = sorted(
                (m for m in replies if not m.has_error()), key=lambda m: m.metadata.src_node_id
            )
            if not ok:
                return None, None
            nodes, client_arrays, metrics, privacy = [], [], [], []
            for msg in ok:
                content = msg.content
                arrays = list(content.array_records.values())
                mets = list(content.metric_records.values())
                if len(arrays) != 1 or len(mets) != 1:
                    raise ConfigError("a reply must carry one ArrayRecord and one MetricRecord")
                nodes.append(int(msg.metadata.src_node_id))
                client_arrays.append({k: arrays[0][k].numpy() for k in arrays[0].keys()})
                metrics.append(dict(mets[0]))
                priv = content.config_records.get("privacy")
                privacy.append(dict(priv) if priv is not None else None)
            ids = [self.client_index.setdefault(n, len(self.client_index)) for n in nodes]
            reported = None
            if self.aggregator.uses_reported_eps:
                missing = [
                    n for n, m in zip(nodes, metrics, strict=True) if self.epsilon_key not in m
                ]
                if missing:
                    raise ConfigError(
                        f"aggregator {self.aggregator.name} needs metric {self.epsilon_key!r}, "
                        f"missing from nodes {missing}"
                    )
                reported = [float(m[self.epsilon_key]) for m in metrics]
            outcome = aggregate_arrays(
                self.current_arrays,
                client_arrays,
                aggregator=self.aggregator,
                client_ids=ids,
                round_index=server_round - 1,
                num_examples=[float(m[self.weighted_by_key]) for m in metrics],
                reported_epsilons=reported,
            )
            sigma2 = outcome.info.get("sigma2_hat")
            entry: dict[str, Any] = {
                "round": server_round,
                "aggregator": self.aggregator.name,
                "nodes": nodes,
                "weights": outcome.weights.tolist(),
                "sigma2_hat": None if sigma2 is None else np.asarray(sigma2, float).tolist(),
                "privacy": privacy,
                "metrics": metrics,
            }
            if self.keep_updates:
                keys = list(self.current_arrays)
                theta = _flat(self.current_arrays, keys)
                entry["global"] = dict(self.current_arrays)
                entry["updates"] = np.stack([_flat(a, keys) - theta for a in client_arrays], 1)
            self.history.append(entry)
            new = ArrayRecord(
                {k: Array(np.ascontiguousarray(v)) for k, v in outcome.arrays.items()}
            )
            self.current_arrays = outcome.arrays
            out: dict[str, Any] = {
                "num-examples": sum(int(m[self.weighted_by_key]) for m in metrics),
                "clients": len(nodes),
            }
            eps = [p["epsilon"] for p in privacy if p is not None and "epsilon" in p]
            if eps:
                out["epsilon-max"] = float(max(eps))
            for n, w, p in zip(nodes, outcome.weights, privacy, strict=True):
                out[f"weight/{n}"] = float(w)
                if p is not None and "epsilon" in p:
                    out[f"epsilon/{n}"] = float(p["epsilon"])
            return new, MetricRecord(out)

    return HDPStrategy


def __getattr__(name: str) -> Any:
    if name == "HDPStrategy":
        cls = _strategy_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
