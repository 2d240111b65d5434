"""Benchmark: one Robust-HDP robust-PCA chunk (p' = 200,000 rows x n = 20 clients).

Usage: python benchmarks/bench_rpca.py [--device cpu|cuda] [--rows 200000] [--clients 20]
                                       [--method admm|ialm] [--max-iter 300]
Data: a weak rank-2 signal plus heterogeneous Gaussian noise (docs/robust-hdp.md, Robust PCA benchmark). Reports time,
iterations, time per iteration and the aggregate noise of the estimated weights relative to
the oracle, for float32 and float64.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from privdl.robust.noise import aggregate_noise, inverse_variance_weights
from privdl.robust.rpca import principal_component_pursuit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--method", default="admm", choices=["admm", "ialm"])
    ap.add_argument("--max-iter", type=int, default=300)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    p, n = args.rows, args.clients
    stds = torch.tensor([0.02, 0.05, 0.1, 0.2], dtype=torch.float64).repeat(n // 4 + 1)[:n]
    U, V = (
        torch.randn(p, 2, generator=g, dtype=torch.float64),
        torch.randn(2, n, generator=g, dtype=torch.float64),
    )
    M = 0.005 * U @ V / 2**0.5 + torch.randn(p, n, generator=g, dtype=torch.float64) * stds
    true = p * stds**2
    oracle = aggregate_noise(inverse_variance_weights(true), true).item()
    for dtype in (torch.float32, torch.float64):
        Md = M.to(device=args.device, dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            principal_component_pursuit(Md[:1000], max_iter=2)  # warm-up (kernels, allocator)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            out = principal_component_pursuit(Md, method=args.method, max_iter=args.max_iter)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        s2 = (out.sparse.double() ** 2).sum(0).cpu()
        ratio = aggregate_noise(inverse_variance_weights(s2), true).item() / oracle
        print(
            f"{args.device} {str(dtype):14s} {p}x{n} {args.method}: {dt:.2f} s, "
            f"{out.iterations} it ({1e3 * dt / out.iterations:.1f} ms/it), "
            f"converged={out.converged} residual={out.residual:.1e} "
            f"noise/oracle={ratio:.4f} warnings={len(caught)}"
        )


if __name__ == "__main__":
    main()
