"""How the DECOR step grows with the number of nodes (logistic regression, DECOR Section 6.1's
a9a setting: d = 123, binary logistic loss, per-example clipping at C = 1).

For each n (square tori ``torus:kxk``, so the degree stays 4 and |E| = 2n), times the DECOR step
(keyed correlated noise on every edge, independent noise, gossip with W = 1/(deg+1)) and the
non-private D-SGD step on the same oracle (random a9a-shaped data, ``--batch`` samples per node),
called in turn (on a CPU in blocks of steps, each with the noise draw its last DECOR step
started ahead), and the set-up (graph, keys, first step). Stops at the first n that does not fit
(out of memory) or whose set-up exceeds ``--max-setup`` seconds, and says so.

    python benchmarks/bench_scale.py --device cuda --sizes 16,64,256,1024,4096,16384,65536

``--accountant N`` times only the SecRDP accountant's build (DECOR's per-step epsilon) on a ring
of N nodes, eavesdropper and curious users (issue 37, item 4): a ring is circulant, so the
eavesdropper's value is one closed form and Algorithm 3 needs only the deletions through vertex
0 (``privdl.accounting.secrdp.SYMMETRY_MIN_NODES``); ``--regular`` adds a random 6-regular graph
(no symmetry: the eavesdropper's certified upper bound ``gauss-radau`` with ``--radau-steps``
Lanczos steps, docs/accounting.md section 1; the exact sparse selected inverse fills in).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
from _common import (
    add_run_flags,
    apply_run_flags,
    block_seconds,
    interleaved_seconds,
    machine_facts,
)

from privdl.algorithms.base import Keys, StepSize, finish_drawn_ahead
from privdl.algorithms.decor import Decor
from privdl.algorithms.dsgd import DSGD
from privdl.comm.local import LocalCommunicator
from privdl.engine import ClipSpec, node_gradients
from privdl.mechanisms import _aesni
from privdl.models import build_model
from privdl.topology import mixing_matrix, parse_graph

DIM, C, LR, SIGMA_CDP, SIGMA_COR = 123, 1.0, 0.1, 0.01, 0.05


def _kept() -> None:
    """The end of a block: wait for the draw its last DECOR step started (the next block's)."""
    finish_drawn_ahead(keep=True)


def graph_spec(graph: str, n: int) -> str:
    """``torus`` (n a square), ``ring`` or ``regular`` (random 6-regular, seed 0)."""
    if graph == "torus":
        side = math.isqrt(n)
        if side * side != n:
            raise SystemExit(f"bench_scale.py: n = {n} is not a square (tori k x k)")
        return f"torus:{side}x{side}"
    return f"ring:{n}" if graph == "ring" else f"regular:{n}:6:0"


def bench_n(
    n: int,
    *,
    batch: int,
    iters: int,
    device: torch.device,
    graph: str = "torus",
    loss: str = "bce",
    account: str = "",
    software_aes: bool = False,
) -> dict[str, float]:
    t0 = time.perf_counter()
    topo = parse_graph(graph_spec(graph, n))
    mixing = mixing_matrix(topo, "decor")
    comm = LocalCommunicator(mixing, device=device, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    model = build_model("linear", in_shape=(DIM,), n_classes=1)
    params = {k: v.to(device) for k, v in model.init(n_nodes=n, generator=gen).items()}
    x = torch.randn(n, batch, DIM, generator=gen).to(device)
    if loss == "bce":
        y = torch.randint(0, 2, (n, batch), generator=gen).to(device=device, dtype=torch.float32)
    else:  # least squares: y = <x, w_node> + noise, one generated w per node
        w = torch.randn(n, DIM, 1, generator=gen)
        y = (torch.bmm(x.cpu(), w).squeeze(-1) + 0.1 * torch.randn(n, batch, generator=gen)).to(
            device
        )

    def oracle(p, t, *, clip):
        return node_gradients(model, p, x, y, loss=loss, clip=clip)  # type: ignore[arg-type]

    decor = Decor(
        StepSize(LR),
        edges=topo.edges,
        n_nodes=n,
        clip=ClipSpec("per_sample", C),
        sigma_cdp=SIGMA_CDP,
        sigma_cor=SIGMA_COR,
    )
    plain = DSGD(StepSize(LR))
    keys = Keys.from_seed(1)
    box = {
        "d": decor.init(dict(params), oracle, comm, keys=keys),
        "p": plain.init(dict(params), oracle, comm, keys=keys),
    }

    def decor_step() -> None:
        box["d"], _ = decor.step(box["d"], oracle, comm)

    def plain_step() -> None:
        box["p"], _ = plain.step(box["p"], oracle, comm)

    def decor_step_software_aes() -> None:  # the same draws with AES in software (same values)
        _aesni.ENABLED = False
        try:
            decor_step()
        finally:
            _aesni.ENABLED = aes_default

    timings: dict[str, float] = {"keys_s": 0.0, "accountant_s": 0.0}
    aes_default = _aesni.ENABLED
    t_keys = time.perf_counter()
    decor_step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timings["first_step_s"] = time.perf_counter() - t_keys
    timings["keys_s"] = t_keys - t0  # graph, mixing, data and the edge-secret agreement
    method = ""
    if account:  # the run's budget: the per-step epsilon of ``account``'s threat model (curious
        # users: DECOR Alg 3, q = 1; the eavesdropper: one diagonal of Sigma^-1, bounded by
        # gauss-radau on a random regular graph)
        from privdl.accounting.secrdp import decor_step_rdp

        t_acc = time.perf_counter()
        acc = decor_step_rdp(
            topo.graph, sigma_cdp=SIGMA_CDP, sigma_cor=SIGMA_COR, clip=C / batch,
            adversary=account,
        )  # fmt: skip
        timings["accountant_s"] = time.perf_counter() - t_acc
        method = acc.method
    setup = time.perf_counter() - t0

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cpu":  # blocks of steps: DECOR's draw ahead overlaps its own steps
        fns = [decor_step, plain_step] + ([decor_step_software_aes] if software_aes else [])
        block_seconds(fns, count=2, after=_kept)
        per = [block_seconds(fns, count=max(1, iters // 3), after=_kept) for _ in range(3)]
        decor_ms = 1e3 * statistics.median(p[0] for p in per)
        plain_ms = 1e3 * statistics.median(p[1] for p in per)
        if software_aes:
            timings["decor_software_aes_ms"] = 1e3 * statistics.median(p[2] for p in per)
            timings["aes_instructions"] = float(_aesni.active())
    else:
        t_decor, t_plain = interleaved_seconds(
            [decor_step, plain_step], iters=iters, warmup=2, sync=sync
        )
        decor_ms, plain_ms = 1e3 * statistics.median(t_decor), 1e3 * statistics.median(t_plain)
    out = {
        "n": n,
        "graph": graph,
        "loss": loss,
        "edges": len(topo.edges),
        "setup_s": setup,
        **timings,
        "accountant": method,
        "decor_ms": decor_ms,
        "nonprivate_ms": plain_ms,
    }
    out["decor_over_nonprivate"] = out["decor_ms"] / out["nonprivate_ms"]
    if "decor_software_aes_ms" in out:
        out["decor_software_aes_over_nonprivate"] = out["decor_software_aes_ms"] / plain_ms
    if device.type == "cuda":
        out["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def bench_accountant(
    n: int, *, regular: bool, radau_steps: int | None = None, block_oracle: bool = False
) -> None:
    import networkx as nx

    from privdl.accounting.secrdp import decor_step_rdp

    graphs = [("ring", nx.cycle_graph(n))]
    if regular:
        graphs.append(("random 6-regular", nx.random_regular_graph(6, n, seed=0)))
    for name, graph in graphs:
        for adversary in ("eavesdropper", "curious"):
            if name != "ring" and adversary == "curious":
                continue  # no certified bound yet (docs/accounting.md section 1)
            t0 = time.perf_counter()
            kw: dict[str, object] = (
                {} if name == "ring" else {"method": "gauss-radau", "radau_steps": radau_steps}
            )
            step = decor_step_rdp(graph, sigma_cdp=1.0, sigma_cor=10.0, adversary=adversary, **kw)  # type: ignore[arg-type]
            row = {
                "graph": f"{name} n={n}",
                "adversary": adversary,
                "build_s": time.perf_counter() - t0,
                "step_rdp": step.step_rdp,
                "method": step.method,
            }
            if name != "ring" and block_oracle:  # the same bound by the block form: the ratio
                from privdl.accounting._graph import edge_array, laplacian
                from privdl.accounting._radau import auto_steps, radau_upper_diagonal

                lap = laplacian(*edge_array(graph))
                k = radau_steps if radau_steps is not None else auto_steps(lap)
                times = {}
                for form, block in (("compiled", None), ("block", 2048)):
                    t0 = time.perf_counter()
                    radau_upper_diagonal(lap, 1.0, 10.0, steps=k, block=block)
                    times[form] = time.perf_counter() - t0
                row["radau_compiled_s"], row["radau_block_s"] = times["compiled"], times["block"]
                row["block_over_compiled"] = times["block"] / times["compiled"]
            print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--accountant", type=int, default=0, help="only the accountant, N nodes")
    ap.add_argument("--regular", action="store_true", help="with --accountant: 6-regular too")
    ap.add_argument(
        "--radau-steps",
        type=int,
        default=None,
        help="with --regular: Lanczos steps (default: auto)",
    )
    ap.add_argument(
        "--radau-block-oracle",
        action="store_true",
        help="with --regular: also time the block form of the bound (the ratio, in one run)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--graph", choices=("torus", "ring", "regular"), default="torus")
    ap.add_argument("--loss", choices=("bce", "mse"), default="bce", help="mse: least squares")
    ap.add_argument(
        "--account",
        nargs="?",
        const="curious",
        default="",
        choices=("curious", "eavesdropper"),
        help="time the accountant in set-up for this threat model (default: curious)",
    )
    ap.add_argument(
        "--software-aes",
        action="store_true",
        help="CPU: also time the DECOR step with AES in software (no AES-NI), in the same blocks",
    )
    ap.add_argument("--sizes", default="16,64,256,1024,4096")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--max-setup", type=float, default=120.0, help="stop after a slower set-up")
    add_run_flags(ap)
    args = ap.parse_args()
    if args.accountant:
        bench_accountant(
            args.accountant,
            regular=args.regular,
            radau_steps=args.radau_steps,
            block_oracle=args.radau_block_oracle,
        )
        return
    tuned = apply_run_flags(args)
    device = torch.device(args.device)
    res: dict[str, object] = {
        "setting": f"DECOR {'least squares' if args.loss == 'mse' else 'logistic regression'}"
        f" d={DIM} {args.graph}, batch {args.batch}/node, C={C}",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        **machine_facts(tuned),
        "rows": [],
    }
    rows: list[dict] = res["rows"]  # type: ignore[assignment]
    for n in (int(s) for s in args.sizes.split(",")):
        graph_spec(args.graph, n)  # refuses a non-square torus before any work
        try:
            row = bench_n(
                n, batch=args.batch, iters=args.iters, device=device, graph=args.graph,
                loss=args.loss, account=args.account, software_aes=args.software_aes,
            )  # fmt: skip
        except torch.OutOfMemoryError as exc:
            res["stopped"] = f"n = {n}: out of memory ({str(exc).splitlines()[0][:120]})"
            break
        rows.append(row)
        print(json.dumps(row), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        if row["setup_s"] > args.max_setup:
            res["stopped"] = f"after n = {n}: set-up {row['setup_s']:.0f} s > --max-setup"
            break
    for a, b in zip(rows, rows[1:], strict=False):
        b["decor_growth_vs_prev"] = b["decor_ms"] / a["decor_ms"]
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}), flush=True)


if __name__ == "__main__":
    main()
