"""Forked gloo ranks for the distributed tests (loopback; fork avoids re-importing torch)."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
from collections.abc import Callable

import pytest
import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(env: dict, target: Callable, rank: int, args: tuple) -> None:  # in the forked rank
    os.environ.update(env)
    torch.set_num_threads(1)
    try:
        target(rank, *args)
    except BaseException:  # noqa: BLE001 - report and exit non-zero
        traceback.print_exc()
        os._exit(3)
    os._exit(0)


def run_ranks(
    world: int, target: Callable, args: tuple = (), *, env: dict | None = None, timeout=120.0
) -> list[int | None]:
    """Fork ``world`` ranks running ``target(rank, *args)``; returns their exit codes."""
    ctx = mp.get_context("fork")
    port = free_port()
    procs = []
    for rank in range(world):
        child_env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            **(env or {}),
        }
        p = ctx.Process(target=_child, args=(child_env, target, rank, args))
        p.start()
        procs.append(p)
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


@pytest.fixture(name="run_ranks")
def _run_ranks_fixture() -> Callable[..., list[int | None]]:
    return run_ranks


@pytest.fixture(name="free_port")
def _free_port_fixture() -> Callable[[], int]:
    return free_port
