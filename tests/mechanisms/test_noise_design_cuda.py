"""Edge-wise noise designs on CUDA (docs/noise-design.md): the same keyed values as on the CPU.

A non-uniform design bypasses the fused kernel (docs/gpu.md) and takes the composed path of
keyed ChaCha20 streams on the device; a uniform design takes DECOR's fused kernel. Both must give
the CPU's noise (float32 Box-Muller on the device's libm: to rounding), and the designed
correlated part must still sum to zero over the nodes on the device.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from privdl.mechanisms.correlated import decor_noise
from privdl.mechanisms.noise_design import NoiseDesign
from privdl.mechanisms.secrets import agree_edge_secrets, node_noise_keys

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _setup(n: int = 10, seed: int = 5):
    graph = nx.gnp_random_graph(n, 0.5, seed=seed)
    edges = np.array(sorted(tuple(sorted(e)) for e in graph.edges()), dtype=np.int64)
    edge_keys = agree_edge_secrets(edges, n, seed=seed, session_id="design-cuda").edge_keys()
    return edges, edge_keys, node_noise_keys(range(n), seed=seed)


@pytest.mark.parametrize("uniform", [False, True])
def test_designed_noise_on_cuda_equals_cpu(uniform: bool) -> None:
    n, size = 10, 4099
    edges, edge_keys, node_keys = _setup(n)
    rng = np.random.default_rng(1)
    design = (
        NoiseDesign.uniform(edges, n, sigma_cdp=0.4, sigma_cor=1.3)
        if uniform
        else NoiseDesign(rng.uniform(0.1, 2.0, n), rng.uniform(0.0, 4.0, len(edges)), edges)
    )

    def draw(device: str, t: int) -> torch.Tensor:
        return decor_noise(
            edge_keys, edges, n, node_keys, t, size, sigma_cor=0.0, sigma_cdp=0.0,
            dtype=torch.float32, device=device, backend="chacha20", design=design,
        )  # fmt: skip

    for t in (0, 7):
        cpu, gpu = draw("cpu", t), draw("cuda", t)
        assert gpu.device.type == "cuda" and gpu.shape == (n, size)
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)
    assert not torch.equal(draw("cuda", 0), draw("cuda", 1))  # steps differ


def test_designed_correlated_part_sums_to_zero_on_cuda() -> None:
    n, size = 10, 2048
    edges, edge_keys, _ = _setup(n)
    rng = np.random.default_rng(2)
    design = NoiseDesign(np.zeros(n), rng.uniform(0.5, 4.0, len(edges)), edges)
    noise = decor_noise(
        edge_keys, edges, n, [], 3, size, sigma_cor=0.0, sigma_cdp=0.0,
        dtype=torch.float32, device="cuda", backend="chacha20", design=design,
    )  # fmt: skip
    assert float(noise.abs().max()) > 1.0  # there is noise on the nodes
    assert float(noise.sum(dim=0).abs().max()) < 1e-4 * float(noise.abs().max()) * n
