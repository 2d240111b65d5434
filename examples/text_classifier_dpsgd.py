"""Your own text classifier (``nn.Embedding`` with a padding row, ``LayerNorm``, a token-wise
``Linear``, mean pooling; or, with ``--model transformer``, a transformer encoder layer)
trained by DP-SGD at a target (epsilon, delta).

The data are synthetic "sentences" of token ids (from seeded torch generators): a vocabulary of
400 words, sentences of 6 to 24 words padded with id 0 to 24, and two classes, each with 20
marker words of which every sentence of that class carries up to three among random filler words.
``privdl.train(algorithm="dpsgd")`` clips every sentence's gradient (the ghost path: the
embedding's per-sentence norm from its distinct words, never a ``400 x 32`` gradient per
sentence) and adds the noise calibrated to the target epsilon. Prints the accounted epsilon with
its labels and the test accuracy of ``result.model`` on held-out sentences, computed here.

    python examples/text_classifier_dpsgd.py --out runs/text-dpsgd          # ~15 s on one core
    python examples/text_classifier_dpsgd.py --quick --out runs/text-quick  # ~5 s
    python examples/text_classifier_dpsgd.py --model transformer --out runs/text-transformer  # ~20 s

With ``--model transformer`` the words pass through ``nn.TransformerEncoderLayer(32, 4, 64,
dropout=0.0, batch_first=True)`` before the mean; it takes the ghost path too (self-attention as
an input projection, the heads' attention and an output projection, docs/engine.md).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import privdl

VOCABULARY, LENGTH, MARKERS, EPSILON = 400, 24, 20, 3.0


def make_sentences(n: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` padded sentences of word ids and their classes (the marker words are fixed)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    words = torch.randint(1 + 2 * MARKERS, VOCABULARY, (n, LENGTH), generator=g)  # filler
    marks = 1 + y[:, None] * MARKERS + torch.randint(0, MARKERS, (n, 3), generator=g)
    lengths = torch.randint(6, LENGTH + 1, (n,), generator=g)
    slots = (torch.rand(n, LENGTH, generator=g) * lengths[:, None]).long()[:, :3]
    words.scatter_(1, slots, marks)  # up to three marker words inside each sentence
    words[torch.arange(LENGTH)[None, :] >= lengths[:, None]] = 0  # padding
    return words, y


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, 32, padding_idx=0)
        self.norm = nn.LayerNorm(32)
        self.token = nn.Linear(32, 32)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.token(self.norm(self.embedding(x))))
        return self.head(h.mean(dim=1))


class TransformerClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, 32, padding_idx=0)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embedding(x)).mean(dim=1))


MODELS = {"mean": TextClassifier, "transformer": TransformerClassifier}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default="runs/text-dpsgd")
    parser.add_argument("--quick", action="store_true", help="a few steps on little data")
    parser.add_argument("--model", choices=sorted(MODELS), default="mean")
    args = parser.parse_args()
    n_train, steps = (1000, 20) if args.quick else (8000, args.steps)
    x, y = make_sentences(n_train, seed=1)
    x_test, y_test = make_sentences(2000, seed=2)
    torch.manual_seed(0)  # the classifier's initial weights
    result = privdl.train(
        algorithm="dpsgd", model=MODELS[args.model](), data=(x, y), eval_data=(x_test, y_test),
        clip=1.0, lr=2.0, batch_size=64, sampling="poisson", epsilon=EPSILON, delta=1e-5,
        steps=steps, eval_every=steps, out=args.out, overwrite=True, progress=False,
    )  # fmt: skip
    p = result.privacy
    print(
        f"epsilon = {p['epsilon']:.4f} (target {EPSILON:g}; accountant {p['accountant']}, "
        f"delta {p['delta']:g}, unit {p['unit']}, threat model {p['threat_model']})"
    )
    with torch.no_grad():
        accuracy = (result.model(x_test).argmax(1) == y_test).float().mean().item()
    print(
        f"test accuracy of result.model: {accuracy:.4f} (chance 0.50; {steps} steps, "
        f"{n_train} training sentences)"
    )


if __name__ == "__main__":
    main()
