"""Per-sample clipping of a text model (issue 37, item 1: embeddings): a bag-of-embeddings
classifier (``nn.Embedding(V, D)``, the mean over the ``L`` tokens, ``nn.Linear(D, 2)``), one model,
against the plain torch step on the same data and CPU, interleaved so load drift hits all alike.

* ``plain``: the ``nn.Module``, ``loss.backward()`` and ``torch.optim.SGD.step()`` (no clipping,
  no noise);
* ``private``: ``node_gradients(..., clip=per_sample)`` on the converted module (the ghost path:
  each sample's embedding gradient norm from a segment sum over its distinct tokens, the clipped
  sum by one ``index_add``), Gaussian noise on every parameter and the SGD update;
* ``vmap``: the same clipped gradient by the generic path (``method="vmap"``), which forms every
  sample's ``V x D`` embedding gradient;
* ``opacus`` (when Opacus is installed): its per-sample gradients (``GradSampleModule``, hooks),
  then the clipped sum, the noise and the update by hand.

* ``clipped``: ``private`` without the noise (the price of per-sample clipping alone);
* ``step``: what ``privdl.train(algorithm="dpsgd")`` steps: the same clipping, its keyed
  ``aes-ziggurat`` noise drawn in a background thread one step ahead, and the update.

The clipped sums of ``private`` and ``vmap`` (and ``opacus``) are checked to agree before timing.
The figures are ``private_over_plain``, ``clipped_over_plain``, ``step_over_plain``,
``vmap_over_private`` and ``opacus_over_private``. DP-SGD's noise covers every row of the table (``V D`` normals a step,
as dense as the plain step's gradient and update), so at large ``V`` it dominates the price.

``--net lstm`` is ``nn.LSTM(D, D)`` over the tokens, the last step classified (Opacus: its
``DPLSTM``, the same parameters). ``--net transformer`` is one pre-norm transformer block (self-attention by
``nn.MultiheadAttention``, a GELU feed-forward); it has no Opacus column (see ``_opacus_step``).
``--net tokenwise`` puts ``nn.LayerNorm(D)`` and ``nn.Linear(D, D)`` at every token before the
mean (their per-sample norms by positions, docs/engine.md); ``--net cnn`` is a text CNN
(``nn.Conv1d(D, D, 3)`` over the tokens, ReLU, the max over time).

    python benchmarks/bench_embedding.py --iters 20 [--net tokenwise|cnn|transformer|lstm] [--threads 1] [--json-out out.json]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from _common import (
    add_run_flags,
    apply_run_flags,
    dpsgd_step,
    emit,
    interleaved_seconds,
    machine_facts,
)
from torch import nn

from privdl.algorithms.base import finish_drawn_ahead
from privdl.engine import ClipSpec, node_gradients
from privdl.models import from_module

CLIP, NOISE, LR, LENGTH, DIM = 1.0, 1.0, 0.05, 64, 64


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocabulary: int) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(vocabulary, DIM), nn.Linear(DIM, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(x).mean(1))


class Tokenwise(BagOfEmbeddings):
    """``--net tokenwise``: LayerNorm and a Linear D -> D at every token before the mean."""

    def __init__(self, vocabulary: int) -> None:
        super().__init__(vocabulary)
        self.norm, self.tok = nn.LayerNorm(DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.tok(self.norm(self.emb(x)))).mean(1))


class TextCNN(BagOfEmbeddings):
    """``--net cnn``: Conv1d D -> D, kernel 3, over the tokens, ReLU, the max over time."""

    def __init__(self, vocabulary: int) -> None:
        super().__init__(vocabulary)
        self.conv = nn.Conv1d(DIM, DIM, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(self.emb(x).transpose(1, 2))).amax(-1))


class Transformer(BagOfEmbeddings):
    """``--net transformer``: one pre-norm transformer block over the tokens (``nn.LayerNorm``,
    ``nn.MultiheadAttention(D, 4)`` as self-attention, a GELU feed-forward D -> 2D -> D, both with
    residual sums), then the mean over the tokens."""

    def __init__(self, vocabulary: int) -> None:
        super().__init__(vocabulary)
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.ff1, self.ff2, self.act = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.ff2(self.act(self.ff1(self.ln2(h))))
        return self.fc(h.mean(1))


class LSTMNet(BagOfEmbeddings):
    """``--net lstm``: ``nn.LSTM(D, D, batch_first=True)`` over the tokens, the last step's
    hidden state to the classes."""

    def __init__(self, vocabulary: int) -> None:
        super().__init__(vocabulary)
        self.rnn = nn.LSTM(DIM, DIM, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(x))
        return self.fc(out[:, -1])


NETS = {
    "bag": BagOfEmbeddings, "tokenwise": Tokenwise, "cnn": TextCNN, "transformer": Transformer,
    "lstm": LSTMNet,
}  # fmt: skip


#: nn.LSTM's parameter names as Opacus's DPLSTM's parent module lists them (one layer)
_DPLSTM_NAMES = {
    f"rnn.{kind}_{m}_l0": f"rnn.l0.{m}.{kind}" for kind in ("weight", "bias") for m in ("ih", "hh")
}


def _opacus_step(net: nn.Module, x, y, gen: torch.Generator):
    """Opacus's per-sample gradients (hooks), clipped and summed, noised and applied by hand."""
    try:
        from opacus import GradSampleModule
    except ImportError:
        return None, None
    if any(isinstance(m, nn.MultiheadAttention) for m in net.modules()):
        # Opacus 1.6 swaps it for its DPMultiheadAttention, which with batch_first=True does not
        # compute nn.MultiheadAttention's function for the same weights (largest difference 0.68
        # on random inputs; sequence-first, the two agree to 2e-16): no like-for-like comparison
        return None, None
    if isinstance(getattr(net, "rnn", None), nn.LSTM):  # Opacus's own LSTM, same parameters
        from opacus.layers import DPLSTM

        lstm = DPLSTM(DIM, DIM, batch_first=True)
        lstm.load_state_dict(net.rnn.state_dict())
        net.rnn = lstm
    wrapped = GradSampleModule(net, loss_reduction="sum")
    names = [k for k, p in net.named_parameters() if p.requires_grad]
    params = [p for p in wrapped.parameters() if p.requires_grad]

    def clipped_sum() -> dict[str, torch.Tensor]:
        back = {v: k for k, v in _DPLSTM_NAMES.items()}
        return {back.get(k, k): g for k, g in zip(names, clipped_list(), strict=True)}

    def clipped_list() -> list[torch.Tensor]:
        for p in params:
            p.grad_sample = None
        F.cross_entropy(wrapped(x), y, reduction="sum").backward()
        per = [p.grad_sample.reshape(len(x), -1) for p in params]
        norms = torch.sqrt(sum(g.square().sum(1) for g in per))
        factor = (CLIP / norms).clamp(max=1.0) / len(x)
        out = [torch.einsum("b...,b->...", p.grad_sample, factor) for p in params]
        for p in params:
            p.grad = None
        return out

    def step() -> None:
        grads = clipped_list()
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                noise = torch.randn(g.shape, generator=gen).mul_(NOISE * CLIP / len(x))
                p.sub_(g.add_(noise), alpha=LR)

    return clipped_sum, step


