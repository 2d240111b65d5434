"""glibc malloc tuning: freed step-sized blocks are reused instead of faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from privdl.engine.allocator import tune_allocator

# Three step-sized blocks (20, 6.5 and 13 MB, like DECOR's torus noise rows), freed out of order;
# prints the minor page faults of 20 repetitions after a warm-up step.
_SCRIPT = """
import resource, sys
import numpy as np
from privdl.engine.allocator import tune_allocator
print(tune_allocator())
def step():
    a = np.empty(48 * 101770, np.float32); a.fill(1)
    b = np.empty(16 * 101770, np.float32); b.fill(2)
    del a
    c = np.empty(32 * 101770, np.float32); c.fill(3)
    del b, c
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _run(tune: str) -> tuple[str, int]:
    env = dict(os.environ, PRIVDL_TUNE_MALLOC=tune)
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def _glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):  # musl, or a platform without the name
        return False


@pytest.mark.skipif(not _glibc(), reason="mallopt thresholds are a glibc feature")
def test_tuned_process_reuses_freed_blocks_instead_of_faulting() -> None:
    applied, tuned_faults = _run("1")
    skipped, plain_faults = _run("0")
    assert applied == "True" and skipped == "False"
    # the kernel's own fault counter is the oracle: untuned glibc maps these blocks afresh
    assert plain_faults > 500
    assert tuned_faults < plain_faults / 10


def test_opt_out_and_idempotence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVDL_TUNE_MALLOC", "0")
    assert tune_allocator(force=True) is False
    assert tune_allocator() is False  # remembered until forced
    monkeypatch.setenv("PRIVDL_TUNE_MALLOC", "1")
    assert tune_allocator(force=True) is _glibc()


def test_the_privdl_command_tunes_malloc_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import privdl.cli.main as cli_main

    calls: list[int] = []
    monkeypatch.setattr(cli_main, "tune_allocator", lambda: calls.append(1) or True)
    assert cli_main.main(["graph", "ring:4", "--json"]) == 0
    assert calls == [1]
