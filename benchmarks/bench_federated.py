"""A Robust-HDP federated round against the non-private epoch over the same data (issue 37,
item 3): MNIST, 20 clients, the Robust-HDP CNN, the paper's batch sizes and Dist6 budgets,
timed in turns in one run so that drift in the machine's load hits all alike.

* ``round``: one round of :class:`privdl.robust.trainer.FederatedDPSGD` with the Robust-HDP
  aggregator (``reestimate_every=None``, the reproductions' schedule: the robust PCA runs in the
  first round, which is the warm-up and timed apart as ``first_round_s``): every client runs
  its ``E_i = ceil(N_i / b_i)`` DP-SGD steps (Poisson batches, per-sample clipping at c = 3,
  Gaussian noise), all clients stacked, then the weighted aggregate;
* ``epoch``: plain torch, an ``nn.Sequential`` of the same layers and ``torch.optim.SGD``, one
  pass over every client's training samples in that client's batch size ``b_i`` (no clipping,
  no noise, no Poisson sampling: the physical limit the issue measures a round against);
* ``round_by_rows`` (``--by-rows``): the round with the conv layers' per-sample gradients by
  kernel-row ``bmm`` s (:func:`privdl.engine.ghost._conv_grads_by_kernel_row`, the CPU path
  before the grouped weight-gradient call), for the before/after figure in the same run;
* ``fedavg`` (``--fedavg``): the same round without privacy (``method = "fedavg"``: no clipping,
  no noise, the same stacked engine and Poisson batches), the engine's own non-private round.

The figure is ``round_over_epoch`` (issue 37 target <= 1.5), the median of the per-turn ratios.

    python benchmarks/bench_federated.py --turns 3 [--threads 1] [--per-client 3000]
        [--data-dir DIR] [--by-rows] [--fedavg] [--json-out out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from _common import add_run_flags, apply_run_flags, emit, machine_facts
from torch import nn

from privdl.engine import ghost
from privdl.experiments.robust_hdp import _federated, _federated_data, _on_device
from privdl.robust import RPCANotConvergedWarning
from privdl.robust.table3 import BATCH_SIZES_20, EPS_LISTS_20

N_CLIENTS, DIST, LR = 20, "Dist6", 2e-3


def _torch_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1568, 10),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument(
        "--per-client",
        type=int,
        default=3000,
        help="samples per client (80%% train; the "
        "paper's 3000, fewer for fewer local steps at the same batch sizes)",
    )
    ap.add_argument("--data-dir", default=None, help="MNIST files (default: privdl's lookup)")
    ap.add_argument("--by-rows", action="store_true", help="also time the kernel-row path")
    ap.add_argument("--fedavg", action="store_true", help="also time the non-private round")
    add_run_flags(ap)
    args = ap.parse_args()
    tuned = apply_run_flags(args)
    ds, train, _ = _federated_data(
        "mnist", n_clients=N_CLIENTS, per_client=args.per_client, data_dir=args.data_dir, seed=1
    )
    train = _on_device(train, torch.device("cpu"))
    batch_sizes = list(BATCH_SIZES_20)  # the paper's; --per-client changes E_i only
    runs = {}
    methods = ["robust-hdp"] + (["robust-hdp-rows"] if args.by_rows else [])
    for method in methods + (["fedavg"] if args.fedavg else []):
        model, fl = _federated(
            model_name="cnn-mnist", ds=ds, train=train, method=method.removesuffix("-rows"),
            eps=list(EPS_LISTS_20[DIST]), reported=None, batch_sizes=batch_sizes, lr=LR,
            rounds=200, rpca={},
        )  # fmt: skip
        params = model.init(
            n_nodes=1, generator=torch.Generator().manual_seed(1), dtype=torch.float32
        )
        runs[method] = (fl, [fl.init(params, seed=1)])

    def one_round(method: str):
        fl, box = runs[method]

        def go() -> None:
            grouped = ghost._grouped_backward_applies
            if method.endswith("-rows"):
                ghost._grouped_backward_applies = lambda x, k: False  # type: ignore[assignment]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RPCANotConvergedWarning)
                    box[0], _ = fl.step(box[0])
            finally:
                ghost._grouped_backward_applies = grouped

        return go

    net = _torch_cnn()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    crit = nn.CrossEntropyLoss()
    counts = train.counts.tolist()

    def epoch() -> None:
        for i, m in enumerate(counts):  # the plain-torch way: one client after another
            x, y, b = train.x[i, :m], train.y[i, :m], batch_sizes[i]
            for s in range(0, m, b):
                opt.zero_grad(set_to_none=True)
                crit(net(x[s : s + b]), y[s : s + b]).backward()
                opt.step()

    fns = {"round": one_round("robust-hdp"), "epoch": epoch}
    if args.by_rows:
        fns["round_by_rows"] = one_round("robust-hdp-rows")
    if args.fedavg:
        fns["fedavg"] = one_round("fedavg")
    first = {}
    for name, fn in fns.items():  # warm-up: the robust PCA runs in the first round
        t0 = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.turns):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    ratios = [r / e for r, e in zip(times["round"], times["epoch"], strict=True)]
    res: dict[str, object] = {
        **machine_facts(tuned),
        "setting": (
            f"MNIST, {N_CLIENTS} clients x {args.per_client} samples ({sum(counts)} train), "
            f"cnn-mnist, b_i = {batch_sizes}, {DIST}, c = 3, lr {LR}"
        ),
        "local_steps": runs["robust-hdp"][0].local_steps.tolist(),
        "first_round_s": first["round"],
        "round_s": times["round"],
        "epoch_s": times["epoch"],
        "round_over_epoch_per_turn": [round(r, 3) for r in ratios],
        "round_over_epoch": statistics.median(ratios),
    }
    if args.by_rows:
        rr = [a / b for a, b in zip(times["round_by_rows"], times["round"], strict=True)]
        res |= {
            "round_by_rows_s": times["round_by_rows"],
            "round_by_rows_over_epoch": statistics.median(
                a / e for a, e in zip(times["round_by_rows"], times["epoch"], strict=True)
            ),
            "round_by_rows_over_round": statistics.median(rr),
        }
    if args.fedavg:
        pr = [r / f for r, f in zip(times["round"], times["fedavg"], strict=True)]
        fe = [f / e for f, e in zip(times["fedavg"], times["epoch"], strict=True)]
        res |= {
            "fedavg_s": times["fedavg"],
            "round_over_fedavg": statistics.median(pr),
            "fedavg_over_epoch": statistics.median(fe),
        }
    emit(res, args.json_out)


if __name__ == "__main__":
    main()
