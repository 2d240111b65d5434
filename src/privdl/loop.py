"""The one training loop: train, resume, seed sweeps, federated rounds, several processes.

``train(cfg, out)`` builds the run's parts through its recipe (:mod:`privdl.registry`), records
as it goes and returns the summary; ``resume(out)`` continues a run from its checkpoint. A
:class:`World` says which process this is and makes the communicator: :class:`LocalWorld` (one
process owns every node, the default) or :class:`privdl.distributed_runner.DistributedWorld`
(``privdl launch`` / ``torchrun``: each process owns a shard of the nodes). Nothing else differs
between them: rank 0 writes the records and checkpoints, every process steps its own nodes.

Records (DESIGN.md, "Loop"): ``config.json`` first, then every ``eval_every`` steps the
checkpoint and then its metrics row (append-only), ``summary.json`` last. A run cut off anywhere
resumes where its checkpoint stands; its privacy ledger is a function of the step count, so a
resumed run neither resets nor double-counts epsilon.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import ValidationError
from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

from privdl.algorithms.base import Keys, finish_drawn_ahead
from privdl.comm.base import Communicator
from privdl.comm.local import LocalCommunicator
from privdl.config import CommonConfig, format_validation_error
from privdl.errors import ConfigError, PrivdlError, ReportedError
from privdl.mechanisms.identity import Authenticator, Roster, load_identities
from privdl.recipes.base import KEY_FIELDS, Recipe, Run, seed_shared
from privdl.records import RecordsWarning, RunRecords, missing_steps, steps_text, write_record
from privdl.registry import get_entry, make_config, recipe_for

__all__ = [
    "Callback",
    "LocalWorld",
    "Trained",
    "World",
    "build_run",
    "resume",
    "train",
]

CALIBRATION_FILE = "calibration.json"


class World:
    """Which process this is and how its communicator is made (the simulator: one process)."""

    rank: int = 0
    size: int = 1

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def communicator(
        self, schedule: Any, *, n_nodes: int, device: str, dtype: torch.dtype
    ) -> Communicator:
        """The communicator over ``n_nodes`` nodes mixing with ``schedule``."""
        return LocalCommunicator(schedule, n_nodes=n_nodes, device=device, dtype=dtype)

    def check(self, n_nodes: int) -> None:
        """Refuse a run this world cannot hold (more processes than nodes)."""

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process."""
        return obj

    def all_gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order."""
        return [obj]

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` says about the processes (nothing for one)."""
        return {}

    def fault_step(self) -> int | None:
        """The step at which this process kills itself (``PRIVDL_DEBUG_KILL``; drills)."""
        return None

    def os_state(self, run: Run, out_dir: Path, ckpt: dict[str, Any] | None) -> Any:
        """The initial state of a ``key_source = "os"`` run: fresh OS keys, or a resumed run's
        (one process: kept in the checkpoint)."""
        return os_state_from_checkpoint(run, ckpt)

    def annotate_checkpoint(self, run: Run, state: Any, ckpt: dict[str, Any]) -> None:
        """What a ``key_source = "os"`` checkpoint keeps of the keys (one process: the keys)."""
        ckpt["keys"] = checkpoint_keys(run, state)

    def checkpoint_path(self, records: RunRecords, step: int) -> Path:
        """Where this process's checkpoint of ``step`` is (one process: ``checkpoint.pt``)."""
        return records.checkpoint_path

    def save_shard(self, records: RunRecords, ckpt: dict[str, Any]) -> None:
        """Save this process's own checkpoint (collective; several processes only)."""
        raise NotImplementedError

    def load_shard(self, run: Run, records: RunRecords) -> dict[str, Any] | None:
        """This process's own checkpoint of the latest step every process saved, or None
        (collective; several processes only)."""
        raise NotImplementedError


class LocalWorld(World):
    """One process owns every node (the simulator)."""


class Callback(Protocol):
    """Hooks a run calls on the writing process (rank 0); implement any of them.

    ``on_evaluate(row)``: a metrics row was recorded (``step``, the task's metrics, ``privacy``);
    ``on_checkpoint(path, step)``: the checkpoint at ``step`` was saved. Log to TensorBoard,
    MLflow or anything else from here without privdl depending on them.
    """

    def on_evaluate(self, row: dict[str, Any]) -> None: ...

    def on_checkpoint(self, path: Path, step: int) -> None: ...


