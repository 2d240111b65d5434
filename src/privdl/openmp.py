"""Process-wide limit on the OpenMP runtime's spin-wait (what ``privdl`` commands do first, before
torch is loaded).

Torch's CPU operators run on GNU OpenMP (``libgomp``, bundled with the Linux wheels). After a
parallel region its worker threads spin for the next one, ``GOMP_SPINCOUNT`` iterations (300,000
by default while ``OMP_WAIT_POLICY`` is unset), before they sleep: milliseconds on the 2-core EPYC
machine, whose ``PAUSE`` instruction is slow. A DECOR step at full threads draws its noise right
after the gradients, on privdl's own kernel threads (:mod:`privdl.mechanisms._pool`), which then
share the cores with the spinning workers. Measured there (2026-11-28, torch at 2 threads, the
MNIST MLP on the 4x4 torus, ``benchmarks/bench_decor.py``): the DECOR step took 20.6-23.0 ms at
the default spin, 14.6 ms with ``GOMP_SPINCOUNT=10000`` and 15.4-16.9 ms with
``OMP_WAIT_POLICY=PASSIVE``; the non-private step took 8.3 ms in all three.

libgomp reads its environment once, when it is loaded, so :func:`limit_spin_wait` acts only before
the first import of torch; it never overrides a value the user set (``GOMP_SPINCOUNT`` or
``OMP_WAIT_POLICY``), and ``PRIVDL_TUNE_OPENMP=0`` turns it off. Processes started from this one
(``privdl launch``'s ranks) inherit it. A program that imports privdl as a library sets it itself,
in its environment.
"""

from __future__ import annotations

import os
import sys

__all__ = ["SPIN_COUNT", "limit_applies", "limit_spin_wait", "spin_setting"]

#: ``GOMP_SPINCOUNT`` set by :func:`limit_spin_wait` (libgomp's own value when it is told that
#: its threads outnumber the CPUs is 1000; this keeps short gaps between operators spinning).
SPIN_COUNT = 10_000


def _user_set() -> bool:
    return "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ


def limit_applies() -> bool:
    """Whether privdl would set the limit: the user set neither variable and did not turn it off
    with ``PRIVDL_TUNE_OPENMP=0``."""
    return not _user_set() and os.environ.get("PRIVDL_TUNE_OPENMP", "1") != "0"


def spin_setting() -> str:
    """What libgomp reads from this environment: ``OMP_WAIT_POLICY=...``, the
    ``GOMP_SPINCOUNT`` value, or ``default``."""
    if "OMP_WAIT_POLICY" in os.environ:
        return f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    return os.environ.get("GOMP_SPINCOUNT", "default")


def limit_spin_wait() -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` in this process's environment, once, before
    torch loads its OpenMP runtime. Returns True when the limit (or the user's own setting of
    either variable) is in the environment for torch to read; False when torch was already
    loaded with neither set, or ``PRIVDL_TUNE_OPENMP=0``."""
    if _user_set():
        return True
    if not limit_applies() or "torch" in sys.modules:
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return True
