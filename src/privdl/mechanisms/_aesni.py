"""AES-256 with the CPU's AES instructions (x86-64 AES-NI) inside numba kernels.

The ``aes-ziggurat/v1`` keystream (:mod:`privdl.mechanisms.ziggurat`) is AES-256-CTR with one key
per stream. :mod:`privdl.mechanisms._aes` computes it with the 32-bit table form of the rounds in
software; where the CPU has AES-NI the same rounds are one instruction each (``AESENC`` is
ShiftRows, SubBytes, MixColumns and AddRoundKey of FIPS 197 Section 5.1; ``AESENCLAST`` the last
round without MixColumns), and the key expansion of FIPS 197 Section 5.2 (Nk = 8) uses
``AESKEYGENASSIST`` (SubWord of a word and RotWord xor Rcon) followed by the running xor of the
previous four words, as described in S. Gueron, "Intel Advanced Encryption Standard (AES) New
Instructions Set", Intel white paper 323641-001 rev. 3.0 (2010), Section "The AES key expansion".

The instructions are reached through LLVM's ``llvm.x86.aesni.*`` intrinsics on ``<2 x i64>``;
the 16-byte AES state is held as two little-endian ``uint64`` halves (byte 0 of the block is the
low byte of the first half), so a block goes in and out of a kernel as two integers.

Whether they are used: :func:`available` (x86-64, the ``aes`` CPU feature in the features numba
compiles for, and a known-answer test of FIPS 197 Appendix C.3 passing); ``PRIVDL_AESNI=0`` in the
environment or :data:`ENABLED` ``= False`` turns them off (the software path, which stays the
reference the tests compare with). The values are the same either way.
"""

from __future__ import annotations

import os
import platform
from functools import cache
from typing import Any

import numpy as np

__all__ = ["ENABLED", "active", "available", "encrypt_blocks", "expand_keys"]

#: ``None``: use AES-NI where :func:`available`; ``False``: never (software AES); ``True``: always
#: (an error where the CPU lacks it). Read at every call (tests switch it).
ENABLED: bool | None = None if os.environ.get("PRIVDL_AESNI", "") != "0" else False


