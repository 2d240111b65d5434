"""Train one configured run, recording as it goes; resume from its checkpoint.

This is the one-call facade: ``train(cfg, out_dir)`` builds the topology, task, communicator,
algorithm and accountant from a :class:`~privdl.config.RunConfig` and runs it.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from privdl.algorithms.base import StepSize, consensus_distance
from privdl.algorithms.decor import Decor
from privdl.algorithms.dsgd import DSGD, DSGDState
from privdl.comm.local import LocalCommunicator
from privdl.config import RunConfig, make_config
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError, PrivdlError
from privdl.records import RunRecords
from privdl.tasks import build_task
from privdl.topology import complete, mixing_matrix, parse_graph


@dataclass
class Built:
    """The composed parts of a run."""

    cfg: RunConfig
    topology: Any
    comm: LocalCommunicator
    task: Any
    algorithm: Any
    privacy: Any  # callable t -> dict | None


def build(cfg: RunConfig, *, calibrated: bool = False) -> Built:
    """Compose topology, communicator, task, algorithm and accountant from ``cfg``.

    Unless ``calibrated`` (a resumed run's saved config), a target ``epsilon`` is turned into
    noise levels first; the returned ``Built.cfg`` is the resolved configuration.
    """
    from privdl.privacy import calibrate, run_accountant

    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but CUDA is not available on this machine")
    topo = parse_graph(cfg.graph)
    if cfg.algorithm == "cdp":
        # CDP baseline: complete graph with exact averaging W = J (DECOR spec §3)
        topo = complete(topo.n)
        mixing = mixing_matrix(topo, "average")
    else:
        topo.require_connected("decentralized training")
        mixing = mixing_matrix(topo, cfg.mixing)
    comm = LocalCommunicator(mixing, device=cfg.device, dtype=dtype)
    task = build_task(cfg)
    if not calibrated:
        if cfg.epsilon is not None and (cfg.sigma > 0 and cfg.algorithm != "decor"):
            raise ConfigError("give either a target epsilon or an explicit sigma, not both")
        if cfg.epsilon is not None and cfg.sigma_cor > 0:
            raise ConfigError("give either a target epsilon or an explicit sigma_cor, not both")
        cfg = calibrate(cfg, topo, task)
    clip = ClipSpec(mode=cfg.clip_mode, threshold=cfg.clip, kind=cfg.clip_kind)
    step = StepSize(cfg.lr, cfg.lr_decay)
    if cfg.algorithm == "dsgd":
        if cfg.sigma > 0 or cfg.sigma_cor > 0:
            raise ConfigError("algorithm 'dsgd' is non-private; use 'ldp' or 'decor' for noise")
        algo = DSGD(step, clip=clip, weight_decay=cfg.weight_decay)
    elif cfg.algorithm in ("ldp", "cdp"):
        if cfg.clip_mode == "none":
            raise ConfigError(f"algorithm {cfg.algorithm!r} needs clipping (set clip)")
        if cfg.sigma <= 0:
            raise ConfigError(f"algorithm {cfg.algorithm!r} needs a noise std sigma > 0")
        if cfg.sigma_cor > 0:
            raise ConfigError(f"algorithm {cfg.algorithm!r} has no correlated noise (sigma_cor)")
        algo = DSGD(step, clip=clip, sigma=cfg.sigma, weight_decay=cfg.weight_decay)
    elif cfg.algorithm == "decor":
        if cfg.clip_mode == "none":
            raise ConfigError("algorithm 'decor' needs clipping (set clip)")
        if cfg.sigma <= 0:
            raise ConfigError("algorithm 'decor' needs sigma (sigma_cdp) > 0 or a target epsilon")
        algo = Decor(
            step,
            edges=topo.edges,
            n_nodes=topo.n,
            clip=clip,
            sigma_cdp=cfg.sigma,
            sigma_cor=cfg.sigma_cor,
            weight_decay=cfg.weight_decay,
        )
    else:  # pragma: no cover - the config validates the name
        raise ConfigError(f"unknown algorithm {cfg.algorithm!r}")
    privacy = run_accountant(cfg, topo, task)
    return Built(cfg, topo, comm, task, algo, privacy)


def _progress(total: int, start: int, enabled: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    prog = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        disable=not enabled,
        transient=False,
    )
    return prog


def train(
    cfg: RunConfig | dict,
    out_dir: str | Path,
    *,
    progress: bool | None = None,
    overwrite: bool = False,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` and write its records into ``out_dir``; returns the summary.

    ``progress=None`` shows a progress bar only when stderr is a terminal. ``stop_after`` ends
    the run early after that many steps without a summary (used to test resuming).
    """
    cfg = cfg if isinstance(cfg, RunConfig) else make_config(cfg)
    built = build(cfg)
    records = RunRecords(out_dir)
    records.start(built.cfg.model_dump(), overwrite=overwrite)
    cfg = built.cfg
    state = built.algorithm.init(built.task.init_params(seed=cfg.seed), seed=cfg.seed)
    return _loop(built, records, state, progress=progress, stop_after=stop_after, t0_wall=0.0)


def resume(out_dir: str | Path, *, progress: bool | None = None) -> dict[str, Any]:
    """Continue the run in ``out_dir`` from its checkpoint (or return its summary if complete)."""
    records = RunRecords(out_dir)
    done = records.summary()
    if done is not None:
        return done
    cfg = make_config(records.config())
    built = build(cfg, calibrated=True)
    ckpt = records.load_checkpoint()
    if ckpt is None:
        state = built.algorithm.init(built.task.init_params(seed=cfg.seed), seed=cfg.seed)
        wall = 0.0
    else:
        state = built.algorithm.init(
            {k: v.to(cfg.device) for k, v in ckpt["params"].items()}, seed=cfg.seed
        )
        state.t = int(ckpt["t"])
        wall = float(ckpt.get("wall_time", 0.0))
    return _loop(built, records, state, progress=progress, stop_after=None, t0_wall=wall)


def _eval_row(built: Built, state: DSGDState, wall: float) -> dict[str, Any]:
    row: dict[str, Any] = {"step": state.t, "wall_time": round(wall, 4)}
    row.update(built.task.evaluate(state.params))
    row["consensus_distance"] = consensus_distance(state.params)
    priv = built.privacy(state.t) if built.privacy is not None else None
    if priv is not None:
        row["privacy"] = priv
    return row


def _loop(built, records, state, *, progress, stop_after, t0_wall) -> dict[str, Any]:
    cfg = built.cfg
    enabled = sys.stderr.isatty() if progress is None else progress
    have = {r.get("step") for r in records.rows()}
    start_wall = time.perf_counter() - t0_wall
    if state.t == 0 and 0 not in have:
        records.append(_eval_row(built, state, 0.0))
    last_row = None
    with _progress(cfg.steps, state.t, enabled) as prog:
        bar = prog.add_task(cfg.algorithm, total=cfg.steps, completed=state.t, info="")
        while state.t < cfg.steps:
            state, info = built.algorithm.step(state, built.task.oracle, built.comm)
            prog.advance(bar)
            if state.t % cfg.eval_every == 0 or state.t == cfg.steps:
                wall = time.perf_counter() - start_wall
                row = _eval_row(built, state, wall)
                if not all(math.isfinite(v) for v in row.values() if isinstance(v, float)):
                    row["diverged"] = True
                records.save_checkpoint(
                    {
                        "params": {k: v.cpu() for k, v in state.params.items()},
                        "t": state.t,
                        "wall_time": wall,
                    }
                )
                if state.t not in have:
                    records.append(row)
                last_row = row
                prog.update(bar, info=_short(row))
                if row.get("diverged"):
                    break
            if stop_after is not None and state.t >= stop_after:
                return {"stopped_at": state.t}
    if last_row is None:
        last_row = _eval_row(built, state, time.perf_counter() - start_wall)
    summary = {
        "config": cfg.model_dump(),
        "final": last_row,
        "steps_done": state.t,
        "completed": state.t == cfg.steps,
        "topology": built.topology.summary(),
    }
    records.finish(summary)
    if last_row.get("diverged"):
        raise PrivdlError(
            f"training diverged at step {state.t} (non-finite metrics); lower --lr or clip"
        )
    return summary


def _short(row: dict[str, Any]) -> str:
    parts = []
    for key in ("loss", "accuracy", "optimality_gap"):
        if key in row and isinstance(row[key], float):
            parts.append(f"{key}={row[key]:.4g}")
    return " ".join(parts)
