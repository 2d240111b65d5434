"""The ``aes-ziggurat`` noise streams against independent oracles.

Oracles: the Marsaglia-Tsang recursion and its area identities (tables); AES-ECB applied to the
documented counter blocks (keystream); a one-sample pure-Python ziggurat written from the layout in
docs/secrets.md (values, bit for bit); the normal distribution's closed forms (KS, tail mass,
moments).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from privdl.errors import PrivacyError
from privdl.mechanisms import ziggurat as zig
from privdl.mechanisms.prng import normal_streams, resolve_backend


def _key(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def _ecb_words(key: bytes, counter: int, substream: int, n_words: int) -> np.ndarray:
    """Keystream from the documented counter blocks, one AES-ECB block at a time."""
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    blocks = [
        counter.to_bytes(8, "little") + substream.to_bytes(4, "little") + j.to_bytes(4, "big")
        for j in range(-(-n_words // 4))
    ]
    raw = ecb.update(b"".join(blocks))
    return np.frombuffer(raw, dtype="<u4")[:n_words].astype(np.int64)


def _reference(words: np.ndarray, size: int) -> tuple[list[float], int]:
    """One sample at a time, as docs/secrets.md s.2.2 states it; returns (values, words used)."""
    k_tab, w_tab, f_tab = zig.tables()
    out: list[float] = []
    p = 0

    def take() -> int:
        nonlocal p
        word = int(words[p])
        p += 1
        return word

    while len(out) < size:
        w = take()
        layer, sign, a = w & 255, (w >> 8) & 1, w >> 9
        x = np.float32(a) * w_tab[layer]
        if a < k_tab[layer]:
            out.append(float(-x if sign else x))
            continue
        if layer == 0:
            while True:
                u1 = ((take() << 21) | (take() >> 11)) + 0.5
                u2 = ((take() << 21) | (take() >> 11)) + 0.5
                e = -math.log(u1 * 2.0**-53) / zig.R
                y = -math.log(u2 * 2.0**-53)
                if y + y >= e * e:
                    break
            v = np.float32(zig.R + e)
            out.append(float(-v if sign else v))
            continue
        u = (take() + 0.5) * 2.0**-32
        if f_tab[layer] + u * (f_tab[layer - 1] - f_tab[layer]) < math.exp(-0.5 * float(x) ** 2):
            out.append(float(-x if sign else x))
    return out, p


def test_shipped_tables_equal_the_recursion_and_its_area_identities() -> None:
    k_ship, w_ship, f_ship = zig.tables()
    k, w, f = zig.compute_tables()
    assert np.abs(k_ship.astype(np.int64) - k).max() <= 1  # floor of a ratio: libm may move it
    np.testing.assert_allclose(w_ship, w, rtol=2e-7)
    np.testing.assert_allclose(f_ship, f, rtol=1e-13)
    # every layer has area v: x_i (f(x_{i-1}) - f(x_i)) = v, the base q f(r) = v
    x = w.astype(np.float64) * 2.0**23  # x_i for i >= 1 (float32-rounded widths)
    areas = x[2:] * (f[1:-1] - f[2:])
    np.testing.assert_allclose(areas, zig.V, rtol=1e-6)
    assert x[0] * math.exp(-0.5 * zig.R**2) == pytest.approx(zig.V, rel=1e-6)
    # the top layer closes the recursion (r and v are a matched pair)
    assert x[1] * (1.0 - f[1]) == pytest.approx(zig.V, rel=1e-6)
    assert (k[2:] < 2**23).all() and k[1] == 0


@pytest.mark.parametrize("n_words", [1, 5, 1001, 4096, 4097, 10_001])
def test_keystream_words_equal_documented_counter_blocks(n_words: int) -> None:
    """Both code paths (cached ECB of counter blocks for short rows, CTR for long ones) against
    OpenSSL's CTR mode and a block-by-block ECB rendering of the documented counter blocks."""
    key, block = _key("ctr"), zig.initial_block(2**40 + 3, 7)
    got = zig.aes_ctr_words(key, block, n_words)
    ctr = Cipher(algorithms.AES(key), modes.CTR(block)).encryptor().update(bytes(4 * n_words))
    np.testing.assert_array_equal(got, np.frombuffer(ctr, dtype="<u4"))
    np.testing.assert_array_equal(got.astype(np.int64), _ecb_words(key, 2**40 + 3, 7, n_words))


@pytest.mark.parametrize("size", [1, 2, 17, 30_000])
def test_rows_equal_the_one_sample_reference_bitwise(size: int) -> None:
    key, counter, substream = _key(f"ref{size}"), 11, 3
    got = zig.ziggurat_rows([key], counter, size, substream=substream)[0]
    words = _ecb_words(key, counter, substream, 2 * size + 64)
    expected, _ = _reference(words, size)
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float32))


def _word(layer: int, sign: int, a: int) -> int:
    return layer | (sign << 8) | (a << 9)


