"""Per-sample clipping of the Robust-HDP MNIST CNN (paper App. B.1; issue 7's local step).

20 clients, batch 128 each (the largest of the paper's batch sizes), CNN conv 1->16 k5, pool,
conv 16->32 k5, pool, fc 1568->10 (p = 28,938), per-example clipping at c = 3. Timed (median
seconds per local step after one warm-up):

* ``ghost``: ``node_gradients(clip=per_sample, method="ghost")``, the ghost path (per-sample
  conv weight gradients from column-only patches, ``ghost.per_sample_conv_weight_grads``);
* ``ghost_full_unfold``: the same path with the full patches ``F.unfold`` and one ``bmm`` (the
  reference measured in the same run; the results agree to float32 rounding);
* ``vmap``: ``node_gradients(method="vmap")`` (torch.func per-sample gradients);
* ``nonprivate``: ``node_gradients`` without clipping (autograd through the grouped convolution);
* ``loop``: one ``nn.Sequential`` per client and a Python loop over the batch (per-sample
  backward, clip, accumulate), how a reference DP-SGD without per-sample machinery works; timed
  on ``--loop-clients`` clients and scaled to 20 (stated in the output).

    python benchmarks/bench_cnn.py --iters 3 [--json-out out.json]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _common import add_run_flags, apply_run_flags, emit, machine_facts, median_seconds
from torch import nn

import privdl.engine.ghost as ghost
from privdl.engine import ClipSpec, node_gradients
from privdl.engine.cuda_graph import GraphedGradients
from privdl.models import build_model

N, BATCH, CLIP = 20, 128, 3.0


def _loop_step(mods: list[nn.Sequential], x: torch.Tensor, y: torch.Tensor) -> None:
    crit = nn.CrossEntropyLoss()
    for i, m in enumerate(mods):
        ps = list(m.parameters())
        acc = [torch.zeros_like(p) for p in ps]
        for s in range(x.shape[1]):
            gs = torch.autograd.grad(crit(m(x[i, s : s + 1]), y[i, s : s + 1]), ps)
            factor = torch.clamp(CLIP / torch.sqrt(sum(g.pow(2).sum() for g in gs)), max=1.0)
            for a, g in zip(acc, gs, strict=True):
                a.add_(g * factor)


def _modules(params: dict[str, torch.Tensor], count: int) -> list[nn.Sequential]:
    mods = []
    for i in range(count):
        m = nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(1568, 10),
        )
        flat = [params[k][i] for k in params]
        with torch.no_grad():
            for p, v in zip(m.parameters(), flat, strict=True):
                p.copy_(v.reshape(p.shape))
        mods.append(m)
    return mods


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--loop-clients", type=int, default=2)
    ap.add_argument("--no-loop", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda adds the graphed path)")
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    gen = torch.Generator().manual_seed(0)
    model = build_model("cnn-mnist", in_shape=(1, 28, 28), n_classes=10)
    device = torch.device(args.device)
    params = {k: v.to(device) for k, v in model.init(n_nodes=N, generator=gen).items()}
    x = torch.randn(N, BATCH, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (N, BATCH), generator=gen).to(device)
    clip = ClipSpec("per_sample", CLIP)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def grads(method: str = "auto", c: ClipSpec = clip):
        return node_gradients(model, params, x, y, loss="cross_entropy", clip=c, method=method)

    def timed(fn) -> float:
        return median_seconds(fn, iters=args.iters, sync=sync)

    res: dict[str, object] = {
        "setting": f"cnn-mnist p=28938, {N} clients x batch {BATCH}, per-example clip {CLIP}",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        **machine_facts(tuned),
    }
    res["ghost_s"] = timed(lambda: grads("ghost"))
    if device.type == "cuda":  # the same calls replayed from CUDA graphs
        g_priv = GraphedGradients(model, loss="cross_entropy", clip=clip, method="ghost")
        g_plain = GraphedGradients(model, loss="cross_entropy", clip=ClipSpec())
        res["ghost_graphed_s"] = timed(lambda: g_priv(params, x, y))
        res["nonprivate_graphed_s"] = timed(lambda: g_plain(params, x, y))
        res["graph_failures"] = [g_priv.failure, g_plain.failure]
        eager = grads("ghost").grads
        replay = g_priv(params, x, y).grads
        res["graphed_max_abs_diff"] = max(float((eager[k] - replay[k]).abs().max()) for k in eager)
        res["ghost_graphed_over_nonprivate_graphed"] = (
            res["ghost_graphed_s"] / res["nonprivate_graphed_s"]
        )
    column_only = ghost._conv_grads_by_kernel_row

    def full_unfold(t, g, k, *, padding, stride):  # one "kernel row" holding all of them
        u = F.unfold(t, k, padding=padding, stride=stride)
        return torch.bmm(g.reshape(g.shape[0], g.shape[1], -1), u.transpose(1, 2)).unsqueeze(0)

    ghost._conv_grads_by_kernel_row = full_unfold
    try:
        reference = grads("ghost").grads
        res["ghost_full_unfold_s"] = timed(lambda: grads("ghost"))
    finally:
        ghost._conv_grads_by_kernel_row = column_only
    mine = grads("ghost").grads
    res["max_rel_diff_to_full_unfold"] = max(
        float((mine[k] - reference[k]).abs().max() / reference[k].abs().max()) for k in mine
    )
    res["vmap_s"] = timed(lambda: grads("vmap"))
    res["nonprivate_s"] = timed(lambda: grads(c=ClipSpec()))
    if not args.no_loop:
        k = args.loop_clients
        mods = [m.to(device) for m in _modules(params, k)]
        res["loop_s_scaled_to_20_clients"] = (
            median_seconds(lambda: _loop_step(mods, x[:k], y[:k]), iters=1, sync=sync) * N / k
        )
        res["loop_over_ghost"] = res["loop_s_scaled_to_20_clients"] / res["ghost_s"]
    res["full_unfold_over_column_only"] = res["ghost_full_unfold_s"] / res["ghost_s"]
    res["ghost_over_nonprivate"] = res["ghost_s"] / res["nonprivate_s"]
    res["vmap_over_ghost"] = res["vmap_s"] / res["ghost_s"]
    emit(res, args.json_out)


if __name__ == "__main__":
    main()
