"""DECOR's CPU noise drawn and combined column block by column block, in cache (AES-NI only).

The two-stage CPU path of :func:`privdl.mechanisms.correlated.decor_noise` first writes every
stream's row of normals (``aes-ziggurat/v1``, :mod:`privdl.mechanisms.ziggurat`) and then sums
them into the nodes' rows (the signed-sum kernel of :mod:`privdl.mechanisms.correlated`). For the
MNIST MLP on the 4x4 torus that is 48 rows of 101,770 normals: 19.5 MB written and read back each
step, which on the 2-core machine cost the step as much in memory traffic as in arithmetic, and
slowed the gradients running beside it.

Here one thread makes the whole draw in blocks of columns: for each block, the next stretch of
every stream (its AES-256-CTR words generated from the block counter where the stream stopped,
then the ziggurat filler resumed at that word), then the signed sum of those stretches into the
block of the output. The stretches stay in L2; only the output is written to memory.

The values are those of the two-stage path bit for bit: a stream's state between two stretches
is the index of the next unread word (:func:`privdl.mechanisms.ziggurat.fill_count`), the CTR
keystream is addressable by block, and the sum does the same float ops in the same order per
element. Tested against the two-stage path (``tests/mechanisms/test_correlated.py``).

numba's disk cache of the kernel is keyed by this file: after editing the filler or
``ctr_blocks`` in ``ziggurat.py`` or the intrinsics in ``_aesni.py``, clear
``__pycache__/_streamed.*.nbi|nbc``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from privdl.mechanisms import ziggurat
from privdl.mechanisms.ziggurat import R, initial_block, jit

__all__ = ["BLOCK_COLUMNS", "streamed_decor_rows", "sum_rows_kernel"]

#: columns per block: 48 streams x 2048 float32 is 393 KB, within a core's L2
BLOCK_COLUMNS = 2048

# module globals, not closures: numba then caches ``streamed`` (set by _kernel)
_fill: Any = None
_expand_key: Any = None
_ctr_blocks: Any = None
_sum_rows: Any = None


@cache
def sum_rows_kernel() -> Any:
    """numba: ``sum_rows(z, zc, indptr, slot_edge, slot_sign, use_cor, cor_scale, node_first,
    cdp_scale, out, c, m)`` sets ``out[r, c:c+m]`` to ``cor_scale * (sum over row r's slots, in
    order, of sign * z[edge, zc:zc+m])`` when ``use_cor``, plus ``cdp_scale * z[node_first + r,
    zc:zc+m]`` when ``node_first >= 0``: float ops in this order, never fused into an FMA, the
    values of the composed torch ops (``correlated_noise + independent_noise``). The signed sum
    of both CPU paths: the two-stage kernel of :mod:`privdl.mechanisms.correlated` and this
    module's (both compile it in: after editing it, clear their numba caches too)."""
    from privdl.mechanisms.ziggurat import jit

    @jit
    def sum_rows(  # type: ignore[no-untyped-def]
        z, zc, indptr, slot_edge, slot_sign, use_cor, cor_scale, node_first, cdp_scale, out, c, m
    ):
        for r in range(out.shape[0]):
            row = out[r, c : c + m]
            if use_cor:
                row[:] = 0.0
                for k in range(indptr[r], indptr[r + 1]):
                    src = z[slot_edge[k], zc : zc + m]
                    if slot_sign[k] > 0:
                        for j in range(m):
                            row[j] = row[j] + src[j]
                    else:
                        for j in range(m):
                            row[j] = row[j] - src[j]
                for j in range(m):
                    row[j] = row[j] * cor_scale
            if node_first >= 0:
                own = z[node_first + r, zc : zc + m]
                if use_cor:
                    for j in range(m):
                        row[j] = row[j] + own[j] * cdp_scale
                else:
                    for j in range(m):
                        row[j] = own[j] * cdp_scale

    return sum_rows


