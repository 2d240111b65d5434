"""What the launched-run tests share: a rank that resumes a run from its folder (a fork target,
so it lives at module level) and the run's metric rows without their wall-clock fields."""

from __future__ import annotations

import json
from pathlib import Path


def resume_rank(rank: int, out: str) -> None:
    """One rank of ``privdl launch --resume``: continue the run saved in ``out``."""
    from privdl.distributed_runner import run_worker

    run_worker(None, out, resume=True, timeout_s=30, progress=False)


def metric_rows(run_dir: Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl`` less ``wall_time`` and ``timestamp`` (when, not
    what), for comparing two runs."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("wall_time")
        r.pop("timestamp")
    return rows
