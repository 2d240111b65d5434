"""Benchmark the noise-design solvers (docs/noise-design.md).

1. Design time against n on random 6-regular graphs (eavesdropper or, with ``--adversary
   curious``, curious users by the one-inverse deletion form; Metropolis W, horizon K):
   DECOR's best scalar pair, then the first-order solver (augmented Lagrangian + L-BFGS-B) with a
   time limit, and the accountant's certificate; the residual ratio vs DECOR's scalar pair.
2. First-order vs cvxpy (Clarabel) on small Erdos-Renyi graphs: objective (relative gap) and time.

Run: ``python benchmarks/bench_noise_design.py [--sizes 50 200 1000] [--limit 55]
[--adversary curious] [--skip-cvxpy]``. On a
machine shared with other jobs set ``OPENBLAS_NUM_THREADS`` to the cores you own: scipy's threaded
BLAS calls inside L-BFGS-B slow down by 20x or more when its threads are not scheduled.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from privdl.accounting.design import design_step_rdp
from privdl.design.convex import solve_convex
from privdl.design.first_order import ConstraintOracle, solve_first_order
from privdl.design.objective import best_scalar, make_problem
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.topology.graphs import erdos_renyi, random_regular
from privdl.topology.mixing import mixing_matrix


def bench_scale(
    sizes: list[int], degree: int, horizon: int, limit: float, adversary: str = "eavesdropper"
) -> None:
    print(f"## design time vs n (random {degree}-regular, {adversary}, K = {horizon})")
    print("| n | scalar s | first-order s | evaluations | converged | ratio vs DECOR | certify s |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        topo = random_regular(n, degree, 1)
        t0 = time.perf_counter()
        mix = mixing_matrix(topo, "metropolis").dense()
        problem = make_problem(topo, mix, horizon=horizon, adversary=adversary)
        s2, c2, scalar = best_scalar(topo, problem)
        t1 = time.perf_counter()
        start = (np.full(n, s2), np.full(topo.num_edges, c2))
        node, edge, info = solve_first_order(problem, start, max_seconds=limit)
        t2 = time.perf_counter()
        design = NoiseDesign(node, edge, topo.edges)
        step = design_step_rdp(topo, design, adversary=adversary).step_rdp
        t3 = time.perf_counter()
        ratio = problem.objective(node, edge) / scalar
        print(
            f"| {n} | {t1 - t0:.2f} | {t2 - t1:.2f} | {info['evaluations']} | "
            f"{info['converged']} | {ratio:.4f} | {t3 - t2:.2f} |"
        )
        assert step / 2.0 <= 1.0 + 1e-9, step  # the accountant agrees with max f <= b = 1


def bench_vs_cvxpy(n: int, ps: list[float], horizon: int) -> None:
    print(f"\n## first-order vs cvxpy (Erdos-Renyi n = {n}, eavesdropper, K = {horizon})")
    print("| p | cvxpy s | first-order s | relative gap | ratio vs DECOR |")
    print("|---|---|---|---|---|")
    for p in ps:
        topo = erdos_renyi(n, p, 1)
        problem = make_problem(
            topo, mixing_matrix(topo, "metropolis").dense(), horizon=horizon,
            adversary="eavesdropper",
        )  # fmt: skip
        s2, c2, scalar = best_scalar(topo, problem)
        oracle = ConstraintOracle.of(problem)
        t0 = time.perf_counter()
        cn, ce, _ = solve_convex(problem)
        conic = problem.objective(cn, ce) * oracle.values(oracle.inverses(cn, ce)).max()
        t1 = time.perf_counter()
        node, edge, _ = solve_first_order(problem, (np.full(n, s2), np.full(topo.num_edges, c2)))
        t2 = time.perf_counter()
        ours = problem.objective(node, edge)
        print(
            f"| {p} | {t1 - t0:.2f} | {t2 - t1:.2f} | {ours / conic - 1:+.2e} | "
            f"{ours / scalar:.4f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 500, 1000])
    parser.add_argument("--degree", type=int, default=6)
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--limit", type=float, default=55.0, help="first-order time limit (s)")
    parser.add_argument("--small-n", type=int, default=20)
    parser.add_argument("--adversary", default="eavesdropper", help="eavesdropper or curious")
    parser.add_argument("--skip-cvxpy", action="store_true", help="only the design-time table")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}\n")  # fmt: skip
    bench_scale(args.sizes, args.degree, args.horizon, args.limit, args.adversary)
    if not args.skip_cvxpy:
        bench_vs_cvxpy(args.small_n, [0.2, 0.4, 0.6, 0.8, 1.0], args.horizon)


if __name__ == "__main__":
    main()
