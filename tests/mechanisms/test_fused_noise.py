"""The fused CUDA noise kernels (privdl.mechanisms.fused_noise) against the composed path.

They run on a GPU (``-m gpu``) or, where Triton is installed, in its CPU interpreter
(``TRITON_INTERPRET=1``); otherwise the tests skip. Oracles: OpenSSL's ChaCha20 keystream
(bit for bit) and the composed path of privdl.mechanisms.correlated (bit for bit on CUDA,
where both use CUDA's libm; to float32 rounding in the interpreter, whose libm is numpy's).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch

from privdl.mechanisms import fused_noise, prng
from privdl.mechanisms.correlated import correlated_noise
from privdl.mechanisms.prng import keystream, normal_streams
from privdl.mechanisms.secrets import agree_edge_secrets, node_noise_keys
from privdl.topology import parse_graph

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and fused_noise.triton is not None
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        fused_noise.triton is None or not (CUDA or INTERPRET),
        reason="needs CUDA with Triton, or Triton's interpreter (TRITON_INTERPRET=1)",
    ),
]
DEVICE = "cuda" if CUDA else "cpu"


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    if CUDA:  # the same libm and the same operations: bit for bit
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def _setup(spec: str, size: int, seed: int = 3):
    topo = parse_graph(spec)
    edges = np.asarray(topo.edges)
    secrets = agree_edge_secrets(edges, topo.n, seed=seed)
    node_keys = list(node_noise_keys(range(topo.n), seed=seed))
    return topo.n, edges, list(secrets.edge_keys()), node_keys


@pytest.mark.parametrize("tiled", [True, False])  # False: the 16-store reference layout
def test_keystream_kernel_is_openssl_chacha20_bit_for_bit(tiled: bool) -> None:
    keys = [hashlib.sha256(f"k{i}".encode()).digest() for i in range(3)]
    counter, substream, n_blocks = 2**33 + 7, 5, 37
    words = np.frombuffer(b"".join(keys), dtype="<u4").reshape(-1, 8).view(np.int32)
    key_words = torch.from_numpy(words.copy()).to(DEVICE)
    out = torch.empty((3, n_blocks * 16), dtype=torch.int32, device=DEVICE)
    nonce = np.frombuffer(fused_noise._nonce(counter, substream)[4:], dtype="<u4").tolist()
    prng._chacha20_kernel[(1, 3)](key_words, out, n_blocks, *nonce, 0, 3, BLOCK=64, TILED=tiled)
    for k, key in enumerate(keys):
        want = keystream(key, counter, n_blocks * 64, substream=substream)
        assert out[k].cpu().numpy().tobytes() == want


@pytest.mark.parametrize("spec,size", [("ring:8", 2049), ("torus:3x3", 3001), ("star:5", 10)])
def test_fused_equals_correlated_plus_independent(spec: str, size: int) -> None:
    n, edges, edge_keys, node_keys = _setup(spec, size)
    t, s_cor, s_cdp = 11, 0.37, 0.05
    got = fused_noise.fused_decor_noise(
        edge_keys, edges, n, node_keys, t, size, sigma_cor=s_cor, sigma_cdp=s_cdp, device=DEVICE
    )
    cor = correlated_noise(
        edge_keys, edges, n, t, size, sigma_cor=s_cor, device=DEVICE, backend="chacha20"
    )
    ind = normal_streams(node_keys, t, size, device=DEVICE, backend="chacha20").mul_(s_cdp)
    _same(got, cor.add_(ind))
    only_cor = fused_noise.fused_decor_noise(
        edge_keys, edges, n, node_keys, t, size, sigma_cor=s_cor, sigma_cdp=0.0, device=DEVICE
    )
    _same(
        only_cor,
        correlated_noise(
            edge_keys, edges, n, t, size, sigma_cor=s_cor, device=DEVICE, backend="chacha20"
        ),
    )
    assert only_cor.double().sum(0).abs().max() <= 1e-5 * only_cor.abs().max()  # K Z cancels
    only_ind = fused_noise.fused_decor_noise(
        (), (), n, node_keys, t, size, sigma_cor=0.0, sigma_cdp=s_cdp, device=DEVICE
    )
    _same(
        only_ind, normal_streams(node_keys, t, size, device=DEVICE, backend="chacha20").mul_(s_cdp)
    )


def test_rows_of_a_subset_equal_the_full_rows_bitwise_and_steps_differ() -> None:
    n, edges, edge_keys, node_keys = _setup("torus:3x3", 999)
    full = fused_noise.fused_decor_noise(
        edge_keys, edges, n, node_keys, 4, 999, sigma_cor=1.0, sigma_cdp=0.1, device=DEVICE
    )
    rows = [7, 2]
    part = fused_noise.fused_decor_noise(
        edge_keys,
        edges,
        n,
        [node_keys[r] for r in rows],
        4,
        999,
        sigma_cor=1.0,
        sigma_cdp=0.1,
        device=DEVICE,
        nodes=rows,
    )
    assert torch.equal(part, full[rows])
    nxt = fused_noise.fused_decor_noise(
        edge_keys, edges, n, node_keys, 5, 999, sigma_cor=1.0, sigma_cdp=0.1, device=DEVICE
    )
    assert not torch.isclose(nxt, full).any(dim=1).all()  # fresh noise at every step
    assert abs(float(full.std()) - (4 * 1.0 + 0.01) ** 0.5) < 0.1  # torus degree 4


@pytest.mark.skipif(not CUDA, reason="the dispatch serves CUDA tensors only")
def test_decor_and_dsgd_steps_use_it_and_keep_their_trajectories(monkeypatch) -> None:
    from privdl.algorithms.base import Keys, StepSize
    from privdl.algorithms.decor import Decor
    from privdl.algorithms.dsgd import DSGD
    from privdl.comm.local import LocalCommunicator
    from privdl.engine import ClipSpec, node_gradients
    from privdl.mechanisms import correlated
    from privdl.models import build_model
    from privdl.topology import mixing_matrix

    topo = parse_graph("ring:6")
    comm = LocalCommunicator(mixing_matrix(topo, "decor"), device="cuda", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    model = build_model("mlp", in_shape=(20,), n_classes=3)
    params = {k: v.cuda() for k, v in model.init(n_nodes=6, generator=gen).items()}
    x, y = torch.randn(6, 8, 20, generator=gen).cuda(), torch.randint(0, 3, (6, 8)).cuda()

    def oracle(p, t, *, clip):
        return node_gradients(model, p, x, y, loss="cross_entropy", clip=clip)

    def run(alg, fused: bool):
        monkeypatch.setattr(
            correlated, "fused_available", lambda *a: fused and fused_noise.fused_available(*a)
        )
        st = alg.init(dict(params), oracle, comm, keys=Keys.from_seed(1))
        for _ in range(3):
            st, _ = alg.step(st, oracle, comm)
        return st.params

    clip = ClipSpec("per_sample", 1.0)
    decor = Decor(
        StepSize(0.1), edges=topo.edges, n_nodes=6, clip=clip, sigma_cdp=0.02, sigma_cor=0.3
    )
    for k, v in run(decor, True).items():
        assert torch.equal(v, run(decor, False)[k])
    ldp = DSGD(StepSize(0.1), clip=clip, sigma=0.02)
    for k, v in run(ldp, True).items():
        assert torch.equal(v, run(ldp, False)[k])


def test_keystream_kernel_makes_consecutive_counters_in_one_launch() -> None:
    """The third grid axis: slab k is OpenSSL's keystream at counter + k, with the carry from
    the low nonce word into the high one."""
    keys = [hashlib.sha256(f"c{i}".encode()).digest() for i in range(2)]
    counter, substream, n_blocks, steps = 2**32 - 2, 9, 5, 4
    words = np.frombuffer(b"".join(keys), dtype="<u4").reshape(-1, 8).view(np.int32)
    key_words = torch.from_numpy(words.copy()).to(DEVICE)
    out = torch.empty((steps * 2, n_blocks * 16), dtype=torch.int32, device=DEVICE)
    nonce = np.frombuffer(fused_noise._nonce(counter, substream)[4:], dtype="<u4").tolist()
    prng._chacha20_kernel[(1, 2, steps)](key_words, out, n_blocks, *nonce, 0, 2, BLOCK=64)
    for k in range(steps):
        for s, key in enumerate(keys):
            want = keystream(key, counter + k, n_blocks * 64, substream=substream)
            assert out[k * 2 + s].cpu().numpy().tobytes() == want, (k, s)


@pytest.mark.parametrize(
    "sigmas", [(0.4, 0.03), (0.4, 0.0), (0.0, 0.2)], ids=["decor", "correlated", "ldp"]
)
def test_a_block_of_steps_equals_the_steps_one_by_one_bitwise(sigmas) -> None:
    s_cor, s_cdp = sigmas
    n, edges, edge_keys, node_keys = _setup("torus:3x3", 777)
    rows = [8, 0, 4]
    kw = dict(sigma_cor=s_cor, sigma_cdp=s_cdp, device=DEVICE, nodes=rows)
    keys = [node_keys[r] for r in rows]
    block = fused_noise.fused_decor_noise(edge_keys, edges, n, keys, 6, 777, steps=3, **kw)
    assert block.shape == (3, 3, 777)
    for k in range(3):
        one = fused_noise.fused_decor_noise(edge_keys, edges, n, keys, 6 + k, 777, **kw)
        assert torch.equal(block[k], one), k
    assert not torch.equal(block[0], block[1])


def test_prefetched_noise_serves_every_step_from_blocks(monkeypatch) -> None:
    """Iteration t comes from the block starting at t - t mod K: the same values as the
    one-iteration call at every t (also when a run resumes mid-block), in ceil(T/K) launches."""
    n, edges, edge_keys, node_keys = _setup("ring:5", 301)
    per_step = 4 * n * 301 + 12 * prng.row_pairs(301) * (len(edge_keys) + n)
    monkeypatch.setenv("PRIVDL_NOISE_BLOCK_BYTES", str(3 * per_step + 7))  # K = 3
    assert fused_noise.block_steps(streams=len(edge_keys) + n, rows=n, size=301) == 3
    launches = []
    real = fused_noise._launch
    monkeypatch.setattr(
        fused_noise,
        "_launch",
        lambda plan, c, k, *a: launches.append((c, k)) or real(plan, c, k, *a),
    )
    monkeypatch.setattr(fused_noise, "_PREFETCHED", {})
    kw = dict(sigma_cor=0.5, sigma_cdp=0.1, device=DEVICE)
    for t in [4, 5, 6, 7, 8, 9, 10]:  # resumed at t = 4, in the block [3, 6)
        got = fused_noise.prefetched_decor_noise(edge_keys, edges, n, node_keys, t, 301, **kw)
        want = fused_noise.fused_decor_noise(edge_keys, edges, n, node_keys, t, 301, **kw)
        assert torch.equal(got, want), t
    blocks = [c for c, k in launches if k == 3]
    assert blocks == [3, 6, 9]  # the rest are the one-iteration oracle calls
    other = fused_noise.prefetched_decor_noise(
        edge_keys, edges, n, node_keys, 10, 301, sigma_cor=0.5, sigma_cdp=0.2, device=DEVICE
    )
    assert not torch.equal(other, want)  # another sigma is another block, not the cached one


def test_launches_split_over_the_grid_limit_give_the_same_noise_bitwise(monkeypatch) -> None:
    """More streams or rows than CUDA's 65,535 programs on a grid axis (n = 65,536 nodes on a
    torus has 196,608 streams) are covered by several launches: forced here with a limit of 4."""
    n, edges, edge_keys, node_keys = _setup("torus:3x3", 300)
    args = (edge_keys, edges, n, node_keys, 5, 300)
    kw = dict(sigma_cor=0.7, sigma_cdp=0.2, device=DEVICE)
    whole = fused_noise.fused_decor_noise(*args, **kw)
    monkeypatch.setattr(prng, "MAX_GRID_YZ", 4)
    assert len(prng.stream_chunks(27)) == 7
    split = fused_noise.fused_decor_noise(*args, **kw)
    assert torch.equal(whole, split)
    normals = prng.normal_streams(node_keys, 5, 300, device=DEVICE, backend="chacha20")
    monkeypatch.setattr(prng, "MAX_GRID_YZ", 65535)
    assert torch.equal(
        normals, prng.normal_streams(node_keys, 5, 300, device=DEVICE, backend="chacha20")
    )
