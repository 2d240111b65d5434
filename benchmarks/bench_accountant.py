"""Benchmark the SecRDP accountant's fast paths against the naive algorithms.

1. q = 1 (honest-but-curious users) on a random 6-regular graph, n = 1000:
   ``dense+lowrank`` (one inverse + Woodbury updates for every deleted vertex) vs the naive loop
   of Algorithm 3 (one plain inverse of the (n-1) x (n-1) matrix per deleted vertex).
2. q = 0 (eavesdropper) on a 300 x 300 torus, n = 90,000:
   ``sparse-selinv`` (one vertex grounded, one sparse LDL^T of the rest + Takahashi selected
   inversion) vs the naive approach of the
   DECOR code (solve Sigma x = e_i for every i with the sparse factor). The naive time is measured
   on ``--naive-sample`` vertices and extrapolated; agreement is checked on those vertices and
   against the vertex-transitive closed form.

3. DP-SGD (``--dpsgd``, issue 37 item 5): ``dpsgd_budget`` (the default, tightest certified
   accountant) against dp-accounting's PLD accountant called directly on the same event (the
   number it reports, bit for bit: checked), interleaved, per setting. ``cold`` empties the kept
   single steps before each call (a first call); ``warm`` keeps them (the same mechanism asked
   again, e.g. after a calibration); ``all_asked`` is what the default did before it asked
   dp-accounting's RDP accountant only where it could win (its RDP and PLD answers, both).

Run: ``python benchmarks/bench_accountant.py [--n 1000] [--side 300] [--dpsgd --iters 5]``.
Prints times and ratios.
"""

from __future__ import annotations

import argparse
import time

import networkx as nx
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla
from _common import interleaved_seconds

from privdl.accounting._graph import edge_array, laplacian
from privdl.accounting._sigma_inverse import deletion_maxima, sigma_inverse_diagonal
from privdl.accounting.secrdp import decor_step_rdp


def plain_inverse_diagonal(lap: sp.spmatrix, sigma_cdp: float, sigma_cor: float) -> np.ndarray:
    """diag(Sigma^{-1}) from one plain dense inverse (what the DECOR code does)."""
    sigma = sigma_cdp**2 * np.eye(lap.shape[0]) + sigma_cor**2 * lap.toarray()
    return np.diag(np.linalg.inv(sigma))


def bench_q1(n: int, degree: int, sigma_cdp: float, sigma_cor: float, seed: int) -> None:
    graph = nx.random_regular_graph(degree, n, seed=seed)
    n, edges = edge_array(graph)
    t0 = time.perf_counter()
    fast = decor_step_rdp(
        graph, sigma_cdp=sigma_cdp, sigma_cor=sigma_cor, adversary="curious", method="dense+lowrank"
    )
    t_fast = time.perf_counter() - t0
    # per-vertex values of the fast path, for an exact comparison with the naive loop
    per_vertex_fast, _ = deletion_maxima(laplacian(n, edges), sigma_cdp, sigma_cor)
    t0 = time.perf_counter()
    per_vertex_naive = np.empty(n)
    for v in range(n):  # the reference loop of Algorithm 3
        keep = np.ones(n, dtype=bool)
        keep[v] = False
        per_vertex_naive[v] = np.max(
            plain_inverse_diagonal(laplacian(n, edges, keep), sigma_cdp, sigma_cor)
        )
    t_naive = time.perf_counter() - t0
    naive_value = 2.0 * per_vertex_naive.max()
    rel = np.max(np.abs(per_vertex_fast - per_vertex_naive) / per_vertex_naive)
    print(f"[q=1] random {degree}-regular, n={n}, sigma_cdp={sigma_cdp}, sigma_cor={sigma_cor}")
    print(f"  fast (dense+lowrank): {t_fast:8.3f} s   eps_step = {fast.step_rdp:.15g}")
    print(f"  naive (n inverses):   {t_naive:8.3f} s   eps_step = {naive_value:.15g}")
    print(f"  speed-up: {t_naive / t_fast:.1f}x   max rel. diff over all n deletions: {rel:.2e}")


