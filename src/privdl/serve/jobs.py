"""The page's computations as jobs: run one at a time, polled for progress, cancellable.

A job runs on the one worker thread of a :class:`JobQueue` (one at a time: the accountants'
warnings are captured through the interpreter-wide ``warnings`` state, and the numbers are CPU
bound anyway). Cancelling a job that is queued means it never starts; cancelling a running job
stops it at the next stage (each threat model, each point of a curve): the page is told at once,
and a stage already under way finishes on the worker, its result dropped.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from privdl.errors import PrivdlError, out_of_range
from privdl.serve.compute import Cancelled

#: Finished jobs kept for polling and download (the oldest are forgotten first).
KEEP_JOBS = 64
#: Jobs waiting at most; one more is refused with a message.
MAX_QUEUED = 8


def user_message(exc: BaseException) -> str | None:
    """The one line shown for a bad input (what the CLI prints after ``error:``); None for a
    bug."""
    if isinstance(exc, PrivdlError):
        return str(exc)
    if isinstance(exc, out_of_range()):
        first = str(exc).splitlines()[0] if str(exc) else "no detail"
        return (
            "the values given are outside the range privdl can compute with "
            f"({type(exc).__name__}: {first}); use less extreme values"
        )
    return None


@dataclass
class Job:
    """One computation: its state (queued, running, done, error, cancelled) and progress."""

    id: str
    kind: str
    work: Callable[[Callable[[float, str], None]], dict[str, Any]]
    state: str = "queued"
    progress: float = 0.0
    message: str = "queued"
    result: dict[str, Any] | None = None
    error: str | None = None
    created: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    cancel_asked: threading.Event = field(default_factory=threading.Event)

    def report(self, fraction: float, what: str) -> None:
        """The progress callback handed to the work: records it, or stops a cancelled job."""
        if self.cancel_asked.is_set():
            raise Cancelled()
        self.progress, self.message = max(0.0, min(1.0, fraction)), what

    def view(self) -> dict[str, Any]:
        """What a poll returns (the result once done)."""
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "state": self.state,
                               "progress": self.progress, "message": self.message,
                               "seconds": self.seconds}  # fmt: skip
        if self.state == "done":
            out["result"] = self.result
        if self.state == "error":
            out["error"] = self.error
        return out


class JobQueue:
    """Jobs by id, run in order on one daemon worker thread."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self._todo: queue.Queue[Job] = queue.Queue()
        self._ids = itertools.count(1)
        self._worker = threading.Thread(target=self._run, name="privdl-serve-jobs", daemon=True)
        self._worker.start()

    def submit(
        self, kind: str, work: Callable[[Callable[[float, str], None]], dict[str, Any]]
    ) -> Job:
        """Queue ``work(progress)``; refused (ConfigError-like message) when too many wait."""
        with self._lock:
            waiting = sum(j.state == "queued" for j in self._jobs.values())
            if waiting >= MAX_QUEUED:
                raise QueueFull(f"{waiting} computations are already waiting; cancel one first")
            job = Job(id=f"{next(self._ids)}", kind=kind, work=work)
            self._jobs[job.id] = job
            while len(self._jobs) > KEEP_JOBS:
                oldest = next(iter(self._jobs))
                if self._jobs[oldest].state in ("queued", "running"):
                    break
                self._jobs.popitem(last=False)
        self._todo.put(job)
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def cancel(self, job_id: str) -> Job | None:
        """Ask ``job_id`` to stop; the page sees it cancelled at once."""
        job = self.get(job_id)
        if job is not None and job.state in ("queued", "running"):
            job.cancel_asked.set()
            job.state, job.message = "cancelled", "cancelled"
        return job

    def _run(self) -> None:
        while True:
            job = self._todo.get()
            if job.cancel_asked.is_set():
                continue
            job.state, job.message = "running", "starting"
            start = time.perf_counter()
            try:
                result = job.work(job.report)
            except Cancelled:
                continue
            except Exception as exc:  # the server outlives every job
                message = user_message(exc)
                if job.cancel_asked.is_set():
                    continue
                job.error = message or f"internal error ({type(exc).__name__}: {exc})"
                job.state = "error"
                job.message = "bad input" if message else "internal error"
                job.seconds = time.perf_counter() - start
                continue
            if job.cancel_asked.is_set():
                continue
            job.result, job.progress, job.message = result, 1.0, "done"
            job.seconds = time.perf_counter() - start
            job.state = "done"


class QueueFull(PrivdlError):
    """Too many jobs waiting."""
