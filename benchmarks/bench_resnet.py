"""The built-in CIFAR ResNets (``resnet18-gn``, ``resnet34-nonorm``): ghost path against vmap.

Setting: 3x32x32 inputs, ``--nodes`` nodes x ``--batch`` samples, per-example clipping at C = 1,
float32 (the PrivSGP-VR and Robust-HDP CIFAR-10 presets' models). Timed, interleaved so load
drift hits all alike, median seconds per call:

* ``ghost``: ``node_gradients(method="ghost")`` — the network run layer by layer
  (``StackedResNet.forward_with``), per-sample norms from each conv's / GroupNorm's / the fc's
  inputs and output gradients, no per-sample gradient of the whole model;
* ``vmap``: ``method="vmap"`` — per-sample gradients by ``vmap(grad)``, chunked so that at most
  2^25 entries (CPU) are live: for 11.2 M parameters, one sample per node at a time;
* ``nonprivate``: ``ClipSpec()`` — one backward of the batch mean (the price-of-privacy reference).

The two clipped gradients agree (``max_rel_diff``, float32 rounding); ``vmap_over_ghost`` and
``ghost_over_nonprivate`` are the figures.

    python benchmarks/bench_resnet.py --nodes 4 --batch 16 --iters 3 [--model resnet34-nonorm]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import add_run_flags, apply_run_flags, emit, interleaved_seconds, machine_facts

from privdl.engine import ClipSpec, node_gradients
from privdl.models import build_model

CLIP = 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("resnet18-gn", "resnet34-nonorm"), default="resnet18-gn")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-tf32", action="store_true", help="cuDNN convolutions in full float32")
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    model = build_model(args.model, in_shape=(3, 32, 32), n_classes=10)
    gen = torch.Generator(device=dev).manual_seed(0)
    params = model.init(n_nodes=args.nodes, generator=gen, device=dev)
    x = torch.randn(args.nodes, args.batch, 3, 32, 32, generator=gen, device=dev)
    y = torch.randint(0, 10, (args.nodes, args.batch), generator=gen, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step(method: str):
        clip = ClipSpec() if method == "nonprivate" else ClipSpec("per_sample", CLIP)
        kw = {} if method == "nonprivate" else {"method": method}
        return lambda: node_gradients(model, params, x, y, loss="cross_entropy", clip=clip, **kw)

    ghost, slow = step("ghost")().grads, step("vmap")().grads
    agree = max(float((ghost[k] - slow[k]).abs().max() / slow[k].abs().max()) for k in slow)
    # both float32 paths against the ghost path in float64 (no TF32 there): which one drifts
    p64 = {k: v.double() for k, v in params.items()}
    ref = node_gradients(
        model, p64, x.double(), y, loss="cross_entropy", clip=ClipSpec("per_sample", CLIP),
        method="ghost",
    ).grads  # fmt: skip

    def off(g: dict) -> dict[str, float]:
        errs = {k: float((g[k].double() - ref[k]).abs().max() / ref[k].abs().max()) for k in ref}
        worst = sorted(errs, key=errs.__getitem__, reverse=True)[:3]
        return {k: errs[k] for k in worst}

    vs64 = {"ghost": off(ghost), "vmap": off(slow)}
    names = ["ghost", "vmap", "nonprivate"]
    times = interleaved_seconds([step(k) for k in names], iters=args.iters, sync=sync)
    med = {k: statistics.median(t) for k, t in zip(names, times, strict=True)}
    emit(
        {
            "setting": f"{args.model} ({model.num_parameters():,} parameters), 3x32x32, "
            f"{args.nodes} nodes x batch {args.batch}, per-example clip {CLIP}, float32",
            "device": str(dev),
            **machine_facts(tuned),
            **{f"{k}_s": round(v, 4) for k, v in med.items()},
            "max_rel_diff": agree,
            "worst_leaves_vs_float64": vs64,
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
            "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "vmap_over_ghost": round(med["vmap"] / med["ghost"], 2),
            "ghost_over_nonprivate": round(med["ghost"] / med["nonprivate"], 2),
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