@dataclass
class Trained:
    """What a finished (or stopped) loop leaves: its summary, the run and its final state."""

    summary: dict[str, Any]
    run: Run
    state: Any


@dataclass
class _Loop:
    progress: bool | None = None
    stop_after: int | None = None
    callbacks: Sequence[Any] = ()
    extra: dict[str, Any] = field(default_factory=dict)


# -- building a run -------------------------------------------------------------------------
def _dtype(cfg: Any) -> torch.dtype:
    return torch.float64 if cfg.dtype == "float64" else torch.float32


def build_run(
    cfg: CommonConfig,
    *,
    world: World | None = None,
    calibrated: bool = False,
    user: Any = None,
) -> Run:
    """Compose topology, communicator, task, algorithm, oracle and accountant of ``cfg``.

    Unless ``calibrated`` (a resumed run's saved config, or rank 0's already), a target
    ``epsilon`` is turned into noise levels first; the returned ``Run.cfg`` is the resolved
    configuration. The run's keys are seeded (:meth:`Run.keys`); the loop replaces them for
    ``key_source = "os"``. ``user``: the objects a Python caller gave (model, data).
    """
    world = world or LocalWorld()
    recipe: Recipe = recipe_for(cfg)
    cfg = recipe.prepare(cfg)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but CUDA is not available on this machine")
    topology, schedule = recipe.topology(cfg)
    n = recipe.n_nodes(cfg)
    task = recipe.make_task(cfg, n, user=user)
    if not calibrated:
        cfg = recipe.calibrate(cfg, topology, task)
    comm = world.communicator(schedule, n_nodes=n, device=cfg.device, dtype=_dtype(cfg))
    algorithm = recipe.algorithm(cfg, topology, task)
    if getattr(cfg, "roster", None) is not None and not getattr(algorithm, "sigma_cor", 0) > 0:
        raise ConfigError(
            f"a roster authenticates DECOR's key agreement (sigma_cor > 0); {cfg.algorithm} "
            "agrees no keys: drop --roster and --identities"
        )
    oracle = recipe.oracle(cfg, task, algorithm, comm.owned_list)
    privacy = recipe.accountant(cfg, topology, task, algorithm)
    run = Run(cfg, recipe, topology, comm, task, algorithm, oracle, privacy, Keys())
    set_keys(run, Keys.from_seed(cfg.seed))
    return run


def set_keys(run: Run, keys: Keys) -> None:
    """Give ``run`` its keys (with the authenticator of its roster, if it has one); the task's
    minibatches follow its sampling seed."""
    roster = getattr(run.cfg, "roster", None)
    if roster is not None and keys.authenticator is None:
        owned = run.comm.owned_list
        if roster == "seed":
            auth = Authenticator.from_seed(run.cfg.seed, run.comm.n_nodes, owned)
        else:
            auth = Authenticator(Roster.load(roster), load_identities(run.cfg.identities, owned))
        keys = dataclasses.replace(keys, authenticator=auth)
    run.keys = keys
    if hasattr(run.task, "seed"):
        run.task.seed = int(keys.sampling_seed)


# -- the loop -------------------------------------------------------------------------------
#: Seconds between the short progress lines of a run whose stderr is not a terminal (a log
#: file, a batch job); ``PRIVDL_PROGRESS_EVERY`` in the environment overrides it.
PROGRESS_EVERY_S = 30.0


class _TwoLineProgress(Progress):
    """The bar on one line and the latest metrics folded below it: at 80 columns a one-line
    table squeezed the metrics to "..." (issue 32)."""

    def get_renderables(self) -> Iterator[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            info = task.fields.get("info")
            if info:
                yield Text(f"  {info}", overflow="fold")


def _progress(enabled: bool, *, console: Any = None) -> Progress:
    return _TwoLineProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=False,
        console=console or Console(stderr=True),  # where the check for a terminal looked
    )


