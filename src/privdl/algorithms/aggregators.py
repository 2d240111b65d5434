"""Server aggregation rules for heterogeneous-DP federated learning (Robust-HDP, Table 1, App. B.3).

Every rule maps one round's uploaded updates ``Delta_i`` (columns of a ``(p, k)`` matrix, the k
participating clients) to weights ``w_i >= 0`` with ``sum_i w_i = 1`` and, for PFA only, modified
updates. The server step is then ``theta^{e+1} = theta^e + sum_i w_i Delta_i``
(Robust-HDP Algorithm 1 line 7).

| rule | weights | server needs |
|---|---|---|
| ``robust-hdp`` | ``(1/sigma_hat_i^2) / sum_j (1/sigma_hat_j^2)``, ``sigma_hat`` from robust PCA | updates only |
| ``oracle`` | Eq. 8 optimum with the TRUE Eq. 7 variances | not an algorithm |
| ``weiavg`` | ``eps_i / sum_j eps_j`` (reported eps; Liu et al. 2021a) | reported eps |
| ``pfa`` | project the "private" clients' updates on the public clients' top-k subspace, then ``∝ eps`` | reported eps |
| ``dpfedavg`` / ``fedavg`` / ``mineps`` | ``N_i / sum_j N_j`` | data sizes |

``mineps`` differs from ``dpfedavg`` on the client side only: every client calibrates its noise
to ``min_j eps_j`` (:attr:`Aggregator.noise_epsilon`).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privdl.errors import ConfigError
from privdl.robust.noise import estimate_noise_levels, inverse_variance_weights
from privdl.robust.rpca import RPCANotConvergedWarning

__all__ = [
    "AGGREGATORS",
    "AggregationInput",
    "AggregationResult",
    "Aggregator",
    "DataSizeAvg",
    "EpsilonAvg",
    "OracleAvg",
    "PFA",
    "RobustHDP",
    "build_aggregator",
    "two_means_split",
]


@dataclass(frozen=True)
class AggregationInput:
    """What the server holds in round ``round_index`` (participating clients ``clients``).

    ``updates`` is ``(p, k)``: one column per participating client, rows in flattened-parameter
    order (Algorithm 1 line 3). ``reported_eps``, ``num_samples`` and ``true_sigma2`` are indexed
    by participating client (length k); ``true_sigma2`` is Eq. 7 and only the oracle may read it.
    """

    updates: Tensor
    clients: Tensor
    round_index: int
    reported_eps: Tensor
    num_samples: Tensor
    true_sigma2: Tensor | None = None


@dataclass(frozen=True)
class AggregationResult:
    """Weights over the participating clients (sum 1) and the updates to aggregate."""

    weights: Tensor
    updates: Tensor
    info: dict[str, Any] = field(default_factory=dict)


class Aggregator(ABC):
    """A server weighting rule. ``uses_reported_eps`` marks rules a client can game
    (Robust-HDP Section 4.2, RQ3)."""

    name: str = "aggregator"
    uses_reported_eps: bool = False

    def noise_epsilon(self, eps: np.ndarray) -> np.ndarray:
        """The epsilons the clients calibrate their noise to (minEps overrides it)."""
        return eps

    @abstractmethod
    def __call__(self, inp: AggregationInput) -> AggregationResult:
        """Weights for this round."""

    def state_dict(self) -> dict[str, Any]:
        """What the rule carries from round to round (for checkpoints); none by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a resumed run continues exactly)."""
        if state:
            raise ConfigError(f"aggregator {self.name} keeps no state; got {sorted(state)}")


def _normalise(w: Tensor) -> Tensor:
    if bool((w < 0).any()) or not bool(w.sum() > 0):
        raise ConfigError("aggregation weights must be >= 0 with a positive sum")
    return w / w.sum()


class DataSizeAvg(Aggregator):
    """``w_i ∝ N_i``: FedAvg (non-private), DPFedAvg (Noble et al. 2021), minEps (Liu 2021a)."""

    def __init__(self, name: str = "dpfedavg", *, min_epsilon: bool = False) -> None:
        self.name = name
        self.min_epsilon = min_epsilon
        self.uses_reported_eps = min_epsilon

    def noise_epsilon(self, eps: np.ndarray) -> np.ndarray:
        return np.full_like(eps, eps.min()) if self.min_epsilon else eps

    def __call__(self, inp: AggregationInput) -> AggregationResult:
        w = _normalise(inp.num_samples.to(inp.updates.dtype))
        return AggregationResult(w, inp.updates)


class EpsilonAvg(Aggregator):
    """WeiAvg (Liu et al. 2021a, Alg. 2): ``w_i = eps_i / sum_j eps_j`` with REPORTED eps."""

    name = "weiavg"
    uses_reported_eps = True

    def __call__(self, inp: AggregationInput) -> AggregationResult:
        return AggregationResult(_normalise(inp.reported_eps.to(inp.updates.dtype)), inp.updates)


class OracleAvg(Aggregator):
    """Eq. 8's optimum ``w_i = (1/sigma_i^2)/sum_j (1/sigma_j^2)`` with the true Eq. 7 variances."""

    name = "oracle"

    def __call__(self, inp: AggregationInput) -> AggregationResult:
        if inp.true_sigma2 is None:
            raise ConfigError("the oracle aggregator needs the true update variances")
        w = inverse_variance_weights(inp.true_sigma2.to(inp.updates.dtype))
        return AggregationResult(w, inp.updates, {"sigma2": inp.true_sigma2})


