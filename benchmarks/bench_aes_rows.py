"""The ``aes-ziggurat/v1`` row kernel: AES-256 by the CPU's AES instructions (AES-NI) against AES
in software (32-bit tables) and against one OpenSSL call per stream, in the same run.

Setting: DECOR's CPU noise at 10^5 nodes (issue 37, item 4; docs/engine.md) draws about 400,000
keyed streams of 124 normals a step (d = 123 plus the bias); long rows (5,000 normals) are the
other end. For each row length, times the rows of ``--streams`` random keys (one thread) with
each keystream source, interleaved, and reports microseconds per stream (median of ``--iters``),
the ratios, the load average, and whether all three gave the same bytes.

    python benchmarks/bench_aes_rows.py [--sizes 124,5000 --streams 100000,4000 --iters 5]
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
from _common import add_run_flags, apply_run_flags, emit, interleaved_seconds, machine_facts

from privdl.mechanisms import _aesni
from privdl.mechanisms import ziggurat as zig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="124,5000", help="normals per row")
    ap.add_argument("--streams", default="100000,4000", help="streams timed, one per size")
    ap.add_argument("--iters", type=int, default=5)
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    res: dict[str, object] = {
        "aes_instructions": _aesni.available(),
        "load_before": os.getloadavg(),
        **machine_facts(tuned),
        "rows": [],
    }
    rows: list[dict] = res["rows"]  # type: ignore[assignment]
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(s) for s in args.streams.split(",")]
    for size, count in zip(sizes, counts, strict=True):
        rng = np.random.default_rng(size)
        key_array = rng.integers(0, 256, (count, 32), dtype=np.uint8)
        keys = [bytes(row) for row in key_array]
        made: dict[str, bytes] = {}

        def batched(name: str, enabled: bool | None, key_array=key_array, size=size, made=made):
            _aesni.ENABLED = enabled
            try:
                made[name] = zig.key_array_rows(key_array, 7, size).tobytes()
            finally:
                _aesni.ENABLED = None

        def openssl(keys=keys, size=size, made=made) -> None:
            made["openssl"] = zig._ziggurat_rows_openssl(keys, 7, size).tobytes()

        fns = [lambda: batched("software", False), openssl]
        names = ["software", "openssl"]
        if _aesni.available():
            fns.insert(0, lambda: batched("aesni", True))
            names.insert(0, "aesni")
        times = interleaved_seconds(fns, iters=args.iters, warmup=1)
        row: dict[str, object] = {"size": size, "streams": count}
        for name, t in zip(names, times, strict=True):
            row[f"{name}_us_per_stream"] = 1e6 * statistics.median(t) / count
        if "aesni" in names:
            fast = row["aesni_us_per_stream"]
            row["software_over_aesni"] = row["software_us_per_stream"] / fast  # type: ignore[operator]
            row["openssl_over_aesni"] = row["openssl_us_per_stream"] / fast  # type: ignore[operator]
        row["same_bytes"] = len(set(made.values())) == 1
        rows.append(row)
    res["load_after"] = os.getloadavg()
    emit(res, args.json_out)


if __name__ == "__main__":
    main()
