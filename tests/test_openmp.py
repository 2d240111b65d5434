"""privdl.openmp: the OpenMP spin limit is set before torch loads, never over the user's choice."""

from __future__ import annotations

import os
import subprocess
import sys


def _run(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    clean.pop("PRIVDL_TUNE_OPENMP", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_limit_is_set_before_torch_and_left_to_the_user_otherwise() -> None:
    from privdl.openmp import SPIN_COUNT

    probe = "import os; from privdl.openmp import limit_spin_wait as f; print(f(), os.environ.get('GOMP_SPINCOUNT'))"
    assert _run(probe) == f"True {SPIN_COUNT}"
    assert _run("import torch; " + probe) == "False None"  # libgomp has read its environment
    assert _run(probe, GOMP_SPINCOUNT="77") == "True 77"  # the user's value stays
    assert _run(probe, OMP_WAIT_POLICY="PASSIVE") == "True None"
    assert _run(probe, PRIVDL_TUNE_OPENMP="0") == "False None"


def test_the_privdl_command_sets_it_before_torch_loads() -> None:
    out = _run(
        "import os, sys; from privdl.cli.main import main; "
        "assert 'torch' not in sys.modules; main(['--version']); "
        "print(os.environ.get('GOMP_SPINCOUNT'))"
    )
    assert out.splitlines()[-1] == "10000"
