"""The same DECOR run three ways: ``privdl launch --device cuda`` (NCCL), ``privdl launch
--device cpu`` (gloo) and ``privdl run`` (the one-process simulator), compared row by row.

Float64 least squares on ``ring:6``, 30 steps, keyed ChaCha20 noise streams on every device (the
same draws), so the three runs must agree to float64 rounding (CUDA's libm against the CPU's).
With one GPU, two NCCL ranks share it (NCCL may refuse that: the error is reported, and the
one-rank NCCL run is compared instead).

    python benchmarks/check_nccl.py --out DIR [--json-out nccl.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

FLAGS = ["decor", "--task", "least-squares", "--graph", "ring:6", "--steps", "30",
         "--eval-every", "5", "--clip", "1", "--sigma", "0.4", "--sigma-cor", "1", "--lr", "0.05",
         "--dtype", "float64", "--seed", "4", "--noise-backend", "chacha20", "--no-progress"]  # fmt: skip


def _run(args: list[str], out: Path, timeout: float) -> dict:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "privdl", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    res = {"rc": p.returncode, "seconds": round(time.monotonic() - t0, 1)}
    if p.returncode:
        res["stderr_tail"] = p.stderr[-1500:]
        return res
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    res["rows"] = [
        {k: v for k, v in r.items() if k not in ("wall_time", "timestamp")} for r in rows
    ]
    return res


def _max_rel_diff(a: list[dict], b: list[dict]) -> float | str:
    if len(a) != len(b):
        return f"row counts differ: {len(a)} vs {len(b)}"
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        for k, va in ra.items():
            vb = rb.get(k)
            if isinstance(va, float) and isinstance(vb, float):
                worst = max(worst, abs(va - vb) / max(abs(va), abs(vb), 1e-300))
            elif va != vb and k not in ("device",):
                return f"field {k}: {va!r} vs {vb!r}"
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    root = Path(args.out)
    runs = {
        "simulator_cpu": ["run", *FLAGS, "--device", "cpu"],
        "gloo_2": ["launch", "--nproc", "2", *FLAGS, "--device", "cpu"],
        "nccl_2": ["launch", "--nproc", "2", *FLAGS, "--device", "cuda"],
        "nccl_1": ["launch", "--nproc", "1", *FLAGS, "--device", "cuda"],
        "simulator_cuda": ["run", *FLAGS, "--device", "cuda"],
    }
    res: dict[str, dict] = {}
    for name, cli in runs.items():
        try:
            res[name] = _run(cli, root / name, args.timeout)
        except subprocess.TimeoutExpired:
            res[name] = {"rc": "timeout"}
        print(name, {k: v for k, v in res[name].items() if k != "rows"}, flush=True)
    ref = res["simulator_cpu"].get("rows")
    summary = {}
    for name in runs:
        rows = res[name].get("rows")
        if ref is not None and rows is not None:
            summary[f"{name}_vs_simulator_cpu_max_rel_diff"] = _max_rel_diff(ref, rows)
    out = {
        "summary": summary,
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in res.items()},
    }
    print(json.dumps(summary, indent=1), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
