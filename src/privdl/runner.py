"""Train one configured run, recording as it goes; resume from its checkpoint.

This is the one-call facade: ``train(cfg, out_dir)`` builds the topology, task, communicator,
algorithm and accountant from a :class:`~privdl.config.RunConfig` and runs it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from privdl.algorithms.base import StepSize, consensus_distance
from privdl.algorithms.decor import Decor
from privdl.algorithms.dsgd import DSGD
from privdl.comm.base import Tree
from privdl.comm.local import LocalCommunicator
from privdl.config import (
    DEFAULT_PORTER_GAMMA,
    FEDERATED,
    PORTER,
    PRIVSGP,
    RunConfig,
    make_config,
)
from privdl.engine.grads import ClipSpec
from privdl.errors import ConfigError, PrivdlError
from privdl.records import RunRecords, write_json_atomic
from privdl.tasks import build_task
from privdl.topology import ExponentialGraph, complete, mixing_matrix, parse_topology


@dataclass
class Built:
    """The composed parts of a run."""

    cfg: RunConfig
    topology: Any
    comm: LocalCommunicator
    task: Any
    algorithm: Any
    privacy: Any  # callable t -> dict | None
    oracle: Any = None  # what algorithm.step calls (default: the task's gradient oracle)

    def __post_init__(self) -> None:
        if self.oracle is None:
            self.oracle = self.task.oracle

    def initial_params(self) -> Tree:
        """``x^0``; PORTER starts every agent at the same point (row 0, its §2.2)."""
        params = self.task.init_params(seed=self.cfg.seed)
        if self.cfg.algorithm in PORTER:
            params = {k: v[:1].expand_as(v).clone() for k, v in params.items()}
        return params

    def init_state(self, params: Tree) -> Any:
        """``algorithm.init`` with what it needs (PrivSGP: its sample oracle for the table);
        with ``key_source = "os"`` its keys and data sampling are drawn afresh
        (:func:`with_os_keys`)."""
        if self.cfg.algorithm in PRIVSGP:
            state = self.algorithm.init(params, self.oracle, seed=self.cfg.seed)
        else:
            state = self.algorithm.init(params, seed=self.cfg.seed)
        if self.cfg.key_source != "os":
            return state
        state = with_os_keys(state, self.algorithm)
        return with_sampling_seed(state, self.task, sampling_seed())

    # the steps of the runner's loop (a federated run has the same: federated_runner)
    def advance(self, state: Any) -> Any:
        """One step of the algorithm."""
        return self.algorithm.step(state, self.oracle, self.comm)[0]

    def eval_row(self, state: Any, wall: float) -> dict[str, Any]:
        """The metrics row at ``state.t``: the task's metrics, consensus, privacy spent."""
        row: dict[str, Any] = {"step": state.t, "wall_time": round(wall, 4)}
        row.update(self.task.evaluate(state.params))
        row["consensus_distance"] = consensus_distance(state.params)
        priv = self.privacy(state.t) if self.privacy is not None else None
        if priv is not None:
            row["privacy"] = priv
        return row

    def checkpoint(self, state: Any, *, wall: float) -> dict[str, Any]:
        ckpt = checkpoint(state, state.params, wall=wall)
        if self.cfg.key_source == "os":  # not derivable: the run cannot resume without them
            ckpt["keys"] = {k: list(getattr(state, k)) for k in _KEY_FIELDS if hasattr(state, k)}
            ckpt["keys"]["sampling_seed"] = int(self.task.seed)
        return ckpt

    def restore(self, state: Any, ckpt: dict[str, Any]) -> Any:
        state = import_state(state, ckpt["params"], ckpt.get("state", {}), t=int(ckpt["t"]))
        if self.cfg.key_source == "os":
            keys = ckpt.get("keys")
            if not isinstance(keys, dict):
                where = (
                    "a privdl launch run keeps them per rank (OUT/keys); resume it with privdl "
                    "launch --resume and the same --nproc"
                    if "key_run_id" in ckpt
                    else "the run cannot be resumed"
                )
                raise PrivdlError(
                    f"the checkpoint of this key_source=os run holds no keys: {where}"
                )
            if "sampling_seed" not in keys:
                raise PrivdlError(
                    "the checkpoint of this key_source=os run predates its sampling seed (an "
                    "earlier privdl): the run cannot be resumed"
                )
            keys = dict(keys)
            seed = int(keys.pop("sampling_seed"))
            state = dataclasses.replace(state, **{k: tuple(v) for k, v in keys.items()})
            state = with_sampling_seed(state, self.task, seed)
        return state

    def calibration(self) -> dict[str, Any] | None:
        """The accounted and nominal noise levels of a calibrated run (``calibration.json``)."""
        from privdl.privacy import calibration_record

        return calibration_record(self.cfg, self.topology, self.task)


