"""Counter-based Gaussian streams: interop with an independent ChaCha20, N(0, 1), independence."""

from __future__ import annotations

import hashlib
import math
import struct

import numpy as np
import pytest
import torch
from scipy import stats

from privdl.errors import PrivacyError
from privdl.mechanisms.prng import keystream, normal_streams

BACKENDS = ["aes-ziggurat", "chacha20", "torch"]


def _key(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


# --- independent oracle: RFC 8439 ChaCha20 block function in pure Python -------------------------
def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def _quarter(s: list[int], a: int, b: int, c: int, d: int) -> None:
    s[a] = (s[a] + s[b]) & 0xFFFFFFFF
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & 0xFFFFFFFF
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & 0xFFFFFFFF
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & 0xFFFFFFFF
    s[b] = _rotl(s[b] ^ s[c], 7)


def _chacha20_block(key: bytes, block_counter: int, nonce12: bytes) -> bytes:
    state = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
    state += list(struct.unpack("<8I", key)) + [block_counter]
    state += list(struct.unpack("<3I", nonce12))
    work = list(state)
    for _ in range(10):
        _quarter(work, 0, 4, 8, 12)
        _quarter(work, 1, 5, 9, 13)
        _quarter(work, 2, 6, 10, 14)
        _quarter(work, 3, 7, 11, 15)
        _quarter(work, 0, 5, 10, 15)
        _quarter(work, 1, 6, 11, 12)
        _quarter(work, 2, 7, 8, 13)
        _quarter(work, 3, 4, 9, 14)
    return struct.pack("<16I", *[(w + s) & 0xFFFFFFFF for w, s in zip(work, state, strict=True)])


def test_oracle_chacha20_matches_rfc8439_vector() -> None:
    # RFC 8439 s.2.3.2: key 00..1f, nonce 000000090000004a00000000, block counter 1.
    block = _chacha20_block(bytes(range(32)), 1, bytes.fromhex("000000090000004a00000000"))
    assert block[:16].hex() == "10f1e7e4d13b5915500fdd1fa32071c4"


def test_keystream_layout_matches_documented_nonce() -> None:
    key, counter, substream = _key("k"), 123456789012, 7
    nonce = counter.to_bytes(8, "little") + substream.to_bytes(4, "little")
    expected = _chacha20_block(key, 0, nonce) + _chacha20_block(key, 1, nonce)
    assert keystream(key, counter, 128, substream=substream) == expected


def _documented_normals(key: bytes, counter: int, size: int, substream: int = 0) -> np.ndarray:
    """docs/secrets.md s.2 (layout v2), from the raw keystream, one pair at a time in numpy."""
    half = (size + 1) // 2
    m = (half + 1) // 2 * 2  # pairs, rounded up to even
    raw = keystream(key, counter, 12 * m, substream=substream)
    words = struct.unpack(f"<{m}Q", raw[: 8 * m])
    angles = struct.unpack(f"<{m}i", raw[8 * m :])
    step = np.float32(2.0 * math.pi * 2.0**-32)
    out = np.zeros(2 * m, dtype=np.float32)
    for j in range(m):
        u1 = np.float32(1.0 - (words[j] % 2**52) * 2.0**-52)  # exact in float64, then rounded
        radius = np.sqrt(np.float32(-2.0) * np.log(u1))
        angle = np.float32(angles[j]) * step
        out[j] = radius * np.cos(angle)
        out[m + j] = radius * np.sin(angle)
    return out[:size]


@pytest.mark.parametrize("size", [1, 7, 8, 1001])
def test_normals_match_documented_box_muller(size: int) -> None:
    key, counter = _key("bm"), 42  # odd sizes: the last sine is dropped
    got = normal_streams([key], counter, size, dtype=torch.float32, backend="chacha20")[0].numpy()
    expected = _documented_normals(key, counter, size)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)  # libm ulps only