def _clock(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _ProgressLines:
    """A short line on stderr every ``every`` seconds (from a thread, so a long step or
    evaluation still reports): step, share done, elapsed, an estimate of what is left and the
    latest metrics. For runs whose stderr is not a terminal, where a bar is unreadable."""

    def __init__(self, label: str, total: int, start: int, every: float) -> None:
        self.label, self.total, self.start, self.every = label, total, start, every
        self.t, self.info = start, ""
        self._began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="privdl-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            print(self.line(), file=sys.stderr, flush=True)

    def line(self) -> str:
        elapsed = time.monotonic() - self._began
        t, total = self.t, max(self.total, 1)
        text = f"{self.label}: step {t}/{self.total} ({100 * t / total:.0f}%), {_clock(elapsed)}"
        if t > self.start:
            text += f", ~{_clock(elapsed * (self.total - t) / (t - self.start))} left"
        return text + (f"; {self.info}" if self.info else "")

    def __enter__(self) -> _ProgressLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _progress_every() -> float:
    text = os.environ.get("PRIVDL_PROGRESS_EVERY")
    try:
        every = float(text) if text else PROGRESS_EVERY_S
    except ValueError:
        every = PROGRESS_EVERY_S
    return every if every > 0 and math.isfinite(every) else PROGRESS_EVERY_S


@contextmanager
def _no_lines() -> Iterator[None]:
    yield None


def short_info(row: dict[str, Any]) -> str:
    """The progress bar's note: the headline metrics and the epsilon spent so far."""
    parts = []
    for key in ("loss", "accuracy", "optimality_gap"):
        if key in row and isinstance(row[key], float):
            parts.append(f"{key}={row[key]:.4g}")
    priv = row.get("privacy")
    if priv and isinstance(priv.get("epsilon"), float):
        tag = " NOMINAL" if priv.get("nominal") else ""  # the full label is in the records
        parts.append(
            f"eps={priv['epsilon']:.3g}{tag} (delta={priv.get('delta', 0):.2g}, "
            f"{priv.get('unit', '?')}, {priv.get('threat_model', '?')})"
        )
    return " ".join(parts)


def row_missing(cfg: Any, t: int, have: set[Any]) -> bool:
    """Whether a run starting (or resuming) at step ``t`` must write that step's row first:
    step 0, or a checkpoint whose row a crash kept from the metrics (the checkpoint is saved
    before its row is appended)."""
    return t not in have and (t == 0 or t % cfg.eval_every == 0 or t == cfg.steps)


def refuse_diverged(summary: dict[str, Any]) -> None:
    """A run whose last evaluation was not finite ends with a clear error (after its records)."""
    if summary["final"].get("diverged"):
        raise PrivdlError(
            f"training diverged at step {summary['steps_done']} (non-finite metrics); "
            "lower --lr or clip"
        )


@contextmanager
def _drop_drawn_ahead() -> Iterator[None]:
    """After the steps: the noise a DECOR step drew ahead for a step that will not run is
    dropped (:func:`privdl.algorithms.base.finish_drawn_ahead`, not waited for)."""
    try:
        yield
    finally:
        finish_drawn_ahead(wait=False)


def _call(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    for cb in callbacks:
        fn = getattr(cb, hook, None)
        if fn is not None:
            fn(*args)


def _finite(row: dict[str, Any]) -> bool:
    return all(math.isfinite(v) for v in row.values() if isinstance(v, float))


def run_loop(
    run: Run,
    records: RunRecords | None,
    state: Any,
    world: World,
    *,
    t0_wall: float,
    options: _Loop,
    save_checkpoint: Callable[[dict[str, Any], Any], None],
) -> Trained:
    """Advance ``state`` to ``cfg.steps``: evaluate, checkpoint and record every ``eval_every``.

    Every process calls this; only the writer (rank 0) has ``records``; the stop flag and the
    summary are rank 0's on every process.
    """
    cfg = run.cfg
    writer = records is not None
    tty = sys.stderr.isatty()
    enabled = writer and (tty if options.progress is None else options.progress)
    # not a terminal and not asked either way: a short line every PROGRESS_EVERY_S instead
    lines_wanted = writer and options.progress is None and not tty
    have = {r.get("step") for r in records.rows()} if records is not None else set()
    if records is not None and state.t > 0:
        lost = missing_steps(have, eval_every=cfg.eval_every, steps=cfg.steps, upto=state.t - 1)
        if lost:  # said, never silent: privdl report flags the gap too
            warnings.warn(
                f"{records.metrics_path} lacks the rows of step(s) {steps_text(lost)}, before "
                f"the checkpoint at step {state.t} (the file was cut or torn): they are lost; "
                f"the run resumes at step {state.t}",
                RecordsWarning,
                stacklevel=2,
            )
    start_wall = time.perf_counter() - t0_wall
    kill = world.fault_step()
    # evaluations gather every process's nodes: every process takes part, the writer records
    if world.broadcast(writer and row_missing(cfg, state.t, have)):
        row, _ = run.evaluate(state, t0_wall)
        if records is not None and row is not None:
            records.append(row)
            _call(options.callbacks, "on_evaluate", row)
    last_row, evaluated = None, False
    label = cfg.algorithm + (f" x{world.size}" if world.size > 1 else "")
    ticker = _ProgressLines(label, cfg.steps, state.t, _progress_every()) if lines_wanted else None
    with _progress(enabled) as prog, ticker or _no_lines(), _drop_drawn_ahead():
        bar = prog.add_task(label, total=cfg.steps, completed=state.t, info="")
        while state.t < cfg.steps:
            if kill is not None and state.t == kill:
                os.kill(os.getpid(), 9)  # SIGKILL: a drill of a dead process
            state = run.advance(state)
            t = state.t
            prog.advance(bar)
            if ticker is not None:
                ticker.t = t
            if t % cfg.eval_every == 0 or t == cfg.steps:
                evaluated = True
                row, ckpt = run.evaluate(state, time.perf_counter() - start_wall)
                stop = False
                if run.sharded and ckpt is not None:  # every rank its own, before the row
                    save_checkpoint(ckpt, state)
                if records is not None and row is not None and ckpt is not None:
                    if not _finite(row):
                        row["diverged"] = True
                    if not run.sharded:
                        save_checkpoint(ckpt, state)
                    _call(options.callbacks, "on_checkpoint", world.checkpoint_path(records, t), t)
                    if t not in have:
                        records.append(row)
                        _call(options.callbacks, "on_evaluate", row)
                    last_row, stop = row, bool(row.get("diverged"))
                    prog.update(bar, info=short_info(row))
                    if ticker is not None:
                        ticker.info = short_info(row)
                if world.broadcast(stop):
                    break
            if options.stop_after is not None and t >= options.stop_after:
                return Trained({"stopped_at": t}, run, state)
    if not evaluated:  # resumed at the last step: evaluate the checkpointed state
        last_row, _ = run.evaluate(state, time.perf_counter() - start_wall)
    summary = None
    if records is not None:
        summary = finish_run(run, records, last_row, state.t, **world.summary(), **options.extra)
    summary = world.broadcast(summary)
    refuse_diverged(summary)
    return Trained(summary, run, state)


def finish_run(
    run: Run, records: RunRecords, last_row: dict[str, Any] | None, t: int, **extra: Any
) -> dict[str, Any]:
    """Write ``summary.json`` (the final row, config, topology, calibration and ``extra``)."""
    import json

    summary = {
        "config": run.cfg.model_dump(),
        "final": last_row,
        "steps_done": t,
        "completed": t == run.cfg.steps,
        "topology": run.topology.summary(),
        **extra,
    }
    cal = records.dir / CALIBRATION_FILE
    if cal.is_file():
        summary["calibration"] = json.loads(cal.read_text())
    return records.finish(summary)


def write_calibration(records: RunRecords, record: dict[str, Any] | None) -> None:
    """Save the accounted and nominal noise levels of a calibrated run (``calibration.json``)."""
    path = records.dir / CALIBRATION_FILE
    if record is not None:
        write_record(path, record)
    elif path.exists():  # an overwritten earlier run's
        path.unlink()


def check_same_run(saved: dict[str, Any], given: dict[str, Any], out_dir: Path) -> None:
    """Refuse to resume a run (``--resume-if-exists``) whose saved config differs from the
    values a command line gives; keys it leaves out keep the saved run's (calibrated noise,
    defaults)."""
    saved_cfg = make_config(saved, saved=True).model_dump()
    differ = [k for k, v in given.items() if saved_cfg.get(k) != v]
    if differ:
        shown = ", ".join(f"{k}={saved_cfg.get(k)!r} (given {given[k]!r})" for k in differ[:3])
        raise ConfigError(
            f"{out_dir} holds a run started with other options ({shown}); "
            "--resume-if-exists resumes only the same run: choose another --out, or --overwrite"
        )


# -- keys of key_source = "os" runs -----------------------------------------------------------
def key_fields(state: Any) -> list[str]:
    """The stream-key fields a state has (each node's noise keys, DECOR's edge secrets)."""
    return [k for k in KEY_FIELDS if hasattr(state, k)]


def os_state_from_checkpoint(run: Run, ckpt: dict[str, Any] | None) -> Any:
    """One process, ``key_source = "os"``: fresh OS keys, or a resumed run's keys from its
    checkpoint (the only place they are kept)."""
    cfg = run.cfg
    keys = ckpt.get("keys") if ckpt is not None else None
    saved_seed = keys.get("sampling_seed") if isinstance(keys, dict) else None
    set_keys(run, Keys.from_os(cfg.seed, sampling_seed=saved_seed))
    state = run.init_state()
    if ckpt is None or not key_fields(state):
        return state
    if not isinstance(keys, dict):
        where = (
            "a privdl launch run keeps them per rank (OUT/keys); resume it with privdl "
            "launch --resume and the same --nproc"
            if "key_run_id" in ckpt
            else "the run cannot be resumed"
        )
        raise PrivdlError(f"the checkpoint of this key_source=os run holds no keys: {where}")
    if saved_seed is None:
        raise PrivdlError(
            "the checkpoint of this key_source=os run predates its sampling seed (an "
            "earlier privdl): the run cannot be resumed"
        )
    saved = {k: tuple(v) for k, v in keys.items() if k != "sampling_seed"}
    return dataclasses.replace(state, **saved)


def checkpoint_keys(run: Run, state: Any) -> dict[str, Any]:
    """What a one-process ``key_source = "os"`` checkpoint keeps: the stream keys and the
    sampling seed (not derivable: the run cannot resume without them)."""
    keys: dict[str, Any] = {k: list(getattr(state, k)) for k in key_fields(state)}
    keys["sampling_seed"] = int(run.keys.sampling_seed)
    return keys


#: Config keys a resume may find changed in ``config.json`` (where the run reads its data,
#: which device runs it, its name in reports, where its keys come from: a launched run's
#: resume with the seed's keys is another run, tests/comm/test_distributed.py): none of them
#: shapes the checkpointed state.
EDITABLE_KEYS = ("device", "data_dir", "label", "key_source")


def refuse_edited_config(
    ckpt: dict[str, Any] | None, cfg: CommonConfig, records: RunRecords
) -> None:
    """Refuse, with one line naming the key, to resume from a checkpoint written under another
    configuration than ``config.json``'s (the file was edited after the run started);
    checkpoints of earlier privdl versions carry no configuration and are checked by shape."""
    saved = ckpt.get("config") if ckpt is not None else None
    if not isinstance(saved, dict):
        return
    then = make_config(saved, saved=True).model_dump()
    now = cfg.model_dump()
    differ = [k for k in sorted(set(then) | set(now)) if k not in EDITABLE_KEYS
              and then.get(k) != now.get(k)]  # fmt: skip
    if differ:
        k = differ[0]
        more = f" (and {', '.join(differ[1:4])})" if len(differ) > 1 else ""
        raise PrivdlError(
            f"{records.dir}/config.json says {k}={now.get(k)!r} but the checkpoint was written "
            f"with {k}={then.get(k)!r}{more}: config.json was edited after the run started; "
            "put it back to resume, or start a new run with --out"
        )


def refuse_shards(records: RunRecords) -> None:
    """One process cannot resume a launched run whose ranks keep their own checkpoints (it
    would have to read every rank's data): one line naming the command that can."""
    worlds = {w for (_, w, _) in records.shard_files()}
    if worlds:
        n = max(worlds)
        raise PrivdlError(
            f"{records.dir} was launched on {n} processes and each keeps its own checkpoint "
            f"({records.shards_dir.name}/): resume it with privdl launch --nproc {n} --resume "
            f"{records.dir}"
        )


def _misfit(run: Run, ckpt: dict[str, Any]) -> str | None:
    """Why an earlier privdl's checkpoint (no config in it) cannot hold this run's nodes' models
    (another shape), or None. A server's model (``replicated``) is not checked."""
    if "config" in ckpt or run.recipe.replicated:
        return None
    fresh = run.recipe.initial_params(run.cfg, run.task)
    saved = ckpt.get("params")
    if not isinstance(saved, dict) or set(saved) != set(fresh):
        return "other model parameters"
    for k, v in fresh.items():
        if not isinstance(saved[k], torch.Tensor) or tuple(saved[k].shape) != tuple(v.shape):
            got = tuple(saved[k].shape) if isinstance(saved[k], torch.Tensor) else "?"
            return f"{k} has shape {got}, this run's {tuple(v.shape)}"
    return None


def config_from_dump(dump: dict[str, Any]) -> CommonConfig:
    """The configuration ``cfg.model_dump()`` came from (what rank 0 sends the other ranks:
    validated by its family's model, not resolved again)."""
    name = dump.get("algorithm") if isinstance(dump, dict) else None
    if not isinstance(name, str):
        raise PrivdlError("rank 0 sent a configuration without an algorithm")
    try:
        return get_entry(name).recipe.config_model.model_validate(dump)
    except ValidationError as exc:
        raise format_validation_error(exc) from None


# -- train and resume -----------------------------------------------------------------------
def fit(
    cfg: CommonConfig | dict[str, Any] | None,
    out_dir: str | Path,
    *,
    resume: bool = False,
    world: World | None = None,
    progress: bool | None = None,
    overwrite: bool = False,
    stop_after: int | None = None,
    callbacks: Sequence[Any] = (),
    user: Any = None,
    extra: dict[str, Any] | None = None,
    on_start: Callable[[RunRecords, CommonConfig], None] | None = None,
    resume_if_exists: dict[str, Any] | None = None,
) -> Trained:
    """Train ``cfg`` into ``out_dir`` (or, with ``resume``, continue the run there) on this
    process of ``world``; every process of a multi-process run calls it.

    ``resume_if_exists``: the config values a command line gave; rank 0 resumes the run in
    ``out_dir`` if it holds one (that recorded a metrics row) started with those values, and
    starts ``cfg`` otherwise (``--resume-if-exists``: the same command starts or continues).

    Rank 0 holds the run directory's lock, validates and calibrates (bad input fails before
    ``out_dir`` is made), writes the records and decides; the other processes get its config,
    checkpoint and verdicts by broadcast. ``on_start(records, cfg)``: called on rank 0 once the
    run directory is held (a new run's after its config is written).
    """
    world = world or LocalWorld()
    records = RunRecords(out_dir)
    with ExitStack() as held:
        run: Run | None = None
        ckpt: dict[str, Any] | None = None
        error: PrivdlError | None = None
        done: dict[str, Any] | None = None
        if world.is_writer:
            try:
                if resume_if_exists is not None and records.metrics_path.exists():
                    check_same_run(records.config(), resume_if_exists, records.dir)
                    resume = True
                if resume:
                    saved = records.config()  # refuses a directory that holds no run
                    held.enter_context(records.exclusive())
                    records.remove_orphans()  # a killed writer's temporary files (keys)
                    cfg = make_config(saved, saved=True)
                    if on_start is not None:
                        on_start(records, cfg)
                    done = records.summary()
                    if done is None and world.size == 1:
                        refuse_shards(records)
                    if done is None:
                        ckpt = records.load_checkpoint()
                        refuse_edited_config(ckpt, cfg, records)
                        if ckpt is not None and "keys" in ckpt and world.size > 1:
                            raise PrivdlError(
                                "this key_source=os run was started in one process and keeps "
                                "its keys in its checkpoint: resume it with privdl run --resume "
                                "(nothing was sent to the other processes)"
                            )
                else:
                    start = cfg if isinstance(cfg, CommonConfig) else make_config(dict(cfg or {}))
                    run = build_run(start, world=world, user=user)  # calibrated once, here
                    cfg = run.cfg
                    assert isinstance(cfg, CommonConfig)
                    held.enter_context(records.exclusive())
                    records.start(cfg.model_dump(), overwrite=overwrite)
                    records.remove_orphans()
                    if on_start is not None:
                        on_start(records, cfg)
                    write_calibration(records, run.calibration())
            except PrivdlError as exc:
                error = exc
        status = None if error is None else str(error)
        dump = cfg.model_dump() if isinstance(cfg, CommonConfig) and status is None else None
        dump, status, finished, resume = world.broadcast((dump, status, done is not None, resume))
        if not world.is_writer and dump is not None:  # plain data on the wire: rebuilt here
            cfg = config_from_dump(dump)
        if status is not None:  # rank 0 raises it; the others exit quietly with code 2
            if error is not None:
                raise error
            raise ReportedError(status)
        if finished:
            summary = world.broadcast(done)
            refuse_diverged(summary)  # a diverged run stays an error, as when it stopped
            return Trained(summary, run, None)  # type: ignore[arg-type]
        assert isinstance(cfg, CommonConfig)
        if world.size > 1:
            ckpt = world.broadcast(ckpt)
        if run is None:
            run = build_run(cfg, world=world, calibrated=True, user=user)
        if run.sharded and resume:  # each rank's own checkpoint, newer than a gathered one
            shard = world.load_shard(run, records)
            if shard is not None:
                ckpt = shard
        if cfg.key_source == "os":
            state = world.os_state(run, Path(out_dir), ckpt)
        else:
            state = run.init_state()
        wall = 0.0
        if ckpt is not None:
            misfit = _misfit(run, ckpt)
            if misfit is not None:  # a checkpoint without its config (an earlier privdl's)
                raise PrivdlError(
                    f"{records.checkpoint_path} does not fit the run in {records.dir}/config.json "
                    f"({misfit}); was config.json edited? the run cannot be resumed"
                )
            if "owned" in ckpt:  # this rank's own rows
                state = run.recipe.restore_shard(run, state, ckpt)
            else:  # every node's (one process's, or a launched run's of an earlier privdl)
                state = run.recipe.restore(run, state, ckpt)
            wall = float(ckpt.get("wall_time", 0.0))
            if ckpt.get("seed_shared"):  # once launched with the seed's keys, always labelled so
                run.notes["seed_shared"] = True

        os_keys = cfg.key_source == "os"

        def save(ck: dict[str, Any], at: Any) -> None:
            ck["config"] = cfg.model_dump()  # what a resume checks config.json against
            if seed_shared(run):
                ck["seed_shared"] = True  # every rank had the seed: the records' label follows
            if os_keys:
                world.annotate_checkpoint(run, at, ck)
            if run.sharded:
                world.save_shard(records, ck)
            else:
                records.save_checkpoint(ck)

        options = _Loop(progress, stop_after, callbacks, dict(extra or {}))
        writer_records = records if world.is_writer else None
        return run_loop(run, writer_records, state, world, t0_wall=wall, options=options,
                        save_checkpoint=save)  # fmt: skip


def train(
    cfg: CommonConfig | dict[str, Any],
    out_dir: str | Path,
    *,
    progress: bool | None = None,
    overwrite: bool = False,
    stop_after: int | None = None,
    callbacks: Sequence[Any] = (),
    world: World | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` and write its records into ``out_dir``; returns the summary.

    ``progress=None`` shows a progress bar only when stderr is a terminal. ``stop_after`` ends
    the run early after that many steps without a summary (used to test resuming).
    """
    return fit(
        cfg, out_dir, progress=progress, overwrite=overwrite, stop_after=stop_after,
        callbacks=callbacks, world=world,
    ).summary  # fmt: skip


def resume(
    out_dir: str | Path,
    *,
    progress: bool | None = None,
    callbacks: Sequence[Any] = (),
    world: World | None = None,
) -> dict[str, Any]:
    """Continue the run in ``out_dir`` from its checkpoint (or return its summary if complete)."""
    return fit(None, out_dir, resume=True, progress=progress, callbacks=callbacks,
               world=world).summary  # fmt: skip