def build(cfg: RunConfig, *, calibrated: bool = False) -> Any:
    """Compose topology, communicator, task, algorithm and accountant from ``cfg``.

    Unless ``calibrated`` (a resumed run's saved config), a target ``epsilon`` is turned into
    noise levels first; the returned ``Built.cfg`` is the resolved configuration. A federated
    algorithm gives a :class:`~privdl.federated_runner.FederatedRun` (same steps).
    """
    from privdl.mechanisms.prng import resolve_backend
    from privdl.privacy import calibrate, run_accountant

    if cfg.algorithm in FEDERATED:
        from privdl.federated_runner import build_federated

        return build_federated(cfg)

    if cfg.noise_backend == "auto":
        cfg = cfg.model_copy(update={"noise_backend": resolve_backend("auto", cfg.device)})
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but CUDA is not available on this machine")
    topo = parse_topology(cfg.graph)
    if isinstance(topo, ExponentialGraph):  # PrivSGP's time-varying graph (config checks)
        mixing = topo
    elif cfg.algorithm == "cdp":
        # CDP baseline: complete graph with exact averaging W = J (DECOR spec §3)
        topo = complete(topo.n)
        mixing = mixing_matrix(topo, "average")
    else:
        topo.require_connected("decentralized training")
        mixing = _mixing(topo, cfg.mixing)
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
        algo = DSGD(
            step,
            clip=clip,
            sigma=cfg.sigma,
            weight_decay=cfg.weight_decay,
            noise_backend=cfg.noise_backend,
        )
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
            noise_backend=cfg.noise_backend,
        )
    elif cfg.algorithm in PORTER:
        algo = _porter(cfg, clip, step)
    elif cfg.algorithm in PRIVSGP:
        return _privsgp(cfg, topo, comm, task, step)
    else:  # pragma: no cover - the config validates the name
        raise ConfigError(f"unknown algorithm {cfg.algorithm!r}")
    privacy = run_accountant(cfg, topo, task)
    return Built(cfg, topo, comm, task, algo, privacy)


def _mixing(topo: Any, rule: str | None) -> Any:
    return mixing_matrix(topo, rule or "metropolis")


def _porter(cfg: RunConfig, clip: ClipSpec, step: StepSize) -> Any:
    """PORTER-DP (Option I, eqs. (6)-(7)) or PORTER-GC (Option II, eqs. (9)-(10))."""
    from privdl.algorithms.porter import Porter
    from privdl.mechanisms.compress import parse_compressor

    if cfg.weight_decay > 0:
        raise ConfigError(f"{cfg.algorithm} has no weight decay")
    if cfg.sigma_cor > 0:
        raise ConfigError(f"{cfg.algorithm} has no correlated noise (sigma_cor)")
    if cfg.clip_mode == "none":
        raise ConfigError(f"{cfg.algorithm} needs clipping (set clip)")
    if cfg.algorithm == "porter-gc" and cfg.sigma > 0:
        raise ConfigError("porter-gc adds no noise (sigma must be 0); use porter-dp for noise")
    if cfg.algorithm == "porter-dp" and cfg.sigma <= 0:
        raise ConfigError("porter-dp needs a noise std sigma > 0 or a target epsilon")
    bits = 64 if cfg.dtype == "float64" else 32
    comp = parse_compressor(cfg.compressor or "none", value_bits=bits)
    gamma = float(cfg.gamma) if cfg.gamma is not None else DEFAULT_PORTER_GAMMA
    return Porter(
        step, gamma, comp, clip, cfg.sigma, name=cfg.algorithm, noise_backend=cfg.noise_backend
    )


def _privsgp(cfg: RunConfig, topo: Any, comm: Any, task: Any, step: StepSize) -> Built:
    """PrivSGP-VR (Algorithm 1) or PrivSGP (Algorithm 2) with the task's sample oracle."""
    from privdl.algorithms.privsgp import PrivSGP
    from privdl.privacy import run_accountant

    if cfg.weight_decay > 0 or cfg.sigma_cor > 0:
        raise ConfigError(f"{cfg.algorithm} has neither weight decay nor correlated noise")
    if cfg.sigma > 0 and cfg.clip is None:
        raise ConfigError(f"{cfg.algorithm} with noise needs a clipping threshold (--clip C)")
    algo = PrivSGP(
        step,
        sigmas=cfg.sigma,
        variance_reduction=cfg.algorithm == "privsgp-vr",
        noise_backend=cfg.noise_backend,
    )
    oracle = task.sample_oracle(clip=cfg.clip, block_size=cfg.block_size)
    privacy = run_accountant(cfg, topo, task)
    return Built(cfg, topo, comm, task, algo, privacy, oracle=oracle)


