"""Robust-HDP on clients' data you hold, with heterogeneous privacy budgets, beside DPFedAvg.

Four clients each hold their own ``(X, y)`` tensors (2400, 1200, 600 and 300 examples of a
synthetic 3-class problem) and their own epsilon (``budgets="1,2,4,8"``: the client with the most
data wants the most privacy); each client's noise is calibrated to its own epsilon. The server
weights the noisy updates by Robust-HDP's noise estimates (robust PCA) or, for comparison, by
data size (DPFedAvg). Prints each client's accounted epsilon
(``result.metrics[-1]["client_epsilons"]``) and server weight (``["weights"]``), and the test
accuracy of ``result.model`` (the server's model) on held-out tensors.

    python examples/robust_hdp_own_clients.py --out runs/rhdp-own            # ~35 s on one core
    python examples/robust_hdp_own_clients.py --quick --out runs/rhdp-quick  # ~10 s
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import privdl

BUDGETS, DELTA, CLASSES, DIM = "1,2,4,8", 1e-5, 3, 30


def make_data(n: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three overlapping Gaussian clusters (fixed centres) in 30 dimensions."""
    centres = 0.3 * torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return centres[y] + torch.randn(n, DIM, generator=g), y


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="rounds")
    parser.add_argument("--out", default="runs/robust-hdp-own")
    parser.add_argument("--quick", action="store_true", help="a few steps on little data")
    args = parser.parse_args()
    sizes, rounds = ([240, 120, 60, 30], 2) if args.quick else ([2400, 1200, 600, 300], args.steps)
    clients = [make_data(n, seed=10 + i) for i, n in enumerate(sizes)]  # each client's (X, y)
    x_test, y_test = make_data(4000, seed=2)
    rows = {}
    for algorithm in ("robust-hdp", "dpfedavg"):
        torch.manual_seed(0)
        result = privdl.train(
            algorithm=algorithm, model=mlp(), data=clients, eval_data=(x_test, y_test),
            clients=len(clients), budgets=BUDGETS, delta=DELTA, clip=1.0, lr=0.1, batch_size=8,
            steps=rounds, eval_every=rounds, out=Path(args.out) / algorithm, overwrite=True,
            progress=False,
        )  # fmt: skip
        with torch.no_grad():
            accuracy = (result.model(x_test).argmax(1) == y_test).float().mean().item()
        rows[algorithm] = (result.metrics[-1], accuracy, result.privacy)

    print(f"{len(sizes)} clients, delta {DELTA:g}, {rounds} rounds: epsilon spent, server weight")
    print("client  examples  budget | robust-hdp: epsilon  weight | dpfedavg: epsilon  weight")
    for i, (n, budget) in enumerate(zip(sizes, BUDGETS.split(","), strict=True)):
        cells = [
            f"{r['client_epsilons'][i]:19.4f} {r['weights'][i]:7.3f}" for r, _, _ in rows.values()
        ]
        print(f"{i:6d} {n:9d} {budget:>7s} |{cells[0]} |{cells[1]}")
    for algorithm, (_, accuracy, p) in rows.items():
        print(
            f"{algorithm}: test accuracy of result.model {accuracy:.4f}; epsilon {p['epsilon']:.4f} "
            f"(largest client's; accountant {p['accountant']}, delta {p['delta']:g}, unit "
            f"{p['unit']}, threat model {p['threat_model']})"
        )


if __name__ == "__main__":
    main()
