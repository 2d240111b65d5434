"""``privdl launch``: one run on several local processes, or one rank of a ``torchrun`` job.

``privdl launch --nproc N [options of privdl run]`` starts N worker processes on this machine
(gloo over loopback, or NCCL with ``--device cuda``) with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set, waits for them, and stops the others if one fails. Under
``torchrun`` (those variables already set) the same command runs as one rank directly::

    torchrun --nproc-per-node 4 -m privdl launch decor --graph ring:16 ...
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import click

from privdl.cli.run import (
    _print_summary,
    command_line_values,
    given_values,
    holds_run,
    refuse_options_with_resume,
    say_if_complete,
)
from privdl.cli.run import run as _run_command
from privdl.comm.distributed import DEFAULT_TIMEOUT_S
from privdl.distributed_runner import worker_main
from privdl.errors import ConfigError, PrivdlError, ReportedError
from privdl.records import RunRecords, seed_run_dirs
from privdl.registry import make_config, plugin_files, recipe_for

_OWN = (
    click.Option(["--nproc"], type=int, default=2, show_default=True, help="Processes to start."),
    click.Option(
        ["--master-addr"],
        default="127.0.0.1",
        show_default=True,
        help="Rendezvous address of rank 0 (ignored under torchrun).",
    ),  # fmt: skip
    click.Option(["--master-port"], type=int, default=0, help="Rendezvous port (0: a free one)."),
    click.Option(
        ["--timeout"],
        type=float,
        default=DEFAULT_TIMEOUT_S,
        show_default=True,
        help="Seconds to wait for a peer before failing.",
    ),
)


def _in_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _check_port(addr: str, port: int) -> int:
    """A free port (``port=0``), or ``port`` if nothing listens on it; else a ConfigError."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as exc:
            raise ConfigError(
                f"port {port} on {addr} is already in use ({exc.strerror}); "
                "choose another --master-port or leave it out"
            ) from None
        return int(s.getsockname()[1])


def _pdeathsig() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the worker gets SIGKILL when the launcher dies (no orphaned ranks)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def spawn(
    job: dict,
    *,
    nproc: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> None:
    """Start ``nproc`` workers for ``job`` and wait; PrivdlError if any of them fails.

    When one worker fails the others are given ``timeout_s + 10`` seconds to notice (they stop
    with their own error) and are then killed, so the launcher never hangs.
    """
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    port = _check_port(master_addr, master_port)
    threads = max(1, (os.cpu_count() or 1) // nproc)
    procs = []
    for rank in range(nproc):
        child = {**os.environ, **(env or {})}
        child.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(port),
            PRIVDL_LAUNCH_SPEC=json.dumps(job),
        )
        child.setdefault("OMP_NUM_THREADS", str(threads))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "privdl.distributed_runner"],
                env=child,
                preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,
            )
        )
    deadline, stopped = None, set()
    try:
        while True:
            codes = [p.poll() for p in procs]
            if deadline is None and any(c not in (None, 0) for c in codes):
                deadline = time.monotonic() + timeout_s + 10.0
            if all(c is not None for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                for r, p in enumerate(procs):
                    if p.poll() is None:
                        p.kill()
                        stopped.add(r)
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        raise
    exited = cast("list[int]", codes)  # the loop ends once every worker has exited
    bad = [(r, c) for r, c in enumerate(exited) if c != 0]
    if bad and not stopped and all(c == 2 for _, c in bad):
        raise ReportedError("the ranks' errors are printed above")  # each said why, once
    if bad:
        # the cause first: ranks killed by a signal, then failing ranks, then those we stopped
        bad.sort(key=lambda rc: (rc[0] in stopped, rc[1] >= 0, rc[0]))
        what = "; ".join(
            f"rank {r} " + ("was stopped after the timeout" if r in stopped else _describe(c))
            for r, c in bad
        )
        raise PrivdlError(f"distributed run failed: {what} (see the ranks' errors above)")


def _launch(
    algorithm, config_file, sets, out, resume_dir, resume_if_exists, overwrite, progress, nproc,
    master_addr, master_port, timeout, **flags,
) -> None:  # fmt: skip
    """Train ALGORITHM on --nproc local processes (or as one rank under torchrun)."""
    if not timeout > 0 or timeout == float("inf"):  # nan too
        raise ConfigError(f"--timeout must be a positive number of seconds, got {timeout}")
    if not 0 <= master_port <= 65535:
        raise ConfigError(f"--master-port must be in 0..65535 (0: a free one), got {master_port}")
    if flags.pop("seeds", None):
        raise ConfigError(
            "privdl launch runs one seed (--seed); repeat over seeds with privdl run --seeds, or "
            "launch each seed into its own --out"
        )
    if resume_if_exists and (resume_dir or overwrite):
        other = "--resume DIR" if resume_dir else "--overwrite"
        raise ConfigError(f"give --resume-if-exists (with --out) or {other}, not both")
    job: dict = {"resume": bool(resume_dir), "overwrite": overwrite, "timeout": timeout}
    if resume_dir:
        refuse_options_with_resume(algorithm, config_file, sets, out, None, overwrite, flags)
        out_dir = Path(resume_dir)
        if not (out_dir / "config.json").is_file() and seed_run_dirs(out_dir):
            raise ConfigError(
                f"{out_dir} holds the runs of --seeds and privdl launch runs one seed: resume "
                f"them with privdl run --resume {out_dir}, or one with launch --resume "
                f"{out_dir}/seed-K"
            )
        cfg = make_config(RunRecords(out_dir).config(), saved=True)  # a corrupt file: one line
    else:
        values = command_line_values(config_file, algorithm, flags, sets)
        cfg = make_config(values)
        out_dir = Path(out or f"runs/{cfg.algorithm}")
        job["config"] = cfg.model_dump()
        if resume_if_exists:  # rank 0 decides, from the run directory it sees
            job["resume_if_exists"] = given_values(cfg, values)
    RunRecords(out_dir)  # --out naming a file: one line here, before any rank starts
    job["out"] = str(out_dir)
    job["progress"] = progress
    job["plugins"] = plugin_files()  # algorithms registered outside privdl: every rank imports
    if os.environ.get("RANK", "0") == "0" and (
        resume_dir or (resume_if_exists and holds_run(out_dir, job["resume_if_exists"]))
    ):  # (another run in --out is refused here, before any rank starts)
        say_if_complete(out_dir)
    if _in_torchrun():
        worker_main(job)
        if os.environ.get("RANK") == "0":
            _print_launched(out_dir)
        return
    if str(cfg.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda requested but CUDA is not available on this machine")
    n = recipe_for(cfg).n_nodes(cfg)
    if nproc > n:
        graph = getattr(cfg, "graph", "server")
        what = f"nodes of graph {graph!r}" if graph != "server" else "clients"
        raise ConfigError(
            f"--nproc {nproc} exceeds the {n} {what}; "
            f"use at most {n} processes (each owns at least one)"
        )
    spawn(job, nproc=nproc, master_addr=master_addr, master_port=master_port, timeout_s=timeout)
    _print_launched(out_dir)


def _print_launched(out_dir: Path) -> None:
    """The summary of a launched run, as ``privdl run`` prints it (from its records)."""
    summary = RunRecords(out_dir).summary()
    if summary is not None:
        _print_summary(summary, out_dir)


launch = click.Command(
    "launch",
    params=[*_run_command.params, *_OWN],
    callback=_launch,
    help=(
        "Train ALGORITHM on --nproc local processes (gloo, or NCCL with --device cuda); the same "
        "options as 'privdl run'. Under torchrun it runs as one rank. Resume with --resume DIR."
    ),
)