#: State fields that are not saved: derived from the seed and the node ids on every start.
_DERIVED = ("t", "seed", "noise_keys", "edge_keys", "nodes")
#: The state's stream keys: each node's own noise keys and DECOR's per-edge secrets.
_KEY_FIELDS = ("noise_keys", "edge_keys")


def sampling_seed() -> int:
    """A 63-bit seed for the data sampling, from the OS (``key_source = "os"``)."""
    import os

    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)


def with_sampling_seed(state: Any, task: Any, seed: int) -> Any:
    """Data sampling keyed by ``seed`` instead of the run's: the task's minibatches and, where
    the state's seed draws the samples (PrivSGP's xi, DP2-SGD's), that seed. Subsampling
    amplification assumes the adversary does not know which samples were drawn.
    (PORTER's and SoteriaFL's state seed keys public compression masks: left as it is.)"""
    from privdl.algorithms.dp2sgd import GossipState
    from privdl.algorithms.privsgp import PrivSGPState

    if hasattr(task, "seed"):
        task.seed = int(seed)
    if isinstance(state, PrivSGPState | GossipState):
        state = dataclasses.replace(state, seed=int(seed))
    return state


def with_os_keys(state: Any, algorithm: Any) -> Any:
    """``state`` with its stream keys drawn from the operating system instead of the seed.

    Node noise keys: ``os.urandom(32)`` each; DECOR's edge secrets: a fresh X25519 agreement with
    OS key pairs (:func:`privdl.mechanisms.agree_edge_secrets` with ``seed=None``). The data
    sampling is re-keyed by :func:`with_sampling_seed`; initialisation and compression masks
    stay seeded.
    """
    import os

    from privdl.mechanisms.secrets import agree_edge_secrets

    updates: dict[str, Any] = {}
    keys = getattr(state, "noise_keys", ())
    if keys:
        updates["noise_keys"] = tuple(None if k is None else os.urandom(32) for k in keys)
    if getattr(state, "edge_keys", ()):
        secrets = agree_edge_secrets(algorithm.edges, algorithm.n_nodes, seed=None)
        updates["edge_keys"] = tuple(secrets.edge_keys())
    return dataclasses.replace(state, **updates) if updates else state


def export_state(state: Any) -> dict[str, torch.Tensor]:
    """The algorithm state's node-leading tensors as one flat tree (``name`` or ``name/leaf``).

    Everything but the step and the seed-derived keys: PORTER's surrogates ``q_x, q_v``, tracker
    ``v`` and stored noisy gradient ``g_prev``; PrivSGP's ``x, w``, SAGA table and running mean.
    The compressor and sampling generators are keyed by ``(seed, t)``: ``t`` is their position.
    """
    out: dict[str, torch.Tensor] = {}
    for f in dataclasses.fields(state):
        v = getattr(state, f.name)
        if f.name in _DERIVED or f.name == "params" or v is None:
            continue
        if isinstance(v, torch.Tensor):
            out[f.name] = v
        elif isinstance(v, dict):
            out.update({f"{f.name}/{k}": leaf for k, leaf in v.items()})
    return out


def import_state(state: Any, params: Tree, saved: dict[str, torch.Tensor], *, t: int) -> Any:
    """``state`` (a fresh ``init``) with the saved tensors, parameters and step put back."""
    names = {f.name for f in dataclasses.fields(state)}
    dev = next(iter(params.values())).device
    updates: dict[str, Any] = {}
    if "params" in names:
        updates["params"] = {k: v.to(dev) for k, v in params.items()}
    for key, v in saved.items():
        name, _, leaf = key.partition("/")
        if name not in names:
            raise PrivdlError(f"the checkpoint does not match the algorithm (field {name!r})")
        if leaf:
            updates.setdefault(name, {})[leaf] = v.to(dev)
        else:
            updates[name] = v.to(dev)
    new = dataclasses.replace(state, **updates)
    new.t = int(t)
    return new


def checkpoint(state: Any, params: Tree, *, wall: float, extra: dict | None = None) -> dict:
    """A checkpoint: the models, the step and (new algorithms) the full state on the CPU."""
    full = export_state(state) if extra is None else extra
    ckpt: dict[str, Any] = {"params": {k: v.cpu() for k, v in params.items()}, "t": state.t}
    ckpt["wall_time"] = wall
    if full:
        ckpt["state"] = {k: v.cpu() for k, v in full.items()}
    return ckpt


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
    with records.exclusive():
        records.start(built.cfg.model_dump(), overwrite=overwrite)
        write_calibration(records, built.calibration())
        state = built.init_state(built.initial_params())
        return _loop(built, records, state, progress=progress, stop_after=stop_after, t0_wall=0.0)


CALIBRATION_FILE = "calibration.json"


