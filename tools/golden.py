"""Record the numbers a refactor must not change, and compare two recordings.

    python tools/golden.py record OUT.json [--work DIR] [--only runs,launch,repro,demo]
    python tools/golden.py compare BEFORE.json AFTER.json [--ignore KEY,KEY]

``--run-args "--accountant rdp"`` appends options to every ``privdl run`` and ``launch`` (e.g. to
show that a new default is the only change: the old choice must give the old numbers);
``--ignore`` leaves keys out of the comparison (e.g. a key the new version adds).

``record`` runs, through the command line as a user would, a small run of every algorithm (single
process and two processes under ``privdl launch``), every quick reproduction and the demo, and
keeps every number they write: each metrics row, each summary's final row and calibration, the
SHA-256 of every tensor in each checkpoint, and each reproduction's ``summary.json``. Wall-clock
times are dropped. ``compare`` prints every value that differs (bit for bit: floats are compared
exactly) and exits 1 if any does. Data: ``PRIVDL_DATA_DIR`` (or ``--data-dir``) for MNIST.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Keys whose values are timings or paths (they differ between any two runs).
VOLATILE = {"wall_time", "seconds", "elapsed", "elapsed_s", "time_s", "runtime_s", "started",
            "finished", "created", "out", "out_dir", "python", "torch", "platform", "host",
            "environment", "timestamp", "date", "duration_s", "run_seconds", "wall_s"}  # fmt: skip

A9A = ["--task", "a9a", "--steps", "30", "--eval-every", "10"]
RUNS: dict[str, list[str]] = {
    "dsgd": ["dsgd", *A9A, "--graph", "ring:6"],
    "ldp": ["ldp", *A9A, "--graph", "ring:6", "--clip", "1", "--epsilon", "5"],
    "cdp": ["cdp", *A9A, "--graph", "ring:6", "--clip", "1", "--epsilon", "5"],
    "decor": ["decor", *A9A, "--graph", "ring:6", "--clip", "1", "--epsilon", "5"],
    "decor-curious-wd": [
        "decor",
        *A9A,
        "--graph",
        "torus:3x3",
        "--clip",
        "0.5",
        "--epsilon",
        "8",
        "--adversary",
        "curious",
        "--weight-decay",
        "0.01",
        "--lr-decay",
        "20",
    ],  # fmt: skip
    "decor-ls": [
        "decor",
        "--task",
        "least-squares",
        "--graph",
        "ring:6",
        "--clip",
        "1",
        "--clip-mode",
        "batch_mean",
        "--epsilon",
        "5",
        "--steps",
        "30",
        "--eval-every",
        "10",
    ],  # fmt: skip
    "decor-sigma": [
        "decor",
        *A9A,
        "--graph",
        "ring:6",
        "--clip",
        "1",
        "--sigma",
        "0.5",
        "--sigma-cor",
        "2",
    ],  # fmt: skip
    "ldp-poisson": [
        "ldp",
        *A9A,
        "--graph",
        "ring:6",
        "--clip",
        "1",
        "--epsilon",
        "5",
        "--sampling",
        "poisson",
        "--partition",
        "dirichlet:0.5",
    ],  # fmt: skip
    "dsgd-mnist": [
        "dsgd",
        "--task",
        "mnist",
        "--graph",
        "ring:4",
        "--steps",
        "20",
        "--eval-every",
        "10",
    ],  # fmt: skip
    "decor-mnist-float64": [
        "decor",
        "--task",
        "mnist",
        "--graph",
        "ring:4",
        "--steps",
        "20",
        "--eval-every",
        "10",
        "--clip",
        "1",
        "--epsilon",
        "3",
        "--dtype",
        "float64",
        "--noise-backend",
        "torch",
    ],  # fmt: skip
    "porter-dp": [
        "porter-dp",
        *A9A,
        "--graph",
        "ring:6",
        "--clip",
        "1",
        "--epsilon",
        "3",
        "--compressor",
        "randk:0.1",
    ],  # fmt: skip
    "porter-gc": [
        "porter-gc",
        *A9A,
        "--graph",
        "ring:6",
        "--clip",
        "1",
        "--compressor",
        "qsgd:4",
    ],  # fmt: skip
    "privsgp": [
        "privsgp",
        "--task",
        "a9a",
        "--graph",
        "expo:8",
        "--clip",
        "1",
        "--epsilon",
        "3",
        "--steps",
        "30",
        "--eval-every",
        "10",
        "--block-size",
        "8",
    ],  # fmt: skip
    "privsgp-vr": [
        "privsgp-vr",
        "--task",
        "a9a",
        "--graph",
        "expo:8",
        "--clip",
        "1",
        "--epsilon",
        "3",
        "--steps",
        "30",
        "--eval-every",
        "10",
        "--block-size",
        "64",
    ],  # fmt: skip
    "privsgp-vr-ls": [
        "privsgp-vr",
        "--task",
        "least-squares",
        "--graph",
        "ring:6",
        "--clip",
        "1",
        "--sigma",
        "0.3",
        "--steps",
        "30",
        "--eval-every",
        "10",
    ],  # fmt: skip
    "robust-hdp": [
        "robust-hdp",
        "--task",
        "a9a",
        "--clients",
        "4",
        "--budgets",
        "1,2,4,8",
        "--clip",
        "1",
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--batch-size",
        "32",
        "--lr",
        "0.05",
    ],  # fmt: skip
    "weiavg": [
        "weiavg",
        "--task",
        "a9a",
        "--clients",
        "4",
        "--budgets",
        "1,2,4,8",
        "--clip",
        "1",
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--batch-size",
        "32",
    ],  # fmt: skip
    "pfa": [
        "pfa",
        "--task",
        "a9a",
        "--clients",
        "4",
        "--budgets",
        "1,2,4,8",
        "--clip",
        "1",
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--batch-size",
        "32",
        "--clients-per-round",
        "3",
    ],  # fmt: skip
    "dpfedavg": [
        "dpfedavg",
        "--task",
        "a9a",
        "--clients",
        "4",
        "--epsilon",
        "2",
        "--clip",
        "1",
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--batch-size",
        "32",
    ],  # fmt: skip
    "mineps": [
        "mineps",
        "--task",
        "a9a",
        "--clients",
        "4",
        "--budgets",
        "1,2,4,8",
        "--clip",
        "1",
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--batch-size",
        "32",
    ],  # fmt: skip
    "fedavg": [
        "fedavg",
        "--task",
        "a9a",
        "--clients",
        "4",
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--batch-size",
        "32",
    ],  # fmt: skip
    "ldp-seeds": [
        "ldp",
        *A9A,
        "--graph",
        "ring:6",
        "--clip",
        "1",
        "--epsilon",
        "5",
        "--seeds",
        "1,2",
    ],  # fmt: skip
}
LAUNCH = ("dsgd", "ldp", "decor", "decor-ls", "porter-dp", "privsgp-vr", "robust-hdp", "pfa")


def _volatile(key: str) -> bool:
    """Timings (``*_s``: seconds) and paths: they differ between any two runs."""
    return key in VOLATILE or key.endswith("_s")


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not _volatile(k)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _tensor_digests(obj: Any, prefix: str = "") -> dict[str, str]:
    import torch

    out: dict[str, str] = {}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        out[prefix] = (
            f"{t.dtype}{tuple(t.shape)}:" + hashlib.sha256(t.numpy().tobytes()).hexdigest()
        )
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_tensor_digests(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(obj, list | tuple) and obj and isinstance(obj[0], torch.Tensor):
        for i, v in enumerate(obj):
            out.update(_tensor_digests(v, f"{prefix}[{i}]"))
    return out


def _run_dir(d: Path) -> dict[str, Any]:
    import torch

    rec: dict[str, Any] = {}
    metrics = d / "metrics.jsonl"
    if metrics.is_file():
        rec["metrics"] = [_strip(json.loads(line)) for line in metrics.read_text().splitlines()
                          if line.strip()]  # fmt: skip
    for name in ("summary.json", "calibration.json"):
        p = d / name
        if p.is_file():
            data = json.loads(p.read_text())
            data.pop("config", None)  # the config's layout may change; its values drive the rest
            rec[name] = _strip(data)
    ckpt = d / "checkpoint.pt"
    data = None
    if ckpt.is_file():
        data = torch.load(ckpt, map_location="cpu", weights_only=True)
    elif (d / "checkpoints").is_dir():  # a launched run: each rank's own nodes, merged here
        from privdl.records import merged_shards

        data = merged_shards(d)
    if data is not None:
        keep = {k: v for k, v in data.items() if k in ("params", "state", "t", "aggregator")}
        rec["checkpoint"] = _tensor_digests(keep)
        rec["checkpoint_t"] = data.get("t")
    return rec


def _cli(args: list[str], *, log: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write("$ privdl " + " ".join(args) + "\n")
        f.flush()
        proc = subprocess.run(
            [sys.executable, "-m", "privdl", *args], stdout=f, stderr=f, env=env, check=False
        )
    if proc.returncode != 0:
        raise SystemExit(f"privdl {' '.join(args)} failed with {proc.returncode}; see {log}")
    return time.perf_counter() - t0


def record(
    out: Path, work: Path, only: set[str], data_dir: str | None, run_args: list[str] | None = None
) -> None:
    extra = list(run_args or [])
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if data_dir:
        env["PRIVDL_DATA_DIR"] = data_dir
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log = work / "log.txt"
    result: dict[str, Any] = {"runs": {}, "launch": {}, "repro": {}, "demo": {}, "seconds": {}}
    if "runs" in only:
        for name, args in RUNS.items():
            d = work / "runs" / name
            result["seconds"][f"run/{name}"] = _cli(["run", *args, *extra, "--out", str(d)],
                                                    log=log, env=env)  # fmt: skip
            if (d / "seeds.json").exists():
                result["runs"][name] = {s.name: _run_dir(s) for s in sorted(d.glob("seed-*"))}
            else:
                result["runs"][name] = _run_dir(d)
    if "launch" in only:
        for name in LAUNCH:
            d = work / "launch" / name
            args = ["launch", "--nproc", "2", *RUNS[name], *extra, "--out", str(d)]
            result["seconds"][f"launch/{name}"] = _cli(args, log=log, env=env)
            result["launch"][name] = _run_dir(d)
    if "repro" in only:
        listing = subprocess.run(
            [sys.executable, "-m", "privdl", "reproduce", "--list"],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        names = [line.split()[0] for line in listing.stdout.splitlines() if line.strip()]
        for name in names:
            d = work / "repro" / name
            args = ["reproduce", name, "--quick", "--out", str(d)]
            if data_dir:
                args += ["--data-dir", data_dir]
            result["seconds"][f"repro/{name}"] = _cli(args, log=log, env=env)
            summary = d / "summary.json"
            result["repro"][name] = _strip(json.loads(summary.read_text()))
    if "demo" in only:
        d = work / "demo"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "privdl", "demo", "--out", str(d), "--steps", "100"],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        result["seconds"]["demo"] = time.perf_counter() - t0
        result["demo"]["table"] = proc.stdout.split("\nreport:")[0]
        result["demo"]["runs"] = {
            p.parent.name: _run_dir(p.parent) for p in sorted(d.glob("**/metrics.jsonl"))
        }
    out.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"recorded {out}")


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'after' if k not in a else 'before'}")
            else:
                _diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items before, {len(b)} after")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b and not (a != a and b != b):  # NaN equals NaN here
        out.append(f"{path}: {a!r} -> {b!r}")


def _drop(x: Any, keys: set[str]) -> Any:
    if isinstance(x, dict):
        return {k: _drop(v, keys) for k, v in x.items() if k not in keys}
    if isinstance(x, list):
        return [_drop(v, keys) for v in x]
    return x


def compare(before: Path, after: Path, ignore: set[str] | None = None) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    if ignore:
        a, b = _drop(a, ignore), _drop(b, ignore)
    a.pop("seconds", None)
    b.pop("seconds", None)
    a, b = _strip(a), _strip(b)  # recordings made before a key was known to be a timing
    out: list[str] = []
    _diff(a, b, "", out)
    for line in out:
        print(line)
    counted = sum(1 for _ in _leaves(a))
    print(f"{len(out)} differences among {counted} recorded values")
    return 1 if out else 0


def _leaves(x: Any):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--work", type=Path, default=Path("golden-work"))
    r.add_argument("--only", default="runs,launch,repro,demo")
    r.add_argument("--data-dir", default=os.environ.get("PRIVDL_DATA_DIR"))
    r.add_argument("--run-args", default="", help="options appended to every run and launch")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--ignore", default="", help="comma-separated keys left out")
    args = p.parse_args()
    if args.cmd == "record":
        record(args.out, args.work, set(args.only.split(",")), args.data_dir,
               args.run_args.split())  # fmt: skip
        return 0
    return compare(args.before, args.after, {k for k in args.ignore.split(",") if k})


if __name__ == "__main__":
    sys.exit(main())
