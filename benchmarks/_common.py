"""Helpers the benchmark scripts share (run them from anywhere: ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

from privdl.engine.allocator import tune_allocator
from privdl.openmp import SPIN_COUNT, limit_applies, spin_setting


def add_malloc_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-tune-malloc``: time with glibc malloc as it is (``privdl`` commands tune it)."""
    parser.add_argument(
        "--no-tune-malloc",
        action="store_true",
        help="leave glibc malloc as it is (privdl commands tune it: privdl.engine.allocator)",
    )


def apply_malloc_flag(args: argparse.Namespace) -> bool:
    """Tune malloc as ``privdl`` does unless ``--no-tune-malloc``; the value goes in the JSON."""
    return False if args.no_tune_malloc else tune_allocator()


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every benchmark takes: ``--threads``, ``--json-out``, ``--no-tune-malloc`` and
    ``--no-limit-spin``."""
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json-out", default=None)
    add_malloc_flag(parser)
    parser.add_argument(
        "--no-limit-spin",
        action="store_true",
        help="leave OpenMP's spin-wait as it is (privdl commands limit it: privdl.openmp)",
    )


def apply_openmp_flag(args: argparse.Namespace) -> str:
    """Limit OpenMP's spin-wait as ``privdl`` does (:mod:`privdl.openmp`) unless
    ``--no-limit-spin`` or ``PRIVDL_TUNE_OPENMP=0``. libgomp reads it when torch loads, which the
    script has done by now, so the script is started again with it in its environment. Returns
    the setting for the JSON."""
    if not getattr(args, "no_limit_spin", False) and limit_applies():
        env = {**os.environ, "GOMP_SPINCOUNT": str(SPIN_COUNT)}
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    return spin_setting()


def apply_run_flags(args: argparse.Namespace) -> bool:
    """Apply the OpenMP spin limit, ``--threads`` and the malloc flag; returns whether malloc was
    tuned (for the JSON)."""
    import torch

    args.openmp_spin = apply_openmp_flag(args)
    tuned = apply_malloc_flag(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    return tuned


def machine_facts(malloc_tuned: bool) -> dict[str, object]:
    """What every benchmark's JSON says about where it ran."""
    import platform

    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "malloc_tuned": malloc_tuned,
        "openmp_spin": spin_setting(),
    }


def median_seconds(
    fn: Callable[[], object],
    *,
    iters: int,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
) -> float:
    """Median wall time of ``fn()`` over ``iters`` calls after ``warmup`` calls (``sync`` waits
    for an accelerator before each clock read)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_seconds(
    fns: list[Callable[[], object]],
    *,
    iters: int,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
) -> list[list[float]]:
    """Wall times of each of ``fns``, called in turn (a, b, a, b, ...) ``iters`` times after
    ``warmup`` turns, so drift in the machine's load affects them alike (``sync`` waits for an
    accelerator before each clock read)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    sync()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(iters):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            sync()
            times[k].append(time.perf_counter() - t0)
    return times


def pipelined_seconds(
    fns: list[Callable[[], object]],
    *,
    steps: int,
    rounds: int,
    sync: Callable[[], None] = lambda: None,
) -> list[float]:
    """Seconds per call of each of ``fns`` when called ``steps`` times back to back with one
    ``sync`` at the end -- what a training loop sees on an accelerator, whose kernels of one call
    overlap the host's work on the next -- in ``rounds`` rounds (a's block, b's block, ...); the
    median over rounds. :func:`interleaved_seconds` waits after every call instead (latency)."""
    per: list[list[float]] = [[] for _ in fns]
    for fn in fns:  # one warm-up block each
        for _ in range(steps):
            fn()
    sync()
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            sync()
            per[k].append((time.perf_counter() - t0) / steps)
    return [statistics.median(p) for p in per]


def emit(res: dict, json_out: str | None) -> None:
    """Print the results as JSON and, with ``--json-out``, write them there too."""
    import json

    print(json.dumps(res, indent=1))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(res, f, indent=2)


def block_seconds(
    fns: list[Callable[[], object]],
    *,
    count: int,
    after: Callable[[], None] = lambda: None,
) -> list[float]:
    """Seconds per call of each of ``fns``, each called ``count`` times in a row and then
    ``after()`` (e.g. :func:`privdl.algorithms.base.finish_drawn_ahead`: a noise draw a DECOR
    step starts for the next step then overlaps its own block, not another function's calls)."""
    out = []
    for fn in fns:
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        after()
        out.append((time.perf_counter() - t0) / count)
    return out


def dpsgd_step(model, params: dict, x, y, *, clip, sigma: float, lr: float) -> Callable[[], None]:
    """One call = one step of what ``privdl run dpsgd`` / ``privdl.train(algorithm="dpsgd")``
    steps: :class:`privdl.algorithms.dsgd.DSGD` on one node (``complete:1``) with ``clip``
    (per-sample) and its keyed ``aes-ziggurat`` noise of std ``sigma``, drawn in a background
    thread one step ahead (:func:`privdl.algorithms.base.drawn_ahead`); ``x (1, B, ...)``."""
    from privdl.algorithms.base import Keys, StepSize
    from privdl.algorithms.dsgd import DSGD
    from privdl.comm.local import LocalCommunicator
    from privdl.engine import node_gradients
    from privdl.topology import mixing_matrix, parse_graph

    comm = LocalCommunicator(
        mixing_matrix(parse_graph("complete:1"), "decor"),
        dtype=x.dtype if x.is_floating_point() else next(iter(params.values())).dtype,
    )
    algo = DSGD(StepSize(lr), clip=clip, sigma=sigma)

    def oracle(p, t, *, clip):
        return node_gradients(model, p, x, y, loss="cross_entropy", clip=clip)

    box = {"s": algo.init(dict(params), oracle, comm, keys=Keys.from_seed(2))}

    def step() -> None:
        box["s"], _ = algo.step(box["s"], oracle, comm)

    return step