def write_calibration(records: RunRecords, record: dict | None) -> None:
    """Save the accounted and nominal noise levels of a calibrated run (``calibration.json``)."""
    path = records.dir / CALIBRATION_FILE
    if record is not None:
        write_json_atomic(path, record)
    elif path.exists():  # an overwritten earlier run's
        path.unlink()


def resume(out_dir: str | Path, *, progress: bool | None = None) -> dict[str, Any]:
    """Continue the run in ``out_dir`` from its checkpoint (or return its summary if complete)."""
    records = RunRecords(out_dir)
    cfg = make_config(records.config())  # refuses a directory that holds no run
    with records.exclusive():
        done = records.summary()
        if done is not None:
            refuse_diverged(done)  # a diverged run stays an error, as when it stopped
            return done
        built = build(cfg, calibrated=True)
        ckpt = records.load_checkpoint()
        state = built.init_state(built.initial_params())
        wall = 0.0
        if ckpt is not None:
            state = built.restore(state, ckpt)
            wall = float(ckpt.get("wall_time", 0.0))
        return _loop(built, records, state, progress=progress, stop_after=None, t0_wall=wall)


def row_missing(cfg: RunConfig, t: int, have: set) -> bool:
    """Whether a run starting (or resuming) at step ``t`` must write that step's row first:
    step 0, or a checkpoint whose row a crash kept from the metrics (the checkpoint is saved
    before its row is appended)."""
    return t not in have and (t == 0 or t % cfg.eval_every == 0 or t == cfg.steps)


def _loop(
    built: Any,
    records: RunRecords | None,
    state: Any,
    *,
    progress: bool | None,
    stop_after: int | None,
    t0_wall: float,
    sync: Callable[[Any], Any] | None = None,
    label: str | None = None,
    before_step: Callable[[int], None] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Advance ``state`` to ``cfg.steps``: evaluate, checkpoint and record every ``eval_every``.

    Several processes (a sharded federated run, :mod:`privdl.distributed_runner`): every rank
    calls this; only the writer (rank 0) has ``records``, evaluates and checkpoints, and
    ``sync(value)`` gives every rank rank 0's value (the stop flag, the summary). ``extra`` goes
    into ``summary.json``; ``before_step(t)`` is the fault-injection hook.
    """
    cfg = built.cfg
    writer = records is not None
    enabled = writer and (sys.stderr.isatty() if progress is None else progress)
    have = {r.get("step") for r in records.rows()} if writer else set()
    start_wall = time.perf_counter() - t0_wall
    t = state.t
    if writer and row_missing(cfg, t, have):
        records.append(built.eval_row(state, t0_wall))
    last_row = None
    with _progress(cfg.steps, t, enabled) as prog:
        bar = prog.add_task(label or cfg.algorithm, total=cfg.steps, completed=t, info="")
        while t < cfg.steps:
            if before_step is not None:
                before_step(t)
            state = built.advance(state)
            t = state.t
            prog.advance(bar)
            if t % cfg.eval_every == 0 or t == cfg.steps:
                stop = False
                if writer:
                    wall = time.perf_counter() - start_wall
                    row = built.eval_row(state, wall)
                    if not all(math.isfinite(v) for v in row.values() if isinstance(v, float)):
                        row["diverged"] = True
                    records.save_checkpoint(built.checkpoint(state, wall=wall))
                    if t not in have:
                        records.append(row)
                    last_row, stop = row, bool(row.get("diverged"))
                    prog.update(bar, info=_short(row))
                if sync is not None:
                    stop = sync(stop)
                if stop:
                    break
            if stop_after is not None and t >= stop_after:
                return {"stopped_at": t}
    summary = None
    if writer:
        if last_row is None:
            last_row = built.eval_row(state, time.perf_counter() - start_wall)
        summary = finish_run(built, records, last_row, t, **extra)
    if sync is not None:
        summary = sync(summary)
    refuse_diverged(summary)
    return summary


def finish_run(
    built: Built, records: RunRecords, last_row: dict[str, Any], t: int, **extra: Any
) -> dict[str, Any]:
    """Write ``summary.json`` (the final row, config, topology, calibration and ``extra``)."""
    import json

    summary = {
        "config": built.cfg.model_dump(),
        "final": last_row,
        "steps_done": t,
        "completed": t == built.cfg.steps,
        "topology": built.topology.summary(),
        **extra,
    }
    cal = records.dir / CALIBRATION_FILE
    if cal.is_file():
        summary["calibration"] = json.loads(cal.read_text())
    records.finish(summary)
    return summary


def refuse_diverged(summary: dict[str, Any]) -> None:
    """A run whose last evaluation was not finite ends with a clear error (after its records)."""
    if summary["final"].get("diverged"):
        raise PrivdlError(
            f"training diverged at step {summary['steps_done']} (non-finite metrics); "
            "lower --lr or clip"
        )


def _short(row: dict[str, Any]) -> str:
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