def _cpu_has_aes() -> bool:
    """x86-64 and ``+aes`` among the CPU features numba compiles for (the host's, unless
    ``NUMBA_CPU_FEATURES`` overrides them)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        import llvmlite.binding as ll
        import numba
    except ImportError:  # pragma: no cover - numba is checked by the caller
        return False
    features = getattr(numba.config, "CPU_FEATURES", None)
    if features is None:
        features = ll.get_host_cpu_features().flatten()
    return "+aes" in str(features).split(",")


@cache
def available() -> bool:
    """The CPU has AES-NI, numba compiles for it, and the compiled kernels give FIPS 197's
    AES-256 example (Appendix C.3) -- else the software path is used."""
    if not _cpu_has_aes():
        return False
    key = bytes(range(32))
    plain = bytes.fromhex("00112233445566778899aabbccddeeff")
    expected = bytes.fromhex("8ea2b7ca516745bfeafc49904b496089")
    try:
        schedule = expand_keys(np.frombuffer(key, dtype=np.uint8).reshape(1, 32))
        blocks = np.frombuffer(plain, dtype="<u8").reshape(1, 2).copy()
        out = encrypt_blocks(schedule[0], blocks)
    except Exception:  # an LLVM that cannot select the instructions: use software AES
        return False
    return out.astype("<u8").tobytes() == expected


def active() -> bool:
    """Whether the AES-NI kernels are used now (:data:`ENABLED` and :func:`available`)."""
    if ENABLED is False:
        return False
    if ENABLED is True and not available():
        from privdl.errors import ConfigError

        raise ConfigError("AES-NI was asked for (privdl.mechanisms._aesni.ENABLED = True) but "
                          "this CPU or its numba build does not provide it")  # fmt: skip
    return available()


# ------------------------------------------------------------------ the intrinsics (numba)
@cache
def intrinsics() -> tuple[Any, Any]:
    """``(expand_key, encrypt_block)``, numba intrinsics (call them from jitted code only, and only
    where :func:`available`):

    * ``expand_key(k0, k1, k2, k3, rk)``: the 15 AES-256 round keys of the key whose 32 bytes are
      the little-endian uint64 ``k0..k3``, written to ``rk`` (uint64, 30 entries: round key r is
      ``rk[2r], rk[2r + 1]``);
    * ``encrypt_block(rk, lo, hi) -> (lo, hi)``: AES-256 of the block ``lo, hi`` (uint64 halves).
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    v2i64 = ir.VectorType(ir.IntType(64), 2)
    v4i32 = ir.VectorType(ir.IntType(32), 4)
    i64 = ir.IntType(64)

    def declare(builder: Any, name: str, args: list[Any]) -> Any:
        return cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v2i64, args), f"llvm.x86.aesni.{name}"
        )

    def round_key_pointer(context: Any, builder: Any, arrty: Any, arr: Any) -> Any:
        data = context.make_array(arrty)(context, builder, arr).data
        return builder.bitcast(data, v2i64.as_pointer())

    def shift4(builder: Any, v: Any) -> Any:
        """``PSLLDQ v, 4`` on ``<4 x i32>``: words (0, v0, v1, v2)."""
        zero = ir.Constant(v4i32, None)
        return builder.shuffle_vector(zero, v, ir.Constant(v4i32, [0, 4, 5, 6]))

    def splat(builder: Any, v: Any, lane: int) -> Any:
        """``PSHUFD v, lane * 0x55``: word ``lane`` in all four words."""
        return builder.shuffle_vector(v, v, ir.Constant(v4i32, [lane] * 4))

    def expand_step(builder: Any, prev: Any, assist: Any, lane: int) -> Any:
        """Four new schedule words: the running xor of the four words ``prev`` (w[i-8..i-5]) with
        word ``lane`` of the ``AESKEYGENASSIST`` result broadcast (FIPS 197 s.5.2's temp)."""
        p = builder.bitcast(prev, v4i32)
        t = builder.xor(p, shift4(builder, p))
        t = builder.xor(t, shift4(builder, shift4(builder, p)))
        t = builder.xor(t, shift4(builder, shift4(builder, shift4(builder, p))))
        t = builder.xor(t, splat(builder, builder.bitcast(assist, v4i32), lane))
        return builder.bitcast(t, v2i64)

    @intrinsic
    def expand_key(typingctx: Any, k0: Any, k1: Any, k2: Any, k3: Any, rk: Any) -> Any:
        sig = types.void(types.uint64, types.uint64, types.uint64, types.uint64, rk)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ks = [
                context.cast(builder, a, t, types.uint64)
                for a, t in zip(args[:4], signature.args[:4], strict=True)
            ]
            ptr = round_key_pointer(context, builder, signature.args[4], args[4])
            genassist = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(v2i64, [v2i64, ir.IntType(8)]),
                "llvm.x86.aesni.aeskeygenassist",
            )

            def pack(lo: Any, hi: Any) -> Any:
                v = builder.insert_element(ir.Constant(v2i64, None), lo, ir.Constant(i64, 0))
                return builder.insert_element(v, hi, ir.Constant(i64, 1))

            keys = [pack(ks[0], ks[1]), pack(ks[2], ks[3])]
            rcon = 1
            while len(keys) < 15:
                # even round key: SubWord(RotWord(w[i-1])) ^ Rcon, i.e. word 3 of the assist
                assist = builder.call(genassist, [keys[-1], ir.Constant(ir.IntType(8), rcon)])
                keys.append(expand_step(builder, keys[-2], assist, 3))
                rcon <<= 1
                if len(keys) < 15:  # odd round key: SubWord(w[i-1]), word 2 of the assist
                    assist = builder.call(genassist, [keys[-1], ir.Constant(ir.IntType(8), 0)])
                    keys.append(expand_step(builder, keys[-2], assist, 2))
            for r, key in enumerate(keys):
                builder.store(key, builder.gep(ptr, [ir.Constant(i64, r)]), align=8)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def encrypt_block(typingctx: Any, rk: Any, lo: Any, hi: Any) -> Any:
        sig = types.UniTuple(types.uint64, 2)(rk, types.uint64, types.uint64)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ptr = round_key_pointer(context, builder, signature.args[0], args[0])
            keys = [
                builder.load(builder.gep(ptr, [ir.Constant(i64, r)]), align=8) for r in range(15)
            ]
            lo_, hi_ = (
                context.cast(builder, a, t, types.uint64)
                for a, t in zip(args[1:], signature.args[1:], strict=True)
            )
            state = builder.insert_element(ir.Constant(v2i64, None), lo_, ir.Constant(i64, 0))
            state = builder.insert_element(state, hi_, ir.Constant(i64, 1))
            state = builder.xor(state, keys[0])
            enc = declare(builder, "aesenc", [v2i64, v2i64])
            for r in range(1, 14):
                state = builder.call(enc, [state, keys[r]])
            state = builder.call(declare(builder, "aesenclast", [v2i64, v2i64]), [state, keys[14]])
            out_lo = builder.extract_element(state, ir.Constant(i64, 0))
            out_hi = builder.extract_element(state, ir.Constant(i64, 1))
            return context.make_tuple(builder, signature.return_type, [out_lo, out_hi])

        return sig, codegen

    return expand_key, encrypt_block


# --------------------------------------------------------- small entry points (for the tests)
@cache
def _expand_kernel() -> Any:
    from privdl.mechanisms.ziggurat import jit

    expand_key, _ = intrinsics()

    @jit
    def expand(words, out):  # type: ignore[no-untyped-def]
        for k in range(words.shape[0]):
            expand_key(words[k, 0], words[k, 1], words[k, 2], words[k, 3], out[k])

    return expand


@cache
def _encrypt_kernel() -> Any:
    from privdl.mechanisms.ziggurat import jit

    _, encrypt_block = intrinsics()

    @jit
    def encrypt(rk, blocks, out):  # type: ignore[no-untyped-def]
        for j in range(blocks.shape[0]):
            out[j, 0], out[j, 1] = encrypt_block(rk, blocks[j, 0], blocks[j, 1])

    return encrypt


def expand_keys(keys: np.ndarray) -> np.ndarray:
    """Round keys ``(K, 30)`` uint64 of ``keys`` ``(K, 32)`` uint8 (AES-NI; see :func:`intrinsics`)."""
    words = np.ascontiguousarray(keys, dtype=np.uint8).view("<u8").astype(np.uint64)
    out = np.empty((len(words), 30), dtype=np.uint64)
    _expand_kernel()(words, out)
    return out


def encrypt_blocks(round_keys: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """AES-256 (ECB) of ``blocks`` ``(B, 2)`` uint64 halves under ``round_keys`` (30,) uint64."""
    out = np.empty_like(blocks, dtype=np.uint64)
    _encrypt_kernel()(
        np.ascontiguousarray(round_keys, dtype=np.uint64),
        np.ascontiguousarray(blocks, dtype=np.uint64),
        out,
    )
    return out