def bench_q0_torus(side: int, sigma_cdp: float, sigma_cor: float, naive_sample: int) -> None:
    graph = nx.convert_node_labels_to_integers(nx.grid_2d_graph(side, side, periodic=True))
    n, edges = edge_array(graph)
    lap = laplacian(n, edges)
    sigma = (sigma_cdp**2 * sp.identity(n) + sigma_cor**2 * lap).tocsc()
    t0 = time.perf_counter()
    diag_fast = sigma_inverse_diagonal(lap, sigma_cdp, sigma_cor, sparse=True)
    t_fast = time.perf_counter() - t0
    lam = 2 - 2 * np.cos(2 * np.pi * np.arange(side) / side)
    closed = float(np.mean(1.0 / (sigma_cdp**2 + sigma_cor**2 * (lam[:, None] + lam[None, :]))))
    rng = np.random.default_rng(0)
    sample = rng.choice(n, size=naive_sample, replace=False)
    t0 = time.perf_counter()
    lu = sla.splu(
        sigma, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0, options={"SymmetricMode": True}
    )
    t_factor = time.perf_counter() - t0
    t0 = time.perf_counter()
    rhs = np.zeros((n, naive_sample))
    rhs[sample, np.arange(naive_sample)] = 1.0
    diag_naive = lu.solve(rhs)[sample, np.arange(naive_sample)]
    t_solve = time.perf_counter() - t0
    t_naive = t_factor + t_solve * n / naive_sample
    rel_sample = np.max(np.abs(diag_fast[sample] - diag_naive) / diag_naive)
    rel_closed = np.max(np.abs(diag_fast - closed) / closed)
    print(f"[q=0] torus {side}x{side}, n={n}, sigma_cdp={sigma_cdp}, sigma_cor={sigma_cor}")
    print(
        f"  fast (sparse LDL^T + selected inversion): {t_fast:8.2f} s, "
        f"eps_step = {2 * diag_fast.max():.15g}"
    )
    print(
        f"  naive (n sparse solves): factor {t_factor:.2f} s + {naive_sample} solves "
        f"{t_solve:.2f} s -> extrapolated {t_naive:8.1f} s for all n"
    )
    print(
        f"  speed-up: {t_naive / t_fast:.1f}x   max rel. diff vs naive sample: {rel_sample:.2e}"
        f"   vs closed form (all n): {rel_closed:.2e}"
    )


DPSGD_SETTINGS = (  # (z, q, T, delta)
    (2.0, 0.001, 1000, 1e-5),
    (5.0, 0.02, 100, 1e-5),
    (1.1, 256 / 60000, 10000, 1e-5),
)


def bench_dpsgd(iters: int) -> None:
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)
    for z, q, steps, delta in DPSGD_SETTINGS:
        _bench_dpsgd_setting(z, q, steps, delta, iters)


def _bench_dpsgd_setting(z: float, q: float, steps: int, delta: float, iters: int) -> None:
    import statistics

    import dp_accounting as dpa
    from dp_accounting.pld import pld_privacy_accountant

    from privdl.accounting.dpsgd import dpsgd_budget
    from privdl.accounting.events import SubsampledGaussianEvent
    from privdl.accounting.rdp_pld import event_epsilon, pld_round_off_mass
    from privdl.accounting.tightest import SHARED_STEPS

    kw = dict(noise_multiplier=z, sampling_rate=q, steps=steps, delta=delta)
    dp_event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    event = SubsampledGaussianEvent(z, q, steps, "poisson", "add_remove")

    def direct() -> float:
        acc = pld_privacy_accountant.PLDAccountant()
        acc.compose(dp_event)
        return float(acc.get_epsilon(delta - 4.0 * pld_round_off_mass(acc)))

    def cold() -> float:
        SHARED_STEPS.clear()
        return dpsgd_budget(**kw).epsilon  # type: ignore[arg-type]

    def warm() -> float:
        return dpsgd_budget(**kw).epsilon  # type: ignore[arg-type]

    def all_asked() -> float:
        return min(
            event_epsilon(event, delta=delta, accountant="rdp"),
            event_epsilon(event, delta=delta, accountant="pld"),
        )

    same = cold() == direct() == warm() == all_asked()
    times = interleaved_seconds([direct, cold, warm, all_asked], iters=iters)
    d, c, w, a = (statistics.median(t) for t in times)
    print(f"[dpsgd] z={z} q={q:.6g} T={steps} delta={delta}: same epsilon: {same}")
    print(
        f"  dp-accounting PLD direct {1e3 * d:7.1f} ms | dpsgd_budget cold {1e3 * c:7.1f} ms "
        f"({c / d:.2f}x), warm {1e3 * w:7.1f} ms ({w / d:.2f}x) | all accountants asked "
        f"{1e3 * a:7.1f} ms ({a / d:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--degree", type=int, default=6)
    parser.add_argument("--side", type=int, default=300)
    parser.add_argument("--naive-sample", type=int, default=256)
    parser.add_argument("--skip-q1", action="store_true")
    parser.add_argument("--skip-torus", action="store_true")
    parser.add_argument("--dpsgd", action="store_true", help="only the DP-SGD comparison")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    if args.dpsgd:
        bench_dpsgd(args.iters)
        return
    if not args.skip_q1:
        bench_q1(args.n, args.degree, 1.0, 10.0, seed=0)
    if not args.skip_torus:
        bench_q0_torus(args.side, 1.0, 10.0, args.naive_sample)


if __name__ == "__main__":
    main()