def test_every_branch_on_crafted_words_matches_the_reference() -> None:
    k_tab, _, f_tab = zig.tables()
    top = 2**23 - 1
    words = [
        _word(5, 0, 3),  # rectangle
        _word(5, 1, 3),  # rectangle, negative
        _word(0, 1, top),  # tail: beyond the base layer's rectangle part
        2**31,
        0,
        5,
        0,  # tail uniforms: U1 = 1/2, U2 tiny -> y large -> accepted
        _word(200, 0, top),  # wedge of layer 200 ...
        0,  # ... with u ~ 0: y at the layer's bottom, under the curve -> accepted
        _word(1, 0, top),  # top layer (K[1] = 0, all wedge), x = x_1 ...
        2**32 - 1,  # ... u ~ 1: y = f(0) = 1 > f(x_1) -> rejected, start over
        _word(3, 1, 0),  # rectangle at a = 0: -0.0
        _word(255, 0, int(k_tab[255]) - 1),  # last value inside the bottom rectangle
    ]
    assert f_tab[1] < 1.0
    arr = np.asarray(words, dtype=np.uint32)
    expected, used = _reference(arr.astype(np.int64), 6)
    assert used == len(words)
    out = np.empty(6, dtype=np.float32)
    assert zig.fill_rows(arr, out)
    np.testing.assert_array_equal(out, np.asarray(expected, dtype=np.float32))
    assert out[2] < -zig.R  # the tail value
    assert not zig.fill_rows(arr[:-1], np.empty(6, dtype=np.float32))  # words ran out


def test_result_does_not_depend_on_margin_or_threads() -> None:
    keys = [_key(f"m{k}") for k in range(5)]
    full = zig.ziggurat_rows(keys, 4, 5000)
    np.testing.assert_array_equal(full, zig.ziggurat_rows(keys, 4, 5000, _words=7))
    np.testing.assert_array_equal(full, zig.ziggurat_rows(keys, 4, 5000, workers=3))
    np.testing.assert_array_equal(full[2:4], zig.ziggurat_rows(keys[2:4], 4, 5000))


def test_distribution_matches_the_standard_normal() -> None:
    x = zig.ziggurat_rows([_key(f"d{k}") for k in range(4)], 0, 500_000).astype(np.float64)
    x = x.ravel()
    n = x.size
    assert stats.kstest(x, "norm").pvalue > 1e-3
    tail = 2 * stats.norm.sf(zig.R)  # mass the tail algorithm must produce
    hits = np.count_nonzero(np.abs(x) > zig.R)
    assert abs(hits - n * tail) < 5 * math.sqrt(n * tail)
    for cut in (1.0, 2.0, 3.0):  # central masses across layers
        mass = 2 * stats.norm.sf(cut)
        assert abs(np.mean(np.abs(x) > cut) - mass) < 5 * math.sqrt(mass / n)
    assert abs(x.mean()) < 5 / math.sqrt(n)
    assert abs(x.var() - 1.0) < 5 * math.sqrt(2 / n)
    assert abs(np.mean(x**4) - 3.0) < 5 * math.sqrt(96 / n)


def test_normal_streams_backend_and_auto_resolution() -> None:
    keys = [_key("a"), _key("b")]
    rows = normal_streams(keys, 9, 333, dtype=torch.float64, backend="aes-ziggurat")
    np.testing.assert_array_equal(rows.numpy(), zig.ziggurat_rows(keys, 9, 333))
    assert torch.equal(normal_streams(keys, 9, 333, dtype=torch.float64), rows)  # auto on CPU
    assert resolve_backend("auto", "cpu") == "aes-ziggurat"
    assert resolve_backend("auto", torch.device("cuda")) == "chacha20"  # its GPU kernel
    assert resolve_backend("torch", "cuda") == "torch"
    with pytest.raises(PrivacyError, match="unknown normal-stream backend"):
        resolve_backend("philox", "cpu")
    with pytest.raises(PrivacyError, match="counter"):
        zig.initial_block(-1, 0)


@pytest.mark.slow
def test_fine_binned_chi_square_over_forty_million_draws() -> None:
    """4e7 draws in 2000 equiprobable bins (20,000 expected each, sd 0.7%) and the tail masses beyond
    4, 4.5 and 5 sigma. Fails on a global misfit (chi-square), on any one bin off by more than
    about 4% of its mass (5.5 sd; a layer width or threshold error shows up locally), or on a tail
    sampler off by about 7% at 5 sigma."""
    keys = [_key(f"chi{k}") for k in range(40)]
    edges = stats.norm.ppf(np.linspace(0.0, 1.0, 2001)[1:-1])
    counts = np.zeros(2000, dtype=np.int64)
    beyond = {4.0: 0, 4.5: 0, 5.0: 0}
    for start in range(0, 40, 8):
        x = zig.ziggurat_rows(keys[start : start + 8], 1, 1_000_000, workers=2).ravel()
        counts += np.bincount(np.searchsorted(edges, x), minlength=2000)
        for cut in beyond:
            beyond[cut] += int(np.count_nonzero(np.abs(x) > cut))
    n = counts.sum()
    assert stats.chisquare(counts).pvalue > 1e-4
    z = (counts - n / 2000) / math.sqrt(n / 2000 * (1 - 1 / 2000))
    assert np.abs(z).max() < 5.5, int(np.abs(z).argmax())
    for cut, hits in beyond.items():
        expected = n * 2 * stats.norm.sf(cut)
        assert abs(hits - expected) < 5 * math.sqrt(expected), (cut, hits, expected)


