"""AES-256 by the CPU's AES instructions (``privdl.mechanisms._aesni``) against independent oracles.

Oracles: OpenSSL through ``cryptography`` (AES-256 ECB and CTR on random keys and counters), the
FIPS 197 key schedule written in Python (``_aes.aes256_key_schedule``), and the software AES of
the numba kernel (the path used without AES-NI), bit for bit; and a small DECOR run whose result
must not change when the instructions are switched off.
"""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from privdl.errors import ConfigError
from privdl.mechanisms import _aesni
from privdl.mechanisms import ziggurat as zig
from privdl.mechanisms._aes import aes256_key_schedule

needs_aesni = pytest.mark.skipif(
    not _aesni.available(),
    reason="this CPU (or the features numba compiles for) has no AES-NI: only software AES runs",
)


@pytest.fixture
def aesni(monkeypatch):
    """Switch the instructions on (True) or off (False) for one call: ``with`` is not needed, the
    switch is read at every draw."""

    def use(on: bool) -> None:
        monkeypatch.setattr(_aesni, "ENABLED", on)

    return use


def _keys(seed: int, k: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (k, 32), dtype=np.uint8)


@needs_aesni
def test_key_expansion_equals_the_fips_197_schedule() -> None:
    keys = _keys(1, 40)
    keys[0] = np.frombuffer(  # FIPS 197 Appendix A.3
        bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4"),
        dtype=np.uint8,
    )
    round_keys = _aesni.expand_keys(keys)
    for k in range(len(keys)):
        words = aes256_key_schedule(bytes(keys[k]))  # FIPS words are big-endian byte groups
        assert round_keys[k].astype("<u8").tobytes() == words.astype(">u4").tobytes(), k


@needs_aesni
def test_blocks_equal_openssl_ecb_and_ctr_on_random_keys_and_counters() -> None:
    rng = np.random.default_rng(2)
    keys = _keys(3, 16)
    round_keys = _aesni.expand_keys(keys)
    for k in range(len(keys)):
        blocks = rng.integers(0, 2**64, (33, 2), dtype=np.uint64)
        blocks[0] = (2**64 - 1, 2**64 - 1)
        blocks[1] = (0, 0)
        raw = blocks.astype("<u8").tobytes()
        ecb = Cipher(algorithms.AES(bytes(keys[k])), modes.ECB()).encryptor().update(raw)
        assert _aesni.encrypt_blocks(round_keys[k], blocks).astype("<u8").tobytes() == ecb


@needs_aesni
@pytest.mark.parametrize("size", [1, 124, 511, 600])  # 600: a long row (batched with AES-NI)
def test_rows_equal_openssl_ctr_and_the_software_kernel_bitwise(aesni, size: int) -> None:
    keys = [bytes(row) for row in _keys(size, 48)]
    for counter, substream in ((0, 0), (12345, 7), (2**64 - 1, 2**32 - 1)):
        aesni(True)
        fast = zig.ziggurat_rows_batched(keys, counter, size, substream=substream)
        short = zig.ziggurat_rows_batched(keys, counter, size, substream=substream, _words=4)
        split = zig.ziggurat_rows_batched(keys, counter, size, substream=substream, workers=3)
        routed = zig.ziggurat_rows(keys, counter, size, substream=substream)  # any length: batched
        aesni(False)
        software = zig.ziggurat_rows_batched(keys, counter, size, substream=substream)
        openssl = zig._ziggurat_rows_openssl(keys, counter, size, substream=substream)
        assert fast.tobytes() == short.tobytes() == split.tobytes() == routed.tobytes()
        assert fast.tobytes() == software.tobytes() == openssl.tobytes(), (counter, substream)
    # the keystream itself: the documented counter blocks (nonce, then the block index
    # big-endian) under AES-NI, against OpenSSL's AES-256-CTR from the initial block
    counter, substream, n_blocks = 2**64 - 1, 2**32 - 1, 70
    blocks = np.empty((n_blocks, 2), dtype=np.uint64)
    blocks[:, 0] = counter
    index = np.arange(n_blocks, dtype=">u4").view("<u4").astype(np.uint64)
    blocks[:, 1] = np.uint64(substream) | (index << np.uint64(32))
    stream = _aesni.encrypt_blocks(_aesni.expand_keys(_keys(size, 1))[0], blocks)
    block = zig.initial_block(counter, substream)
    ctr = Cipher(algorithms.AES(keys[0]), modes.CTR(block)).encryptor()
    assert stream.astype("<u8").tobytes() == ctr.update(bytes(16 * n_blocks))


@needs_aesni
def test_a_small_decor_run_is_the_same_with_and_without_aesni(aesni, monkeypatch, tmp_path) -> None:
    from privdl.loop import train
    from privdl.registry import make_config

    config = {
        "task": "least-squares",
        "graph": "ring:8",
        "steps": 12,
        "lr": 0.01,
        "clip": 1.0,
        "clip_mode": "batch_mean",
        "eval_every": 6,
        "dtype": "float64",
        "algorithm": "decor",
        "sigma": 0.5,
        "sigma_cor": 2.0,
        "noise_backend": "aes-ziggurat",
    }
    results, draws = [], []
    active = _aesni.active
    monkeypatch.setattr(_aesni, "active", lambda: draws.append(active()) or draws[-1])
    for on in (True, False):
        aesni(on)
        final = train(make_config(config), tmp_path / str(on), progress=False)["final"]
        results.append({k: v for k, v in final.items() if k != "wall_time"})
    assert results[0] == results[1]
    assert np.isfinite(results[0]["optimality_gap"])
    # the run drew through both paths (each draw asks at least once; the software path twice)
    assert draws.count(True) >= 12 and draws.count(False) >= 12


def test_the_switch_off_uses_software_aes_and_on_without_the_cpu_is_an_error(
    aesni, monkeypatch
) -> None:
    keys = [bytes(row) for row in _keys(9, 4)]
    aesni(False)
    assert not _aesni.active()
    assert np.array_equal(  # software AES against OpenSSL, whatever the CPU
        zig.ziggurat_rows_batched(keys, 3, 20), zig._ziggurat_rows_openssl(keys, 3, 20)
    )
    aesni(True)
    monkeypatch.setattr(_aesni, "available", lambda: False)
    with pytest.raises(ConfigError, match="AES-NI was asked for"):
        zig.ziggurat_rows_batched(keys, 3, 20)
