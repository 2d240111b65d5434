"""Example-level audits of a federated client (Robust-HDP, Malekmohammadi et al., ICML 2024,
Algorithm 1, and the baselines of its Table 1): canary examples in client 0's local data.

Client 0 runs its local DP-SGD (Eq. 1: Poisson sampling at ``q = b/N``, per-example clipping,
``N(0, c^2 z^2)`` noise over the expected batch size) as implemented
(:class:`privdl.algorithms.federated.FederatedRounds`), its noise multiplier calibrated to its
epsilon by the run's recipe. Its data are the canary examples of :mod:`privdl.audit.examples`
(one coordinate per trial, add/remove); the other clients hold all-zero inputs (zero gradients,
their own noise), so the server's aggregation runs as in any round. The adversary is the server
(Robust-HDP's threat model): it sees every client's update ``Delta_i`` every round; the view of
trial ``k`` is coordinate ``k`` of client 0's updates.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch
from torch import nn

from privdl.algorithms.base import Keys
from privdl.audit.examples import canary_data
from privdl.audit.gossip import MAX_CELLS
from privdl.comm.base import Communicator
from privdl.errors import ConfigError
from privdl.tree import Tree

__all__ = ["build_client_run", "client_budget", "client_views"]

#: Clients of a federated audit (Robust-HDP's noise estimate needs a few besides the canary's).
CLIENTS = 4


class _ServerView:
    """The run's communicator, keeping the client updates the server aggregates each round."""

    def __init__(self, inner: Communicator) -> None:
        self._inner = inner
        self.updates: list[torch.Tensor] = []

    def weighted_sum(self, tree: Tree, weights: torch.Tensor) -> Tree:
        (value,) = tree.values()  # the audit's model is one weight matrix
        self.updates.append(value.detach().reshape(value.shape[0], -1).clone())
        return self._inner.weighted_sum(tree, weights)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def build_client_run(
    values: dict[str, Any],
    present: np.ndarray,
    *,
    sampling_rate: float,
    calibrated: Any = None,
    fillers: bool = False,
) -> Any:
    """The federated run of one batch of trials: client 0 holds the canary examples of
    ``present``, its expected batch size ``sampling_rate`` times their number (``fillers``:
    a zero-gradient example in every absent slot, :func:`privdl.audit.examples.canary_data`)."""
    from privdl.data.custom import user_data
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes
    from privdl.registry import make_config
    from privdl.tasks import UserObjects

    m = len(present) if fillers else int(np.sum(present))
    if m < 1 or not 0 < sampling_rate < 1:
        raise ConfigError("a client audit needs canaries and a sampling rate in (0, 1)")
    clip = float(values.get("clip") or 1.0)
    x, y = canary_data(present, clip, fillers=fillers)
    others = [(torch.zeros_like(x), torch.zeros_like(y)) for _ in range(CLIENTS - 1)]
    batch = max(1, round(sampling_rate * m))
    cfg = calibrated or make_config(
        {**values, "task": "user", "clients": CLIENTS, "batch_size": batch, "clip": clip}
    )
    model = nn.Linear(len(present), 1, bias=False)
    nn.init.zeros_(model.weight)
    user = UserObjects(data=user_data([(x, y), *others], n_classes=2), model=model)
    return build_run(cfg, user=user, calibrated=calibrated is not None)


def client_views(run: Any, *, seed: int) -> np.ndarray:
    """``(B, rounds)``: each trial's coordinate of client 0's update, every round."""
    rounds = int(run.cfg.steps)
    params = run.recipe.initial_params(run.cfg, run.task)
    size = sum(int(v[0].numel()) for v in params.values())
    if size * rounds > MAX_CELLS:
        raise ConfigError(f"{size} trials x {rounds} rounds is too large for one audit")
    comm = _ServerView(run.comm)
    keys = Keys.from_seed(seed)
    state = run.algorithm.init(params, run.oracle, cast(Communicator, comm), keys=keys)
    for _ in range(rounds):
        state, _ = run.algorithm.step(state, run.oracle, cast(Communicator, comm))
    return torch.stack([u[0] for u in comm.updates]).T.to(torch.float64).numpy()


def client_budget(run: Any) -> dict[str, Any]:
    """Client 0's accounted budget after every round (its recipe's client accountant)."""
    from privdl.recipes.federated import _client_accountant

    accountant = _client_accountant(run)
    if accountant is None:
        raise ConfigError(f"{run.cfg.algorithm} adds no noise: nothing to audit")
    return dict(accountant.budgets()[0]["accounted"] or {})