@cache
def _kernel() -> Any:
    global _fill, _expand_key, _ctr_blocks, _sum_rows
    from privdl.mechanisms._aesni import intrinsics

    _fill = ziggurat._kernel()
    _sum_rows = sum_rows_kernel()
    _ctr_blocks = ziggurat.ctr_blocks_kernel()
    _expand_key, _ = intrinsics()

    @jit
    def streamed(  # type: ignore[no-untyped-def]
        keys, nonce_lo, nonce_hi, k2, ws, f_tab, r, indptr, slot_edge, slot_sign,
        use_cor, cor_scale, node_first, cdp_scale, out, block, extra,
    ):  # fmt: skip
        n_streams = keys.shape[0]
        size = out.shape[1]
        rk = np.empty((n_streams, 30), dtype=np.uint64)
        for s in range(n_streams):
            _expand_key(keys[s, 0], keys[s, 1], keys[s, 2], keys[s, 3], rk[s])
        pos = np.zeros(n_streams, dtype=np.int64)  # each stream's next unread word
        z = np.empty((n_streams, block), dtype=np.float32)
        buf = np.empty(2 * ((block + block // 16 + max(extra, 0) + 16) // 4 + 2), dtype=np.uint64)
        for b0 in range(0, size, block):
            m = min(block, size - b0)
            for s in range(n_streams):  # the next m normals of stream s
                need = max(1, m + m // 16 + extra)
                while True:
                    first = pos[s] >> 2  # CTR block holding the next word
                    skip = pos[s] & 3
                    blocks = (skip + need + 3) // 4
                    if 2 * blocks > buf.shape[0]:
                        buf = np.empty(2 * blocks, dtype=np.uint64)
                    _ctr_blocks(rk[s], nonce_lo, nonce_hi, first, 0, blocks, buf)
                    words = buf.view(np.uint32)[skip : skip + need]
                    used = _fill(words, z[s, :m], k2, ws, f_tab, r)
                    if used >= 0:
                        pos[s] += used
                        break
                    need *= 2  # the words ran out: redo the stretch with more (same values)
            _sum_rows(  # the nodes' rows of this block from the streams' stretches
                z, 0, indptr, slot_edge, slot_sign, use_cor, cor_scale, node_first, cdp_scale,
                out, b0, m,
            )  # fmt: skip

    return streamed


def streamed_decor_rows(
    key_array: np.ndarray,
    counter: int,
    out: np.ndarray,
    slots: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    use_cor: bool,
    cor_scale: float,
    node_first: int,
    cdp_scale: float,
    block: int = BLOCK_COLUMNS,
    _extra_words: int = 64,
) -> None:
    """Fill ``out`` ``(rows, size)`` (float32 or float64) with DECOR's noise from the streams
    ``key_array`` ``(K, 32)`` at step ``counter``, in one thread (call only where
    :func:`privdl.mechanisms._aesni.active`).

    ``slots`` and the scalars are those of the signed-sum kernel of
    :mod:`privdl.mechanisms.correlated`: row r is ``cor_scale * sum_k sign_k z[slot_edge_k]`` over
    its slots, plus ``cdp_scale * z[node_first + r]`` when ``node_first >= 0``. Each stretch of
    ``m`` normals is first tried with ``m + m // 16 + _extra_words`` words and redone with twice
    as many if they run out, which changes no value (tests shrink the margin to force it).
    """
    indptr, slot_edge, sign = slots
    if not out.size or not len(key_array):
        return
    halves = np.frombuffer(initial_block(counter, 0), dtype="<u8").astype(np.uint64)
    words = np.ascontiguousarray(key_array, dtype=np.uint8).view("<u8").astype(np.uint64)
    k2, ws, f_tab = ziggurat._signed_tables()
    kind = out.dtype.type  # the multiplies happen in the working dtype
    _kernel()(
        words, halves[0], halves[1], k2, ws, f_tab, R, indptr, slot_edge, sign,
        use_cor, kind(cor_scale), node_first, kind(cdp_scale), out, max(16, int(block)),
        int(_extra_words),
    )  # fmt: skip