def two_means_split(values: np.ndarray) -> np.ndarray:
    """Exact 2-means on a line: the boolean mask of the upper cluster ("public" clients).

    The split point minimising the within-cluster sum of squares over sorted values (KMeans(2) is
    one of the clusterings the authors' reference code offers for PFA; this one is deterministic).
    All-equal values put every client in the public cluster.
    """
    v = np.asarray(values, float)
    order = np.argsort(v, kind="stable")
    s = v[order]
    if s[0] == s[-1]:
        return np.ones(v.size, dtype=bool)
    k = np.arange(1, v.size)  # lower cluster = s[:k]
    c1, c2 = np.cumsum(s), np.cumsum(s**2)
    lo = c2[k - 1] - c1[k - 1] ** 2 / k
    hi = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (v.size - k)
    cut = int(k[np.argmin(lo + hi)])
    mask = np.zeros(v.size, dtype=bool)
    mask[order[cut:]] = True
    return mask


class PFA(Aggregator):
    """PFA (Liu et al. 2021a) as Robust-HDP App. B.3 uses it, original-PFA projection variant.

    1. Cluster clients by reported eps into public (larger eps) and private (2-means).
    2. Project each private update on the top-``k`` principal subspace of the public updates,
       centred at the public mean: ``Delta <- V V^T (Delta - mean) + mean``.
    3. Aggregate all clients with ``w_i ∝ eps_i``.
    With one public client the subspace is empty and private updates become the public mean.
    """

    name = "pfa"
    uses_reported_eps = True

    def __init__(self, *, components: int = 1) -> None:
        if components < 1:
            raise ConfigError(f"PFA components must be >= 1, got {components}")
        self.components = components

    def __call__(self, inp: AggregationInput) -> AggregationResult:
        eps = inp.reported_eps.detach().cpu().double().numpy()
        public = torch.as_tensor(two_means_split(eps), device=inp.updates.device)
        upd = inp.updates
        if bool(public.all()):
            return AggregationResult(_normalise(inp.reported_eps.to(upd.dtype)), upd)
        pub = upd[:, public]
        mean = pub.mean(1, keepdim=True)
        centred = pub - mean
        u, s, _ = torch.linalg.svd(centred, full_matrices=False)
        rank = int((s > s.max() * 1e-10).sum()) if s.numel() else 0
        v = u[:, : min(self.components, rank)]
        private = upd[:, ~public]
        projected = v @ (v.T @ (private - mean)) + mean
        new = upd.clone()
        new[:, ~public] = projected
        w = _normalise(inp.reported_eps.to(upd.dtype))
        return AggregationResult(w, new, {"public": public})


