"""Benchmark the noise-design solvers (docs/noise-design.md).

1. Design time against n on random 6-regular graphs (eavesdropper or, with ``--adversary
   curious``, curious users by the one-inverse deletion form; Metropolis W, horizon K):
   DECOR's best scalar pair, then the first-order solver (augmented Lagrangian + L-BFGS-B) with
   what is left of a time limit for the whole design, and the accountant's certificate (its own
   code: the low-rank deletion path for curious users); the residual ratio vs DECOR's pair.
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
) -> list[dict[str, float]]:
    """Design time against n; ``limit`` bounds the whole design (problem, DECOR's scalar pair and
    the first-order solver): the solver gets what is left of it. The certificate (the
    accountant's, computed by its own code) is timed apart. Wall and CPU seconds (process time,
    all threads) are both given: on a shared machine the wall time depends on the load."""
    print(f"## design time vs n (random {degree}-regular, {adversary}, K = {horizon})")
    print(
        "| n | problem + scalar s (cpu) | first-order s (cpu) | evaluations | converged | "
        "design total s (cpu) | ratio vs DECOR | certify s (cpu) | method | max f | working set |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for n in sizes:
        topo = random_regular(n, degree, 1)
        t0, c0 = time.perf_counter(), time.process_time()
        mix = mixing_matrix(topo, "metropolis").dense()
        problem = make_problem(topo, mix, horizon=horizon, adversary=adversary)
        s2, c2, scalar = best_scalar(topo, problem)
        t1, c1 = time.perf_counter(), time.process_time()
        start = (np.full(n, s2), np.full(topo.num_edges, c2))
        node, edge, info = solve_first_order(
            problem, start, max_seconds=max(1.0, limit - (t1 - t0))
        )
        t2, c2_ = time.perf_counter(), time.process_time()
        design = NoiseDesign(node, edge, topo.edges)
        step = design_step_rdp(topo, design, adversary=adversary)
        t3, c3 = time.perf_counter(), time.process_time()
        ratio = problem.objective(node, edge) / scalar
        print(
            f"| {n} | {t1 - t0:.1f} ({c1 - c0:.1f}) | {t2 - t1:.1f} ({c2_ - c1:.1f}) | "
            f"{info['evaluations']} | {info['converged']} | {t2 - t0:.1f} ({c2_ - c0:.1f}) | "
            f"{ratio:.4f} | {t3 - t2:.1f} ({c3 - c2_:.1f}) | {step.method} | "
            f"{step.step_rdp / 2.0:.12f} | {info.get('working_set', '-')} ({info.get('rounds', '-')}) |",
            flush=True,
        )
        assert step.step_rdp / 2.0 <= 1.0 + 1e-9, step  # the accountant agrees with max f <= b = 1
        rows.append({"n": n, "design_s": t2 - t0, "certify_s": t3 - t2, "ratio": ratio})
    return rows


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
    parser.add_argument(
        "--limit", type=float, default=55.0, help="time limit of the whole design (s)"
    )
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
