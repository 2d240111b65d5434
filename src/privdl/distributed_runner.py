"""One configured run on several processes (``privdl launch`` / ``torchrun``): the runner for a shard.

Mirrors :func:`privdl.runner.train` / :func:`privdl.runner.resume` (it reuses ``runner.build`` for
topology, task, algorithm, calibration and accountant) with a
:class:`~privdl.comm.distributed.DistributedCommunicator`. Every rank holds the rows of the nodes
it owns; rank 0 writes the records. A checkpoint holds every shard's state (the full ``(n, ...)``
parameters, gathered at each evaluation, and the step ``t``): the noise streams are counter-based
(keyed by ``(secret, t)``) and the minibatches by ``(seed, t)``, so ``t`` is the position of every
generator and secret stream. Checkpoints have the single-process format, so a run can be resumed
with another number of processes, or by ``privdl run --resume``. The privacy ledger is a function
of the step count (``privacy(t)``), so a resumed run neither resets nor double-counts epsilon.

Entry point for processes started by ``privdl launch``: ``python -m privdl.distributed_runner``
(reads its job from ``PRIVDL_LAUNCH_SPEC``).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from privdl.algorithms.base import consensus_distance
from privdl.algorithms.decor import Decor, DecorState
from privdl.algorithms.dsgd import DSGD, DSGDState
from privdl.comm.base import Tree
from privdl.comm.distributed import (
    DEFAULT_TIMEOUT_S,
    DistributedCommunicator,
    DistributedError,
    DistributedKeyTransport,
    init_from_env,
    shard_ranges,
)
from privdl.config import FEDERATED, RunConfig, make_config
from privdl.engine.clipping import clip_by_global_norm
from privdl.engine.grads import ClipSpec, GradResult, node_gradients
from privdl.errors import ConfigError, PrivdlError, ReportedError
from privdl.records import RunRecords

__all__ = ["ShardOracle", "init_shard_state", "run_worker", "worker_main"]

#: Environment variable carrying a launcher's job (JSON) to the processes it starts.
SPEC_ENV = "PRIVDL_LAUNCH_SPEC"
#: Fault injection for tests and drills: ``"RANK:STEP"`` makes that rank SIGKILL itself at STEP.
KILL_ENV = "PRIVDL_DEBUG_KILL"


class ShardOracle:
    """The task's gradient oracle restricted to the owned nodes (rows ``owned``).

    Minibatch indices come from the task's generator keyed by ``(seed, t)`` for all ``n`` nodes
    (same draw on every rank, as in the simulator); each rank keeps its rows and computes only
    its own nodes' gradients (DECOR Alg. 1 line 2).
    """

    def __init__(self, task: Any, owned: torch.Tensor) -> None:
        self.task = task
        self.owned = owned

    def __call__(self, params: Tree, t: int, *, clip: ClipSpec) -> GradResult:
        task, idx = self.task, self.owned
        if task.kind == "least-squares":  # L_i = 1/2 ||a_i x - b||^2, full local gradient
            x = params["x"]
            a = task._a[idx][:, None]
            b = task._b[idx]
            grads = {"x": a * (a * x - b)}
            if clip.mode != "none":
                grads = clip_by_global_norm(grads, clip.threshold, kind=clip.kind)
            loss = 0.5 * (a * x - b).pow(2).sum(dim=-1)
            return GradResult(grads=grads, loss=loss, per_sample_norms=None)
        from privdl.data import sample_batches
        from privdl.tasks import step_generator

        data = task.data
        x_all, y_all = data.x[idx], data.y[idx]
        if task.sampling == "full":
            xb, yb, mask, denom = x_all, y_all, data.valid[idx], None
        else:
            bi = sample_batches(
                data.counts,
                task.batch_size,
                generator=step_generator(task.seed, "batches", t),
                scheme=task.sampling,
                m_max=data.x.shape[1],
            )
            index = bi.index[idx]
            rows = torch.arange(index.shape[0], device=index.device)[:, None]
            xb, yb = x_all[rows, index], y_all[rows, index]
            mask = bi.mask[idx] if task.sampling == "poisson" else None
            denom = float(task.batch_size) if task.sampling == "poisson" else None
        return node_gradients(
            task.model, params, xb, yb, loss=task.loss_name, clip=clip, mask=mask, denominator=denom
        )


def init_shard_state(
    algorithm: Any,
    params: Tree,
    *,
    comm: DistributedCommunicator,
    seed: int | None,
    session_id: str = "",
    transport: DistributedKeyTransport | None = None,
    oracle: Any = None,
) -> Any:
    """The algorithm's state for the owned rows ``params`` (same keys as ``algorithm.init``).

    D-SGD and DECOR: node noise keys are derived only for owned nodes (other entries ``None``).
    DECOR's edge secrets come from a real X25519 exchange of public keys with the ranks that own
    neighbouring nodes (:class:`DistributedKeyTransport`); with a seed the key pairs are the
    simulator's, so the streams are identical (INSECURE, reproducible mode, as in the simulator).

    Any other algorithm whose ``init`` accepts ``nodes`` (PORTER, PrivSGP-VR) is initialised with
    ``algorithm.init(params, [oracle,] seed=seed, nodes=owned)``: it derives its keys for the
    global ids it holds. ``oracle`` is passed positionally when ``init`` takes one (PrivSGP-VR's
    initial gradients); a ``session_id`` only to an ``init`` that accepts one.
    """
    from privdl.mechanisms.secrets import agree_edge_secrets, node_noise_keys

    owned = comm.owned.tolist()

    def keys_for_owned() -> tuple:
        keys: list[bytes | None] = [None] * comm.n_nodes
        for i, key in zip(
            owned, node_noise_keys(owned, seed=seed, session_id=session_id), strict=True
        ):
            keys[i] = key
        return tuple(keys)

    if isinstance(algorithm, Decor):
        edge_keys: tuple[bytes | None, ...] = ()
        if algorithm.sigma_cor > 0:
            transport = transport or DistributedKeyTransport(comm, algorithm.edges)
            secrets = agree_edge_secrets(
                algorithm.edges,
                algorithm.n_nodes,
                transport=transport,
                nodes=owned,
                seed=seed,
                session_id=session_id,
            )
            edge_keys = tuple(secrets.edge_keys())
        return DecorState(params=params, t=0, edge_keys=edge_keys, noise_keys=keys_for_owned())
    if isinstance(algorithm, DSGD):
        keys = keys_for_owned() if algorithm.sigma > 0 else ()
        return DSGDState(params=params, t=0, noise_keys=keys)  # type: ignore[arg-type]
    init = getattr(algorithm, "init", None)
    sig = inspect.signature(init) if callable(init) else None
    if sig is not None and "nodes" in sig.parameters:
        args: tuple[Any, ...] = ()
        if "oracle" in sig.parameters:
            if oracle is None:
                raise ConfigError(f"{type(algorithm).__name__}.init needs the shard's oracle")
            args = (oracle,)
        kw: dict[str, Any] = {"seed": seed, "nodes": owned}
        if session_id:
            if "session_id" not in sig.parameters:
                raise ConfigError(f"{type(algorithm).__name__}.init takes no session_id")
            kw["session_id"] = session_id
        return init(params, *args, **kw)
    raise ConfigError(f"{type(algorithm).__name__} has no distributed state initialiser yet")


def _bcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclass
class _Job:
    cfg: RunConfig | None
    out_dir: Path
    resume: bool
    overwrite: bool


def _setup(job: _Job, held: ExitStack) -> tuple[RunConfig, dict | None, str | None]:
    """Rank 0: lock the run directory into ``held``, resolve the config, prepare the records;
    returns (cfg, checkpoint, error)."""
    from privdl.runner import build

    try:
        records = RunRecords(job.out_dir)
        if job.resume:
            records.config()  # refuses a directory that holds no run, before locking it
            held.enter_context(records.exclusive())
            if records.summary() is not None:
                return make_config(records.config()), None, "done"
            cfg = make_config(records.config())
            return cfg, records.load_checkpoint(), None
        assert job.cfg is not None
        from privdl.runner import write_calibration

        built = build(job.cfg)  # calibrated once, here; bad input fails before --out is made
        cfg = built.cfg
        shard_ranges(cfg_nodes(cfg), dist.get_world_size())
        held.enter_context(records.exclusive())
        records.start(cfg.model_dump(), overwrite=job.overwrite)
        write_calibration(records, built.calibration())
        return cfg, None, None
    except PrivdlError as exc:
        return job.cfg, None, f"error:{exc}"  # type: ignore[return-value]


def cfg_nodes(cfg: RunConfig) -> int:
    """Number of nodes of a config's graph (a federated run's: its clients)."""
    from privdl.config import FEDERATED, federated_clients
    from privdl.topology import parse_topology

    if cfg.algorithm in FEDERATED:
        return federated_clients(cfg)[0]
    return parse_topology(cfg.graph).n


def _shard_oracles(built: Any, comm: DistributedCommunicator) -> tuple[Any, Any]:
    """``(oracle for step, oracle for init)`` of the owned nodes.

    PrivSGP(-VR): the task's sample oracle restricted to the owned rows (``rows``), used by both
    ``init`` (the SAGA table) and ``step``; the others: :class:`ShardOracle`.
    """
    from privdl.config import PRIVSGP

    if built.cfg.algorithm in PRIVSGP:
        rows = built.oracle.rows(comm.owned.tolist())
        return rows, rows
    return ShardOracle(built.task, comm.owned), None


def run_worker(
    cfg: RunConfig | dict | None,
    out_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """This process's part of a distributed run (call on every rank); returns the summary.

    Joins the process group from the environment (``privdl launch`` or ``torchrun``). With
    ``resume`` the config and checkpoint are read from ``out_dir`` by rank 0 and broadcast.
    """
    from privdl.runner import (
        _progress,
        _short,
        build,
        checkpoint,
        export_state,
        finish_run,
        import_state,
        refuse_diverged,
        row_missing,
    )

    if cfg is not None and not isinstance(cfg, RunConfig):
        cfg = make_config(cfg)
    device = cfg.device if cfg is not None else "cpu"
    rank, world = init_from_env(device=device, timeout_s=timeout_s)
    with ExitStack() as held:  # rank 0 holds the run directory's lock to the end
        job = _Job(cfg, Path(out_dir), resume, overwrite)
        setup = _setup(job, held) if rank == 0 else None
        cfg, ckpt, status = _bcast(setup)
        if status == "done":
            summary = _bcast(RunRecords(out_dir).summary() if rank == 0 else None)
            refuse_diverged(summary)  # a diverged run stays an error, as when it stopped
            return summary
        if status is not None:  # rank 0 prints it; the others exit quietly with code 2
            message = status.removeprefix("error:")
            raise PrivdlError(message) if rank == 0 else ReportedError(message)
        if cfg.algorithm in FEDERATED:
            return _federated_worker(
                cfg, ckpt, out_dir, timeout_s=timeout_s, progress=progress, stop_after=stop_after
            )
        built = build(cfg, calibrated=True)
        dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        comm = DistributedCommunicator(
            built.comm.schedule, device=cfg.device, dtype=dtype, timeout_s=timeout_s
        )
        oracle, sample_oracle = _shard_oracles(built, comm)
        full = built.initial_params()
        state = init_shard_state(
            built.algorithm, comm.shard(full), comm=comm, seed=cfg.seed, oracle=sample_oracle
        )
        key_run_id = None
        if cfg.key_source == "os":
            state, key_run_id = _os_keys(
                built.algorithm, state, comm.shard(full), comm=comm, oracle=sample_oracle,
                task=built.task, out_dir=Path(out_dir), ckpt=ckpt,
            )  # fmt: skip
        wall0 = 0.0
        if (
            ckpt is not None
        ):  # the checkpoint holds every shard's full state (single-process format)
            full = {k: v.to(cfg.device) for k, v in ckpt["params"].items()}
            saved = comm.shard(ckpt.get("state", {})) if ckpt.get("state") else {}
            state = import_state(state, comm.shard(full), saved, t=int(ckpt["t"]))
            wall0 = float(ckpt.get("wall_time", 0.0))
        records = RunRecords(out_dir) if rank == 0 else None
        kill = _kill_step(rank)
        have = {r.get("step") for r in records.rows()} if records is not None else set()
        start_wall = time.perf_counter() - wall0
        if records is not None and row_missing(cfg, state.t, have):
            records.append(_eval_row(built, full, state.t, wall0))
        enabled = rank == 0 and (sys.stderr.isatty() if progress is None else progress)
        last_row, evaluated = None, False
        with _progress(cfg.steps, state.t, enabled) as prog:
            bar = prog.add_task(
                f"{cfg.algorithm} x{world}", total=cfg.steps, completed=state.t, info=""
            )
            while state.t < cfg.steps:
                if kill is not None and state.t == kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                state, _ = built.algorithm.step(state, oracle, comm)
                prog.advance(bar)
                if state.t % cfg.eval_every == 0 or state.t == cfg.steps:
                    full = comm.all_gather_nodes(state.params)
                    extra = comm.all_gather_nodes(export_state(state))
                    stop, evaluated = False, True
                    if records is not None:
                        wall = time.perf_counter() - start_wall
                        row = _eval_row(built, full, state.t, wall)
                        if not all(math.isfinite(v) for v in row.values() if isinstance(v, float)):
                            row["diverged"] = True
                        ckpt_now = checkpoint(state, full, wall=wall, extra=extra)  # every shard
                        if key_run_id is not None:  # which rank key files go with it (public)
                            ckpt_now["key_run_id"] = key_run_id
                        records.save_checkpoint(ckpt_now)
                        if state.t not in have:
                            records.append(row)
                        last_row, stop = row, bool(row.get("diverged"))
                        prog.update(bar, info=_short(row))
                    if _bcast(stop):
                        break
                if stop_after is not None and state.t >= stop_after:
                    return {"stopped_at": state.t}
        summary = None
        if not evaluated:  # resumed at the last step: evaluate the checkpointed state
            full = comm.all_gather_nodes(state.params)
        if records is not None:
            if last_row is None:
                last_row = _eval_row(built, full, state.t, time.perf_counter() - start_wall)
            summary = finish_run(
                built, records, last_row, state.t,
                distributed={"world_size": world, "backend": dist.get_backend()},
            )  # fmt: skip
        summary = _bcast(summary)
        refuse_diverged(summary)
        return summary


def _key_file(out_dir: Path, rank: int) -> Path:
    return out_dir / "keys" / f"rank-{rank}.pt"


_KEY_FILE_FIELDS = {"world", "owned", "keys", "sampling_seed", "run_id"}


def _key_values_fit(saved: dict, state: Any) -> bool:
    """The saved keys have the fresh state's shape: a non-negative int sampling seed, and per
    key field as many entries, 32-byte keys exactly where the fresh state has one, else None."""
    seed = saved["sampling_seed"]
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        return False
    for field, keys in saved["keys"].items():
        fresh = tuple(getattr(state, field))
        if not isinstance(keys, tuple) or len(keys) != len(fresh):
            return False
        for new, old in zip(keys, fresh, strict=True):
            if (new is None) != (old is None):
                return False
            if new is not None and not (isinstance(new, bytes) and len(new) == 32):
                return False
    return True


def _os_keys(
    algorithm: Any,
    state: Any,
    params: Tree,
    *,
    comm: DistributedCommunicator,
    oracle: Any,
    task: Any,
    out_dir: Path,
    ckpt: dict | None,
) -> tuple[Any, str]:
    """``key_source = "os"`` under ``privdl launch``: each rank's keys from the OS, kept only in
    its own file ``OUT/keys/rank-R.pt`` (mode 0600, folder 0700; never gathered into the
    checkpoint). Returns the state and the run's key id (kept in the checkpoint, not secret).

    DECOR and D-SGD are initialised again without a seed (node noise keys from ``os.urandom``,
    DECOR's X25519 pairs from ``generate()`` and exchanged with the neighbours' ranks); other
    algorithms keep their seeded state and get fresh node noise keys. Each rank also draws its
    own data-sampling seed (:func:`privdl.runner.with_sampling_seed`; a rank samples only its
    nodes' rows). A resumed run (``ckpt``) reads the file back: it must carry the checkpoint's
    key id (not another run's file) and the fields this algorithm has, and the run needs the
    same number of processes.
    """
    from dataclasses import replace

    from privdl.runner import sampling_seed, with_os_keys, with_sampling_seed

    rank, world = dist.get_rank(), dist.get_world_size()
    path = _key_file(out_dir, rank)
    owned = comm.owned.tolist()
    fields = {k for k in ("noise_keys", "edge_keys") if hasattr(state, k)}
    problem, saved = None, None
    if ckpt is not None:
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            problem = (
                f"{path} is missing: a launched key_source=os run resumes only with the keys "
                "each rank kept (a privdl run keeps them in its checkpoint: resume that with "
                "privdl run --resume)"
            )
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one clear line
            problem = f"{path} is unreadable ({type(exc).__name__}); the run cannot resume"
        else:
            if (
                not isinstance(saved, dict)
                or set(saved) != _KEY_FILE_FIELDS
                or not isinstance(saved["keys"], dict)
                or set(saved["keys"]) != fields
            ):
                problem = f"{path} is not a key file of this run's kind; the run cannot resume"
            elif saved["run_id"] != ckpt.get("key_run_id"):
                problem = (
                    f"{path} belongs to another run (its key id differs from the checkpoint's)"
                )
            elif saved["world"] != world:
                problem = (
                    f"this key_source=os run was launched with {saved['world']} processes: "
                    f"resume it with --nproc {saved['world']} (each rank kept its own keys)"
                )
            elif saved["owned"] != owned:
                problem = f"{path} holds another rank's keys (nodes {saved['owned']}, not {owned})"
            elif not _key_values_fit(saved, state):
                problem = f"{path} holds malformed keys; the run cannot resume"
    problems: list[str | None] = [None] * world
    dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p), None)
    if first is not None:
        raise PrivdlError(first) if rank == 0 else ReportedError(first)
    if saved is not None:
        state = replace(state, **saved["keys"])
        return with_sampling_seed(state, task, saved["sampling_seed"]), saved["run_id"]
    run_id = _bcast(os.urandom(16).hex() if rank == 0 else None)
    if isinstance(algorithm, Decor | DSGD):
        state = init_shard_state(algorithm, params, comm=comm, seed=None, oracle=oracle)
    else:  # no edge secrets to agree across ranks: the single-process replacement does
        state = with_os_keys(state, algorithm)
    seed = sampling_seed()
    state = with_sampling_seed(state, task, seed)
    keys = {k: tuple(getattr(state, k)) for k in sorted(fields)}
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # created afresh, so the mode below applies
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        torch.save(
            {"world": world, "owned": owned, "keys": keys, "sampling_seed": seed, "run_id": run_id},
            f,
        )
    return state, run_id


def _federated_worker(
    cfg: RunConfig,
    ckpt: dict | None,
    out_dir: str | Path,
    *,
    timeout_s: float,
    progress: bool | None,
    stop_after: int | None,
) -> dict[str, Any]:
    """This rank's part of a federated run (Robust-HDP Algorithm 1 and its baselines).

    Each rank runs the local DP-SGD steps of the clients it owns; the server's round (gather M,
    aggregate, broadcast rank 0's weights, all-reduce the weighted sum) is
    :class:`~privdl.algorithms.federated.FederatedDPSGD`'s sharded path. The server model, the
    generator, the participation record and the aggregator's state are the same on every rank,
    so rank 0's checkpoint is the whole run's, in the single-process format (resume with any
    number of processes, or ``privdl run --resume``).
    """
    from privdl.algorithms.federated import no_gossip
    from privdl.federated_runner import build_federated
    from privdl.runner import _loop

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    comm = DistributedCommunicator(
        no_gossip, n_nodes=cfg_nodes(cfg), device=cfg.device, dtype=dtype, timeout_s=timeout_s
    )
    built = build_federated(cfg, comm=comm)
    if cfg.key_source == "os":  # every rank holds the same generator: rank 0's OS draw
        from privdl.runner import sampling_seed

        built.noise_seed = _bcast(sampling_seed() if rank == 0 else None)
    state = built.init_state(built.initial_params())
    wall = 0.0
    if ckpt is not None:
        state = built.restore(state, ckpt)
        wall = float(ckpt.get("wall_time", 0.0))
    kill = _kill_step(rank)

    def before_step(t: int) -> None:
        if kill is not None and t == kill:
            os.kill(os.getpid(), signal.SIGKILL)

    return _loop(
        built,
        RunRecords(out_dir) if rank == 0 else None,
        state,
        progress=progress,
        stop_after=stop_after,
        t0_wall=wall,
        sync=_bcast,
        label=f"{cfg.algorithm} x{world}",
        before_step=before_step,
        distributed={"world_size": world, "backend": dist.get_backend()},
    )


def _eval_row(built: Any, full: Tree, t: int, wall: float) -> dict[str, Any]:
    row: dict[str, Any] = {"step": t, "wall_time": round(wall, 4)}
    row.update(built.task.evaluate(full))
    row["consensus_distance"] = consensus_distance(full)
    priv = built.privacy(t) if built.privacy is not None else None
    if priv is not None:
        row["privacy"] = priv
    return row


def _kill_step(rank: int) -> int | None:
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return None
    r, _, step = spec.partition(":")
    return int(step) if int(r) == rank else None


def worker_main(job: dict[str, Any]) -> int:
    """Run a launcher's job in this process; errors become one line on stderr and exit code 2."""
    rank = os.environ.get("RANK", "?")
    try:
        summary = run_worker(
            job.get("config"),
            job["out"],
            resume=bool(job.get("resume")),
            overwrite=bool(job.get("overwrite")),
            timeout_s=float(job.get("timeout", DEFAULT_TIMEOUT_S)),
            progress=job.get("progress"),
        )
    except ReportedError:
        os._exit(2)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: the launcher says "aborted", once
        sys.stderr.flush()
        os._exit(130)
    except PrivdlError as exc:
        text = str(exc) if str(exc).startswith("rank ") else f"rank {rank}: {exc}"
        print(f"error: {text}", file=sys.stderr, flush=True)
        os._exit(2)  # no process-group teardown: a dead peer would make it hang
    except (RuntimeError, DistributedError) as exc:  # pragma: no cover - unexpected c10d errors
        print(f"error: [rank {rank}] distributed failure: {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    if rank == "0" and job.get("print_summary", True):
        from privdl.cli.run import _print_summary

        _print_summary(summary, Path(job["out"]))
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from privdl.engine.allocator import tune_allocator

    tune_allocator()  # as the privdl command does
    sys.exit(worker_main(json.loads(os.environ[SPEC_ENV])))
