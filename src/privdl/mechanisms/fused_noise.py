"""A DECOR step's whole noise on CUDA in two kernels (``chacha20`` streams, layout v2).

The composed path (:func:`privdl.mechanisms.correlated.correlated_noise` plus
:func:`~privdl.mechanisms.correlated.independent_noise`) launches one keystream kernel per kind
of stream, about ten elementwise kernels of Box-Muller per call, a gather and an ``addcmul`` per
degree slot, and copies the slot tables and stream keys to the GPU at every step. On a GPU a
step of the DECOR MNIST setting is launch-bound, so that cost about as much as the gradients.

Here (DECOR Alg. 1 line 3; matrix form Alg. 4, ``N = K Z`` plus the independent ``vbar``):

1. one kernel writes the ChaCha20 keystream of every needed stream (the incident edges' secrets,
   then the owned nodes' noise keys), with the nonce ``(t, substream)`` passed as scalars, so no
   per-step host-to-device copy is made (the stream keys and slot tables are uploaded once and
   cached);
2. one kernel turns, for each owned row ``i`` and block of coordinates, the keystream of each
   incident edge into normals (Box-Muller as in :func:`~privdl.mechanisms.prng.keystream_to_normals`),
   accumulates ``+z_e`` at the lower endpoint and ``-z_e`` at the upper one in edge order,
   multiplies by ``sigma_cor``, and adds ``sigma_cdp`` times the node's own normals.

Every float operation is the composed path's, in the same order and precision, with FMA
contraction turned off and CUDA's libdevice ``logf``/``cosf``/``sinf`` and IEEE ``sqrt``: the
values are meant to equal the composed path's bit for bit (checked on the GPU by
``tests/mechanisms/test_fused_noise.py``). Float32 only; other dtypes, backends and devices take
the composed path.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privdl.errors import ConfigError, PrivacyError
from privdl.mechanisms._edges import incident_edges, row_slots
from privdl.mechanisms.prng import (
    _ANGLE_STEP,
    _MAX_STREAM_BYTES,
    _check_key,
    _nonce,
    resolve_backend,
    row_pairs,
    stream_chunks,
    tl,
    triton,
)
from privdl.mechanisms.secrets import as_edge_array

__all__ = ["block_steps", "fused_available", "fused_decor_noise", "prefetched_decor_noise"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests)
_KEYSTREAM_BLOCK = 256  # ChaCha20 blocks per program
_PAIR_BLOCK = 1024  # Box-Muller pairs per program

if triton is not None:
    # module level, not in a function: prng defines its Triton kernel only where Triton is installed
    from privdl.mechanisms.prng import _chacha20_kernel

    if _INTERPRET:  # the interpreter has no libdevice; its numpy functions stand in

        @triton.jit
        def _log(x):
            return tl.log(x)

        @triton.jit
        def _cos(x):
            return tl.cos(x)

        @triton.jit
        def _sin(x):
            return tl.sin(x)

    else:
        from triton.language.extra import libdevice

        @triton.jit
        def _log(x):  # logf, as torch's CUDA log_ calls it
            return libdevice.log(x)

        @triton.jit
        def _cos(x):
            return libdevice.cos(x)

        @triton.jit
        def _sin(x):
            return libdevice.sin(x)

    @triton.jit
    def _pair(ks64_ptr, ks32_ptr, stream, row64, row32, m, j, inside, angle_step):
        """Box-Muller pair j of a stream (layout v2): r cos(a), r sin(a) in float32.

        ``stream`` counts rows of the keystream array from its start (a step's slab included).
        """
        s64 = stream.to(tl.int64)
        w = tl.load(ks64_ptr + s64 * row64 + j, mask=inside, other=0)
        f = ((w & 0xFFFFFFFFFFFFF) | 0x3FF0000000000000).to(tl.float64, bitcast=True)
        u1 = (2.0 - f).to(tl.float32)
        radius = tl.sqrt_rn(_log(u1) * -2.0)
        s = tl.load(ks32_ptr + s64 * row32 + 2 * m + j, mask=inside, other=0)
        angle = s.to(tl.float32) * angle_step
        return _cos(angle) * radius, _sin(angle) * radius

    @triton.jit
    def _noise_kernel(
        ks64_ptr,
        ks32_ptr,
        row64,
        row32,
        m,
        size,
        indptr_ptr,
        slot_stream_ptr,
        slot_sign_ptr,
        node_base,
        streams,
        sigma_cor,
        sigma_cdp,
        angle_step,
        out_ptr,
        first_row,
        n_rows,
        HAS_COR: tl.constexpr,
        HAS_NODE: tl.constexpr,
        MAX_DEGREE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """Row ``first_row + program_id(1)`` of ``n_rows``: sigma_cor * sum_slots (+-z_e)
        [+ sigma_cdp * z_node], pairs ``j`` of block ``program_id(0)`` (cos half at ``j``, sin
        half at ``m + j``), for the iteration ``program_id(2)`` of the block (keystream slab
        ``streams`` rows long)."""
        r = tl.program_id(1) + first_row
        j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        step = tl.program_id(2).to(tl.int64)
        first = step * streams  # the step's first keystream row
        inside = j < m
        if HAS_COR:
            acc_c = tl.zeros([BLOCK], dtype=tl.float32)
            acc_s = tl.zeros([BLOCK], dtype=tl.float32)
            start = tl.load(indptr_ptr + r)
            degree = tl.load(indptr_ptr + r + 1) - start
            for k in range(
                0, MAX_DEGREE
            ):  # incident edges in edge order; a row stops at its degree
                used = k < degree
                stream = first + tl.load(slot_stream_ptr + start + k, mask=used, other=0)
                sign = tl.load(slot_sign_ptr + start + k, mask=used, other=0)
                zc, zs = _pair(ks64_ptr, ks32_ptr, stream, row64, row32, m, j, inside, angle_step)
                acc_c = tl.where(sign > 0, acc_c + zc, tl.where(sign < 0, acc_c - zc, acc_c))
                acc_s = tl.where(sign > 0, acc_s + zs, tl.where(sign < 0, acc_s - zs, acc_s))
            acc_c = acc_c * sigma_cor
            acc_s = acc_s * sigma_cor
            if HAS_NODE:
                zc, zs = _pair(
                    ks64_ptr,
                    ks32_ptr,
                    first + node_base + r,
                    row64,
                    row32,
                    m,
                    j,
                    inside,
                    angle_step,
                )
                acc_c = acc_c + zc * sigma_cdp
                acc_s = acc_s + zs * sigma_cdp
        else:
            zc, zs = _pair(
                ks64_ptr, ks32_ptr, first + node_base + r, row64, row32, m, j, inside, angle_step
            )
            acc_c = zc * sigma_cdp
            acc_s = zs * sigma_cdp
        out = out_ptr + (step * n_rows + r.to(tl.int64)) * size
        tl.store(out + j, acc_c, mask=inside & (j < size))
        tl.store(out + m + j, acc_s, mask=inside & (m + j < size))


def fused_available(device: torch.device | str, dtype: torch.dtype, backend: str) -> bool:
    """True where :func:`fused_decor_noise` serves: CUDA with Triton, float32, ``chacha20``."""
    device = torch.device(device)
    return (
        triton is not None
        and device.type == "cuda"
        and dtype == torch.float32
        and resolve_backend(backend, device) == "chacha20"
    )


@dataclass(frozen=True)
class _Plan:
    """What stays the same from step to step, uploaded once: key words and slot tables."""

    key_words: torch.Tensor  # (streams, 8) int32: incident edges' secrets, then node keys
    indptr: torch.Tensor  # (rows + 1,) int32: row r's slots are indptr[r]:indptr[r + 1]
    slot_stream: torch.Tensor  # (slots,) int32: stream index of the slot's edge
    slot_sign: torch.Tensor  # (slots,) int32: +1 at the lower endpoint, -1 at the upper
    max_degree: int  # most slots of any row
    node_base: int  # stream index of the first row's node key
    n_rows: int


_EDGES_SEEN: dict[tuple[int, int], tuple[Any, np.ndarray, bytes]] = {}


def _checked_edges(edges: Any, n_nodes: int) -> tuple[bytes, int]:
    """The validated edge array's bytes and length, remembered for the same edges object (a step
    would otherwise spend most of its host time validating the graph again)."""
    seen = _EDGES_SEEN.get((id(edges), n_nodes))
    if seen is not None and seen[0] is edges and isinstance(edges, np.ndarray):
        array = seen[1]
        if edges.dtype == array.dtype and np.array_equal(edges, array):  # not changed in place
            return seen[2], len(array)
    array = as_edge_array(edges, n_nodes)
    if len(_EDGES_SEEN) > 16:
        _EDGES_SEEN.clear()
    _EDGES_SEEN[(id(edges), n_nodes)] = (edges, array.copy(), array.tobytes())
    return array.tobytes(), len(array)


@functools.lru_cache(maxsize=16)
def _plan(
    edge_keys: tuple[bytes | None, ...],
    edge_bytes: bytes,
    rows: tuple[int, ...],
    node_keys: tuple[bytes, ...],
    n_nodes: int,
    device: str,
) -> _Plan:
    array = np.frombuffer(edge_bytes, dtype=np.int64).reshape(-1, 2)
    _, lower, upper, keys = incident_edges(edge_keys, array, n_nodes, rows)
    ends, slot_edge, sign = row_slots(lower, upper)
    indptr = np.searchsorted(ends, np.arange(len(rows) + 1))
    all_keys = [_check_key(k) for k in keys] + [_check_key(k) for k in node_keys]
    words = np.frombuffer(b"".join(all_keys), dtype="<u4").reshape(-1, 8).view(np.int32)
    dev = torch.device(device)

    def up(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=np.int32)).to(dev)  # a writable copy

    return _Plan(
        key_words=up(words if len(words) else np.zeros((0, 8))),
        indptr=up(indptr),
        slot_stream=up(slot_edge),
        slot_sign=up(sign),
        max_degree=int(np.diff(indptr).max()) if len(rows) else 0,
        node_base=len(keys),
        n_rows=len(rows),
    )


def fused_decor_noise(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    node_keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    sigma_cor: float,
    sigma_cdp: float,
    device: torch.device | str,
    nodes: Sequence[int] | None = None,
    substream: int = 0,
    steps: int | None = None,
) -> torch.Tensor:
    """Rows ``sigma_cor * sum_{j in N_i} (+-z_ij) + sigma_cdp * z_i`` for ``nodes`` (all if None).

    ``node_keys[r]`` is the noise key of the r-th requested row. ``sigma_cor = 0`` (or no edges)
    leaves the correlated part out; ``sigma_cdp = 0`` the independent one. The values equal
    ``correlated_noise(...) + independent_noise(...)`` of the ``chacha20`` backend (module doc).
    Returns ``(rows, size)`` float32 on ``device``; with ``steps=K``, ``(K, rows, size)``: the
    noise of iterations ``counter, ..., counter + K - 1``, still in two launches (each slab
    equals the one-iteration call at its counter).
    """
    if triton is None:
        raise PrivacyError("fused noise needs Triton")
    device = torch.device(device)
    k = 1 if steps is None else int(steps)
    if k < 1 or counter + k - 1 >= 2**64:
        raise PrivacyError(f"steps must be >= 1 and end below counter 2^64; got {steps}")
    rows = tuple(range(n_nodes)) if nodes is None else tuple(int(r) for r in nodes)
    has_cor, has_node = sigma_cor > 0.0, sigma_cdp > 0.0
    if has_node and len(node_keys) != len(rows):
        raise PrivacyError(f"got {len(node_keys)} node keys for {len(rows)} rows")
    shape = (len(rows), size) if steps is None else (k, len(rows), size)
    if not (has_cor or has_node) or size == 0 or not rows:
        return torch.zeros(shape, dtype=torch.float32, device=device)
    plan = _plan_for(edge_keys, edges, n_nodes, node_keys, rows, has_cor, has_node, device)
    has_cor = has_cor and len(plan.slot_stream) > 0
    if not (has_cor or has_node):  # no requested row has an edge
        return torch.zeros(shape, dtype=torch.float32, device=device)
    m = row_pairs(size)
    if 12 * m > _MAX_STREAM_BYTES:
        raise PrivacyError(f"a stream holds at most 2^34 normals; asked for {size}")
    out = _launch(plan, counter, k, size, m, substream, sigma_cor, sigma_cdp, has_cor, has_node)
    return out.view(shape)


def _plan_for(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    node_keys: Sequence[bytes],
    rows: tuple[int, ...],
    has_cor: bool,
    has_node: bool,
    device: torch.device,
) -> _Plan:
    edge_bytes, n_edges = _checked_edges(edges, n_nodes) if has_cor else (b"", 0)
    if has_cor and len(edge_keys) != n_edges:
        raise ConfigError(f"got {len(edge_keys)} edge keys for {n_edges} edges")
    return _plan(
        tuple(edge_keys) if has_cor else (),
        edge_bytes,
        rows,
        tuple(node_keys) if has_node else (),
        n_nodes,
        str(device),
    )


def _launch(
    plan: _Plan,
    counter: int,
    steps: int,
    size: int,
    m: int,
    substream: int,
    sigma_cor: float,
    sigma_cdp: float,
    has_cor: bool,
    has_node: bool,
) -> torch.Tensor:
    """The two kernels for iterations ``counter .. counter + steps - 1``: ``(steps * rows, size)``."""
    device = plan.indptr.device
    n_blocks = (12 * m // 4 + 15) // 16  # 3m keystream words of 32 bits, in 64-byte blocks
    nonce = np.frombuffer(_nonce(counter, substream)[4:], dtype="<u4").tolist()
    streams = plan.key_words.shape[0]
    ks = torch.empty((steps * streams, n_blocks * 16), dtype=torch.int32, device=device)
    for first, count in stream_chunks(streams):  # one launch unless streams > 65,535
        grid = (triton.cdiv(n_blocks, _KEYSTREAM_BLOCK), count, steps)
        _chacha20_kernel[grid](
            plan.key_words, ks, n_blocks, *nonce, first, streams, BLOCK=_KEYSTREAM_BLOCK
        )
    out = torch.empty((steps * plan.n_rows, size), dtype=torch.float32, device=device)
    for first, count in stream_chunks(plan.n_rows):
        grid = (triton.cdiv(m, _PAIR_BLOCK), count, steps)
        _launch_noise(grid, ks, n_blocks, m, size, plan, streams, sigma_cor, sigma_cdp, out,
                      first, has_cor, has_node)  # fmt: skip
    return out


def _launch_noise(grid, ks, n_blocks, m, size, plan, streams, sigma_cor, sigma_cdp, out, first,
                  has_cor, has_node) -> None:  # fmt: skip
    _noise_kernel[grid](
        ks.view(torch.int64),
        ks,
        n_blocks * 8,
        n_blocks * 16,
        m,
        size,
        plan.indptr,
        plan.slot_stream,
        plan.slot_sign,
        plan.node_base,
        streams,
        float(sigma_cor),
        float(sigma_cdp),
        float(np.float32(_ANGLE_STEP)),
        out,
        first,
        plan.n_rows,
        HAS_COR=has_cor,
        HAS_NODE=has_node,
        MAX_DEGREE=plan.max_degree,
        BLOCK=_PAIR_BLOCK,
        enable_fp_fusion=False,  # no FMA: the composed path rounds every product before it adds
    )


# Iterations drawn ahead: (call's identity) -> (first iteration, (K, rows, size) block).
_PREFETCHED: dict[tuple, tuple[int, torch.Tensor]] = {}
_BLOCK_BUDGET = 512 * 2**20  # bytes of block and keystream (PRIVDL_NOISE_BLOCK_BYTES)
_MAX_BLOCK_STEPS = 32


def block_steps(*, streams: int, rows: int, size: int, budget: int | None = None) -> int:
    """How many iterations :func:`prefetched_decor_noise` draws in one launch: as many as fit
    ``budget`` bytes (``PRIVDL_NOISE_BLOCK_BYTES``, default 512 MiB) of block and keystream,
    at least 1 and at most 32."""
    if budget is None:
        budget = int(os.environ.get("PRIVDL_NOISE_BLOCK_BYTES", str(_BLOCK_BUDGET)))
    per_step = 4 * rows * size + 12 * row_pairs(size) * streams
    return max(1, min(_MAX_BLOCK_STEPS, budget // max(per_step, 1)))


def prefetched_decor_noise(
    edge_keys: Sequence[bytes | None],
    edges: Any,
    n_nodes: int,
    node_keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    sigma_cor: float,
    sigma_cdp: float,
    device: torch.device | str,
    nodes: Sequence[int] | None = None,
    substream: int = 0,
) -> torch.Tensor:
    """:func:`fused_decor_noise` of iteration ``counter``, served from a block of iterations.

    On a GPU a step of a small model is bound by host time, and the two launches with their
    Python cost about 0.2 ms (issue 2's benchmark). Here iteration ``t`` draws the block of
    iterations ``t0 .. t0 + K - 1`` with ``t0 = t - t mod K`` (:func:`block_steps`) in those two
    launches, and the later iterations of the block are views into it. The values are those of
    the one-iteration call (the counter-based streams do not depend on how they are batched), so
    a resumed run or one with another ``K`` draws the same noise. The result is a view into a
    cached block: use it out of place.
    """
    device = torch.device(device)
    rows = tuple(range(n_nodes)) if nodes is None else tuple(int(r) for r in nodes)
    key = (
        tuple(edge_keys) if sigma_cor > 0 else (),
        _checked_edges(edges, n_nodes)[0] if sigma_cor > 0 else b"",
        n_nodes,
        tuple(node_keys) if sigma_cdp > 0 else (),
        rows,
        size,
        float(sigma_cor),
        float(sigma_cdp),
        substream,
        str(device),
    )
    held = _PREFETCHED.get(key)
    if held is not None and 0 <= counter - held[0] < held[1].shape[0]:
        return held[1][counter - held[0]]
    streams = (len(edge_keys) if sigma_cor > 0 else 0) + (len(rows) if sigma_cdp > 0 else 0)
    k = block_steps(streams=streams, rows=len(rows), size=size)
    start = counter - counter % k
    k = min(k, 2**64 - start)
    block = fused_decor_noise(
        edge_keys,
        edges,
        n_nodes,
        node_keys,
        start,
        size,
        sigma_cor=sigma_cor,
        sigma_cdp=sigma_cdp,
        device=device,
        nodes=nodes,
        substream=substream,
        steps=k,
    )
    _PREFETCHED.pop(key, None)
    if len(_PREFETCHED) >= 4:  # a few concurrent callers (e.g. two runs in one process)
        _PREFETCHED.pop(next(iter(_PREFETCHED)))
    _PREFETCHED[key] = (start, block)
    return block[counter - start]
