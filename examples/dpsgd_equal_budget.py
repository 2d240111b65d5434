"""Plain DP-SGD (one trusted aggregator) beside LDP and DECOR on 4 nodes, at one (epsilon, delta).

The same model (a small MLP of your own) and the same data (synthetic 3-class Gaussian clusters
in 30 dimensions) are trained three ways at the same target (epsilon, delta):

* ``algorithm="dpsgd"``: DP-SGD with one trusted aggregator holding all the data (threat model
  ``central``), here with ``optimizer="sgd:momentum=0.9"``: the optimizer post-processes the
  privatized gradient, so the accountant (and the noise calibrated to the target) is unchanged;
  its batch is the four nodes' batches together, so every method sees as many examples a step;
* ``algorithm="ldp"`` on ``ring:4``: each node adds its own noise (threat model ``ldp``);
* ``algorithm="decor"`` on ``ring:4``: DECOR's pairwise-cancelling correlated noise (threat
  model ``eavesdropper``);
* and, for reference, non-private D-SGD on ``ring:4`` (``result.privacy`` is None).

The table has each method's accounted epsilon, threat model and the test accuracy of
``result.model`` on held-out tensors.

    python examples/dpsgd_equal_budget.py --out runs/equal-budget         # ~20 s on one core
    python examples/dpsgd_equal_budget.py --quick --out runs/equal-quick  # ~15 s
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import privdl

EPSILON, DELTA, CLASSES, DIM = 0.5, 1e-5, 3, 30


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
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="runs/dpsgd-equal-budget")
    parser.add_argument("--quick", action="store_true", help="a few steps on little data")
    args = parser.parse_args()
    n_train, steps = (800, 10) if args.quick else (4000, args.steps)
    x, y = make_data(n_train, seed=1)
    x_test, y_test = make_data(4000, seed=2)
    batch = 8  # per node
    private = dict(clip=1.0, epsilon=EPSILON, delta=DELTA)
    methods = {
        # lr 0.01 with momentum 0.9: an effective step of 0.1, the others' lr
        "DP-SGD, momentum 0.9": dict(algorithm="dpsgd", batch_size=4 * batch,
                                     optimizer="sgd:momentum=0.9", lr=0.01, **private),
        "LDP, ring:4": dict(algorithm="ldp", graph="ring:4", batch_size=batch, lr=0.1, **private),
        "DECOR, ring:4": dict(algorithm="decor", graph="ring:4", batch_size=batch, lr=0.1,
                              **private),
        "D-SGD, ring:4": dict(algorithm="dsgd", graph="ring:4", batch_size=batch, lr=0.1),
    }  # fmt: skip
    print(f"target epsilon {EPSILON}, delta {DELTA:g}, {steps} steps, {n_train} training examples")
    print(f"{'method':22s} {'epsilon':>8s}  {'threat model':13s} {'accuracy':>8s}")
    for name, options in methods.items():
        torch.manual_seed(0)
        result = privdl.train(
            model=mlp(), data=(x, y), eval_data=(x_test, y_test), steps=steps, eval_every=steps,
            sampling="poisson", progress=False, out=Path(args.out) / options["algorithm"],
            overwrite=True, **options,
        )  # fmt: skip
        with torch.no_grad():
            accuracy = (result.model(x_test).argmax(1) == y_test).float().mean().item()
        p = result.privacy or {"epsilon": float("inf"), "threat_model": "non-private"}
        print(f"{name:22s} {p['epsilon']:8.4f}  {p['threat_model']:13s} {accuracy:8.4f}")


if __name__ == "__main__":
    main()
