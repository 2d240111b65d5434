"""Time per step: distributed (P processes, gloo over loopback) against the single-process simulator.

DECOR's least-squares task with d = 1e5 on ``ring:16`` (float32), D-SGD and DECOR steps; the
distributed run shards the 16 nodes over P processes (``DistributedCommunicator``, batched
point-to-point gossip). Reported as a ratio measured in one run::

    python benchmarks/bench_distributed.py [--nproc 4] [--dim 100000] [--steps 20]

``--threads`` torch threads are used by the simulator and by each rank (default 1: on a shared or
small machine intra-op threads contend and distort both timings). With fewer cores than
processes the ratio measures oversubscription as much as communication: read it next to
``cpu_count``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import time

import torch

from privdl.algorithms.base import Keys, StepSize
from privdl.algorithms.decor import Decor
from privdl.algorithms.dsgd import DSGD
from privdl.comm.local import LocalCommunicator
from privdl.engine.grads import ClipSpec
from privdl.tasks import LeastSquaresTask
from privdl.topology import mixing_matrix, parse_graph


def _algorithms(topo, n: int) -> dict:
    clip = ClipSpec(mode="batch_mean", threshold=1.0)
    return {
        "dsgd": DSGD(StepSize(0.01)),
        "decor": Decor(
            StepSize(0.01), edges=topo.edges, n_nodes=n, clip=clip, sigma_cdp=0.1, sigma_cor=1.0
        ),
    }


def _simulator(graph: str, dim: int, steps: int, warmup: int) -> dict[str, float]:
    topo = parse_graph(graph)
    n = topo.n
    task = LeastSquaresTask(n, dim=dim)
    comm = LocalCommunicator(mixing_matrix(topo, "metropolis"))
    out = {}
    for name, algo in _algorithms(topo, n).items():
        state = algo.init(task.init_params(seed=0), task.oracle, comm, keys=Keys.from_seed(0))
        for _ in range(warmup):
            state, _ = algo.step(state, task.oracle, comm)
        start = time.perf_counter()
        for _ in range(steps):
            state, _ = algo.step(state, task.oracle, comm)
        out[name] = (time.perf_counter() - start) / steps
    return out


def _rank(rank, world, port, graph, dim, steps, warmup, threads, queue) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(threads)
    import torch.distributed as dist

    from privdl.comm.distributed import DistributedCommunicator, init_from_env

    init_from_env()
    topo = parse_graph(graph)
    n = topo.n
    task = LeastSquaresTask(n, dim=dim)
    comm = DistributedCommunicator(mixing_matrix(topo, "metropolis"))
    oracle = task.oracle_for(comm.owned.tolist())
    out = {}
    for name, algo in _algorithms(topo, n).items():
        params = comm.shard(task.init_params(seed=0))
        state = algo.init(params, oracle, comm, keys=Keys.from_seed(0))
        for _ in range(warmup):
            state, _ = algo.step(state, oracle, comm)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            state, _ = algo.step(state, oracle, comm)
        dist.barrier()
        out[name] = (time.perf_counter() - start) / steps
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def _distributed(
    nproc: int, graph: str, dim: int, steps: int, warmup: int, threads: int
) -> dict[str, float]:
    ctx = mp.get_context("fork")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, nproc, port, graph, dim, steps, warmup, threads, queue))
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--graph", default="ring:16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sim_t = _simulator(args.graph, args.dim, args.steps, args.warmup)
    dist_t = _distributed(args.nproc, args.graph, args.dim, args.steps, args.warmup, args.threads)
    rows = {
        name: {
            "simulator_s_per_step": sim_t[name],
            "distributed_s_per_step": dist_t[name],
            "ratio_distributed_over_simulator": dist_t[name] / sim_t[name],
        }
        for name in sim_t
    }
    meta = {
        "nproc": args.nproc,
        "dim": args.dim,
        "graph": args.graph,
        "steps": args.steps,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }
    print(json.dumps({"setup": meta, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