def bench(net_name: str, vocabulary: int, batch: int, iters: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    make = NETS[net_name]
    net = make(vocabulary)
    model = from_module(net, in_shape=(LENGTH,))
    params = model.init(n_nodes=1, generator=gen)
    x = torch.randint(0, vocabulary, (1, batch, LENGTH), generator=gen)
    y = torch.randint(0, 2, (1, batch), generator=gen)
    clip = ClipSpec("per_sample", CLIP)
    noise_gen = torch.Generator().manual_seed(1)

    def clipped(method: str) -> dict[str, torch.Tensor]:
        res = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, method=method)
        return res.grads

    def private() -> None:
        grads = clipped("ghost")
        with torch.no_grad():
            for k, g in grads.items():
                noise = torch.randn(g.shape, generator=noise_gen).mul_(NOISE * CLIP / batch)
                params[k].sub_(g.add_(noise), alpha=LR)

    def clipped_step() -> None:  # the price of clipping alone: no noise
        grads = clipped("ghost")
        with torch.no_grad():
            for k, g in grads.items():
                params[k].sub_(g, alpha=LR)

    def vmap() -> None:
        clipped("vmap")

    plain_net = make(vocabulary)
    plain_net.load_state_dict({k: v[0] for k, v in params.items()})
    opt = torch.optim.SGD(plain_net.parameters(), lr=LR)

    def plain() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(plain_net(x[0]), y[0]).backward()
        opt.step()

    opacus_net = make(vocabulary)
    opacus_net.load_state_dict({k: v[0] for k, v in params.items()})
    opacus_sum, opacus = _opacus_step(opacus_net, x[0], y[0], noise_gen)

    # the clipped sums agree before anything is timed
    ghost_g, vmap_g = clipped("ghost"), clipped("vmap")
    others = [vmap_g]
    if opacus_sum is not None:
        others.append({k: g[None] for k, g in opacus_sum().items()})
    for other in others:
        for k in ghost_g:
            torch.testing.assert_close(ghost_g[k], other[k], rtol=1e-4, atol=1e-6)

    step = dpsgd_step(model, params, x, y, clip=clip, sigma=NOISE * CLIP / batch, lr=LR)
    funcs = [private, plain, vmap, clipped_step, step] + ([opacus] if opacus is not None else [])
    times = interleaved_seconds(funcs, iters=iters, warmup=2)
    finish_drawn_ahead()
    med = [statistics.median(t) for t in times]
    row: dict[str, object] = {
        "setting": f"{net_name} V={vocabulary}, D={DIM}, L={LENGTH}, batch {batch}",
        "private_s": med[0],
        "plain_s": med[1],
        "vmap_s": med[2],
        "clipped_s": med[3],
        "step_s": med[4],
        "private_over_plain": med[0] / med[1],
        "clipped_over_plain": med[3] / med[1],
        "step_over_plain": med[4] / med[1],
        "vmap_over_private": med[2] / med[0],
    }
    if opacus is not None:
        row["opacus_s"] = med[5]
        row["opacus_over_private"] = med[5] / med[0]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--net", choices=sorted(NETS), default="bag")
    ap.add_argument("--vocabularies", default="10000,50000")
    ap.add_argument("--batches", default="64")
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    rows = [
        bench(args.net, int(v), int(b), args.iters)
        for v in args.vocabularies.split(",")
        for b in args.batches.split(",")
    ]
    emit({**machine_facts(tuned), "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
