"""Vectorized engine vs a faithful per-node loop, DECOR MNIST setting (paper Section 6.2).

n = 16 nodes, MLP 784-128-10, batch 64, per-example clipping at C = 1, SGD lr 0.1, Gaussian noise.

1. loop: one ``nn.Module`` + ``torch.optim.SGD`` per node; per-example clipping by a Python loop
   over the batch (per-sample backward, clip, accumulate) — how the DECOR and Robust-HDP reference
   codes work;
2. private: ``node_gradients(clip=per_sample)`` + Gaussian noise + SGD on the stacked parameters;
3. nonprivate: ``node_gradients(clip=none)`` + SGD on the stacked parameters.

Reports the median ms per iteration of each (after warm-up), the ratios loop/private and
private/nonprivate, threads and device. ``--check`` also compares the vectorized clipped gradient
with the loop's on the chosen device (float64).

    python benchmarks/bench_engine.py --device cpu --iters 20 --json-out out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable

import torch
from _common import add_run_flags, apply_run_flags, interleaved_seconds, machine_facts
from torch import nn

from privdl.algorithms.base import in_background
from privdl.engine import ClipSpec, node_gradients
from privdl.mechanisms import independent_noise, node_noise_keys
from privdl.mechanisms.prng import resolve_backend
from privdl.models import build_model

N_NODES, BATCH, IN_DIM, HIDDEN, CLASSES = 16, 64, 784, 128, 10
C, LR, SIGMA = 1.0, 0.1, 1.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _interleaved(
    fns: list[Callable[[], None]], *, iters: int, warmup: int, device: torch.device
) -> list[list[float]]:
    return interleaved_seconds(fns, iters=iters, warmup=warmup, sync=lambda: _sync(device))


def _time(fn: Callable[[], None], *, iters: int, warmup: int, device: torch.device) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _modules_from(params: dict[str, torch.Tensor], device: torch.device) -> list[nn.Sequential]:
    mods = []
    for i in range(params["fc1.weight"].shape[0]):
        m = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
        m = m.to(device=device, dtype=params["fc1.weight"].dtype)
        with torch.no_grad():
            m[0].weight.copy_(params["fc1.weight"][i])
            m[0].bias.copy_(params["fc1.bias"][i])
            m[2].weight.copy_(params["fc2.weight"][i])
            m[2].bias.copy_(params["fc2.bias"][i])
        mods.append(m)
    return mods


def loop_clipped_grads(mods: list[nn.Sequential], x: torch.Tensor, y: torch.Tensor) -> list:
    """Reference per-example clipping: per node, per sample: backward, clip, accumulate."""
    out = []
    crit = nn.CrossEntropyLoss()
    for i, m in enumerate(mods):
        ps = list(m.parameters())
        acc = [torch.zeros_like(p) for p in ps]
        for s in range(x.shape[1]):
            loss = crit(m(x[i, s : s + 1]), y[i, s : s + 1])
            gs = torch.autograd.grad(loss, ps)
            norm = torch.sqrt(sum(g.pow(2).sum() for g in gs))
            factor = torch.clamp(C / norm, max=1.0)
            for a, g in zip(acc, gs, strict=True):
                a.add_(g * factor)
        out.append([a / x.shape[1] for a in acc])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--iters", type=int, default=20, help="timed iterations (vectorized)")
    ap.add_argument("--loop-iters", type=int, default=5, help="timed iterations (loop)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="also check vectorized == loop (fp64)")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler tables")
    add_run_flags(ap)
    args = ap.parse_args()
    malloc_tuned = apply_run_flags(args)
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    data_gen = torch.Generator(device=device).manual_seed(1)

    model = build_model("mlp", in_shape=(IN_DIM,), n_classes=CLASSES, hidden=(HIDDEN,))
    x = torch.randn(N_NODES, BATCH, IN_DIM, generator=data_gen, device=device)
    y = torch.randint(0, CLASSES, (N_NODES, BATCH), generator=data_gen, device=device)

    results: dict[str, object] = {
        "setting": f"n={N_NODES} mlp {IN_DIM}-{HIDDEN}-{CLASSES} B={BATCH} C={C} lr={LR}",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        **machine_facts(malloc_tuned),
    }

    if args.check:
        p64 = model.init(
            n_nodes=4, generator=gen, dtype=torch.float64, device=device, same_init=False
        )
        x64, y64 = x[:4, :16].double(), y[:4, :16]
        ref = loop_clipped_grads(_modules_from(p64, device), x64, y64)
        got = node_gradients(
            model, p64, x64, y64, loss="cross_entropy", clip=ClipSpec("per_sample", C)
        ).grads
        err = 0.0
        for i in range(4):
            for k, r in zip(got, ref[i], strict=True):
                err = max(err, (got[k][i] - r).abs().max().item())
        results["check_max_abs_err_fp64"] = err
        results["check_ok"] = err < 1e-10

    params = model.init(n_nodes=N_NODES, generator=gen, device=device)
    mods = _modules_from(params, device)
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in mods]
    crit = nn.CrossEntropyLoss()

    def loop_step() -> None:
        for i, (m, opt) in enumerate(zip(mods, opts, strict=True)):
            ps = list(m.parameters())
            acc = [torch.zeros_like(p) for p in ps]
            for s in range(BATCH):
                loss = crit(m(x[i, s : s + 1]), y[i, s : s + 1])
                gs = torch.autograd.grad(loss, ps)
                norm = torch.sqrt(sum(g.pow(2).sum() for g in gs))
                factor = torch.clamp(C / norm, max=1.0)
                for a, g in zip(acc, gs, strict=True):
                    a.add_(g * factor)
            for p, a in zip(ps, acc, strict=True):
                noise = torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype)
                p.grad = (a + SIGMA * C * noise) / BATCH
            opt.step()

    private_clip = ClipSpec("per_sample", C)

    keys = list(params)
    plist = [params[k] for k in keys]
    sizes = [p.numel() for p in plist]
    noise_scale = SIGMA * C / BATCH

    def private_step() -> None:
        """x <- x - lr (g + sigma C / B * N(0, I)), g the batch mean of clipped gradients."""
        r = node_gradients(model, params, x, y, loss="cross_entropy", clip=private_clip)
        grads = [r.grads[k] for k in keys]
        noise = torch.randn(sum(sizes), generator=gen, device=device).split(sizes)
        torch._foreach_add_(
            grads, [z.view_as(p) for z, p in zip(noise, plist, strict=True)], alpha=noise_scale
        )
        torch._foreach_add_(plist, grads, alpha=-LR)

    node_keys = node_noise_keys(range(N_NODES), seed=0)
    per_node = [p.numel() // N_NODES for p in plist]
    counter = itertools.count()

    def library_private_step(backend: str, prefetch: bool = True) -> Callable[[], None]:
        """As ``private_step``, with privdl's per-node keyed noise streams, drawn in the background
        while the gradients are computed (what DSGD/LDP runs). ``prefetch``: on CUDA, draw a
        block of iterations per launch (DSGD does; a no-op elsewhere)."""

        def step() -> None:
            t = next(counter)
            pending = in_background(  # as DSGD does: the noise is drawn while the grads run
                lambda: independent_noise(
                    node_keys,
                    t,
                    sum(per_node),
                    sigma=noise_scale,
                    device=device,
                    backend=backend,
                    prefetch=prefetch,
                ),
                device=device,
            )
            r = node_gradients(model, params, x, y, loss="cross_entropy", clip=private_clip)
            grads = [r.grads[k] for k in keys]
            flat = pending()
            noise = [
                z.reshape(p.shape) for z, p in zip(flat.split(per_node, 1), plist, strict=True)
            ]
            torch._foreach_add_(grads, noise)
            torch._foreach_add_(plist, grads, alpha=-LR)

        return step

    def nonprivate_step() -> None:
        r = node_gradients(model, params, x, y, loss="cross_entropy")
        torch._foreach_add_(plist, [r.grads[k] for k in keys], alpha=-LR)

    def private_grad_only() -> None:
        node_gradients(model, params, x, y, loss="cross_entropy", clip=private_clip)

    def nonprivate_grad_only() -> None:
        node_gradients(model, params, x, y, loss="cross_entropy")

    def noise_only() -> None:
        torch.randn(sum(sizes), generator=gen, device=device)

    t_loop = _time(loop_step, iters=args.loop_iters, warmup=1, device=device)
    # the private and the non-private step called in turn, so drift in load affects both alike
    t_priv, t_non = _interleaved(
        [private_step, nonprivate_step], iters=2 * args.iters, warmup=args.warmup, device=device
    )

    # the same private step with privdl's keyed streams (one per node), against non-private
    # three alternating rounds per backend; the ratio is the median of the per-round ratios, so a
    # drift in the machine's load between the two measurements does not decide it
    variants = [("aes-ziggurat", True), ("chacha20", True), ("torch", True)]
    if device.type == "cuda":  # the fused keyed streams one launch pair per step, as before
        variants.append(("chacha20", False))
    for backend, prefetch in variants:
        lib_ms, per_round = [], []
        for _ in range(3):
            t_lib, t_non2 = _interleaved(
                [library_private_step(backend, prefetch), nonprivate_step],
                iters=args.iters,
                warmup=1,
                device=device,
            )
            lib_ms.append(statistics.median(t_lib))
            per_round.append(statistics.median(t_lib) / statistics.median(t_non2))
        name = backend if prefetch else f"{backend}_unprefetched"
        results[f"ms_per_iter_private_{name}_streams"] = round(1e3 * statistics.median(lib_ms), 3)
        results[f"ratio_private_{name}_streams_over_nonprivate"] = round(
            statistics.median(per_round), 3
        )
        results[f"ratio_private_{name}_streams_per_round"] = [round(r, 3) for r in per_round]
    default = resolve_backend("auto", device)  # what DSGD/LDP/DECOR runs use by default
    results["default_streams"] = default
    results["ratio_private_default_streams_over_nonprivate"] = results[
        f"ratio_private_{default}_streams_over_nonprivate"
    ]
    if device.type == "cuda":  # host-side cost per step (launch-bound when close to the total)
        for name, fn in (("private", private_step), ("nonprivate", nonprivate_step)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            results[f"ms_host_only_{name}"] = round(
                1e3 * (time.perf_counter() - t0) / args.iters, 3
            )
            torch.cuda.synchronize()
    if args.profile:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        for name, fn in (("private", private_step), ("nonprivate", nonprivate_step)):
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(10):
                    fn()
                _sync(device)
            print(f"== profile {name} (10 steps)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))

    # where the price of privacy goes: clipped vs plain gradients, and the Gaussian noise draw
    t_pg, t_ng = _interleaved(
        [private_grad_only, nonprivate_grad_only], iters=args.iters, warmup=1, device=device
    )
    t_noise = _time(noise_only, iters=args.iters, warmup=1, device=device)
    results["ms_grad_only_private"] = round(1e3 * statistics.median(t_pg), 3)
    results["ms_grad_only_nonprivate"] = round(1e3 * statistics.median(t_ng), 3)
    results["ms_noise_draw"] = round(1e3 * statistics.median(t_noise), 3)
    results["ratio_grad_only_private_over_nonprivate"] = round(
        statistics.median(t_pg) / statistics.median(t_ng), 3
    )

    ms = {
        k: 1e3 * statistics.median(v)
        for k, v in (("loop", t_loop), ("private", t_priv), ("nonprivate", t_non))
    }
    results.update(
        {
            "ms_per_iter_loop": round(ms["loop"], 3),
            "ms_per_iter_private": round(ms["private"], 3),
            "ms_per_iter_nonprivate": round(ms["nonprivate"], 3),
            "ratio_loop_over_private": round(ms["loop"] / ms["private"], 1),
            "ratio_private_over_nonprivate": round(ms["private"] / ms["nonprivate"], 3),
            "iters": {"loop": len(t_loop), "private": len(t_priv), "nonprivate": len(t_non)},
        }
    )
    print(json.dumps(results, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
