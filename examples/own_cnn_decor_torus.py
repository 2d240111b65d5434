"""Your own CNN on your own tensors, trained by DECOR on a torus at a target (epsilon, delta).

A small CNN (Conv2d, ReLU, MaxPool2d, Linear) learns four classes of synthetic 1x12x12 images
(a fixed random pattern per class plus noise, from seeded torch generators), trained by DECOR on
``torus:3x3`` (``--quick``: ``torus:2x2``), each node holding an iid share of the tensors, with
the noise calibrated to the target epsilon. Prints the accounted epsilon with its labels and the
test accuracy of ``result.model`` (the nodes' average) on held-out tensors, computed here.

    python examples/own_cnn_decor_torus.py --out runs/cnn-decor          # ~20 s on one core
    python examples/own_cnn_decor_torus.py --quick --out runs/cnn-quick  # ~10 s
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import privdl

CLASSES, SIDE, EPSILON = 4, 12, 4.0


def make_images(n: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy images of the four class patterns (the patterns are the same for any seed)."""
    patterns = torch.randn(CLASSES, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = 0.6 * patterns[y] + torch.randn(n, 1, SIDE, SIDE, generator=g)
    return x, y


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool2 = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 3 * 3, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(torch.relu(self.conv1(x)))
        x = self.pool2(torch.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="runs/own-cnn-decor")
    parser.add_argument("--quick", action="store_true", help="a few steps on little data")
    args = parser.parse_args()
    quick, full = ("torus:2x2", 800, 10), ("torus:3x3", 9000, args.steps)
    graph, n_train, steps = quick if args.quick else full
    x, y = make_images(n_train, seed=1)
    x_test, y_test = make_images(2000, seed=2)
    torch.manual_seed(0)  # SmallCNN's initial weights: every node starts from them
    rows = []  # a callback: a plain function gets every recorded metrics row
    result = privdl.train(
        algorithm="decor", model=SmallCNN(), data=(x, y), eval_data=(x_test, y_test),
        graph=graph, clip=1.0, lr=0.2, batch_size=32, sampling="poisson", epsilon=EPSILON,
        delta=1e-5, steps=steps, eval_every=steps if args.quick else max(1, steps // 5),
        out=args.out, overwrite=True, progress=False, callbacks=[rows.append],
    )  # fmt: skip
    for row in rows:
        spent = row["privacy"]["epsilon"]
        print(f"step {row['step']:4d}  loss {row['loss']:.4f}  epsilon so far {spent:.4f}")
    p = result.privacy
    print(
        f"epsilon = {p['epsilon']:.4f} (target {EPSILON:g}; accountant {p['accountant']}, "
        f"delta {p['delta']:g}, unit {p['unit']}, threat model {p['threat_model']})"
    )
    with torch.no_grad():
        accuracy = (result.model(x_test).argmax(1) == y_test).float().mean().item()
    print(
        f"test accuracy of result.model: {accuracy:.4f} (chance {1 / CLASSES:.2f}; "
        f"{graph}, {steps} steps, {n_train} training images)"
    )


if __name__ == "__main__":
    main()
