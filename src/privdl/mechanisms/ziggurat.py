"""Keyed Gaussian streams by AES-256-CTR and the ziggurat method (noise backend ``"aes-ziggurat"``).

The CPU backend for DECOR's keyed noise (Alg 1 line 3; docs/secrets.md section 2.2) and every other
per-node Gaussian draw. Same contract as the ``"chacha20"`` backend of :mod:`privdl.mechanisms.prng`
(row k is a pure function of ``(key_k, counter, substream)``) at about a third of its cost: 4 bytes of
keystream per normal instead of 6, and a table lookup instead of log, sqrt, sin and cos.

Layout ``aes-ziggurat/v1`` (docs/secrets.md s.2.2):

* keystream: AES-256 in CTR mode (NIST SP 800-38A) with key = the 32-byte stream key and initial
  counter block ``counter (8 bytes LE) || substream (4 bytes LE) || 0 (4 bytes)``, incremented as a
  128-bit big-endian integer (the last 4 bytes count blocks; 2^32 blocks per stream);
* words: the keystream read as little-endian uint32 ``w_0, w_1, ...``, consumed in order;
* one normal (Marsaglia & Tsang 2000, 256 layers, r = 3.6541528853610088, v = 4.92867323399e-3):
  take ``w``; layer ``i = w & 255``, sign bit ``(w >> 8) & 1``, ``a = w >> 9`` (23 bits);
  ``x = float32(a) * W[i]`` (float32 multiply). If ``a < K[i]`` return ``+-x`` (98.9% of draws).
  Else if ``i == 0`` (the tail beyond r): repeat { take four words ``p, q, s, t``;
  ``U1 = (((p << 21) | (q >> 11)) + 0.5) 2^-53``, ``U2`` likewise from ``s, t``;
  ``e = -ln(U1) / r``; ``y = -ln(U2)`` } until ``2 y >= e^2`` and return ``+-float32(r + e)``.
  Else take one word ``u`` and accept ``+-x`` if ``F[i] + (u + 0.5) 2^-32 (F[i-1] - F[i]) <
  exp(-x^2 / 2)`` (float64, x widened from float32); otherwise start over with the next word.
  A row of ``size`` normals is the first ``size`` values.
* tables ``K`` (int32), ``W`` (float32), ``F`` (float64) are shipped
  (``resources/ziggurat256.npz``); :func:`compute_tables` re-derives them and the tests compare.

The 53-bit tail uniforms keep the tail exact down to 2^-53 (largest value about 13.7), unlike a
32-bit inversion that would cut it at 6.2 sigma (see docs/secrets.md on the delta this would
cost). Values are float32 numbers. The accept tests use float64 ``exp``/``log``; two libms that
differ by an ulp there can take different branches, with probability below 1e-15 per draw.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from functools import cache, lru_cache
from importlib import resources
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from privdl.errors import PrivacyError
from privdl.mechanisms import _aesni
from privdl.mechanisms._pool import run_parallel

__all__ = ["LAYERS", "R", "V", "aes_ctr_words", "compute_tables", "fill_rows", "ziggurat_rows"]

LAYERS = 256
R = 3.6541528853610088  # right edge of the base layer (Marsaglia & Tsang 2000, 256 layers)
V = 4.92867323399e-3  # area of every layer
_MANTISSA = 2.0**23  # a = w >> 9 has 23 bits
_MAX_BLOCKS = 2**32  # 32-bit block counter per (key, counter, substream)


def compute_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Marsaglia-Tsang recursion for the 256-layer tables ``(K, W, F)``.

    x_255 = r and x_{i-1} = sqrt(-2 ln(v / x_i + f(x_i))) with f(x) = exp(-x^2/2);
    W[i] = x_i / 2^23, K[i] = floor(x_{i-1} / x_i 2^23), F[i] = f(x_i); the base layer has width
    q = v / f(r): W[0] = q / 2^23, K[0] = floor(r / q 2^23), F[0] = 1; K[1] = 0 (the top layer is
    all wedge).
    """
    k = np.zeros(LAYERS, dtype=np.int64)
    w = np.zeros(LAYERS, dtype=np.float64)
    f = np.zeros(LAYERS, dtype=np.float64)
    x = R
    q = V / math.exp(-0.5 * R * R)
    k[0] = int(R / q * _MANTISSA)
    w[0] = q / _MANTISSA
    w[LAYERS - 1] = R / _MANTISSA
    f[0] = 1.0
    f[LAYERS - 1] = math.exp(-0.5 * R * R)
    for i in range(LAYERS - 2, 0, -1):
        below = x
        x = math.sqrt(-2.0 * math.log(V / x + math.exp(-0.5 * x * x)))
        k[i + 1] = int(x / below * _MANTISSA)
        f[i] = math.exp(-0.5 * x * x)
        w[i] = x / _MANTISSA
    return k.astype(np.int32), w.astype(np.float32), f


