"""Run records: resolved config, environment, append-only JSONL metrics, checkpoints, summary.

Layout of a run directory::

    .lock             held (flock) by the one process writing the run; a second is refused
    config.json       the resolved configuration
    environment.json  package versions, device, threads, platform
    calibration.json  the calibrated noise levels (accounted and nominal), when calibrated
    metrics.jsonl     one JSON object per evaluation, appended (never rewritten)
    checkpoint.pt     the latest state (written atomically before its metrics line)
    checkpoints/      a launched run's: each rank's own rows, rank-R-of-W-step-T.pt (0600)
    summary.json      written last, atomically: its presence means the run completed

Every JSON file and every metrics row carries ``schema_version`` (:data:`SCHEMA_VERSION`) and
``timestamp`` (when it was written, UTC ISO 8601); non-finite numbers are JSON ``null``. Files
written before schema version 2 have neither field and hold ``"nan"``/``"inf"`` strings: they
are read as they are (rows are never rewritten) and :meth:`RunRecords.read_rows` gives those
strings as ``None``, as a version-2 file has them. docs/records.md has the schemas.

Reports are made from these files, never from live training.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from privdl.errors import PrivdlError

#: Version of the record formats (docs/records.md). 1: before the field existed (non-finite
#: numbers as strings, no timestamps); 2: ``null`` for non-finite numbers, ``schema_version``
#: and ``timestamp`` in every JSON file and metrics row.
SCHEMA_VERSION = 2
#: The fields every record carries besides its content (stripped where the content is read
#: back as a configuration).
RECORD_FIELDS = ("schema_version", "timestamp")
#: How schema version 1 wrote non-finite floats (``str(float)``).
_LEGACY_NONFINITE = frozenset({"nan", "inf", "-inf"})


def utc_timestamp() -> str:
    """Now, as UTC ISO 8601 with milliseconds (``2025-01-31T12:00:00.123+00:00``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def stamped(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the record fields (:data:`RECORD_FIELDS`) first."""
    return {"schema_version": SCHEMA_VERSION, "timestamp": utc_timestamp(), **obj}


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become ``None`` (JSON null; schema version 1 wrote
    the strings "nan", "inf")."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def nonfinite_as_null(obj: Any) -> Any:
    """A record read back with schema version 1's non-finite strings ("nan", "inf", "-inf")
    as ``None``, as version 2 writes them (for tools reading old and new runs alike)."""
    if isinstance(obj, str) and obj in _LEGACY_NONFINITE:
        return None
    if isinstance(obj, dict):
        return {k: nonfinite_as_null(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [nonfinite_as_null(v) for v in obj]
    return obj


def save_torch_atomic(path: Path, obj: Any) -> None:
    """``torch.save`` to ``path`` through a temporary file and a rename (never half-written)."""
    import torch

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plain_data(obj: Any) -> Any:
    """A copy of ``obj`` that torch's weights-only unpickler reads back: numpy scalars become
    Python numbers (float64/int64 exactly; float32 widens exactly), numpy arrays tensors, paths
    strings, tuples stay tuples; tensors, ``bytes``, ``str``, numbers and ``None`` are kept.
    Anything else (an object whose pickle names a class) is refused: a checkpoint holds data."""
    import numpy as np
    import torch

    if isinstance(obj, np.generic):  # before the numbers: np.float64 is a float
        return obj.item()
    if obj is None or isinstance(obj, bool | int | float | complex | str | bytes | torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, dict):
        return {plain_data(k): plain_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain_data(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(plain_data(v) for v in obj)
    raise TypeError(f"a checkpoint holds tensors and plain data only, not {type(obj).__name__}")


#: What older checkpoints may hold besides tensors and plain data: numpy arrays and scalars
#: (their reconstruction only allocates an array from raw bytes and a dtype; nothing in these
#: names calls code). Read under :func:`torch.serialization.safe_globals`, nothing else is.
def _numpy_safe_globals() -> list[Any]:
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # pragma: no cover - numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar  # type: ignore[no-redef]
    dtypes = [type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDG"]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtypes]


def load_torch_safe(path: Path, *, fix: str) -> Any:
    """``torch.load(path, weights_only=True)`` (tensors, dicts, lists, tuples, numbers, strings,
    bytes; numpy arrays and scalars of earlier privdl versions' files): a file whose pickle
    names anything else (a crafted file that would run code) is refused with one line, and
    nothing in it is executed. ``fix`` ends the message (what the user can do)."""
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "GLOBAL" in str(exc):  # it names a class or function: not tensors and data
            raise PrivdlError(
                f"{path} holds objects other than tensors and plain data (not a privdl "
                f"checkpoint, or a crafted one); it was not loaded: {fix}"
            ) from None
        raise PrivdlError(
            f"{path} is unreadable (UnpicklingError: not a torch file); {fix}"
        ) from None
    except OSError as exc:  # the file may be good: say why it cannot be read, nothing more
        raise PrivdlError(
            f"cannot read {path} ({exc.strerror or type(exc).__name__}); the run cannot go on "
            "without it: make it readable"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file: one clear line
        raise PrivdlError(f"{path} is unreadable ({type(exc).__name__}); {fix}") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (never half-written);
    non-finite numbers become null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_clean(obj), f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_record(path: Path, obj: dict[str, Any]) -> None:
    """A record file: ``obj`` with ``schema_version`` and ``timestamp``, written atomically."""
    write_json_atomic(path, stamped(obj))


def environment() -> dict[str, Any]:
    """Package versions, Python, platform and torch threading facts."""
    import torch

    versions: dict[str, str | None] = {}
    for pkg in ("privdl", "torch", "numpy", "scipy", "networkx", "dp-accounting", "cryptography"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "packages": versions,
    }


#: The folder of a launched run's rank checkpoints, and their names.
SHARDS_DIR = "checkpoints"
_SHARD_NAME = re.compile(r"rank-(\d+)-of-(\d+)-step-(\d+)\.pt")

#: The files of a run directory written through a temporary file and a rename.
_ATOMIC_FILES = (
    "checkpoint.pt", "config.json", "environment.json", "calibration.json", "summary.json",
    "seeds.json", "report.md",
)  # fmt: skip


class RecordsWarning(UserWarning):
    """Run records that are readable but not whole (unreadable lines, metrics cut short)."""


class RunRecords:
    """The files of one run directory."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        check_out_dir(self.dir)
        if self.dir.exists() and not self.dir.is_dir():
            raise PrivdlError(f"{self.dir} is a file, not a run directory")

    @property
    def metrics_path(self) -> Path:
        return self.dir / "metrics.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.dir / "checkpoint.pt"

    @property
    def summary_path(self) -> Path:
        return self.dir / "summary.json"

    @property
    def shards_dir(self) -> Path:
        """Where each rank of a launched run keeps its own checkpoints (never gathered)."""
        return self.dir / SHARDS_DIR

    def shard_path(self, rank: int, world: int, step: int) -> Path:
        """Rank ``rank``'s checkpoint (of ``world`` ranks) at ``step``."""
        return self.shards_dir / f"rank-{rank}-of-{world}-step-{step}.pt"

    def shard_files(self, rank: int | None = None) -> dict[tuple[int, int, int], Path]:
        """``(rank, world, step) -> path`` of the rank checkpoints here (``rank``: one rank's)."""
        found = {}
        for p in self.shards_dir.glob("rank-*-of-*-step-*.pt"):
            m = _SHARD_NAME.fullmatch(p.name)
            if m is not None and (rank is None or int(m[1]) == rank):
                found[(int(m[1]), int(m[2]), int(m[3]))] = p
        return found

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the run directory's lock while writing it: a second process (say a ``--resume``
        while the run still goes) is refused with a clear error instead of interleaving its
        rows and checkpoints. The OS drops the lock when the holder dies, so a killed run can be
        resumed at once. (No lock where ``fcntl`` does not exist, i.e. on Windows.)"""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield
            return
        make_dir(self.dir)
        try:
            fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only --out: nothing written, one line
            raise PrivdlError(
                f"cannot write in {self.dir} ({exc.strerror or type(exc).__name__}); choose "
                "another --out"
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise PrivdlError(
                    f"{self.dir} is being written by another privdl process (pid {holder}); "
                    "wait for it to end, or choose another --out"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the lock

    def remove_orphans(self) -> list[Path]:
        """Delete the temporary files a process killed mid-write left (``.checkpoint.pt.XXXX``:
        with ``key_source = "os"`` one holds every key); call with the lock held (no writer is
        using them then). Returns what was removed."""
        removed = []
        for name in _ATOMIC_FILES:
            for p in self.dir.glob(f".{name}.*"):
                if len(p.name) == len(name) + 10 and p.is_file():  # mkstemp's 8 characters
                    p.unlink(missing_ok=True)
                    removed.append(p)
        for p in self.shards_dir.glob(".rank-*.pt.*"):  # a killed rank's half-written one
            if p.is_file():
                p.unlink(missing_ok=True)
                removed.append(p)
        return removed

    def start(self, config: dict[str, Any], *, overwrite: bool = False) -> None:
        """Create the directory for a fresh run; refuses to mix with an earlier run's records."""
        if self.metrics_path.exists() and not overwrite:
            raise PrivdlError(
                f"{self.dir} already holds a run; use --resume {self.dir} (privdl.resume) to "
                "continue it, --overwrite (overwrite=True) to replace it, or choose another --out"
            )
        make_dir(self.dir)
        for p in (self.metrics_path, self.checkpoint_path, self.summary_path):
            if p.exists():
                p.unlink()
        shutil.rmtree(self.dir / "keys", ignore_errors=True)  # an earlier run's rank key files
        shutil.rmtree(self.shards_dir, ignore_errors=True)  # and its ranks' checkpoints
        write_record(self.dir / "config.json", config)
        write_record(self.dir / "environment.json", environment())

    def config(self) -> dict[str, Any]:
        p = self.dir / "config.json"
        if not p.is_file():
            raise PrivdlError(f"{self.dir} is not a privdl run directory (no config.json)")
        values = _read_json(p)
        if not isinstance(values, dict):
            raise PrivdlError(f"{p} is corrupt (not a JSON object); the run cannot be resumed")
        for key in RECORD_FIELDS:  # the file's, not the configuration's
            values.pop(key, None)
        # runs saved before the field existed drew ChaCha20 streams: resume them with those
        values.setdefault("noise_backend", "chacha20")
        return values

    def append(self, row: dict[str, Any]) -> None:
        """Append one metrics row (one line of JSON, with ``schema_version`` and ``timestamp``)
        and flush it to disk.

        A torn last line (a crash mid-write) is closed with a newline first, so the new row
        stays a line of its own instead of being glued onto the fragment.
        """
        with self.metrics_path.open("a+b") as f:
            line = json.dumps(_clean(stamped(row)), sort_keys=True) + "\n"
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every complete metrics row (a torn last line from a crash is skipped)."""
        yield from self.read_rows()[0]

    def read_rows(self) -> tuple[list[dict[str, Any]], int]:
        """The metrics rows (JSON objects with an integer ``step``) and how many non-blank lines
        were not such rows (a torn last line, or a corrupted file). Non-finite numbers are
        ``None`` whichever schema version wrote them."""
        if not self.metrics_path.exists():
            return [], 0
        rows, bad = [], 0
        try:
            text = self.metrics_path.read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            raise PrivdlError(
                f"cannot read {self.metrics_path} ({exc.strerror or type(exc).__name__})"
            ) from None
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                rows.append(nonfinite_as_null(row))
            else:
                bad += 1
        return rows, bad

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Save ``state`` as tensors and plain data only (:func:`plain_data`), so that
        :meth:`load_checkpoint` reads it back with torch's weights-only unpickler."""
        save_torch_atomic(self.checkpoint_path, plain_data(state))

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint, read with torch's weights-only unpickler (:func:`load_torch_safe`):
        nothing in a run directory can run code here, whoever wrote it."""
        if not self.checkpoint_path.exists():
            return None
        fix = "the run cannot be resumed from it (move it away to restart from step 0)"
        ckpt = load_torch_safe(self.checkpoint_path, fix=fix)
        if not isinstance(ckpt, dict) or "t" not in ckpt:
            raise PrivdlError(f"{self.checkpoint_path} is not a privdl checkpoint; {fix}")
        return ckpt

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json``; returns what was written (stamped, non-finite as None)."""
        record = _clean(stamped(summary))
        write_json_atomic(self.summary_path, record)
        return dict(record)

    def summary(self) -> dict[str, Any] | None:
        if not self.summary_path.exists():
            return None
        summary = _read_json(self.summary_path)
        if not isinstance(summary, dict):
            raise PrivdlError(f"{self.summary_path} is corrupt (not a JSON object)")
        return dict(nonfinite_as_null(summary))


def merged_shards(directory: str | Path) -> dict[str, Any]:
    """Every node's rows of a launched run's latest checkpoint that every rank saved, in the
    one-process format (``t``, ``params``, ``state``, node rows in rank order): for whoever
    holds every rank's files (one machine's run, a test). No rank of a run calls this: each
    reads only its own file. A directory without such a set is a one-line error."""
    import torch

    records = RunRecords(directory)
    files = records.shard_files()
    steps: dict[tuple[int, int], set[int]] = {}
    for rank, world, step in files:
        steps.setdefault((world, step), set()).add(rank)
    whole = [ws for ws, ranks in steps.items() if ranks == set(range(ws[0]))]
    if not whole:
        raise PrivdlError(f"{records.dir} holds no checkpoint saved by every rank of a launch")
    world, step = max(whole, key=lambda ws: ws[1])
    fix = "it cannot be merged"
    parts = [load_torch_safe(files[(r, world, step)], fix=fix) for r in range(world)]
    merged: dict[str, Any] = {"t": step}
    for name in ("params", "state"):
        if parts[0].get(name):
            merged[name] = {k: torch.cat([p[name][k] for p in parts]) for k in parts[0][name]}
    return merged


def missing_steps(have: set[Any], *, eval_every: int, steps: int, upto: int) -> list[int]:
    """The evaluation steps ``<= upto`` (step 0, every ``eval_every``-th, the last) whose
    metrics row is not among ``have``: rows lost to a cut or torn ``metrics.jsonl``."""
    grid = set(range(0, min(upto, steps) + 1, max(1, int(eval_every))))
    if upto >= steps:
        grid.add(steps)
    return sorted(grid - set(have))


def steps_text(steps: list[int], limit: int = 6) -> str:
    """``125, 150, 175`` (the first ``limit`` and how many more)."""
    shown = ", ".join(map(str, steps[:limit]))
    return shown + (f" and {len(steps) - limit} more" if len(steps) > limit else "")


#: POSIX limits on a path (Linux's NAME_MAX and PATH_MAX, in bytes): checked before anything is
#: made, so that ``mkdir -p`` does not create the parents of a path it then cannot finish.
NAME_MAX, PATH_MAX = 255, 4096


def check_out_dir(path: Path) -> None:
    """Refuse, with one line, a directory path the file system cannot hold: a name longer than
    :data:`NAME_MAX` bytes or a path (with the files privdl writes in it) of :data:`PATH_MAX`."""
    raw = os.fsencode(path)
    name = max(Path(path).parts, key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(name)) > NAME_MAX:
        raise PrivdlError(
            f"cannot use {_shorten(path)} as a directory: its name {_shorten(name)} is "
            f"{len(os.fsencode(name))} bytes, more than the {NAME_MAX} a file system allows"
        )
    if len(raw) + 32 >= PATH_MAX:  # room for the files written inside (".metrics.jsonl.XXXX")
        raise PrivdlError(
            f"cannot use {_shorten(path)} as a directory: its path is {len(raw)} bytes, too "
            f"long for the {PATH_MAX} a path may have; choose a shorter --out"
        )


def _shorten(path: str | Path, limit: int = 60) -> str:
    text = str(path)
    return repr(text if len(text) <= limit else f"{text[:28]}...{text[-28:]}")


def make_dir(path: Path) -> None:
    """``mkdir -p`` with a one-line error for a path that cannot be a directory."""
    check_out_dir(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrivdlError(f"cannot create the directory {path}: {exc.strerror or exc}") from None


def _read_json(path: Path) -> Any:
    """A record file's JSON; a corrupt one is a one-line :class:`PrivdlError`."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PrivdlError(f"{path} is corrupt ({exc.__class__.__name__}: {exc})") from None
    except OSError as exc:
        raise PrivdlError(f"cannot read {path} ({exc.strerror or type(exc).__name__})") from None


#: What ``privdl run --seeds`` writes into its ``--out`` before the first seed starts.
SEEDS_PLAN = "seeds.json"


def write_seeds_plan(
    parent: Path, seeds: list[int], config: dict[str, Any], given: list[str] | None = None
) -> None:
    """Record a ``--seeds`` sweep (its seeds and the config before ``seed`` is set, and the
    keys the command line gave), so that ``--resume`` also starts the seeds a cut-off sweep had
    not reached, and refuses seed runs of another configuration."""
    plan: dict[str, Any] = {"seeds": list(seeds), "config": config}
    if given is not None:
        plan["given"] = sorted(given)
    write_record(parent / SEEDS_PLAN, plan)


def seeds_plan_given(parent: str | Path) -> list[str] | None:
    """The config keys a sweep's command line gave (None: a plan written before they were
    recorded)."""
    plan = _read_json(Path(parent) / SEEDS_PLAN)
    given = plan.get("given") if isinstance(plan, dict) else None
    return [str(k) for k in given] if isinstance(given, list) else None


def read_seeds_plan(parent: str | Path) -> tuple[list[int], dict[str, Any]] | None:
    """A sweep's ``(seeds, config)``, or None where ``parent`` has no plan (sweeps started
    before session 19 did not write one); a malformed plan is a one-line error."""
    path = Path(parent) / SEEDS_PLAN
    if not path.is_file():
        return None
    plan = _read_json(path)
    seeds = plan.get("seeds") if isinstance(plan, dict) else None
    config = plan.get("config") if isinstance(plan, dict) else None
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        or not isinstance(config, dict)
    ):
        raise PrivdlError(f"{path} is corrupt (expected seeds and a config); cannot resume")
    return seeds, config


def seed_run_dirs(parent: str | Path) -> list[Path]:
    """The runs ``--seeds`` wrote into ``parent`` (``seed-K`` with a config), in seed order."""
    found = Path(parent).glob("seed-*/config.json")
    return [p.parent for p in sorted(found, key=lambda p: (len(p.parent.name), p))]