class RobustHDP(Aggregator):
    """Robust-HDP (Algorithm 1 lines 3-6): weights from robust-PCA noise estimates.

    ``reestimate_every=1`` re-runs RPCA every round (the paper); ``None`` estimates once and
    freezes (the authors' reference code; docs/robust-hdp.md); a client never estimated before
    triggers a new estimate. ``estimate_kwargs`` go to :func:`privdl.robust.estimate_noise_levels`
    (``chunk_rows``, ``max_blocks``, ``max_iter``, ``preset``...). RPCA runs in float64.
    """

    name = "robust-hdp"

    def __init__(self, *, reestimate_every: int | None = 1, **estimate_kwargs: Any) -> None:
        if reestimate_every is not None and reestimate_every < 1:
            raise ConfigError(f"reestimate_every must be >= 1 or None, got {reestimate_every}")
        self.reestimate_every = reestimate_every
        self.estimate_kwargs = estimate_kwargs
        self.sigma2: dict[int, float] = {}
        self.estimated_at: int | None = None
        self.rpca_not_converged = 0  # RPCA solves (blocks) that stopped at max_iter, so far

    def __call__(self, inp: AggregationInput) -> AggregationResult:
        ids = [int(i) for i in inp.clients.tolist()]
        due = (
            self.estimated_at is None
            or any(i not in self.sigma2 for i in ids)
            or (
                self.reestimate_every is not None
                and inp.round_index - self.estimated_at >= self.reestimate_every
            )
        )
        if due:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                est = estimate_noise_levels(inp.updates.double(), **self.estimate_kwargs)
            self.sigma2.update(zip(ids, est.tolist(), strict=True))
            self.estimated_at = inp.round_index
            self.rpca_not_converged += sum(
                issubclass(w.category, RPCANotConvergedWarning) for w in caught
            )
            for caught_warning in caught:  # passed on to the caller's filters, state consistent
                warnings.warn(caught_warning.message, stacklevel=2)
        sigma2 = torch.tensor([self.sigma2[i] for i in ids], dtype=torch.float64)
        w = inverse_variance_weights(sigma2).to(inp.updates)
        return AggregationResult(w, inp.updates, {"sigma2_hat": sigma2, "estimated": due})

    def state_dict(self) -> dict[str, Any]:
        """The noise estimates so far and the round of the last estimate (frozen weights)."""
        return {
            "sigma2": dict(self.sigma2),
            "estimated_at": self.estimated_at,
            "rpca_not_converged": self.rpca_not_converged,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sigma2 = {int(k): float(v) for k, v in state["sigma2"].items()}
        self.estimated_at = state["estimated_at"]
        self.rpca_not_converged = int(state.get("rpca_not_converged", 0))  # older checkpoints


AGGREGATORS = ("robust-hdp", "oracle", "weiavg", "pfa", "dpfedavg", "mineps", "fedavg")


def build_aggregator(name: str, **options: Any) -> Aggregator:
    """An aggregator by name (see :data:`AGGREGATORS`); ``options`` go to its constructor."""
    key = name.lower()
    try:
        if key == "robust-hdp":
            return RobustHDP(**options)
        if key == "pfa":
            return PFA(**options)
        if options:
            raise TypeError(f"unexpected options {sorted(options)}")
        if key == "oracle":
            return OracleAvg()
        if key == "weiavg":
            return EpsilonAvg()
        if key in ("dpfedavg", "fedavg"):
            return DataSizeAvg(key)
        if key == "mineps":
            return DataSizeAvg("mineps", min_epsilon=True)
    except TypeError as e:
        raise ConfigError(f"bad options for aggregator {name!r}: {e}") from None
    raise ConfigError(f"unknown aggregator {name!r}; choose from {', '.join(AGGREGATORS)}")
