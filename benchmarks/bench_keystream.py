"""The ChaCha20 keystream kernel on CUDA: one (BLOCK, 16) tile store per block (``TILED=True``,
not yet the default) against the default of 16 scattered 4-byte stores, in the same run.

Setting: a DECOR MNIST block of noise (DECOR paper Section 6.2; docs/gpu.md): 48 streams
(32 edges of the 4x4 torus + 16 nodes), 101,770 normals each, 14 iterations per launch -- 29 MB
of keystream per iteration. Reports the median time per launch (CUDA events), the keystream's
write rate, the ratio, and whether the two layouts wrote the same bytes. CUDA only.

    python benchmarks/bench_keystream.py [--streams 48 --size 101770 --steps 14] [--json-out F]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics

import numpy as np
import torch
from _common import add_run_flags, apply_run_flags, emit, machine_facts

from privdl.mechanisms import fused_noise, prng


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=48)
    ap.add_argument("--size", type=int, default=101_770)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--iters", type=int, default=30)
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    dev = torch.device("cuda")
    keys = [hashlib.sha256(f"k{i}".encode()).digest() for i in range(args.streams)]
    words = np.frombuffer(b"".join(keys), dtype="<u4").reshape(-1, 8).view(np.int32)
    key_words = torch.from_numpy(words.copy()).to(dev)
    m = prng.row_pairs(args.size)
    n_blocks = (12 * m // 4 + 15) // 16  # as fused_noise._launch
    nonce = np.frombuffer(fused_noise._nonce(5, 0)[4:], dtype="<u4").tolist()
    outs = {
        tiled: torch.empty(
            (args.steps * args.streams, n_blocks * 16), dtype=torch.int32, device=dev
        )
        for tiled in (True, False)
    }
    block = fused_noise._KEYSTREAM_BLOCK
    grid = ((n_blocks + block - 1) // block, args.streams, args.steps)

    def launch(tiled: bool) -> None:
        prng._chacha20_kernel[grid](
            key_words, outs[tiled], n_blocks, *nonce, 0, args.streams, BLOCK=block, TILED=tiled
        )

    for tiled in (True, False):  # compile and warm up
        launch(tiled)
    torch.cuda.synchronize()
    same = torch.equal(outs[True], outs[False])
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.iters):  # alternate, so drift affects both alike
        for tiled in (True, False):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch(tiled)
            end.record()
            end.synchronize()
            times[tiled].append(start.elapsed_time(end) / 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = outs[True].numel() * 4
    emit(
        {
            "setting": f"{args.streams} streams x {args.size} normals x {args.steps} steps "
            f"({nbytes / 1e6:.0f} MB of keystream per launch), BLOCK={block}",
            "device": torch.cuda.get_device_name(dev),
            **machine_facts(tuned),
            "same_bytes": same,
            "tiled_ms": 1e3 * med[True],
            "scattered_ms": 1e3 * med[False],
            "tiled_GBps": nbytes / med[True] / 1e9,
            "scattered_GBps": nbytes / med[False] / 1e9,
            "scattered_over_tiled": med[False] / med[True],
            "tiled_us_per_step": 1e6 * med[True] / args.steps,
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
