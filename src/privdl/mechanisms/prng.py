"""Counter-based Gaussian streams keyed by a secret (DECOR Alg 1 line 3; docs/secrets.md s.2).

DECOR needs noise that two parties can regenerate bit-for-bit from a shared secret (the edge seed
s_ij of the paper, s.2) and that is *fresh at every iteration t* (the paper's "uncorrelated across
iterations"; the official code's reuse of one draw is a bug that voids its accounting,
docs/reproductions-decor.md). A counter-based generator gives both: the row for stream key ``k`` at
step ``t`` is a pure function of ``(k, t)``, so it does not depend on which other rows are generated
in the same call, on how nodes are sharded over processes, or on what was drawn before (no hidden
generator state to checkpoint).

Backends
--------
``"auto"`` (default): ``"aes-ziggurat"`` when the noise is made for a CPU tensor, ``"chacha20"``
    for a CUDA one (it has a GPU kernel). Runs record the backend they resolved; every party of a
    run must use the same one (a distributed run shares its device type, hence its backend).
``"aes-ziggurat"`` (interoperable, docs/secrets.md s.2.2, layout ``aes-ziggurat/v1``): AES-256-CTR
    keystream and the 256-layer ziggurat, compiled with numba; about 3x faster than ``"chacha20"``
    on a CPU. See :mod:`privdl.mechanisms.ziggurat`. On CUDA it is made on the CPU and copied.
``"chacha20"`` (interoperable, documented in docs/secrets.md, layout v2):
    keystream = ChaCha20 (RFC 8439 block function) with key = the 32-byte stream key, initial block
    counter 0 and the 96-bit nonce ``counter (8 bytes LE) || substream (4 bytes LE)``. A row of
    ``size`` normals uses m pairs (m = ceil(size / 2) rounded up to even) from the first 12 m
    keystream bytes: m little-endian uint64 words w_j (radius), then m little-endian int32 words
    s_j (angle). With k_j = w_j mod 2^52: u1_j = 1 - k_j 2^-52 in (0, 1] (exact in float64, then
    rounded to float32, which keeps the smallest value 2^-52 and so the tail radius 8.49),
    r_j = sqrt(-2 ln u1_j) and angle_j = s_j * (2 pi 2^-32) in [-pi, pi), in float32;
    x_j = r_j cos(angle_j), x_m+j = r_j sin(angle_j); the row is x_0..x_size-1 (float32).
    Exact layout: docs/secrets.md and :func:`keystream_to_normals`.
``"torch"``:
    a ``torch.Generator`` per stream on the target device, seeded with the first 8 bytes of
    SHA-256(label || key || counter || substream), then ``torch.randn`` in the requested dtype
    (float32 or float64; streams in parallel threads on the CPU). Same
    determinism contract within one torch version and one device type, but not interoperable.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from privdl.errors import PrivacyError
from privdl.mechanisms._pool import kernel_cpus, run_parallel
from privdl.mechanisms.ziggurat import ziggurat_rows

try:  # optional: a fused ChaCha20 kernel for CUDA devices
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None
    tl = None

__all__ = [
    "BACKENDS",
    "KEY_BYTES",
    "NormalBackend",
    "keystream",
    "keystream_to_normals",
    "normal_streams",
    "resolve_backend",
    "uniform_streams",
]

KEY_BYTES = 32
NormalBackend = Literal["auto", "aes-ziggurat", "chacha20", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "aes-ziggurat", "chacha20", "torch")
_TORCH_SEED_LABEL = b"privdl/normal-stream/torch-seed/v1"
_MAX_COUNTER = 2**64
_LOW52 = (1 << 52) - 1
_MAX_WORKERS = 8  # threads for the keystream (results do not depend on it)
_PARALLEL_BYTES = 1 << 22
_ONE_BITS = 0x3FF0000000000000  # IEEE-754 exponent bits of 1.0
_MAX_SUBSTREAM = 2**32
# ChaCha20 with a 32-bit block counter gives 2^32 blocks of 64 bytes per (key, nonce).
_MAX_STREAM_BYTES = 2**32 * 64


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, bytes | bytearray | memoryview) or len(key) != KEY_BYTES:
        raise PrivacyError(f"stream keys must be {KEY_BYTES} bytes; got {type(key).__name__}")
    return bytes(key)


def _check_keys(keys: Sequence[bytes]) -> Sequence[bytes]:
    """:func:`_check_key` for every key, without a Python call per key where they are all
    ``bytes`` of the right length (the usual case: hundreds of thousands of keys a step)."""
    if not keys or (set(map(type, keys)) == {bytes} and set(map(len, keys)) == {KEY_BYTES}):
        return keys
    return [_check_key(key) for key in keys]


def _nonce(counter: int, substream: int) -> bytes:
    """16-byte ChaCha20 IV for `cryptography`: 4-byte LE block counter 0, then the 96-bit nonce."""
    if not 0 <= counter < _MAX_COUNTER:
        raise PrivacyError(f"counter must be in [0, 2^64); got {counter}")
    if not 0 <= substream < _MAX_SUBSTREAM:
        raise PrivacyError(f"substream must be in [0, 2^32); got {substream}")
    return bytes(4) + counter.to_bytes(8, "little") + substream.to_bytes(4, "little")


def keystream(key: bytes, counter: int, n_bytes: int, *, substream: int = 0) -> bytes:
    """The raw ChaCha20 keystream of stream ``(key, counter, substream)``: ``n_bytes`` bytes."""
    if not 0 <= n_bytes <= _MAX_STREAM_BYTES:
        raise PrivacyError(f"a stream holds at most 2^38 bytes; asked for {n_bytes}")
    enc = Cipher(algorithms.ChaCha20(_check_key(key), _nonce(counter, substream)), mode=None)
    return enc.encryptor().update(bytes(n_bytes))


def row_pairs(size: int) -> int:
    """Number m of Box-Muller pairs a row of ``size`` normals uses: ceil(size / 2), made even."""
    return ((size + 1) // 2 + 1) // 2 * 2


def keystream_to_normals(raw: torch.Tensor, size: int) -> torch.Tensor:
    """Box-Muller on keystream rows (..., 12 m) uint8 -> float32 normals (..., size), layout v2.

    Bytes [0, 8m) of a row are m little-endian uint64 words: with k = w mod 2^52 the word is
    mapped exactly to the double f = 1 + k 2^-52 in [1, 2) by setting the exponent bits, and
    u1 = 2 - f in (0, 1] (exact), rounded to float32, gives the radius sqrt(-2 ln u1) (float32
    keeps u1's relative precision down to 2^-52, so the largest radius stays 8.49, as with a
    float64 transform; see docs/secrets.md). Bytes [8m, 12m) are m little-endian int32 words s;
    the angle is float32(s) * float32(2 pi 2^-32) in [-pi, pi). Output j < m is r_j cos(angle_j),
    output m + j is r_j sin(angle_j), in float32. The row's stride must be a multiple of 8 bytes.
    """
    m = raw.shape[-1] // 12
    if m == 0 or raw.numel() == 0:
        return torch.empty((*raw.shape[:-1], size), dtype=torch.float32, device=raw.device)
    if sys.byteorder != "little":  # the words are defined as little-endian
        raise PrivacyError("the chacha20 noise backend needs a little-endian machine")
    words = raw[..., : 8 * m].view(torch.int64)
    radius = (
        words.bitwise_and(_LOW52)
        .bitwise_or_(_ONE_BITS)
        .view(torch.float64)
        .neg_()
        .add_(2.0)
        .to(torch.float32)
        .log_()
        .mul_(-2.0)
        .sqrt_()
    )
    angle = raw[..., 8 * m : 12 * m].view(torch.int32).to(torch.float32).mul_(_ANGLE_STEP)
    out = torch.empty((*raw.shape[:-1], 2 * m), dtype=torch.float32, device=raw.device)
    torch.cos(angle, out=out[..., :m]).mul_(radius)
    torch.sin(angle, out=out[..., m:]).mul_(radius)
    return out[..., :size]


_ANGLE_STEP = 2.0 * math.pi * 2.0**-32  # rounded to float32 by the float32 multiply

if triton is not None:
    # ChaCha20 keystream on CUDA: the RFC 8439 block function, as OpenSSL computes it (tests check
    # the two bit for bit). One program writes BLOCK consecutive 64-byte blocks of one stream; the
    # nonce words are scalars, so no per-step state is copied to the GPU.

    @triton.jit
    def _rotl(x, r):
        return (x << r) | (x >> (32 - r))

    @triton.jit
    def _quarter(a, b, c, d):
        a = a + b
        d = _rotl(d ^ a, 16)
        c = c + d
        b = _rotl(b ^ c, 12)
        a = a + b
        d = _rotl(d ^ a, 8)
        c = c + d
        b = _rotl(b ^ c, 7)
        return a, b, c, d

    @triton.jit
    def _chacha20_kernel(
        key_ptr,
        out_ptr,
        n_blocks,
        n0,
        n1,
        n2,
        first_stream,
        n_streams,
        BLOCK: tl.constexpr,
        TILED: tl.constexpr = False,
    ):
        """RFC 8439 block function: stream ``first_stream + program_id(1)`` with key words
        ``key_ptr[s, 0:8]``, block counter = block index, nonce words ``(n0, n1, n2)``; BLOCK
        blocks per program. ``first_stream`` lets a caller cover more than the 65,535 programs
        CUDA allows on the second grid axis in several launches (:func:`stream_chunks`).

        A third grid axis makes consecutive iterations in one launch: program ``k`` of it
        writes iteration ``counter + k`` (the 64-bit counter is ``n1:n0``) into the ``k``-th
        ``(n_streams, n_blocks * 16)`` slab of ``out`` (the caller keeps ``counter + k < 2^64``).
        """
        stream = tl.program_id(1).to(tl.int64) + first_stream
        step = tl.program_id(2).to(tl.int64)
        block = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = block < n_blocks
        base = key_ptr + stream * 8
        zero = tl.zeros([BLOCK], dtype=tl.uint32)
        s0 = zero + 0x61707865  # "expand 32-byte k"
        s1 = zero + 0x3320646E
        s2 = zero + 0x79622D32
        s3 = zero + 0x6B206574
        s4 = tl.load(base + 0).to(tl.uint32, bitcast=True) + zero
        s5 = tl.load(base + 1).to(tl.uint32, bitcast=True) + zero
        s6 = tl.load(base + 2).to(tl.uint32, bitcast=True) + zero
        s7 = tl.load(base + 3).to(tl.uint32, bitcast=True) + zero
        s8 = tl.load(base + 4).to(tl.uint32, bitcast=True) + zero
        s9 = tl.load(base + 5).to(tl.uint32, bitcast=True) + zero
        s10 = tl.load(base + 6).to(tl.uint32, bitcast=True) + zero
        s11 = tl.load(base + 7).to(tl.uint32, bitcast=True) + zero
        s12 = block.to(tl.uint32)
        wide = tl.zeros([BLOCK], dtype=tl.int64)  # the nonce words may arrive as constants (1)
        low = wide + n0 + step  # counter + k, carried into the high word
        s13 = (low & 0xFFFFFFFF).to(tl.uint32)
        s14 = ((wide + n1 + (low >> 32)) & 0xFFFFFFFF).to(tl.uint32)
        s15 = (wide + n2).to(tl.uint32)
        x0, x1, x2, x3, x4, x5, x6, x7 = s0, s1, s2, s3, s4, s5, s6, s7
        x8, x9, x10, x11, x12, x13, x14, x15 = s8, s9, s10, s11, s12, s13, s14, s15
        for _ in range(10):
            x0, x4, x8, x12 = _quarter(x0, x4, x8, x12)
            x1, x5, x9, x13 = _quarter(x1, x5, x9, x13)
            x2, x6, x10, x14 = _quarter(x2, x6, x10, x14)
            x3, x7, x11, x15 = _quarter(x3, x7, x11, x15)
            x0, x5, x10, x15 = _quarter(x0, x5, x10, x15)
            x1, x6, x11, x12 = _quarter(x1, x6, x11, x12)
            x2, x7, x8, x13 = _quarter(x2, x7, x8, x13)
            x3, x4, x9, x14 = _quarter(x3, x4, x9, x14)
        slab = step * n_streams + stream
        offs = (slab * n_blocks + block.to(tl.int64)) * 16
        if TILED:
            # the 16 words of each block as one (BLOCK, 16) tile: a thread stores its block's
            # 64 contiguous bytes in wide stores instead of 16 scattered 4-byte ones. The same
            # bytes (tested in Triton's interpreter); not yet compiled or timed on a GPU
            # (benchmarks/bench_keystream.py, docs/gpu.md), so not the default
            tile = _tile16(
                x0 + s0, x1 + s1, x2 + s2, x3 + s3, x4 + s4, x5 + s5, x6 + s6, x7 + s7,
                x8 + s8, x9 + s9, x10 + s10, x11 + s11, x12 + s12, x13 + s13, x14 + s14,
                x15 + s15, BLOCK,
            )  # fmt: skip
            word = tl.arange(0, 16)
            tl.store(
                out_ptr + offs[:, None] + word[None, :],
                tile.to(tl.int32, bitcast=True),
                mask=inside[:, None],
            )
        else:  # the default, measured on H100/H200: 16 scattered 4-byte stores
            _store_words(out_ptr + offs, inside, x0 + s0, x1 + s1, x2 + s2, x3 + s3, x4 + s4,
                         x5 + s5, x6 + s6, x7 + s7, x8 + s8, x9 + s9, x10 + s10, x11 + s11,
                         x12 + s12, x13 + s13, x14 + s14, x15 + s15)  # fmt: skip

    @triton.jit
    def _store_words(out, inside, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13,
                     w14, w15):  # fmt: skip
        """Word k of each block at ``out + k``, one 4-byte store per word (64-byte stride)."""
        tl.store(out + 0, w0.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 1, w1.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 2, w2.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 3, w3.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 4, w4.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 5, w5.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 6, w6.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 7, w7.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 8, w8.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 9, w9.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 10, w10.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 11, w11.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 12, w12.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 13, w13.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 14, w14.to(tl.int32, bitcast=True), mask=inside)
        tl.store(out + 15, w15.to(tl.int32, bitcast=True), mask=inside)

    @triton.jit
    def _tile16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                BLOCK: tl.constexpr):  # fmt: skip
        """``T[b, w] = x_w[b]``: joins of words (k, k+8), then (k, k+4), (k, k+2), (k, k+1)
        give ``[b, i, j, l, m] = x_{8i + 4j + 2l + m}``, which reshapes row-major to (BLOCK, 16)."""
        a0, a1, a2, a3 = tl.join(x0, x8), tl.join(x1, x9), tl.join(x2, x10), tl.join(x3, x11)
        a4, a5, a6, a7 = tl.join(x4, x12), tl.join(x5, x13), tl.join(x6, x14), tl.join(x7, x15)
        b0, b1, b2, b3 = tl.join(a0, a4), tl.join(a1, a5), tl.join(a2, a6), tl.join(a3, a7)
        c0, c1 = tl.join(b0, b2), tl.join(b1, b3)
        return tl.reshape(tl.join(c0, c1), (BLOCK, 16))


def _triton_chacha20_kernel() -> Any:
    """The CUDA keystream kernel, or None where Triton is not installed."""
    return None if triton is None else _chacha20_kernel


def _chacha20_words_cuda(
    keys: Sequence[bytes], nonce: bytes, n_words: int, device: torch.device, kernel: Any
) -> torch.Tensor:
    """Keystream words (len(keys), n_words) as int64, generated on the GPU."""
    n_blocks = (n_words + 7) // 8
    key_words = np.frombuffer(b"".join(keys), dtype="<u4").reshape(len(keys), 8).view(np.int32)
    key_gpu = torch.from_numpy(key_words.copy()).to(device)
    out = torch.empty((len(keys), n_blocks * 16), dtype=torch.int32, device=device)
    block = 256
    words = np.frombuffer(nonce[4:], dtype="<u4").tolist()
    for first, count in stream_chunks(len(keys)):
        grid = (-(-n_blocks // block), count)
        kernel[grid](key_gpu, out, n_blocks, *words, first, len(keys), BLOCK=block)
    return out.view(torch.int64)[:, :n_words]


#: CUDA's limit on the second and third grid axes
MAX_GRID_YZ = 65535


def stream_chunks(count: int, limit: int | None = None) -> list[tuple[int, int]]:
    """``(first, size)`` launches covering ``count`` streams (rows) with at most ``limit``
    (default :data:`MAX_GRID_YZ`) programs each on the grid's second axis."""
    step = MAX_GRID_YZ if limit is None else int(limit)
    return [(s, min(step, count - s)) for s in range(0, count, step)]