def test_jit_falls_back_to_an_in_memory_build_where_numba_cannot_cache() -> None:
    """A function numba cannot locate a cache for (here: source from exec, as a read-only install
    without a home directory would be) is still compiled, without the disk cache."""
    import numba

    namespace: dict = {}
    exec("def twice(x):\n    return 2 * x\n", namespace)  # no source file: no cache locator
    with pytest.raises(RuntimeError, match="cannot cache"):
        numba.njit(cache=True)(namespace["twice"])
    assert zig.jit(namespace["twice"])(21) == 42


def test_without_numba_auto_is_chacha20_and_aes_ziggurat_is_a_clear_error(monkeypatch) -> None:
    from privdl.mechanisms import prng

    monkeypatch.setattr(prng, "_have_numba", lambda: False)
    assert resolve_backend("auto", "cpu") == "chacha20"
    with pytest.raises(PrivacyError, match="needs numba"):
        resolve_backend("aes-ziggurat", "cpu")


# ------------------------------------------------- AES inside the kernel (issue 37, 10^5 nodes)
def test_aes_tables_and_key_schedule_follow_fips_197() -> None:
    from privdl.mechanisms._aes import aes256_key_schedule, aes256_tables

    sbox, te = aes256_tables()
    assert (sbox[0], sbox[0x53], sbox[0xFF]) == (0x63, 0xED, 0x16)  # FIPS 197 Figure 7
    assert te[0, 0] == 0xC66363A5 and te[1, 0] == 0xA5C66363
    # FIPS 197 Appendix A.3: the first and last words of the expanded 256-bit key
    key = bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
    w = aes256_key_schedule(key)
    assert (w[8], w[9], w[59]) == (0x9BA35411, 0x8E6925AF, 0x706C631E)


@pytest.mark.parametrize("size", [1, 5, 124, 700])
def test_batched_rows_equal_the_openssl_rows_bitwise(size: int) -> None:
    rng = np.random.default_rng(size)
    keys = [bytes(rng.integers(0, 256, 32, dtype=np.uint8)) for _ in range(64)]
    for counter, substream in ((0, 0), (9, 2), (2**63 + 11, 2**32 - 1)):
        openssl = zig._ziggurat_rows_openssl(keys, counter, size, substream=substream)
        batched = zig.ziggurat_rows_batched(keys, counter, size, substream=substream)
        short = zig.ziggurat_rows_batched(keys, counter, size, substream=substream, _words=4)
        split = zig.ziggurat_rows_batched(keys, counter, size, substream=substream, workers=3)
        assert openssl.tobytes() == batched.tobytes() == short.tobytes() == split.tobytes()
    assert np.array_equal(  # and the documented keystream, read by the one-sample reference
        batched[0, : min(size, 40)],
        np.float32(_reference(_ecb_words(keys[0], counter, substream, 4096), min(size, 40))[0]),
    )


def test_fill_count_is_the_words_read_and_resuming_there_gives_the_same_row() -> None:
    """fill_count returns the reference's word count; a row made in stretches, each starting at
    the word the previous one stopped at, equals the row made in one call (the streamed DECOR
    kernel relies on this)."""
    rng = np.random.default_rng(5)
    words = rng.integers(0, 2**32, 6000, dtype=np.uint64).astype(np.uint32)
    slow = rng.random(len(words)) < 0.2  # many tail and top-layer wedge words
    words[slow] = (words[slow] & ~np.uint32(255)) | rng.integers(0, 2, slow.sum()).astype(np.uint32)
    n = 3000
    expected, used = _reference(words.astype(np.int64), n)
    whole = np.empty(n, dtype=np.float32)
    assert zig.fill_count(words, whole) == used
    np.testing.assert_array_equal(whole, np.asarray(expected, dtype=np.float32))
    pieces, pos, made = [], 0, 0
    while made < n:
        m = int(min(n - made, rng.integers(1, 40)))
        piece = np.empty(m, dtype=np.float32)
        read = zig.fill_count(words[pos:], piece)
        assert read > 0
        pieces.append(piece)
        pos, made = pos + read, made + m
    assert pos == used
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    assert zig.fill_count(words[: used - 1], np.empty(n, dtype=np.float32)) == -1