@cache
def tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shipped tables ``(K, W, F)`` (bit-exact on every machine, unlike a libm recomputation)."""
    with resources.files("privdl").joinpath("resources", "ziggurat256.npz").open("rb") as fh:
        data = np.load(fh)
        return (
            np.ascontiguousarray(data["K"], dtype=np.int32),
            np.ascontiguousarray(data["W"], dtype=np.float32),
            np.ascontiguousarray(data["F"], dtype=np.float64),
        )


def initial_block(counter: int, substream: int) -> bytes:
    """The 16-byte initial CTR block of stream ``(counter, substream)``."""
    if not 0 <= counter < 2**64:
        raise PrivacyError(f"counter must be in [0, 2^64); got {counter}")
    if not 0 <= substream < 2**32:
        raise PrivacyError(f"substream must be in [0, 2^32); got {substream}")
    return counter.to_bytes(8, "little") + substream.to_bytes(4, "little") + bytes(4)


def aes_ctr_words(
    key: bytes,
    block: bytes,
    n_words: int,
    out: np.ndarray | None = None,
    zeros: bytes | None = None,
) -> np.ndarray:
    """The first ``n_words`` little-endian uint32 keystream words of AES-256-CTR(key, block).

    ``out`` (at least ``n_words + 4`` words) and ``zeros`` (``4 n_words`` zero bytes) may be passed
    in to reuse buffers across streams.
    """
    if n_words > _MAX_BLOCKS * 4:
        raise PrivacyError(f"a stream holds at most 2^34 words; asked for {n_words}")
    if n_words <= _SMALL_WORDS:  # short rows: AES key setup would dominate, reuse it
        raw = _ecb_encryptor(key).update(_counter_blocks(block, -(-n_words // 4)))
        return np.frombuffer(raw, dtype="<u4")[:n_words].copy()
    if out is None or out.shape[0] < n_words + 4:
        out = np.empty(n_words + 4, dtype="<u4")  # update_into wants a block of headroom
    if zeros is None or len(zeros) != 4 * n_words:
        zeros = bytes(4 * n_words)
    encryptor = Cipher(algorithms.AES(key), modes.CTR(block)).encryptor()
    # numpy's stubs give ndarray __buffer__ only for Python >= 3.12 (3.11 has the protocol)
    encryptor.update_into(zeros, memoryview(out).cast("B"))  # type: ignore[arg-type]
    return out[:n_words]


#: Without AES-NI in the kernel (:mod:`privdl.mechanisms._aesni`), rows of up to this many normals
#: take :func:`ziggurat_rows_batched` (software AES in the compiled kernel, no Python per stream)
#: and longer ones one OpenSSL call per stream (AES-NI where the CPU has it, but not numba). The
#: values are the same either way; on the 2-core CPU the two cost the same near 500 normals a row
#: (9 us against 20-40 us a stream at 124 normals, 365 us against 90 us at 5000). With AES-NI in
#: the kernel every row is batched (faster than OpenSSL at 5000 normals too: docs/engine.md).
BATCHED_MAX_SIZE = 512


def batched(size: int) -> bool:
    """Whether rows of ``size`` normals are made by :func:`ziggurat_rows_batched`."""
    return size <= BATCHED_MAX_SIZE or _aesni.active()


_SMALL_WORDS = 4096  # up to here the keystream is AES-ECB of explicit counter blocks
_MAX_CACHED_KEYS = 4096
_local = threading.local()


def _ecb_encryptor(key: bytes) -> Any:
    """A per-thread, per-key AES-256-ECB encryptor (ECB has no state between calls)."""
    cache = getattr(_local, "ecb", None)
    if cache is None:
        cache = _local.ecb = {}
    encryptor = cache.get(key)
    if encryptor is None:
        if len(cache) >= _MAX_CACHED_KEYS:
            cache.clear()
        encryptor = cache[key] = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return encryptor


@lru_cache(maxsize=64)  # every stream of one call shares the nonce: built once per call
def _counter_blocks(block: bytes, n_blocks: int) -> bytes:
    """CTR's counter blocks 0..n_blocks-1: the 12-byte nonce of ``block``, then j (4 bytes BE)."""
    blocks = np.empty((n_blocks, 16), dtype=np.uint8)
    blocks[:, :12] = np.frombuffer(block[:12], dtype=np.uint8)
    blocks[:, 12:] = np.arange(n_blocks, dtype=">u4").view(np.uint8).reshape(n_blocks, 4)
    return blocks.tobytes()