def _openssl_keystreams(keys: Sequence[bytes], nonce: bytes, n_bytes: int) -> bytearray:
    """``n_bytes`` of ChaCha20 keystream per key (OpenSSL, one call per stream into its own
    slice of one buffer, in threads for large draws); at least 8 bytes long."""
    zeros = bytes(n_bytes)
    buffer = bytearray(max(len(keys) * n_bytes, 8))
    view = memoryview(buffer)

    def fill(k: int) -> None:
        encryptor = Cipher(algorithms.ChaCha20(keys[k], nonce), mode=None).encryptor()
        encryptor.update_into(zeros, view[k * n_bytes : (k + 1) * n_bytes])

    _in_threads(fill, len(keys), parallel=len(buffer) >= _PARALLEL_BYTES)
    return buffer


def _chacha20_normals(
    keys: Sequence[bytes], counter: int, size: int, substream: int, device: torch.device
) -> torch.Tensor:
    m = row_pairs(size)
    n_bytes = 12 * m
    if n_bytes > _MAX_STREAM_BYTES:
        raise PrivacyError(f"a stream holds at most 2^34 normals; asked for {size}")
    nonce = _nonce(counter, substream)
    on_gpu = device.type == "cuda" and keys and m < 2**29  # 32-bit offsets in a row
    kernel = _triton_chacha20_kernel() if on_gpu else None
    checked = [_check_key(key) for key in keys]
    if kernel is not None:
        words = _chacha20_words_cuda(checked, nonce, n_bytes // 8, device, kernel)
        return keystream_to_normals(words.view(torch.uint8), size)
    buffer = _openssl_keystreams(checked, nonce, n_bytes)
    raw = torch.frombuffer(buffer, dtype=torch.uint8)[: len(keys) * n_bytes]
    raw = raw.reshape(len(keys), n_bytes).to(device)  # Box-Muller runs where the data goes
    return keystream_to_normals(raw, size)


def _in_threads(fn: Any, count: int, *, parallel: bool) -> None:
    """``fn(k)`` for k < count, spread over the worker pool when ``parallel`` (the callees release
    the GIL)."""
    workers = min(count, _MAX_WORKERS, kernel_cpus())
    if not parallel or workers <= 1:
        for k in range(count):
            fn(k)
        return

    def chunk(j: int) -> None:
        for k in range(j, count, workers):
            fn(k)

    run_parallel(chunk, workers)


def _torch_seed(key: bytes, counter: int, substream: int) -> int:
    digest = hashlib.sha256(
        _TORCH_SEED_LABEL + _check_key(key) + _nonce(counter, substream)[4:]
    ).digest()
    return int.from_bytes(digest[:8], "little")


def _torch_normals(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    substream: int,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    out = torch.empty((len(keys), size), dtype=work, device=device)
    seeds = [_torch_seed(key, counter, substream) for key in keys]

    def fill(k: int) -> None:  # one generator per stream: rows do not depend on each other
        generator = torch.Generator(device=device).manual_seed(seeds[k])
        torch.randn(size, generator=generator, dtype=work, device=device, out=out[k])

    big = device.type == "cpu" and out.numel() * out.element_size() >= _PARALLEL_BYTES
    _in_threads(fill, len(keys), parallel=big)
    return out


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """The concrete backend ``backend`` names for noise made on ``device`` (``"auto"`` resolved)."""
    if backend not in BACKENDS:
        raise PrivacyError(
            f"unknown normal-stream backend {backend!r}; use one of {', '.join(BACKENDS)}"
        )
    if backend == "aes-ziggurat" and not _have_numba():
        raise PrivacyError("the aes-ziggurat noise backend needs numba (pip install numba)")
    if backend != "auto":
        return backend
    if torch.device(device).type == "cuda" or not _have_numba():
        return "chacha20"  # its Triton kernel on CUDA; the portable layout where numba is missing
    return "aes-ziggurat"


@functools.cache
def _have_numba() -> bool:
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def _ziggurat_normals(
    keys: Sequence[bytes], counter: int, size: int, substream: int, device: torch.device
) -> torch.Tensor:
    checked = _check_keys(keys)
    big = len(checked) * size * 4 >= _PARALLEL_BYTES
    workers = min(len(checked), _MAX_WORKERS, kernel_cpus()) if big else 1
    rows = ziggurat_rows(checked, counter, size, substream=substream, workers=workers)
    return torch.from_numpy(rows).to(device)


def normal_streams(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    substream: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    backend: NormalBackend = "auto",
) -> torch.Tensor:
    """Standard-normal rows, row k a pure function of ``(keys[k], counter, substream, backend)``.

    DECOR Alg 1 line 3 draws v_ij^(t) fresh at every t; use the iteration t as ``counter`` and the
    agreed edge secret (or a node's private noise key) as the stream key. ``substream`` separates
    several independent draws within one step (e.g. chunks). ``"auto"`` resolves by device
    (:func:`resolve_backend`). ``"aes-ziggurat"``: AES-256-CTR words and the ziggurat on the CPU
    (threads for large requests), float32 values, bit-identical on every machine (layout
    ``aes-ziggurat/v1``). ``"chacha20"``: the keystream is made by OpenSSL on the CPU (threads
    for large requests) or, on CUDA with Triton installed, by a fused kernel on the GPU (the same
    bits); Box-Muller runs on ``device`` in float32 (layout v2). CPU and CUDA results agree to a
    few float32 ulps (their libm differ) and are bit-identical on one device; the values are
    float32 numbers, cast to ``dtype``. ``"torch"``: ``torch.randn`` in ``dtype`` (float32 or
    float64) from a generator on ``device`` (CPU: Mersenne Twister; CUDA: Philox), so CPU and CUDA
    values differ entirely.

    Returns a tensor of shape ``(len(keys), size)``.
    """
    if size < 0:
        raise PrivacyError(f"size must be >= 0; got {size}")
    device = torch.device(device)
    backend = resolve_backend(backend, device)  # type: ignore[assignment]
    if backend == "aes-ziggurat":
        rows = _ziggurat_normals(keys, counter, size, substream, device)
    elif backend == "chacha20":
        rows = _chacha20_normals(keys, counter, size, substream, device)
    else:
        rows = _torch_normals(keys, counter, size, substream, device, dtype)
    return rows.to(dtype=dtype, device=device)


def uniform_streams(
    keys: Sequence[bytes],
    counter: int,
    size: int,
    *,
    substream: int = 0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Uniform rows on [0, 1), row k a pure function of ``(keys[k], counter, substream)``.

    The ChaCha20 keystream of the stream (the nonce of :func:`keystream`), read as ``size``
    little-endian uint64 words w; the value is ``(w >> 11) 2^-53``, exact in float64 (every
    multiple of 2^-53 in [0, 1) equally likely). What a federated client's Poisson sampling
    compares with its rate ``q_i``, from the client's own key (docs/security.md s.1).
    Returns ``(len(keys), size)`` float64 on ``device``.
    """
    if size < 0:
        raise PrivacyError(f"size must be >= 0; got {size}")
    if sys.byteorder != "little":  # the words are defined as little-endian
        raise PrivacyError("keyed uniform streams need a little-endian machine")
    n_bytes = 8 * size
    if n_bytes > _MAX_STREAM_BYTES:
        raise PrivacyError(f"a stream holds at most 2^35 uniforms; asked for {size}")
    checked = [_check_key(key) for key in keys]
    nonce = _nonce(counter, substream)
    buffer = _openssl_keystreams(checked, nonce, n_bytes)
    words = torch.frombuffer(buffer, dtype=torch.int64)[: len(checked) * size]
    top = words.reshape(len(checked), size).bitwise_right_shift(11).bitwise_and_((1 << 53) - 1)
    return top.to(torch.float64).mul_(2.0**-53).to(device)
