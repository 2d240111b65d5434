"""Cost of DECOR's noise per step, MNIST setting (paper Section 6.2): n = 16, P = 101,770, float32.

For the 4x4 torus (32 edges) and the ring (16 edges), and for each normal-stream backend, times one
step's correlated noise N^(t) = K Z^(t) (|E| streams) plus independent noise vbar^(t) (n streams),
and compares it with ``torch.randn`` of the same total size ((|E| + n) x P, float32, one global
generator: the cost floor, but not reproducible per edge). For scale it also times the per-sample
clipped gradients of one DECOR step (16 nodes x batch 64, MLP 784-128-10, ``torch.func``).

    python benchmarks/bench_noise.py --repeats 7 --json-out noise.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import networkx as nx
import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from privdl.mechanisms import (
    agree_edge_secrets,
    correlated_noise,
    independent_noise,
    node_noise_keys,
)

N_NODES, P, BATCH = 16, 784 * 128 + 128 + 128 * 10 + 10, 64


def _edges(graph: nx.Graph) -> np.ndarray:
    return np.array(sorted(tuple(sorted(e)) for e in graph.edges()), dtype=np.int64)


def _median_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    def run() -> None:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _noise_step(
    keys: list, edges: np.ndarray, node_keys: list, backend: str, device: torch.device
) -> Callable[[], torch.Tensor]:
    counter = iter(range(10**9))

    def step() -> torch.Tensor:
        t = next(counter)
        cor = correlated_noise(
            keys, edges, N_NODES, t, P, sigma_cor=1.0, backend=backend, device=device
        )
        ind = independent_noise(node_keys, t, P, sigma=1.0, backend=backend, device=device)
        return cor + ind

    return step


def _per_sample_grad_step(device: torch.device) -> Callable[[], object]:
    """Clipped per-sample gradients for 16 nodes x 64 samples: the compute a DECOR step must do."""
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    )
    model = model.to(device)
    params = {k: v.detach().expand(N_NODES, *v.shape).clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N_NODES, BATCH, 784, generator=gen).to(device)
    y = torch.randint(0, 10, (N_NODES, BATCH), generator=gen).to(device)

    def loss(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    per_node = vmap(vmap(grad(loss), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))

    def step() -> torch.Tensor:
        grads = per_node(params, x, y)
        flat = torch.cat([g.reshape(N_NODES, BATCH, -1) for g in grads.values()], dim=2)
        scale = (1.0 / flat.norm(dim=2, keepdim=True).clamp_min(1.0)).clamp_max(1.0)
        return (flat * scale).mean(dim=1)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    device = torch.device(args.device)
    graphs = {
        "torus": nx.convert_node_labels_to_integers(nx.grid_2d_graph(4, 4, periodic=True)),
        "ring": nx.cycle_graph(N_NODES),
    }
    node_keys = node_noise_keys(range(N_NODES), seed=0, session_id="bench")
    results: dict[str, object] = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "P": P,
        "n": N_NODES,
    }
    step_ms = _median_ms(_per_sample_grad_step(device), args.repeats, device)
    results["per_sample_grad_step_ms"] = step_ms
    print(f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"reference: clipped per-sample gradients, 16 x 64 samples: {step_ms:8.1f} ms")
    for name, graph in graphs.items():
        edges = _edges(graph)
        keys = agree_edge_secrets(edges, N_NODES, seed=0, session_id="bench").edge_keys()
        streams = len(edges) + N_NODES
        randn_ms = _median_ms(
            lambda s=streams: torch.randn(s, P, device=device), args.repeats, device
        )
        results[f"{name}/randn_ms"] = randn_ms
        print(f"{name}: |E| = {len(edges)}, {streams} streams x {P}; torch.randn {randn_ms:.2f} ms")
        for backend in ("aes-ziggurat", "chacha20", "torch"):
            ms = _median_ms(
                _noise_step(keys, edges, node_keys, backend, device), args.repeats, device
            )
            results[f"{name}/{backend}_ms"] = ms
            print(
                f"  {backend:12s} {ms:8.2f} ms   x{ms / randn_ms:5.2f} randn"
                f"   {100 * ms / (ms + step_ms):5.1f}% of (noise + gradients)"
            )
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