def jit(fn: Any) -> Any:
    """``numba.njit(nogil=True, boundscheck=False)``, cached on disk where numba finds a writable
    cache directory; where it finds none (a read-only install without a home directory) numba
    refuses ``cache=True`` outright, and the kernel is compiled in memory on every start instead.
    """
    import numba

    try:
        return numba.njit(nogil=True, cache=True, boundscheck=False)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True, cache=False, boundscheck=False)(fn)


@cache
def _signed_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(K2, WS, F)``: K and W extended to 512 entries indexed by ``w & 511`` (layer and sign bit),
    with ``WS = [W, -W]``: ``float32(a) * -W[i]`` is exactly ``-(float32(a) * W[i])`` (IEEE
    rounding is symmetric), so the rectangle path needs no separate sign step."""
    k_tab, w_tab, f_tab = tables()
    k2 = np.ascontiguousarray(np.concatenate([k_tab, k_tab]), dtype=np.int32)
    ws = np.ascontiguousarray(np.concatenate([w_tab, -w_tab]), dtype=np.float32)
    return k2, ws, f_tab


@cache
def _kernel() -> Any:
    """The compiled row filler (numba, compiled once and cached on disk)."""

    @jit
    def fill(words, out, k2, ws, f_tab, r):  # type: ignore[no-untyped-def]
        n = out.shape[0]
        nw = words.shape[0]
        p = 0
        i = 0
        while i < n:
            m = min(n - i, nw - p)
            if m <= 0:
                return -1
            j = 0
            run_words = words[p : p + m]  # views: the run's loop then indexes from 0 (about
            run_out = out[i : i + m]  # 1.4x faster than words[p + j] on a 2-core EPYC VM)
            while j < m:  # a run of rectangle draws (98.9%): one compare, one multiply each
                word = np.int64(run_words[j])
                index = word & 511  # layer and sign bit: ws holds +-W
                a = np.int32(word >> 9)
                if a >= k2[index]:
                    break
                run_out[j] = np.float32(a) * ws[index]
                j += 1
            i += j
            p += j
            if j == m:
                continue
            word = np.int64(words[p])  # the run stopped at a word outside its rectangle
            p += 1
            layer = word & 255
            sign = np.float32(1 - ((word >> 7) & 2))
            if layer == 0:  # the tail beyond r
                while True:
                    if p + 4 > nw:
                        return -1
                    u1 = (np.int64(words[p]) << 21) | (np.int64(words[p + 1]) >> 11)
                    u2 = (np.int64(words[p + 2]) << 21) | (np.int64(words[p + 3]) >> 11)
                    p += 4
                    e = -math.log((u1 + 0.5) * 2.0**-53) / r
                    y = -math.log((u2 + 0.5) * 2.0**-53)
                    if y + y >= e * e:
                        break
                out[i] = np.float32(r + e) * sign
                i += 1
                continue
            if p >= nw:
                return -1
            x = np.float32(np.int32(word >> 9)) * ws[layer]  # the wedge
            u = (np.float64(words[p]) + 0.5) * 2.0**-32
            p += 1
            xd = np.float64(x)
            if f_tab[layer] + u * (f_tab[layer - 1] - f_tab[layer]) < math.exp(-0.5 * xd * xd):
                out[i] = x * sign
                i += 1
        return p  # the words read: the next row or block starts at words[p]

    return fill


def fill_rows(words: np.ndarray, out: np.ndarray) -> bool:
    """Ziggurat normals from ``words`` (uint32) into ``out`` (float32); False if words ran out."""
    return fill_count(words, out) >= 0


def fill_count(words: np.ndarray, out: np.ndarray) -> int:
    """:func:`fill_rows` returning how many words it read (-1 if they ran out): the state of a
    stream between two stretches of its normals is that count alone, so a row can be made in
    column blocks, each resuming at the word the previous one stopped at, with the same values."""
    k2, ws, f_tab = _signed_tables()
    return int(_kernel()(words, out, k2, ws, f_tab, R))


def _row_words(size: int) -> int:
    """Words generated up front for a row: 1.0226 are used per normal on average."""
    return size + size // 16 + 256


def ziggurat_rows(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    substream: int = 0,
    workers: int = 1,
    _words: int | None = None,
) -> np.ndarray:
    """Rows ``(len(keys), size)`` float32, row k the ``aes-ziggurat/v1`` stream of ``keys[k]``.

    Streams are dealt to ``workers`` threads (the kernel releases the GIL); each thread reuses one
    keystream buffer, so a row's words stay in cache between AES and the ziggurat. A row whose words
    run out (never seen in practice: the margin is many standard deviations) is redone from the
    start with twice the words, so the result never depends on the margin (``_words`` sets it, for
    tests).
    """
    if batched(size):
        return ziggurat_rows_batched(
            keys, counter, size, substream=substream, workers=workers, _words=_words
        )
    return _ziggurat_rows_openssl(
        keys, counter, size, substream=substream, workers=workers, _words=_words
    )


def _ziggurat_rows_openssl(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    substream: int = 0,
    workers: int = 1,
    _words: int | None = None,
) -> np.ndarray:
    """:func:`ziggurat_rows` with each stream's keystream from OpenSSL (AES-NI where the CPU has
    it): one cipher call per stream, the faster path for long rows."""
    block = initial_block(counter, substream)
    out = np.empty((len(keys), size), dtype=np.float32)
    first = _row_words(size) if _words is None else _words
    zeros = bytes(4 * first) if first > _SMALL_WORDS else None  # CTR input; short rows use ECB

    def run(start: int, step: int) -> None:
        buffer = np.empty(first + 4, dtype="<u4")
        for k in range(start, len(keys), step):
            n_words = first
            words = aes_ctr_words(keys[k], block, n_words, buffer, zeros)
            while not fill_rows(words, out[k]):
                n_words *= 2
                words = aes_ctr_words(keys[k], block, n_words)

    workers = max(1, min(workers, len(keys)))
    if workers == 1:
        run(0, 1)
    else:
        fill_rows(np.zeros(1, dtype=np.uint32), np.empty(0, dtype=np.float32))  # compile, once
        run_parallel(lambda j: run(j, workers), workers)
    return out


_fill_rows_jit: Any = None  # set by _batched_kernel


@cache
def _batched_kernel() -> Any:
    """The compiled filler of many rows at once: per row, the AES-256 key schedule and the CTR
    keystream (:mod:`privdl.mechanisms._aes`) are made inside the kernel and fed to the row filler
    of :func:`_kernel`, so a call costs no Python per stream."""
    global _fill_rows_jit
    _fill_rows_jit = _kernel()  # a module global, not a closure: numba then caches ``rows``

    @jit
    def rows(keys, nonce, out, sbox, te, k2, ws, f_tab, r, first, start, stop):  # type: ignore[no-untyped-def]
        rk = np.empty(60, dtype=np.int64)
        cap = ((first + 3) // 4) * 4
        buf = np.empty(cap, dtype=np.uint32)
        n0 = np.int64(nonce[0])
        n1 = np.int64(nonce[1])
        n2 = np.int64(nonce[2])
        for k in range(start, stop):
            for i in range(8):  # FIPS 197 s.5.2, Nk = 8
                rk[i] = (
                    (np.int64(keys[k, 4 * i]) << 24)
                    | (np.int64(keys[k, 4 * i + 1]) << 16)
                    | (np.int64(keys[k, 4 * i + 2]) << 8)
                    | np.int64(keys[k, 4 * i + 3])
                )
            rcon = np.int64(1)
            for i in range(8, 60):
                t = rk[i - 1]
                if i % 8 == 0:
                    t = ((t << 8) | (t >> 24)) & 0xFFFFFFFF
                    t = (
                        (sbox[t >> 24] << 24)
                        | (sbox[(t >> 16) & 255] << 16)
                        | (sbox[(t >> 8) & 255] << 8)
                        | sbox[t & 255]
                    ) ^ (rcon << 24)
                    rcon = rcon << 1
                    if rcon & 0x100:
                        rcon ^= 0x11B
                elif i % 8 == 4:
                    t = (
                        (sbox[t >> 24] << 24)
                        | (sbox[(t >> 16) & 255] << 16)
                        | (sbox[(t >> 8) & 255] << 8)
                        | sbox[t & 255]
                    )
                rk[i] = rk[i - 8] ^ t
            n_words = first
            made = 0  # blocks of keystream in buf
            while True:
                blocks = (n_words + 3) // 4
                if 4 * blocks > buf.shape[0]:
                    grown = np.empty(4 * blocks, dtype=np.uint32)
                    grown[: 4 * made] = buf[: 4 * made]
                    buf = grown
                for j in range(made, blocks):  # block j = AES(nonce || j), FIPS 197 s.5.1
                    s0 = n0 ^ rk[0]
                    s1 = n1 ^ rk[1]
                    s2 = n2 ^ rk[2]
                    s3 = np.int64(j) ^ rk[3]
                    for rd in range(1, 14):
                        b = 4 * rd
                        t0 = te[0, s0 >> 24] ^ te[1, (s1 >> 16) & 255] ^ te[2, (s2 >> 8) & 255]
                        t0 ^= te[3, s3 & 255] ^ rk[b]
                        t1 = te[0, s1 >> 24] ^ te[1, (s2 >> 16) & 255] ^ te[2, (s3 >> 8) & 255]
                        t1 ^= te[3, s0 & 255] ^ rk[b + 1]
                        t2 = te[0, s2 >> 24] ^ te[1, (s3 >> 16) & 255] ^ te[2, (s0 >> 8) & 255]
                        t2 ^= te[3, s1 & 255] ^ rk[b + 2]
                        t3 = te[0, s3 >> 24] ^ te[1, (s0 >> 16) & 255] ^ te[2, (s1 >> 8) & 255]
                        t3 ^= te[3, s2 & 255] ^ rk[b + 3]
                        s0, s1, s2, s3 = t0, t1, t2, t3
                    for c in range(4):  # last round: SubBytes, ShiftRows, AddRoundKey
                        if c == 0:
                            a0, a1, a2, a3 = s0, s1, s2, s3
                        elif c == 1:
                            a0, a1, a2, a3 = s1, s2, s3, s0
                        elif c == 2:
                            a0, a1, a2, a3 = s2, s3, s0, s1
                        else:
                            a0, a1, a2, a3 = s3, s0, s1, s2
                        v = (
                            (sbox[a0 >> 24] << 24)
                            | (sbox[(a1 >> 16) & 255] << 16)
                            | (sbox[(a2 >> 8) & 255] << 8)
                            | sbox[a3 & 255]
                        ) ^ rk[56 + c]
                        # the keystream bytes read as a little-endian word
                        buf[4 * j + c] = np.uint32(
                            ((v >> 24) & 255)
                            | (((v >> 16) & 255) << 8)
                            | (((v >> 8) & 255) << 16)
                            | ((v & 255) << 24)
                        )
                made = blocks
                if _fill_rows_jit(buf[:n_words], out[k], k2, ws, f_tab, r) >= 0:
                    break
                n_words *= 2

    return rows


@cache
def ctr_blocks_kernel() -> Any:
    """numba (AES-NI): ``ctr_blocks(rk, nonce_lo, nonce_hi, first, start, stop, buf)`` writes the
    keystream blocks ``first + j`` for ``start <= j < stop`` to ``buf[2 j], buf[2 j + 1]``: block J
    is AES-256 under the round keys ``rk`` of ``nonce || J``, J big-endian in the last 4 bytes
    (the layout's initial counter block plus J). Read as little-endian uint32 the halves are the
    keystream's words in order. Shared by the batched rows and the streamed DECOR draw."""
    from privdl.mechanisms._aesni import intrinsics

    global _expand_key, _encrypt_block
    _expand_key, _encrypt_block = intrinsics()

    @jit
    def ctr_blocks(rk, nonce_lo, nonce_hi, first, start, stop, buf):  # type: ignore[no-untyped-def]
        byte = np.uint64(255)
        for j in range(start, stop):
            u = np.uint64(first + j)
            swapped = (
                ((u & byte) << np.uint64(56))
                | (((u >> np.uint64(8)) & byte) << np.uint64(48))
                | (((u >> np.uint64(16)) & byte) << np.uint64(40))
                | (((u >> np.uint64(24)) & byte) << np.uint64(32))
            )
            buf[2 * j], buf[2 * j + 1] = _encrypt_block(rk, nonce_lo, nonce_hi | swapped)

    return ctr_blocks


@cache
def _batched_kernel_aesni() -> Any:
    """:func:`_batched_kernel` with AES-256 by the CPU's AES instructions
    (:mod:`privdl.mechanisms._aesni`): the same keystream words, the same filler."""
    global _fill_rows_jit, _ctr_blocks
    _fill_rows_jit = _kernel()
    _ctr_blocks = ctr_blocks_kernel()  # sets _expand_key too

    @jit
    def rows(keys, nonce_lo, nonce_hi, out, k2, ws, f_tab, r, first, start, stop):  # type: ignore[no-untyped-def]
        rk = np.empty(30, dtype=np.uint64)
        buf = np.empty((first + 3) // 4 * 2, dtype=np.uint64)  # block j: buf[2 j], buf[2 j + 1]
        for k in range(start, stop):
            _expand_key(keys[k, 0], keys[k, 1], keys[k, 2], keys[k, 3], rk)
            n_words = first
            made = 0
            while True:
                blocks = (n_words + 3) // 4
                if 2 * blocks > buf.shape[0]:
                    grown = np.empty(2 * blocks, dtype=np.uint64)
                    grown[: 2 * made] = buf[: 2 * made]
                    buf = grown
                _ctr_blocks(rk, nonce_lo, nonce_hi, 0, made, blocks, buf)
                made = blocks
                # little-endian uint64 halves read as uint32 words: the keystream's words in order
                if _fill_rows_jit(buf.view(np.uint32)[:n_words], out[k], k2, ws, f_tab, r) >= 0:
                    break
                n_words *= 2

    return rows


# set by _batched_kernel_aesni (module globals: numba then caches rows). numba's disk cache of
# ``rows`` is keyed by this file only: after editing the intrinsics in _aesni.py, clear it
# (``__pycache__/ziggurat.*.nbi|nbc``) or the old code keeps running.
_expand_key: Any = None
_encrypt_block: Any = None
_ctr_blocks: Any = None  # set by _batched_kernel_aesni


def _batched_words(size: int) -> int:
    """Words made up front per row by the batched kernel (more are made only where a row needs
    them, which changes no value): 1.0226 are used per normal on average."""
    return size + size // 16 + 16


def ziggurat_rows_batched(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    substream: int = 0,
    workers: int = 1,
    _words: int | None = None,
) -> np.ndarray:
    """:func:`ziggurat_rows` with the AES inside the compiled kernel (the same values bit for
    bit: the same keystream, consumed by the same filler); rows are split over ``workers``
    threads in contiguous ranges."""
    key_array = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 32)
    return key_array_rows(key_array, counter, size, substream=substream, workers=workers,
                          _words=_words)  # fmt: skip


def key_array_rows(
    key_array: np.ndarray,
    counter: int,
    size: int,
    *,
    substream: int = 0,
    workers: int = 1,
    _words: int | None = None,
) -> np.ndarray:
    """:func:`ziggurat_rows_batched` for keys already laid out as a ``(K, 32)`` uint8 array (a
    caller drawing from the same keys at every step prepares it once)."""
    block = initial_block(counter, substream)
    out = np.empty((len(key_array), size), dtype=np.float32)
    if not len(key_array) or not size:
        return out
    keys = key_array
    nonce = np.frombuffer(block[:12], dtype=">u4").astype(np.int64)
    sbox, te = _aes_tables64()
    k2, ws, f_tab = _signed_tables()
    first = max(4, _batched_words(size) if _words is None else _words)
    workers = max(1, min(workers, len(keys)))
    bounds = np.linspace(0, len(keys), workers + 1).astype(np.int64)
    args: tuple[Any, ...]
    if _aesni.active():
        kernel = _batched_kernel_aesni()
        halves = np.frombuffer(block, dtype="<u8").astype(np.uint64)  # the block's two halves
        words = np.ascontiguousarray(key_array, dtype=np.uint8).view("<u8").astype(np.uint64)
        args = (words, halves[0], halves[1], out, k2, ws, f_tab, R, first)
    else:
        kernel = _batched_kernel()
        args = (key_array, nonce, out, sbox, te, k2, ws, f_tab, R, first)
    run_parallel(lambda j: kernel(*args, bounds[j], bounds[j + 1]), workers)
    return out


@cache
def _aes_tables64() -> tuple[np.ndarray, np.ndarray]:
    from privdl.mechanisms._aes import aes256_tables

    sbox, te = aes256_tables()
    return sbox.astype(np.int64), np.ascontiguousarray(te.astype(np.int64))
