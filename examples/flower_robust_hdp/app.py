"""A Flower app (Message API): Robust-HDP aggregation over clients with heterogeneous DP budgets.

Four clients (``--clients``) each hold an a9a-like tabular binary task (synthetic: 24 Gaussian
features, a shared linear rule with label noise, a per-client shift of the features; nothing to
download) and a budget of its own (epsilons 1, 2, 4, 8, delta 1e-5). Each trains a logistic
model with privdl's DP-SGD (per-sample clipping, Poisson sampling, noise calibrated to its own
epsilon over all rounds by privdl's tightest accountant) inside a Flower ``ClientApp``
(:func:`privdl.integrations.flower_app.dp_client_app`); the ``ServerApp`` runs
:data:`privdl.integrations.flower_app.HDPStrategy` with Robust-HDP's noise-aware weights through
``strategy.start(grid=...)``. Flower's simulation engine runs it:

    python examples/flower_robust_hdp/app.py                     # 3 rounds, 4 clients
    python examples/flower_robust_hdp/app.py --rounds 2 --aggregator dpfedavg

Each round prints every client's weight and its accounted epsilon with its labels (accountant,
delta, neighbouring relation, unit, threat model), then the global model's accuracy on held-out
data. The noise is seeded (``--seed``): a reproducible simulation, not a secure deployment.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from privdl.integrations.flower_app import DPClient, dp_client_app
from privdl.models import build_model

FEATURES = 24
EPSILONS = (1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5
SAMPLES = 500  # per client
HIDDEN = 32  # 24 x 32 + 32 + 32 x 2 + 2 = 866 parameters: robust PCA needs many rows
BATCH = 50  # expected Poisson batch: q = 0.1, 10 local steps a round


def client_data(
    pid: int, n: int = SAMPLES, *, seed: int = 0, split: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``pid``'s examples (``split`` 0: training, 1: held out): the shared rule
    ``y = [x.w + noise > 0]`` on features shifted by the client's own offset."""
    rule = np.random.default_rng(seed).normal(size=FEATURES)
    shift = 0.5 * np.random.default_rng([seed, 1 + pid]).normal(size=FEATURES)
    rng = np.random.default_rng([seed, 1 + pid, 1 + split])
    x = rng.normal(size=(n, FEATURES)) + shift
    y = (x @ rule / np.sqrt(FEATURES) + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)


def model() -> Any:
    return build_model("mlp", in_shape=(FEATURES,), n_classes=2, hidden=(HIDDEN,))


def make_apps(
    *,
    rounds: int = 3,
    epsilons: Sequence[float] = EPSILONS,
    aggregator: str = "robust-hdp",
    seed: int = 0,
    calibration: str = "tightest",
) -> tuple[Any, Any, Any]:
    """The ``ServerApp``, the ``ClientApp`` and the strategy (whose ``history`` has each round's
    weights and every client's labelled epsilon once the run is over)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from flwr.serverapp import ServerApp

    from privdl.integrations.flower_app import HDPStrategy

    n = len(epsilons)
    clients: dict[int, DPClient] = {}  # one per partition and process: calibrated once

    def setup(context: Any) -> DPClient:
        pid = int(context.node_config["partition-id"])
        if pid not in clients:
            x, y = client_data(pid, seed=seed)
            clients[pid] = DPClient(
                model(), x, y, epsilon=float(epsilons[pid]), delta=DELTA, clip=1.0, lr=0.5,
                batch_size=BATCH, rounds=rounds, calibration=calibration,
            )  # fmt: skip
        return clients[pid]

    client_app = dp_client_app(setup, seed=seed)
    strategy = HDPStrategy(
        aggregator=aggregator,
        aggregator_options={"max_iter": 2000} if aggregator == "robust-hdp" else None,
        fraction_train=1.0,
        min_train_nodes=n,
        min_available_nodes=n,
        fraction_evaluate=0.0,
        keep_updates=True,
    )
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Any, context: Any) -> None:
        init = model().init(n_nodes=1, generator=torch.Generator().manual_seed(seed))
        arrays = ArrayRecord({k: Array(v[0].numpy()) for k, v in init.items()})
        strategy.result = strategy.start(
            grid=grid,
            initial_arrays=arrays,
            num_rounds=rounds,
            train_config=ConfigRecord({"lr": 0.5}),
            evaluate_fn=lambda r, a: _central_accuracy(a, seed=seed, n=n),
        )

    return server_app, client_app, strategy


def _central_accuracy(arrays: Any, *, seed: int, n: int) -> Any:
    """The global model on held-out examples of every client (the server's evaluation)."""
    from flwr.app import MetricRecord

    held = [client_data(pid, 400, seed=seed, split=1) for pid in range(n)]
    m = model()
    params = {k: torch.as_tensor(arrays[k].numpy())[None] for k in arrays.keys()}
    hits = 0.0
    for x, y in held:
        hits += float((m.forward(params, x[None])[0].argmax(1) == y).double().mean())
    return MetricRecord({"accuracy": hits / n})


def run(
    *, rounds: int = 3, epsilons: Sequence[float] = EPSILONS, aggregator: str = "robust-hdp",
    seed: int = 0, calibration: str = "tightest", verbose: bool = False,
) -> Any:  # fmt: skip
    """Run the app in Flower's simulation engine; returns the strategy (see its ``history``)."""
    from flwr.simulation import run_simulation

    server_app, client_app, strategy = make_apps(
        rounds=rounds, epsilons=epsilons, aggregator=aggregator, seed=seed, calibration=calibration
    )
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=len(epsilons),
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        verbose_logging=verbose,
    )
    return strategy


def report(strategy: Any) -> str:
    """Each round's weights and every client's labelled epsilon, as text."""
    lines = []
    for entry in strategy.history:
        lines.append(f"round {entry['round']} ({entry['aggregator']}):")
        for node, w, p in zip(entry["nodes"], entry["weights"], entry["privacy"], strict=True):
            lines.append(
                f"  node {node}: weight {w:.4f}  eps={p['epsilon']:.4g} (target "
                f"{entry['metrics'][entry['nodes'].index(node)]['epsilon-target']:g}), "
                f"delta={p['delta']:g}, {p['accountant']}, {p['neighbouring']}, "
                f"{p['unit']}-level, threat model {p['threat-model']}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="server rounds (default 3)")
    parser.add_argument(
        "--aggregator", default="robust-hdp", help="privdl aggregator (default robust-hdp)"
    )
    parser.add_argument("--seed", type=int, default=0, help="data and noise seed (default 0)")
    args = parser.parse_args()
    start = time.perf_counter()
    strategy = run(rounds=args.rounds, aggregator=args.aggregator, seed=args.seed)
    print(report(strategy))
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
