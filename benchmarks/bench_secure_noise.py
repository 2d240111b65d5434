"""Cost of the secure noise mode (docs/security.md s.4) against the default keyed streams.

One step's independent noise of n = 16 nodes at the MNIST MLP's P = 101,770 parameters (DECOR's
Section 6.2 setting): the default ``independent_noise`` (float32 keyed Gaussian streams, the
resolved backend) against ``secure_noise`` (discrete Gaussian on the power-of-two grid, float64,
CKS 2020 Algorithm 3 in vectorized rejection rounds) plus the snapping of a gradient to the grid,
and ``secure_noise(exact=True)`` (``--noise-mode secure-exact``: CKS 2020 Algorithms 1-3 in integer
arithmetic, a vectorized state machine). Reported as medians and their ratios, measured in one run.

    python benchmarks/bench_secure_noise.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

from privdl.mechanisms import independent_noise, node_noise_keys
from privdl.mechanisms.discrete_gaussian import grid_for, secure_noise, snap
from privdl.mechanisms.prng import resolve_backend

N_NODES, P, SIGMA = 16, 784 * 128 + 128 + 128 * 10 + 10, 0.8


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (numba compilation of the default backend)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=N_NODES)
    parser.add_argument("--params", type=int, default=P)
    parser.add_argument("--exact-repeats", type=int, default=1, help="0: skip the exact sampler")
    args = parser.parse_args()
    keys = node_noise_keys(range(args.nodes), seed=1)
    grads = torch.randn(args.nodes, args.params)
    grid = grid_for(SIGMA)
    default = _median_s(
        lambda: grads + independent_noise(keys, 3, args.params, sigma=SIGMA), args.repeats
    )
    secure = _median_s(
        lambda: (snap(grads, grid) + secure_noise(keys, 3, args.params, sigma=SIGMA)).float(),
        args.repeats,
    )
    exact = (
        _median_s(
            lambda: (
                snap(grads, grid) + secure_noise(keys, 3, args.params, sigma=SIGMA, exact=True)
            ).float(),
            args.exact_repeats,
        )
        if args.exact_repeats > 0
        else None
    )
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "params": args.params,
                "default_backend": resolve_backend("auto", "cpu"),
                "default_s": round(default, 4),
                "secure_s": round(secure, 4),
                "secure_over_default": round(secure / default, 2),
                "secure_exact_s": None if exact is None else round(exact, 4),
                "secure_exact_over_default": None if exact is None else round(exact / default, 2),
                "threads": torch.get_num_threads(),
                "machine": platform.machine(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
