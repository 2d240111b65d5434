"""One worker pool per process for the CPU noise kernels (keystream, ziggurat, signed sums).

The kernels release the GIL (OpenSSL, numba ``nogil``), so threads give real parallelism. A step
used to start a fresh ``ThreadPoolExecutor`` for each of its noise calls; on the 2-core machine
starting and joining those threads cost a few milliseconds per DECOR step, next to torch's own
OpenMP threads. The pool here is started once and kept; results never depend on it (every task
writes its own rows or columns).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "MAX_WORKERS",
    "beside_compute",
    "kernel_cpus",
    "run_parallel",
    "spare_cpus",
    "usable_cpus",
]

MAX_WORKERS = 8
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_LOCK = threading.Lock()
_inside = threading.local()
_beside = threading.local()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def beside_compute(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` marked as running beside the compute (a step's noise drawn in a background thread
    while torch's threads compute the gradients): the kernels it calls then size themselves by
    :func:`kernel_cpus`, the CPUs torch leaves, instead of taking every core from the gradients."""

    def marked() -> T:
        _beside.active = True
        try:
            return fn()
        finally:
            _beside.active = False

    return marked


def kernel_cpus() -> int:
    """CPUs a noise kernel may use from this thread: all usable ones, or beside the compute
    (:func:`beside_compute`) those torch's intra-op threads leave, at least one."""
    cpus = usable_cpus()
    if getattr(_beside, "active", False):
        import torch

        cpus -= torch.get_num_threads()
    return max(1, cpus)


def spare_cpus() -> int:
    """Usable CPUs that torch's intra-op threads leave free (0 when they take every one): where a
    step's noise can be drawn beside its gradients without preempting them."""
    import torch

    return max(0, usable_cpus() - torch.get_num_threads())


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL[0] != os.getpid():  # a forked child starts its own
            workers = min(MAX_WORKERS, usable_cpus())
            _POOL = (os.getpid(), ThreadPoolExecutor(workers, thread_name_prefix="privdl-kernel"))
        return _POOL[1]


def _marked(fn: Callable[[int], object], j: int) -> object:
    _inside.active = True
    try:
        return fn(j)
    finally:
        _inside.active = False


def run_parallel(fn: Callable[[int], object], count: int) -> None:
    """``fn(j)`` for ``j < count``: in the process's worker pool when ``count > 1``, inline when
    ``count <= 1`` or when called from a pool worker (no nested waits, so no deadlock).
    Exceptions are re-raised here."""
    if count <= 1 or getattr(_inside, "active", False):
        for j in range(count):
            fn(j)
        return
    futures = [_pool().submit(_marked, fn, j) for j in range(count)]
    for future in futures:
        future.result()
