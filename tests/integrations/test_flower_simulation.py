"""RobustHDPStrategy inside a real Flower simulation (Ray backend, one actor per client).

Needs ``flwr[simulation]`` (flwr + ray); skipped otherwise, and marked slow (Ray starts in ~10 s).
The oracle recomputes every client's update outside Flower (they are pure functions of the
client's partition id and the round) and applies :func:`robust_hdp_aggregate` round by round:
the global model Flower ends with must equal it, and the weights must fall as the client's
noise grows.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SHAPES = [(40, 50), (50,)]
STDS = [0.01, 0.01, 0.05, 0.2, 0.8]  # heterogeneous DP noise of the five clients
ROUNDS = 3
RPCA = {"max_iter": 2000}


def _initial() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _local_update(parameters: list[np.ndarray], pid: int, server_round: int) -> list[np.ndarray]:
    """A client's 'training': move halfway to its target, plus its Gaussian noise (seeded)."""
    target_rng = np.random.default_rng(100 + pid)
    noise_rng = np.random.default_rng(1000 * server_round + pid)
    out = []
    for p in parameters:
        target = target_rng.standard_normal(p.shape).astype(np.float32)
        noise = STDS[pid] * noise_rng.standard_normal(p.shape).astype(np.float32)
        out.append((p + 0.5 * (target - p) + noise).astype(np.float32))
    return out


def test_strategy_in_a_flower_simulation() -> None:
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.simulation import run_simulation

    from privdl.algorithms.aggregators import RobustHDP
    from privdl.integrations.flower import RobustHDPStrategy, robust_hdp_aggregate

    class Client(NumPyClient):
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def fit(self, parameters, config):
            update = _local_update(parameters, self.pid, int(config["round"]))
            return update, 100, {"pid": self.pid}

    def client_fn(context: Context):
        return Client(int(context.node_config["partition-id"])).to_client()

    history: list[tuple[int, dict]] = []

    class Recording(RobustHDPStrategy):  # type: ignore[misc, valid-type]
        def aggregate_fit(self, server_round, results, failures):
            params, metrics = super().aggregate_fit(server_round, results, failures)
            pids = {str(p.cid): int(r.metrics["pid"]) for p, r in results}
            weights = {pids[k.split("/", 1)[1]]: v for k, v in metrics.items() if "weight/" in k}
            history.append((server_round, weights))
            return params, metrics

    strategy = Recording(
        initial_parameters=ndarrays_to_parameters(_initial()),
        fraction_fit=1.0,
        min_fit_clients=len(STDS),
        min_available_clients=len(STDS),
        fraction_evaluate=0.0,
        on_fit_config_fn=lambda r: {"round": r},
        reestimate_every=1,
        estimate_kwargs=RPCA,
    )

    def server_fn(context: Context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ROUNDS))

    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=len(STDS),
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    assert [r for r, _ in history] == list(range(1, ROUNDS + 1))

    # oracle: the same rounds outside Flower, clients in partition order
    theta = _initial()
    aggregator = RobustHDP(reestimate_every=1, **RPCA)
    for r, weights in history:
        updates = [_local_update(theta, pid, r) for pid in range(len(STDS))]
        theta_next, w, _ = robust_hdp_aggregate(
            theta,
            updates,
            aggregator=aggregator,
            client_ids=list(range(len(STDS))),
            round_index=r - 1,
            num_examples=[100] * len(STDS),
        )
        got = np.array([weights[pid] for pid in range(len(STDS))])
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-7)
        assert got[0] > got[2] > got[3] > got[4]  # more noise, less weight
        theta = theta_next
    final = parameters_to_ndarrays(strategy.current_parameters)
    for a, b in zip(final, theta, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
