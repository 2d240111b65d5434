"""Process-wide tuning of glibc's ``malloc`` for training loops (what ``privdl`` commands do first).

A training step allocates and frees the same multi-megabyte tensors every iteration (gradients,
noise rows, the half-step). glibc serves blocks above its *mmap threshold* (128 KiB, raised
dynamically up to 32 MiB only after such a block is freed) with fresh ``mmap`` pages, and returns
memory above its *trim threshold* to the kernel, so each step can fault in, zero and unmap the
same megabytes again. On the 2-core benchmark VM that churn made the DECOR torus step 10-25%
slower and its timing twice as noisy (benchmarks/bench_decor.py, ``--no-tune-malloc``).
:func:`tune_allocator` fixes both thresholds once, the remedy PyTorch's CPU performance guide
reaches through jemalloc or tcmalloc; freed blocks then stay in the heap and are reused, and the
process keeps up to its peak heap mapped.

It is a no-op off glibc (macOS, Windows, musl) and when ``PRIVDL_TUNE_MALLOC=0``. Library code
never calls it on import: the ``privdl`` command, its launched ranks and the benchmarks do.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_applied: bool | None = None


def tune_allocator(*, force: bool = False) -> bool:
    """Set glibc's mmap threshold to 32 MiB and its trim threshold to 1 GiB, once per process.

    Returns True when the settings are in force (set now or earlier), False where they do not
    apply: not Linux/glibc, ``PRIVDL_TUNE_MALLOC=0`` in the environment, or ``mallopt`` refused.
    ``force`` re-applies them (tests).
    """
    global _applied
    if _applied is not None and not force:
        return _applied
    _applied = False
    if os.environ.get("PRIVDL_TUNE_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:  # the process's own symbols (libc among them): no ldconfig subprocess at start-up
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    gnu_version = getattr(libc, "gnu_get_libc_version", None)  # glibc only, not musl
    if mallopt is None or gnu_version is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _applied
