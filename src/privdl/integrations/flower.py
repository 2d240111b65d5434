"""Robust-HDP aggregation as a legacy Flower strategy (optional extra: ``pip install "privdl[flower]"``).

.. deprecated::
    :data:`RobustHDPStrategy` subclasses Flower's legacy ``flwr.server.strategy.FedAvg``
    (``fit``/``evaluate`` with ``Parameters``); constructing it emits a ``DeprecationWarning``.
    Use :mod:`privdl.integrations.flower_app` (Flower's Message API: ``HDPStrategy`` with
    ``start(grid=...)``, and a DP-SGD ``ClientApp``) instead. It keeps working while Flower
    ships the legacy API.

Robust-HDP (Malekmohammadi, Yu & Cao, ICML 2024), Algorithm 1 lines 3-7, on the server of a
Flower deployment. Flower clients return their locally trained parameters; the strategy forms
``Delta_i = theta_i - theta^e`` against the global parameters it sent (``configure_fit``), stacks
them as the columns of ``M`` (line 3), and lets :class:`privdl.algorithms.aggregators.RobustHDP`
estimate the noise levels ``sigma_hat_i^2 = ||S_{:,i}||^2`` by robust PCA (lines 4-5) and the
weights ``w_i ∝ 1/sigma_hat_i^2`` (line 6). The new global model is
``theta^{e+1} = theta^e + sum_i w_i Delta_i`` (line 7).

The clients are expected to run DP-SGD themselves (e.g. Opacus); the server never reads their
epsilons. ``flwr`` is imported only when :data:`RobustHDPStrategy` is first used::

    from privdl.integrations.flower import RobustHDPStrategy
    strategy = RobustHDPStrategy(initial_parameters=..., reestimate_every=None)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from privdl.algorithms.aggregators import AggregationInput, RobustHDP
from privdl.errors import ConfigError

__all__ = ["INSTALL_HINT", "require_flwr", "robust_hdp_aggregate"]  # + RobustHDPStrategy (lazy)

INSTALL_HINT = 'the Flower integration needs flwr; install it with: pip install "privdl[flower]"'


def require_flwr() -> Any:
    """The ``flwr`` module, or a one-line :class:`ConfigError` telling how to install it."""
    try:
        import flwr
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return flwr


def robust_hdp_aggregate(
    global_arrays: Sequence[np.ndarray],
    client_arrays: Sequence[Sequence[np.ndarray]],
    *,
    aggregator: RobustHDP,
    client_ids: Sequence[int],
    round_index: int,
    num_examples: Sequence[int] | None = None,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """One Robust-HDP server step on plain arrays (Algorithm 1 lines 3-7; needs no flwr).

    Returns the new global arrays (dtypes and shapes of ``global_arrays``), the weights ``w``
    and the noise estimates ``sigma_hat^2`` (ordered like ``client_arrays``). One client gets
    weight 1 (robust PCA needs at least two columns).
    """
    k = len(client_arrays)
    if k == 0:
        raise ConfigError("Robust-HDP aggregation needs at least one client update")
    shapes = [np.shape(a) for a in global_arrays]
    for arrays in client_arrays:
        if [np.shape(a) for a in arrays] != shapes:
            raise ConfigError("a client returned parameters whose shapes differ from the global")
    theta = np.concatenate([np.asarray(a, np.float64).ravel() for a in global_arrays])
    clients = np.stack(
        [np.concatenate([np.asarray(a, np.float64).ravel() for a in arr]) for arr in client_arrays]
    )
    updates = torch.from_numpy(clients - theta[None, :]).T.contiguous()  # (p, k): line 3
    if k == 1:
        weights, sigma2 = np.ones(1), np.full(1, np.nan)
    else:
        sizes = np.ones(k) if num_examples is None else np.asarray(num_examples, float)
        result = aggregator(
            AggregationInput(
                updates=updates,
                clients=torch.as_tensor(list(client_ids), dtype=torch.int64),
                round_index=round_index,
                reported_eps=torch.ones(k, dtype=torch.float64),  # never read by Robust-HDP
                num_samples=torch.as_tensor(sizes, dtype=torch.float64),
            )
        )
        weights = result.weights.double().cpu().numpy()
        sigma2 = result.info["sigma2_hat"].double().cpu().numpy()
    new_flat = theta + updates.numpy() @ weights  # line 7
    out, start = [], 0
    for a, shape in zip(global_arrays, shapes, strict=True):
        size = int(np.prod(shape))
        out.append(new_flat[start : start + size].reshape(shape).astype(np.asarray(a).dtype))
        start += size
    return out, weights, sigma2


def _strategy_class() -> type:
    """Build the strategy class on first use (subclass of ``flwr.server.strategy.FedAvg``)."""
    require_flwr()
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    class RobustHDPStrategy(FedAvg):
        """FedAvg's client sampling and evaluation with Robust-HDP's noise-aware aggregation.

        Deprecated (a ``DeprecationWarning`` on construction): use
        :data:`privdl.integrations.flower_app.HDPStrategy` on Flower's Message API.

        Args:
            reestimate_every: 1 re-runs robust PCA every round (Algorithm 1); ``None`` estimates
                once and freezes the weights (the authors' reference code); a client never seen
                before triggers a new estimate.
            estimate_kwargs: options of :func:`privdl.robust.estimate_noise_levels`
                (``chunk_rows``, ``max_blocks``, ``max_iter``, ...).
            **fedavg_kwargs: passed to ``FedAvg`` (``initial_parameters``, ``fraction_fit``, ...).

        ``aggregate_fit`` returns the new parameters and metrics ``weight/<cid>``,
        ``sigma2_hat/<cid>`` and ``rpca_estimated``.
        """

        def __init__(
            self,
            *,
            reestimate_every: int | None = 1,
            estimate_kwargs: dict[str, Any] | None = None,
            **fedavg_kwargs: Any,
        ) -> None:
            warnings.warn(
                "RobustHDPStrategy is built on Flower's legacy strategy API and is deprecated; "
                "use privdl.integrations.flower_app.HDPStrategy (Flower's Message API)",
                DeprecationWarning,
                stacklevel=2,
            )
            super().__init__(**fedavg_kwargs)
            self.aggregator = RobustHDP(
                reestimate_every=reestimate_every, **(estimate_kwargs or {})
            )
            self.current_parameters = fedavg_kwargs.get("initial_parameters")
            self.client_index: dict[str, int] = {}

        def __repr__(self) -> str:
            return f"RobustHDPStrategy(reestimate_every={self.aggregator.reestimate_every})"

        def initialize_parameters(self, client_manager: Any) -> Any:
            params = super().initialize_parameters(client_manager)
            if params is not None:
                self.current_parameters = params
            return params

        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            self.current_parameters = parameters  # theta^e, the reference of every Delta_i
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(
            self, server_round: int, results: list[tuple[Any, Any]], failures: list[Any]
        ) -> tuple[Any, dict[str, Any]]:
            if not results or (failures and not self.accept_failures):
                return None, {}
            if self.current_parameters is None:
                raise ConfigError(
                    "RobustHDPStrategy needs the global parameters of this round: pass "
                    "initial_parameters= or let the server call configure_fit first"
                )
            cids = [str(proxy.cid) for proxy, _ in results]
            ids = [self.client_index.setdefault(c, len(self.client_index)) for c in cids]
            new, weights, sigma2 = robust_hdp_aggregate(
                parameters_to_ndarrays(self.current_parameters),
                [parameters_to_ndarrays(res.parameters) for _, res in results],
                aggregator=self.aggregator,
                client_ids=ids,
                round_index=server_round - 1,
                num_examples=[res.num_examples for _, res in results],
            )
            metrics: dict[str, Any] = {}
            if self.fit_metrics_aggregation_fn:
                metrics.update(
                    self.fit_metrics_aggregation_fn(
                        [(res.num_examples, res.metrics) for _, res in results]
                    )
                )
            for c, w, s in zip(cids, weights, sigma2, strict=True):
                metrics[f"weight/{c}"] = float(w)
                metrics[f"sigma2_hat/{c}"] = float(s)
            metrics["rpca_estimated"] = bool(
                len(results) > 1 and self.aggregator.estimated_at == server_round - 1
            )
            self.current_parameters = ndarrays_to_parameters(new)
            return self.current_parameters, metrics

    return RobustHDPStrategy


def __getattr__(name: str) -> Any:
    if name == "RobustHDPStrategy":
        cls = _strategy_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
