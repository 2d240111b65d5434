"""One run on several processes (``privdl launch`` / ``torchrun``): the world of a shard.

The training loop is :mod:`privdl.loop`'s, unchanged; what a multi-process run brings is its
:class:`DistributedWorld`: the process group (gloo on CPU, NCCL on GPU), a
:class:`~privdl.comm.distributed.DistributedCommunicator` that owns this rank's block of nodes,
broadcasts of rank 0's decisions, and where the keys of a ``key_source = "os"`` run are kept
(each rank's own file ``OUT/keys/rank-R.pt``, never gathered into the checkpoint). Each rank
checkpoints its own nodes' rows (``OUT/checkpoints/rank-R-of-W-step-T.pt``; a federated run's
server model is rank 0's ``checkpoint.pt``), so no rank holds another rank's state (a
PrivSGP-VR node's SAGA table is raw gradients of its data): a run resumes with the same number
of processes under ``privdl launch --resume`` (docs/security.md s.1).

Entry point for processes started by ``privdl launch``: ``python -m privdl.distributed_runner``
(reads its job from ``PRIVDL_LAUNCH_SPEC``). A job names the files that registered algorithms
from outside privdl (``plugins``); each rank imports them first, so an algorithm defined in a
user's module or a test file runs here as in the launcher.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from privdl.algorithms.base import Keys
from privdl.comm.base import Communicator
from privdl.comm.distributed import (
    DEFAULT_TIMEOUT_S,
    DistributedCommunicator,
    DistributedError,
    all_gather_objects,
    backend_name,
    broadcast_object,
    init_from_env,
    shutdown,
)
from privdl.config import CommonConfig
from privdl.errors import PrivdlError, ReportedError
from privdl.loop import World, fit, key_fields, refuse_edited_config, set_keys
from privdl.recipes.base import Run
from privdl.records import RunRecords, load_torch_safe, plain_data, save_torch_atomic
from privdl.registry import make_config

__all__ = ["DistributedWorld", "import_plugins", "run_worker", "worker_main"]

#: Environment variable carrying a launcher's job (JSON) to the processes it starts.
SPEC_ENV = "PRIVDL_LAUNCH_SPEC"
#: Fault injection for tests and drills: ``"RANK:STEP"`` makes that rank SIGKILL itself at STEP.
KILL_ENV = "PRIVDL_DEBUG_KILL"


class DistributedWorld(World):
    """This process's place in a ``torch.distributed`` job (joins it from the environment)."""

    def __init__(self, *, device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.rank, self.size = init_from_env(device=device, timeout_s=timeout_s)
        self.timeout_s = timeout_s

    def communicator(
        self, schedule: Any, *, n_nodes: int, device: str, dtype: torch.dtype
    ) -> Communicator:
        return DistributedCommunicator(
            schedule, n_nodes=n_nodes, device=device, dtype=dtype, timeout_s=self.timeout_s
        )

    def broadcast(self, obj: Any) -> Any:
        return broadcast_object(obj)

    def all_gather(self, obj: Any) -> list[Any]:
        return all_gather_objects(obj)

    def summary(self) -> dict[str, Any]:
        return {"distributed": {"world_size": self.size, "backend": backend_name()}}

    def fault_step(self) -> int | None:
        spec = os.environ.get(KILL_ENV)
        if not spec:
            return None
        r, _, step = spec.partition(":")
        return int(step) if int(r) == self.rank else None

    # -- key_source = "os": each rank's keys in its own file -----------------------------------
    def os_state(self, run: Run, out_dir: Path, ckpt: dict[str, Any] | None) -> Any:
        """Each rank's keys from the OS, kept only in ``OUT/keys/rank-R.pt`` (mode 0600, folder
        0700). A resumed run reads its file back: it must carry the checkpoint's key id (not
        another run's file) and the fields this algorithm has, and the run needs the same number
        of processes. A recipe whose processes share one generator (``shared_sampling``: the
        federated participants) takes rank 0's sampling seed; the clients' own keys, which draw
        their batches and noise, stay with the rank that runs them (docs/security.md s.1)."""
        path = _key_file(out_dir, self.rank)
        owned = run.comm.owned_list
        saved, problem = (None, None) if ckpt is None else _read_key_file(path, ckpt, self.size)
        if saved is not None and saved["owned"] != owned:
            problem = f"{path} holds another rank's keys (nodes {saved['owned']}, not {owned})"
        sampling = saved["sampling_seed"] if saved is not None else None
        if saved is None and run.recipe.shared_sampling:
            sampling = self.broadcast(Keys.from_os(0).sampling_seed if self.rank == 0 else None)
        set_keys(run, Keys.from_os(run.cfg.seed, sampling_seed=sampling))
        state = run.init_state()
        fields = set(key_fields(state))
        if saved is not None and problem is None:
            if set(saved["keys"]) != fields:
                problem = f"{path} is not a key file of this run's kind; the run cannot resume"
            elif not _key_values_fit(saved, state):
                problem = f"{path} holds malformed keys; the run cannot resume"
        first = next((p for p in self.all_gather(problem) if p), None)
        if first is not None:
            raise PrivdlError(first) if self.rank == 0 else ReportedError(first)
        if saved is not None:
            run.notes["key_run_id"] = saved["run_id"]
            return dataclasses.replace(state, **saved["keys"])
        run_id = self.broadcast(os.urandom(16).hex() if self.rank == 0 else None)
        run.notes["key_run_id"] = run_id
        keys = {k: tuple(getattr(state, k)) for k in sorted(fields)}
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # created afresh, so the mode below applies
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            torch.save(
                {"world": self.size, "owned": owned, "keys": keys,
                 "sampling_seed": int(run.keys.sampling_seed), "run_id": run_id},
                f,
            )  # fmt: skip
        return state

    def annotate_checkpoint(self, run: Run, state: Any, ckpt: dict[str, Any]) -> None:
        """Which rank key files go with the checkpoint (public; the keys stay in them)."""
        ckpt["key_run_id"] = run.notes["key_run_id"]

    # -- each rank's own checkpoint ------------------------------------------------------------
    def checkpoint_path(self, records: RunRecords, step: int) -> Path:
        return records.shard_path(self.rank, self.size, step)

    def save_shard(self, records: RunRecords, ckpt: dict[str, Any]) -> None:
        """Save this rank's own rows (``checkpoints/rank-R-of-W-step-T.pt``, 0600), wait until
        every rank has saved step T, then drop this rank's older files (and rank 0 the gathered
        ``checkpoint.pt`` of an earlier privdl or of a one-process start): a rank killed
        mid-way leaves the previous step whole on every rank."""
        t = int(ckpt["t"])
        path = records.shard_path(self.rank, self.size, t)
        problem = None
        try:
            records.shards_dir.mkdir(mode=0o700, exist_ok=True)
            save_torch_atomic(path, plain_data({**ckpt, "world": self.size}))
        except OSError as exc:
            problem = f"rank {self.rank}: cannot write {path} ({exc.strerror or exc})"
        first = next((p for p in self.all_gather(problem) if p), None)
        if first is not None:
            raise PrivdlError(first) if self.rank == 0 else ReportedError(first)
        for (_, world, step), old in records.shard_files(self.rank).items():
            if (world, step) != (self.size, t):
                old.unlink(missing_ok=True)
        if self.rank == 0:
            records.checkpoint_path.unlink(missing_ok=True)

    def load_shard(self, run: Run, records: RunRecords) -> dict[str, Any] | None:
        """This rank's own checkpoint of the latest step every rank saved (each rank reads
        only its own file; only the file names' steps are exchanged), or None where the ranks
        saved none in common (a gathered ``checkpoint.pt``, if any, is then resumed). A run
        launched on another number of processes, a file of another rank or run, or one written
        under another configuration is refused in one line."""
        mine = records.shard_files(self.rank)
        everyone = self.all_gather(sorted((w, t) for (_, w, t) in mine))
        worlds = {w for have in everyone for (w, _) in have}
        problem: str | None = None
        ckpt: dict[str, Any] | None = None
        common = set.intersection(*(set(have) for have in everyone))
        if worlds - {self.size}:
            n = max(worlds - {self.size})
            problem = (
                f"this run was launched with {n} processes and each rank keeps its own "
                f"checkpoint: resume it with --nproc {n}"
            )
        elif common:
            world, t = max(common)
            path = mine[(self.rank, world, t)]
            fix = "the run cannot be resumed from it"
            try:
                ckpt = load_torch_safe(path, fix=fix)
                if not isinstance(ckpt, dict) or not {"t", "owned", "params"} <= set(ckpt):
                    problem = f"{path} is not a privdl checkpoint; {fix}"
                elif ckpt["t"] != t or ckpt["owned"] != run.comm.owned_list:
                    problem = f"{path} holds another rank's or step's nodes; {fix}"
                else:
                    refuse_edited_config(ckpt, run.cfg, records)
            except PrivdlError as exc:
                problem = f"rank {self.rank}: {exc}"
        first = next((p for p in self.all_gather(problem) if p), None)
        if first is not None:
            raise PrivdlError(first) if self.rank == 0 else ReportedError(first)
        return ckpt


def _key_file(out_dir: Path, rank: int) -> Path:
    return out_dir / "keys" / f"rank-{rank}.pt"


_KEY_FILE_FIELDS = {"world", "owned", "keys", "sampling_seed", "run_id"}


def _read_key_file(path: Path, ckpt: dict[str, Any], world: int) -> tuple[dict | None, str | None]:
    """A rank's saved keys, or why they cannot be used."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None, (
            f"{path} is missing: a launched key_source=os run resumes only with the keys "
            "each rank kept (a privdl run keeps them in its checkpoint: resume that with "
            "privdl run --resume)"
        )
    except Exception as exc:  # noqa: BLE001 - any unreadable file: one clear line
        return None, f"{path} is unreadable ({type(exc).__name__}); the run cannot resume"
    if (
        not isinstance(saved, dict)
        or set(saved) != _KEY_FILE_FIELDS
        or not isinstance(saved["keys"], dict)
    ):
        return None, f"{path} is not a key file of this run's kind; the run cannot resume"
    if saved["run_id"] != ckpt.get("key_run_id"):
        return None, f"{path} belongs to another run (its key id differs from the checkpoint's)"
    if saved["world"] != world:
        return None, (
            f"this key_source=os run was launched with {saved['world']} processes: "
            f"resume it with --nproc {saved['world']} (each rank kept its own keys)"
        )
    seed = saved["sampling_seed"]
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        return None, f"{path} holds malformed keys; the run cannot resume"
    return saved, None


def _key_values_fit(saved: dict, state: Any) -> bool:
    """Per key field as many entries as the fresh state, 32-byte keys exactly where the fresh
    state has one, else None."""
    for name, keys in saved["keys"].items():
        fresh = tuple(getattr(state, name))
        if not isinstance(keys, tuple) or len(keys) != len(fresh):
            return False
        for new, old in zip(keys, fresh, strict=True):
            if (new is None) != (old is None):
                return False
            if new is not None and not (isinstance(new, bytes) and len(new) == 32):
                return False
    return True


def import_plugins(files: list[str]) -> None:
    """Import the files that registered algorithms in the launcher (a user's module, a test)."""
    loaded = {
        str(Path(str(m.__file__)).resolve())
        for m in list(sys.modules.values())
        if getattr(m, "__file__", None)
    }
    for i, path in enumerate(files):
        name = f"privdl_plugin_{i}_{Path(path).stem}"
        if name in sys.modules or str(Path(path).resolve()) in loaded:
            continue  # imported already (a forked or in-process rank)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PrivdlError(f"cannot import {path}, which registered an algorithm")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def run_worker(
    cfg: CommonConfig | dict | None,
    out_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool | None = None,
    stop_after: int | None = None,
    resume_if_exists: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """This process's part of a distributed run (call on every rank); returns the summary.

    Joins the process group from the environment (``privdl launch`` or ``torchrun``). With
    ``resume`` the config and checkpoint are read from ``out_dir`` by rank 0 and broadcast;
    ``resume_if_exists`` (the values the command line gave): rank 0 resumes the run in
    ``out_dir`` if it holds one started with them, else starts ``cfg``.
    """
    if cfg is not None and not isinstance(cfg, CommonConfig):
        cfg = make_config(cfg)
    device = cfg.device if cfg is not None else "cpu"
    world = DistributedWorld(device=device, timeout_s=timeout_s)
    return fit(
        cfg, out_dir, resume=resume, world=world, progress=progress, overwrite=overwrite,
        stop_after=stop_after, resume_if_exists=resume_if_exists,
    ).summary  # fmt: skip


def worker_main(job: dict[str, Any]) -> int:
    """Run a launcher's job in this process; errors become one line on stderr and exit code 2.
    (The launcher prints the summary from the records once every rank is done.)"""
    rank = os.environ.get("RANK", "?")
    try:
        import_plugins(list(job.get("plugins", ())))
        run_worker(
            job.get("config"),
            job["out"],
            resume=bool(job.get("resume")),
            overwrite=bool(job.get("overwrite")),
            timeout_s=float(job.get("timeout", DEFAULT_TIMEOUT_S)),
            progress=job.get("progress"),
            resume_if_exists=job.get("resume_if_exists"),
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
    sys.stdout.flush()
    shutdown()
    return 0


if __name__ == "__main__":
    from privdl.engine.allocator import tune_allocator

    tune_allocator()  # as the privdl command does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(worker_main(json.loads(os.environ[SPEC_ENV])))