def test_tail_radius_keeps_52_bits() -> None:
    """u1 = 2^-52 (the smallest) survives the float32 rounding: the radius reaches 8.49."""
    from privdl.mechanisms.prng import keystream_to_normals

    m = 2
    word = (2**52 - 1).to_bytes(8, "little")  # k = 2^52 - 1 -> u1 = 2^-52
    raw = torch.frombuffer(bytearray(word * m + bytes(4 * m)), dtype=torch.uint8)[None]
    x = keystream_to_normals(raw, 2 * m)
    assert x[0, 0].item() == pytest.approx(math.sqrt(2 * 52 * math.log(2)), rel=1e-6)
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_standard_normal_ks_and_moments(backend: str) -> None:
    keys = [_key(f"stream{k}") for k in range(4)]
    x = normal_streams(keys, 3, 50_000, dtype=torch.float64, backend=backend).numpy().ravel()
    m = x.size
    assert stats.kstest(x, "norm").pvalue > 1e-3
    assert abs(x.mean()) < 5 / math.sqrt(m)
    assert abs(x.var() - 1.0) < 5 * math.sqrt(2 / m)
    tail = np.mean(np.abs(x) > 3.0)
    p3 = 2 * stats.norm.sf(3.0)
    assert abs(tail - p3) < 5 * math.sqrt(p3 * (1 - p3) / m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_independent_across_keys_and_counters(backend: str) -> None:
    size = 40_000
    keys = [_key("a"), _key("b")]
    now = normal_streams(keys, 10, size, dtype=torch.float64, backend=backend).numpy()
    later = normal_streams(keys, 11, size, dtype=torch.float64, backend=backend).numpy()
    bound = 5 / math.sqrt(size)
    assert abs(np.corrcoef(now[0], now[1])[0, 1]) < bound
    assert abs(np.corrcoef(now[0], later[0])[0, 1]) < bound
    assert not np.array_equal(now[0], later[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_key_and_counter_reproduces_bitwise(backend: str) -> None:
    keys = [_key("x"), _key("y")]
    first = normal_streams(keys, 5, 1001, dtype=torch.float64, backend=backend)
    second = normal_streams(keys, 5, 1001, dtype=torch.float64, backend=backend)
    assert torch.equal(first, second)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [1, 2, 17, 1000])
def test_row_does_not_depend_on_other_streams(backend: str, size: int) -> None:
    keys = [_key(f"s{k}") for k in range(7)]
    full = normal_streams(keys, 9, size, dtype=torch.float64, backend=backend)
    for subset in ([3], [6, 0], [2, 4, 5]):
        part = normal_streams(
            [keys[k] for k in subset], 9, size, dtype=torch.float64, backend=backend
        )
        assert torch.equal(part, full[subset])


def test_float32_is_the_cast_of_float64() -> None:
    keys = [_key("c")]
    x64 = normal_streams(keys, 1, 999, dtype=torch.float64)
    x32 = normal_streams(keys, 1, 999, dtype=torch.float32)
    assert x32.dtype == torch.float32
    assert torch.equal(x32, x64.to(torch.float32))


def test_substream_gives_a_different_independent_draw() -> None:
    key = [_key("sub")]
    a = normal_streams(key, 4, 20_000, dtype=torch.float64).numpy()[0]
    b = normal_streams(key, 4, 20_000, substream=1, dtype=torch.float64).numpy()[0]
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)


def test_empty_inputs_give_empty_tensors() -> None:
    assert normal_streams([], 0, 10).shape == (0, 10)
    assert normal_streams([_key("e")], 0, 0).shape == (1, 0)


@pytest.mark.parametrize(
    ("keys", "counter", "kwargs"),
    [
        ([b"short"], 0, {}),
        ([bytes(32)], -1, {}),
        ([bytes(32)], 2**64, {}),
        ([bytes(32)], 0, {"substream": 2**32}),
        ([bytes(32)], 0, {"backend": "philox"}),
    ],
)
def test_bad_inputs_raise_privacy_error(keys: list[bytes], counter: int, kwargs: dict) -> None:
    with pytest.raises(PrivacyError):
        normal_streams(keys, counter, 4, **kwargs)


def test_threaded_keystream_equals_serial_per_stream() -> None:
    keys = [_key(f"big{k}") for k in range(3)]
    size = 200_000  # 3 x 1.6 MB: the batched call takes the threaded path, single rows do not
    batched = normal_streams(keys, 2, size, dtype=torch.float64)
    for k, key in enumerate(keys):
        assert torch.equal(batched[k], normal_streams([key], 2, size, dtype=torch.float64)[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_keystream_is_bitwise_openssl_and_normals_agree() -> None:
    from privdl.mechanisms import prng

    kernel = prng._triton_chacha20_kernel()
    if kernel is None:
        pytest.skip("Triton is not installed")
    keys = [_key(f"gpu{k}") for k in range(5)]
    counter, substream = 2**40 + 3, 9
    nonce = bytes(4) + counter.to_bytes(8, "little") + substream.to_bytes(4, "little")
    for n_words in (1, 7, 8, 4097):
        words = prng._chacha20_words_cuda(keys, nonce, n_words, torch.device("cuda"), kernel)
        for k, key in enumerate(keys):
            expected = np.frombuffer(
                keystream(key, counter, 8 * n_words, substream=substream), "<i8"
            )  # fmt: skip
            assert np.array_equal(words[k].cpu().numpy(), expected)
    cpu = normal_streams(
        keys, counter, 10_001, substream=substream, dtype=torch.float64, backend="chacha20"
    )
    gpu = normal_streams(
        keys, counter, 10_001, substream=substream, dtype=torch.float64, device="cuda"
    )  # "auto" is chacha20 on CUDA
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-6)  # float32 libm ulps


def test_torch_backend_known_answer_and_whole_key_dependence():
    """docs/secrets.md's recipe for the "torch" backend, rebuilt from the text: seed = first 8
    bytes (LE) of SHA-256("privdl/normal-stream/torch-seed/v1" || key || t (8 LE) || s (4 LE)),
    then torch.randn; and every byte of the key matters (keys differing in the last byte differ)."""
    import hashlib

    key = bytes(range(32))
    t, s, size = 7, 3, 257
    digest = hashlib.sha256(
        b"privdl/normal-stream/torch-seed/v1"
        + key
        + t.to_bytes(8, "little")
        + s.to_bytes(4, "little")
    ).digest()
    want = torch.randn(
        size, generator=torch.Generator().manual_seed(int.from_bytes(digest[:8], "little")),
        dtype=torch.float64,
    )  # fmt: skip
    got = normal_streams([key], t, size, substream=s, dtype=torch.float64, backend="torch")[0]
    assert torch.equal(got, want)
    last = key[:-1] + bytes([key[-1] ^ 1])
    first = bytes([key[0] ^ 1]) + key[1:]
    rows = normal_streams([key, last, first], t, size, dtype=torch.float64, backend="torch")
    assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], rows[2])


def test_stream_chunks_cover_every_stream_once_within_the_limit() -> None:
    from privdl.mechanisms.prng import MAX_GRID_YZ, stream_chunks

    for count in (0, 1, 5, MAX_GRID_YZ, MAX_GRID_YZ + 1, 3 * 65536):
        chunks = stream_chunks(count)
        covered = [s for first, size in chunks for s in range(first, first + size)]
        assert covered == list(range(count))
        assert all(0 < size <= MAX_GRID_YZ for _, size in chunks)
    assert stream_chunks(10, limit=4) == [(0, 4), (4, 4), (8, 2)]
