"""The price of privacy for one model (issue 37, item 1): a DP-SGD gradient step against the plain
torch step, on the same network, data and CPU, interleaved so load drift hits both alike.

* ``private``: ``node_gradients(..., clip=per_sample)`` for one node (``n = 1``), ``method``
  ``auto`` (the ghost path: per-layer norms from the layer inputs and output gradients, the conv
  layers by direct per-sample gradients or the Gram form ``<G^T G, U^T U>``, whichever is
  cheaper), plus the Gaussian noise and the SGD update;
* ``plain``: an ``nn.Sequential`` of the same layers, ``loss.backward()`` and
  ``torch.optim.SGD.step()`` (no clipping, no noise);
* ``step``: what ``privdl run dpsgd`` / ``privdl.train(algorithm="dpsgd")`` steps: the gossip
  step of :class:`privdl.algorithms.decor.Decor` on one node (``complete:1``) with per-sample
  clipping and its keyed ``aes-ziggurat`` noise, drawn in a background thread one step ahead
  (:func:`privdl.algorithms.base.drawn_ahead`), where ``private`` draws ``torch.randn`` inline.

Networks: the Robust-HDP MNIST CNN (conv 1->16 k5, pool, conv 16->32 k5, pool, fc 1568->10;
p = 28,938) and the DECOR MLP 784-128-10, at batch 64 and 256. The figures are
``private_over_plain`` and ``step_over_plain`` (target <= 1.4, issue 37), timed two ways:
interleaved one call at a time (median of ``--iters``), and in blocks of ``--block`` steps in a
row, as a training loop runs them (``*_blocks``: median over 9 rounds of the three blocks). The
blocks keep each function's tensors in cache, which the plain step gains most from: on the 2-core
machine (2026-11-28) the plain MLP step at batch 64 took 0.61-0.68 ms in blocks against
0.75-0.94 ms interleaved, so its ratios are the higher, and the honest, figures.

    python benchmarks/bench_price.py --iters 20 [--threads 1] [--json-out out.json]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import (
    add_run_flags,
    apply_run_flags,
    block_seconds,
    dpsgd_step,
    emit,
    interleaved_seconds,
    machine_facts,
)
from torch import nn

from privdl.algorithms.base import finish_drawn_ahead
from privdl.engine import ClipSpec, node_gradients
from privdl.models import build_model

CLIP, NOISE, LR = 1.0, 1.0, 0.05
BLOCK_ROUNDS = 9


def _torch_net(name: str) -> nn.Sequential:
    if name == "cnn-mnist":
        return nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(1568, 10),
        )  # fmt: skip
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def bench(name: str, batch: int, iters: int, block: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    in_shape = (1, 28, 28) if name == "cnn-mnist" else (784,)
    model = build_model(name, in_shape=in_shape, n_classes=10)
    params = model.init(n_nodes=1, generator=gen)
    x = torch.randn(1, batch, *in_shape, generator=gen)
    y = torch.randint(0, 10, (1, batch), generator=gen)
    clip = ClipSpec("per_sample", CLIP)
    noise_gen = torch.Generator().manual_seed(1)

    def private() -> None:
        res = node_gradients(model, params, x, y, loss="cross_entropy", clip=clip)
        with torch.no_grad():
            for k, g in res.grads.items():
                noise = torch.randn(g.shape, generator=noise_gen).mul_(NOISE * CLIP / batch)
                params[k].sub_(g.add_(noise), alpha=LR)

    net = _torch_net(name)
    with torch.no_grad():
        for p, v in zip(net.parameters(), params.values(), strict=True):
            p.copy_(v[0].reshape(p.shape))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    crit = nn.CrossEntropyLoss()
    xt = x[0].reshape(batch, 1, 28, 28) if name == "cnn-mnist" else x[0]
    yt = y[0]

    def plain() -> None:
        opt.zero_grad(set_to_none=True)
        crit(net(xt), yt).backward()
        opt.step()

    step = dpsgd_step(model, params, x, y, clip=clip, sigma=NOISE * CLIP / batch, lr=LR)

    priv_t, plain_t, step_t = interleaved_seconds([private, plain, step], iters=iters, warmup=2)
    finish_drawn_ahead()
    p, q, s = (statistics.median(t) for t in (priv_t, plain_t, step_t))
    # consecutive steps, as a training loop runs them: each function's caches stay warm
    rounds = [
        block_seconds(
            [private, plain, step], count=block, after=lambda: finish_drawn_ahead(keep=True)
        )
        for _ in range(BLOCK_ROUNDS)
    ]
    finish_drawn_ahead()
    pb, qb, sb = (statistics.median(r[k] for r in rounds) for k in range(3))
    return {
        "setting": f"{name} (p={model.num_parameters()}), batch {batch}, clip {CLIP}",
        "private_s": p,
        "plain_s": q,
        "step_s": s,
        "private_over_plain": p / q,
        "step_over_plain": s / q,
        "private_blocks_s": pb,
        "plain_blocks_s": qb,
        "step_blocks_s": sb,
        "private_over_plain_blocks": pb / qb,
        "step_over_plain_blocks": sb / qb,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--block", type=int, default=20, help="steps in a row per timed block")
    ap.add_argument("--nets", default="cnn-mnist,mlp")
    ap.add_argument("--batches", default="64,256")
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    rows = [
        bench(name, int(b), args.iters, args.block)
        for name in args.nets.split(",")
        for b in args.batches.split(",")
    ]
    emit({**machine_facts(tuned), "rows": rows}, args.json_out)


if __name__ == "__main__":
    main()
