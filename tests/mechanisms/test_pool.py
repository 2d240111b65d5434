"""The noise kernels' worker pool: every index once, errors re-raised, nesting without deadlock."""

from __future__ import annotations

import threading

import pytest

from privdl.mechanisms import _pool


def test_every_index_runs_exactly_once_in_pool_threads() -> None:
    seen: list[tuple[int, str]] = []
    lock = threading.Lock()

    def record(j: int) -> None:
        with lock:
            seen.append((j, threading.current_thread().name))

    _pool.run_parallel(record, 7)
    assert sorted(j for j, _ in seen) == list(range(7))
    assert all(name.startswith("privdl-kernel") for _, name in seen)
    seen.clear()
    _pool.run_parallel(record, 1)  # a single task runs inline, in the caller's thread
    assert seen == [(0, threading.current_thread().name)]


def test_exceptions_reach_the_caller() -> None:
    def fail(j: int) -> None:
        if j == 2:
            raise ValueError("task 2")

    with pytest.raises(ValueError, match="task 2"):
        _pool.run_parallel(fail, 4)


def test_nested_calls_run_inline_instead_of_waiting_on_the_pool() -> None:
    """A task that itself calls run_parallel would deadlock a full pool if it queued its work;
    nested calls run inline in the worker, so this finishes (the timeout would catch a hang)."""
    width = _pool.MAX_WORKERS + 2  # more outer tasks than the pool has threads
    done = []
    lock = threading.Lock()

    def inner(j: int) -> None:
        with lock:
            done.append(j)

    def outer(_: int) -> None:
        _pool.run_parallel(inner, 3)

    worker = threading.Thread(target=_pool.run_parallel, args=(outer, width))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert sorted(done) == sorted(list(range(3)) * width)


def test_kernel_cpus_leave_torch_its_threads_beside_the_compute() -> None:
    import torch

    usable = _pool.usable_cpus()
    assert _pool.kernel_cpus() == usable
    threads = torch.get_num_threads()
    try:
        for t in (1, usable, usable + 3):
            torch.set_num_threads(t)
            seen = _pool.beside_compute(_pool.kernel_cpus)()
            assert seen == max(1, usable - t)
        assert _pool.kernel_cpus() == usable  # the mark ends with the call
    finally:
        torch.set_num_threads(threads)
