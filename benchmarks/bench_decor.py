"""DECOR step cost on the MNIST setting (DECOR paper Section 6.2; issue 4 "Performance").

n = 16 nodes on the 4x4 torus and on the ring, MLP 784-128-10, batch 64 of random MNIST-shaped
data, per-example clipping at C = 1, sigma_cdp = 0.01, sigma_cor = 0.05, W = 1/(deg+1).

Timed (median ms per iteration after warm-up; on a CPU the mean over a block of ``--iters``
steps in a row, three blocks each in turn):

* ``decor``: :class:`privdl.algorithms.decor.Decor` ``.step`` (vectorized per-example gradients,
  keyed correlated noise N = K Z through the incidence matrix, independent noise, gossip);
* ``nonprivate``: :class:`privdl.algorithms.dsgd.DSGD` without clipping or noise, same oracle;
* on a CPU also ``clipped``: DSGD with DECOR's per-example clipping and no noise, so that
  ``decor_ahead_over_clipped`` is the price of the noise alone (the unclipped gradient of the
  stacked linear layers comes back transposed and its update reads it across strides, so here
  the clipped step is the faster of the two references: docs/engine.md);
* ``noise``: the noise generation of one DECOR step alone (correlated + independent), one
  iteration per call;
* ``noise_wait``: how long a DECOR step waits for its noise after its gradients (the getter of
  :func:`privdl.algorithms.base.drawn_ahead`), median per step, with ``Decor(draw_ahead=False)``:
  the draw starts in a worker thread at the step's start and runs while the gradients do;
* on a CPU also ``decor_ahead``: the default ``draw_ahead=True``, the draw of step t + 1 started
  when step t takes its own (through step t's tail and step t + 1's gradients), and its
  ``noise_wait_ahead``;
* on CUDA also ``decor_unprefetched``: the DECOR step with one noise launch pair per iteration
  (``PRIVDL_NOISE_BLOCK_BYTES=1``), as before the noise was drawn in blocks of iterations;
* ``loop``: a faithful per-node Python loop: one ``nn.Module`` + ``torch.optim.SGD`` per node,
  per-example clipping by a loop over the batch, and, per node, the correlated noise of each of
  its edges drawn from a generator keyed by (edge secret, t) -- what each endpoint would do --
  plus its independent noise, then gossip by a loop over neighbours.

Reports the ratios loop/decor, decor/nonprivate and the share of the DECOR step spent in noise.

    python benchmarks/bench_decor.py --iters 10 --loop-iters 2 [--json-out out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from typing import Any

import torch
from _common import (
    add_run_flags,
    apply_run_flags,
    block_seconds,
    interleaved_seconds,
    machine_facts,
    median_seconds,
    pipelined_seconds,
)
from torch import nn

import privdl.algorithms.decor as decor_module
from privdl.algorithms.base import (
    Keys,
    StepSize,
    drawn_ahead,
    finish_drawn_ahead,
    in_background,
)
from privdl.algorithms.decor import Decor
from privdl.algorithms.dsgd import DSGD
from privdl.comm.local import LocalCommunicator
from privdl.engine import ClipSpec, node_gradients
from privdl.engine.cuda_graph import graphed_oracle
from privdl.mechanisms import fused_noise
from privdl.mechanisms.correlated import decor_noise
from privdl.models import build_model
from privdl.topology import mixing_matrix, parse_graph

N, BATCH, IN_DIM, HIDDEN, CLASSES = 16, 64, 784, 128, 10
C, LR, SIGMA_CDP, SIGMA_COR = 1.0, 0.1, 0.01, 0.05


DEVICE = torch.device("cpu")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def _finish() -> None:
    """The end of a block of steps: the draw its last DECOR step started ahead (kept for the
    next block's first step, so each block pays for as many draws as it has steps), then sync."""
    finish_drawn_ahead(keep=True)
    _sync()


def _median_ms(fn, *, iters: int, warmup: int) -> float:
    return 1e3 * median_seconds(fn, iters=iters, warmup=warmup, sync=_sync)


def _edge_generator(secret: int, t: int) -> torch.Generator:
    """Per-edge, per-step generator keyed by (secret, t): both endpoints derive the same one."""
    digest = hashlib.sha256(f"{secret}/{t}".encode()).digest()
    seed = int.from_bytes(digest[:8], "little") >> 1
    return torch.Generator(device=DEVICE).manual_seed(seed)


class PerNodeLoop:
    """The reference-code way: one model and optimizer per node, loops everywhere."""

    def __init__(self, params: dict[str, torch.Tensor], topo, mixing, x, y) -> None:
        self.mods, self.opts = [], []
        for i in range(N):
            m = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
            m = m.to(DEVICE)
            with torch.no_grad():
                m[0].weight.copy_(params["fc1.weight"][i])
                m[0].bias.copy_(params["fc1.bias"][i])
                m[2].weight.copy_(params["fc2.weight"][i])
                m[2].bias.copy_(params["fc2.bias"][i])
            self.mods.append(m)
            self.opts.append(torch.optim.SGD(m.parameters(), lr=LR))
        self.edges = [tuple(map(int, e)) for e in topo.edges]
        self.secret = {e: k for k, e in enumerate(self.edges)}
        self.nbrs = {i: [int(j) for j in topo.neighbours(i)] for i in range(N)}
        self.w = mixing.dense()
        self.x, self.y, self.t = x, y, 0
        self.crit = nn.CrossEntropyLoss()

    def step(self) -> None:
        t = self.t
        for i, (m, opt) in enumerate(zip(self.mods, self.opts, strict=True)):
            ps = list(m.parameters())
            acc = [torch.zeros_like(p) for p in ps]
            for s in range(BATCH):  # per-example clipping by a loop
                loss = self.crit(m(self.x[i, s : s + 1]), self.y[i, s : s + 1])
                gs = torch.autograd.grad(loss, ps)
                factor = torch.clamp(C / torch.sqrt(sum(g.pow(2).sum() for g in gs)), max=1.0)
                for a, g in zip(acc, gs, strict=True):
                    a.add_(g * factor)
            node_gen = _edge_generator(10**6 + i, t)
            for p, a in zip(ps, acc, strict=True):
                noise = SIGMA_CDP * torch.randn(p.shape, generator=node_gen, device=DEVICE)
                for j in self.nbrs[i]:  # correlated noise, one keyed draw per incident edge
                    e = (min(i, j), max(i, j))
                    z = SIGMA_COR * torch.randn(
                        p.shape, generator=_edge_generator(self.secret[e], t), device=DEVICE
                    )
                    noise += z if i < j else -z
                p.grad = a / BATCH + noise
            opt.step()
        with torch.no_grad():  # gossip, a loop over neighbours
            half = [[p.detach().clone() for p in m.parameters()] for m in self.mods]
            for i, m in enumerate(self.mods):
                for k, p in enumerate(m.parameters()):
                    p.copy_(self.w[i, i] * half[i][k])
                    for j in self.nbrs[i]:
                        p.add_(self.w[i, j] * half[j][k])
        self.t += 1


def bench_topology(spec: str, *, iters: int, loop_iters: int, warmup: int) -> dict[str, float]:
    topo = parse_graph(spec)
    mixing = mixing_matrix(topo, "decor")
    comm = LocalCommunicator(mixing, device=DEVICE, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    model = build_model("mlp", in_shape=(IN_DIM,), n_classes=CLASSES)
    params = {k: v.to(DEVICE) for k, v in model.init(n_nodes=N, generator=gen).items()}
    x = torch.randn(N, BATCH, IN_DIM, generator=gen).to(DEVICE)
    y = torch.randint(0, CLASSES, (N, BATCH), generator=gen).to(DEVICE)

    def oracle(p, t, *, clip):
        return node_gradients(model, p, x, y, loss="cross_entropy", clip=clip)

    decor = Decor(
        StepSize(LR),
        edges=topo.edges,
        n_nodes=N,
        clip=ClipSpec("per_sample", C),
        sigma_cdp=SIGMA_CDP,
        sigma_cor=SIGMA_COR,
    )
    plain = DSGD(StepSize(LR))
    clipped = DSGD(StepSize(LR), clip=ClipSpec("per_sample", C))
    keys1 = Keys.from_seed(1)
    box = {
        "d": decor.init(dict(params), oracle, comm, keys=keys1),
        "p": plain.init(dict(params), oracle, comm, keys=keys1),
        "c": clipped.init(dict(params), oracle, comm, keys=keys1),
    }

    box["f"] = decor.init(dict(params), oracle, comm, keys=Keys.from_seed(2))
    waits: dict[str, list[float]] = {"d": [], "f": []}
    which = ["d"]

    def timed_ahead(owner, t, draw, *, device, ahead=True):  # the step's wait for its noise
        if which[0] == "f":  # Decor(draw_ahead=True), the default
            getter = drawn_ahead(owner, t, draw, device=device)
        else:  # draw_ahead=False: started at the step's start
            getter = in_background(lambda: draw(t), device=device)

        def get():
            t0 = time.perf_counter()
            value = getter()
            waits[which[0]].append(time.perf_counter() - t0)
            return value

        return get

    decor_module.drawn_ahead = timed_ahead  # type: ignore[assignment]

    def decor_step() -> None:
        which[0] = "d"
        box["d"], _ = decor.step(box["d"], oracle, comm)

    def decor_ahead_step() -> None:  # Decor(draw_ahead=True)
        which[0] = "f"
        box["f"], _ = decor.step(box["f"], oracle, comm)

    def plain_step() -> None:
        box["p"], _ = plain.step(box["p"], oracle, comm)

    def clipped_step() -> None:
        box["c"], _ = clipped.step(box["c"], oracle, comm)

    size = sum(v[0].numel() for v in params.values())
    keys, counter = box["d"], [0]

    def noise_only() -> None:  # what a DECOR step draws (fused into two kernels on CUDA)
        counter[0] += 1
        decor_noise(
            keys.edge_keys,
            topo.edges,
            N,
            keys.noise_keys,
            counter[0],
            size,
            sigma_cor=SIGMA_COR,
            sigma_cdp=SIGMA_CDP,
            device=DEVICE,
        )

    # three rounds of the two steps called in turn, so drift in the machine's load affects both
    # alike; the ratio is the median of the three per-round ratios
    rounds, fresh, clip_only = [], [], []
    if DEVICE.type == "cpu":  # blocks of steps: a draw ahead must not overlap the other steps
        fns = [decor_step, plain_step, decor_ahead_step, clipped_step]
        block_seconds(fns, count=warmup, after=_finish)
        for _ in range(3):
            t_d, t_p, t_f, t_c = block_seconds(fns, count=iters, after=_finish)
            rounds.append((1e3 * t_d, 1e3 * t_p))
            fresh.append(1e3 * t_f)
            clip_only.append(1e3 * t_c)
    else:
        for _ in range(3):
            t_decor, t_plain = interleaved_seconds(
                [decor_step, plain_step], iters=iters, warmup=warmup, sync=_sync
            )
            rounds.append((1e3 * statistics.median(t_decor), 1e3 * statistics.median(t_plain)))
    decor_module.drawn_ahead = drawn_ahead
    out: dict[str, Any] = {"noise_wait_ms": 1e3 * statistics.median(waits["d"])}
    if DEVICE.type == "cuda":  # what a training loop sees: no sync between steps
        out |= _pipelined("", decor_step, plain_step)
    if fresh:
        out |= {
            "decor_ahead_ms": statistics.median(fresh),
            "noise_wait_ahead_ms": 1e3 * statistics.median(waits["f"]),
            "decor_ahead_over_nonprivate_per_round": [
                round(f / r[1], 3) for f, r in zip(fresh, rounds, strict=True)
            ],
            "decor_ahead_over_nonprivate": statistics.median(
                f / r[1] for f, r in zip(fresh, rounds, strict=True)
            ),
            "clipped_ms": statistics.median(clip_only),
            "decor_ahead_over_clipped": statistics.median(
                f / c for f, c in zip(fresh, clip_only, strict=True)
            ),
        }
    if DEVICE.type == "cuda":  # as before prefetching: one launch pair per step (K = 1)
        os.environ["PRIVDL_NOISE_BLOCK_BYTES"] = "1"
        fused_noise._PREFETCHED.clear()  # no step is served from an earlier, longer block
        try:
            ratios = []
            for _ in range(3):
                t_decor, t_plain = interleaved_seconds(
                    [decor_step, plain_step], iters=iters, warmup=warmup, sync=_sync
                )
                ratios.append(statistics.median(t_decor) / statistics.median(t_plain))
            out["decor_unprefetched_over_nonprivate_per_round"] = [round(r, 3) for r in ratios]
            out["decor_unprefetched_over_nonprivate"] = statistics.median(ratios)
        finally:
            del os.environ["PRIVDL_NOISE_BLOCK_BYTES"]
            fused_noise._PREFETCHED.clear()
    if DEVICE.type == "cuda":
        out |= _graphed(topo, decor, plain, model, params, x, y, keys1, iters, warmup)
        out["profile"] = {
            "decor": _gpu_profile(decor_step),
            "nonprivate": _gpu_profile(plain_step),
        }
    out |= {
        "decor_ms": statistics.median(r[0] for r in rounds),
        "nonprivate_ms": statistics.median(r[1] for r in rounds),
        "decor_over_nonprivate_per_round": [round(r[0] / r[1], 3) for r in rounds],
        "noise_ms": _median_ms(noise_only, iters=iters, warmup=warmup),
    }
    if loop_iters > 0:
        loop = PerNodeLoop(params, topo, mixing, x, y)
        out["loop_ms"] = _median_ms(loop.step, iters=loop_iters, warmup=1)
        out["loop_over_decor"] = out["loop_ms"] / out["decor_ms"]
        if "decor_graphed_ms" in out:
            out["loop_over_decor_graphed"] = out["loop_ms"] / out["decor_graphed_ms"]
    out["decor_over_nonprivate"] = statistics.median(r[0] / r[1] for r in rounds)
    out["noise_share_of_decor"] = out["noise_ms"] / out["decor_ms"]
    return out


def _pipelined(tag: str, decor_step, plain_step, steps: int = 25, rounds: int = 5) -> dict:
    """Per-step time of each step called ``steps`` times back to back, one sync at the end (a
    training loop: on a GPU the kernels of step t overlap the host's work on step t + 1)."""
    d, p = pipelined_seconds([decor_step, plain_step], steps=steps, rounds=rounds, sync=_sync)
    return {
        f"decor{tag}_pipelined_ms": 1e3 * d,
        f"nonprivate{tag}_pipelined_ms": 1e3 * p,
        f"decor{tag}_over_nonprivate{tag}_pipelined": d / p,
    }


def _host_profile(fn, iters: int = 50) -> list[tuple[float, str]]:
    """The host's own time per call (cProfile tottime, us) of the 12 costliest functions."""
    import cProfile
    import pstats

    for _ in range(3):
        fn()
    _sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    _sync()
    rows = []
    for (file, line, name), (_cc, _nc, tt, _ct, _callers) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        rows.append((round(1e6 * tt / iters, 2), f"{os.path.basename(file)}:{line}:{name}"))
    rows.sort(reverse=True)
    return rows[:12]


def _gpu_profile(fn, iters: int = 20) -> dict[str, float]:
    """Kernels per call and their summed GPU time (torch.profiler), and the wall time per call:
    the gap is host time (Python, launches)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    _sync()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            _sync()
        kernels, gpu_us = 0, 0.0
        top: list[tuple[float, str, int]] = []
        for ev in prof.key_averages():
            dev = getattr(ev, "self_device_time_total", None)
            if dev is None:
                dev = getattr(ev, "self_cuda_time_total", 0.0)
            on_gpu = str(getattr(ev, "device_type", "")).endswith("CUDA")
            if dev > 0 and (on_gpu or ev.key.startswith(("void ", "triton", "sm90", "cutlass"))):
                kernels += ev.count
                gpu_us += dev
                top.append((dev / iters, ev.key[:90], round(ev.count / iters, 2)))
        top.sort(reverse=True)
        return {
            "kernels_per_call": kernels / iters,
            "gpu_ms_per_call": gpu_us / iters / 1e3,
            "top_kernels_us_per_call": [(round(us, 2), name, n) for us, name, n in top[:10]],
        }
    except Exception as exc:  # noqa: BLE001 - the figures above stand without the profile
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _graphed(topo, decor, plain, model, params, x, y, keys, iters, warmup) -> dict[str, object]:
    """The same two steps with the clipped gradients replayed from CUDA graphs
    (:class:`privdl.engine.cuda_graph.GraphedGradients`): values and times."""
    comm = LocalCommunicator(mixing_matrix(topo, "decor"), device=DEVICE, dtype=torch.float32)
    g_oracle = graphed_oracle(model, x, y, loss="cross_entropy")

    def e_oracle(p, t, *, clip):
        return node_gradients(model, p, x, y, loss="cross_entropy", clip=clip)

    # values first: three DECOR steps from the same state, eager and graphed
    se = decor.init(dict(params), e_oracle, comm, keys=keys)
    sg = decor.init(dict(params), g_oracle, comm, keys=keys)
    fused_noise._PREFETCHED.clear()
    for _ in range(3):
        se, _ = decor.step(se, e_oracle, comm)
    fused_noise._PREFETCHED.clear()
    for _ in range(3):
        sg, _ = decor.step(sg, g_oracle, comm)
    diff = max(float((se.params[k] - sg.params[k]).abs().max()) for k in se.params)
    fused_noise._PREFETCHED.clear()
    box = {
        "d": decor.init(dict(params), g_oracle, comm, keys=keys),
        "p": plain.init(dict(params), g_oracle, comm, keys=keys),
    }

    def decor_step() -> None:
        box["d"], _ = decor.step(box["d"], g_oracle, comm)

    def plain_step() -> None:
        box["p"], _ = plain.step(box["p"], g_oracle, comm)

    rounds = []
    for _ in range(3):
        t_decor, t_plain = interleaved_seconds(
            [decor_step, plain_step], iters=iters, warmup=warmup, sync=_sync
        )
        rounds.append((1e3 * statistics.median(t_decor), 1e3 * statistics.median(t_plain)))
    return {
        "graphed_max_abs_diff_after_3_steps": diff,
        "graph_failures": [g.failure for g in g_oracle.graphs.values()],  # type: ignore[attr-defined]
        "graph_replays": [g.replays for g in g_oracle.graphs.values()],  # type: ignore[attr-defined]
        "decor_graphed_ms": statistics.median(r[0] for r in rounds),
        "nonprivate_graphed_ms": statistics.median(r[1] for r in rounds),
        "decor_graphed_over_nonprivate_graphed_per_round": [round(a / b, 3) for a, b in rounds],
        "decor_graphed_over_nonprivate_graphed": statistics.median(a / b for a, b in rounds),
        **_pipelined("_graphed", decor_step, plain_step),
        "host_profile_graphed_decor": _host_profile(decor_step),
        "profile_graphed": {
            "decor": _gpu_profile(decor_step),
            "nonprivate": _gpu_profile(plain_step),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--loop-iters", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--graphs", default="torus:4x4,ring:16")
    add_run_flags(ap)
    args = ap.parse_args()
    malloc_tuned = apply_run_flags(args)
    global DEVICE
    DEVICE = torch.device(args.device)
    res: dict[str, object] = {
        "setting": f"n={N} mlp {IN_DIM}-{HIDDEN}-{CLASSES} B={BATCH} C={C} per-example, "
        f"sigma_cdp={SIGMA_CDP} sigma_cor={SIGMA_COR}",
        "device": torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "cpu",
        **machine_facts(malloc_tuned),
    }
    for spec in args.graphs.split(","):
        res[spec] = bench_topology(
            spec, iters=args.iters, loop_iters=args.loop_iters, warmup=args.warmup
        )
        print(spec, json.dumps(res[spec], indent=1), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
