"""AES-256 (FIPS 197) encryption of counter blocks, compiled with numba, for many keys in one call.

The ``aes-ziggurat/v1`` streams (:mod:`privdl.mechanisms.ziggurat`) are AES-256-CTR keystreams,
one key per stream. Through OpenSSL each stream costs a cipher object and a few Python calls, which
at 10^5 nodes (hundreds of thousands of short streams per DECOR step) costs far more than the AES
itself. Here the key schedule (FIPS 197 Section 5.2, Nk = 8, Nr = 14) and the cipher (Section 5.1)
run inside the numba kernel, in the usual 32-bit table form (Daemen & Rijmen, The Design of
Rijndael, 2002, Section 4.2: SubBytes, ShiftRows and MixColumns of a round as four table
lookups per column). The result is the same AES: the tests compare it with OpenSSL on random keys
and counters.

Tables are derived here from the field arithmetic of FIPS 197 Section 4 (the S-box is the
multiplicative inverse in GF(2^8) followed by the affine map of Section 5.1.1).
"""

from __future__ import annotations

from functools import cache

import numpy as np

__all__ = ["aes256_key_schedule", "aes256_tables"]


def _xtime(b: int) -> int:
    """Multiplication by x (i.e. 2) in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1 (FIPS 197 s.4.2.1)."""
    b <<= 1
    return (b ^ 0x11B) if b & 0x100 else b


def _gmul(a: int, b: int) -> int:
    out = 0
    while b:
        if b & 1:
            out ^= a
        a = _xtime(a)
        b >>= 1
    return out


@cache
def aes256_tables() -> tuple[np.ndarray, np.ndarray]:
    """``(SBOX (256,) uint32, TE (4, 256) uint32)``: the S-box and the four round tables
    ``TE[k][x] = ror(T0[x], 8 k)`` with ``T0[x] = (2 S[x], S[x], S[x], 3 S[x])`` big-endian."""
    inverse = [0] * 256
    for a in range(1, 256):
        for b in range(1, 256):
            if _gmul(a, b) == 1:
                inverse[a] = b
                break
    sbox = np.zeros(256, dtype=np.uint32)
    for x in range(256):
        b = inverse[x]
        s = b
        for shift in range(1, 5):  # b ^ rotl(b,1) ^ rotl(b,2) ^ rotl(b,3) ^ rotl(b,4) ^ 0x63
            s ^= ((b << shift) | (b >> (8 - shift))) & 0xFF
        sbox[x] = s ^ 0x63
    te = np.zeros((4, 256), dtype=np.uint32)
    for x in range(256):
        s = int(sbox[x])
        t0 = (_gmul(s, 2) << 24) | (s << 16) | (s << 8) | _gmul(s, 3)
        for k in range(4):
            te[k, x] = ((t0 >> (8 * k)) | (t0 << (32 - 8 * k))) & 0xFFFFFFFF
    return sbox, te


def aes256_key_schedule(key: bytes) -> np.ndarray:
    """The 60 round-key words of AES-256 (FIPS 197 Section 5.2), in Python (for the tests; the
    kernel expands keys itself)."""
    sbox, _ = aes256_tables()
    w = [int.from_bytes(key[4 * i : 4 * i + 4], "big") for i in range(8)]
    rcon = 1
    for i in range(8, 60):
        temp = w[i - 1]
        if i % 8 == 0:
            temp = ((temp << 8) | (temp >> 24)) & 0xFFFFFFFF
            temp = _sub_word(temp, sbox) ^ (rcon << 24)
            rcon = _xtime(rcon)
        elif i % 8 == 4:
            temp = _sub_word(temp, sbox)
        w.append(w[i - 8] ^ temp)
    return np.asarray(w, dtype=np.uint32)


def _sub_word(word: int, sbox: np.ndarray) -> int:
    return (
        (int(sbox[word >> 24]) << 24)
        | (int(sbox[(word >> 16) & 255]) << 16)
        | (int(sbox[(word >> 8) & 255]) << 8)
        | int(sbox[word & 255])
    )
