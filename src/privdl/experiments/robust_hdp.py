"""Robust-HDP reproductions (Malekmohammadi, Yu & Cao, ICML 2024): Table 3, Tables 12-14, Fig. 5.

* ``robust-hdp-table3``: the closed form NoiseAgg(w) of every weighting rule (Table 3).
* ``robust-hdp-mnist`` / ``robust-hdp-fmnist`` / ``robust-hdp-cifar10``: average client test
  accuracy of Robust-HDP, WeiAvg, PFA, DPFedAvg, minEps and FedAvg (Tables 12-14). Quick mode is
  CI-sized (10 clients, a linear model, a few rounds; CIFAR-10 on the synthetic stand-in): its
  checks are about the noise-aware weights, not about the paper's accuracies.
* ``robust-hdp-falsified``: one client reports a larger eps (Fig. 5 right, spec §6).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privdl.algorithms.aggregators import build_aggregator
from privdl.algorithms.federated import (
    FederatedConfig,
    FederatedDPSGD,
    evaluate_clients,
    split_train_test,
)
from privdl.data import load_dataset, stack_partitions
from privdl.experiments import Reproduction, load_preset, write_outputs
from privdl.models import build_model
from privdl.robust import RPCANotConvergedWarning
from privdl.robust.table3 import BATCH_SIZES_20, EPS_LISTS_20, table3_row

PAPER_TABLE3 = {
    "WeiAvg": [1.02, 1.89, 0.92, 3.22, 4.58, 28.29, 9.85, 48.15, 34.91],
    "DPFedAvg": [1.27, 16.94, 16.28, 26.87, 25.64, 70.71, 18.50, 85.70, 43.20],
    "minEps": [4.68, 103.91, 103.91, 127.18, 103.91, 1868.45, 74.41, 241.37, 87.15],
    "Oracle": [0.27, 0.47, 0.07, 0.64, 0.39, 7.60, 2.25, 13.81, 5.93],
}
# cells the spec finds inconsistent (smallest eps lists; Oracle Dist3 printed below its rounding)
TABLE3_EXCEPTIONS = {("DPFedAvg", 6), ("minEps", 6), ("minEps", 8), ("Oracle", 3)}
METHODS = ("robust-hdp", "weiavg", "pfa", "dpfedavg", "mineps", "fedavg")


def _plot(path: Path, series: dict[str, list[float]], labels: list[str], *, ylabel: str, log=False):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(1, len(series))
    for j, (name, vals) in enumerate(series.items()):
        ax.bar(np.arange(len(labels)) + j * width, vals, width, label=name)
    ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- Table 3
def run_table3(out_dir: Path, *, quick: bool, data_dir: str | None = None) -> dict[str, Any]:
    """Table 3 closed form (spec §2.4) for Dist1..Dist9, paper values beside ours."""
    rows = [table3_row(EPS_LISTS_20[f"Dist{d}"]) for d in range(1, 10)]
    ours = {rule: [r[rule] for r in rows] for rule in PAPER_TABLE3}
    checks, lines = {}, []
    for rule, paper in PAPER_TABLE3.items():
        ok = []
        for d, (o, p) in enumerate(zip(ours[rule], paper, strict=True), start=1):
            if (rule, d) not in TABLE3_EXCEPTIONS:
                ok.append(abs(o - p) <= max(0.02 * p, 0.005))
        checks[f"{rule} within 2% where consistent"] = bool(all(ok))
        lines.append(f"| {rule} | " + " ".join(f"{v:.2f}" for v in ours[rule]) + " | ")
        lines[-1] += " ".join(f"{v:.2f}" for v in paper) + " |"
    checks["Oracle <= every other rule"] = all(
        ours["Oracle"][d] <= min(ours[r][d] for r in ("WeiAvg", "DPFedAvg", "minEps"))
        for d in range(9)
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    dists = [f"D{d}" for d in range(1, 10)]
    _plot(out_dir / "table3.png", ours, dists, ylabel="NoiseAgg (ours)", log=True)
    report = "\n".join(
        [
            "# Robust-HDP Table 3: normalised aggregate noise after round 1 (closed form)",
            "",
            "NoiseAgg(w) = sum_i w_i^2 K ceil(N/b_i) c^2 z_i^2 / b_i^2; FMNIST, N = 2400, K = 1, "
            "E = 200, c = 3, delta = 1e-4, official eps/batch lists; z_i from the reference "
            "accountant (rounded to 2 decimals).",
            "",
            "| rule | ours Dist1..9 | paper Dist1..9 |",
            "|---|---|---|",
            *lines,
            "",
            "Cells not expected within 2% (spec §2.4, O5): DPFedAvg Dist6 and minEps Dist6/Dist8 "
            "(eps <= 0.17: z depends steeply on the RDP order grid and accountant details; the "
            "paper's variant is unknown), Oracle Dist3 (exact 0.0755 printed 0.07). The Robust-HDP "
            "row of Table 3 needs real RPCA estimates and is not a closed form.",
            "",
            "![table3](table3.png)",
            "",
            "Checks: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items()),
        ]
    )
    summary = {"ours": ours, "paper": PAPER_TABLE3, "checks": checks}
    return write_outputs(out_dir, report_md=report, summary=summary)


# --------------------------------------------------------------------------- accuracy tables
def _federated_data(dataset: str, *, n_clients: int, per_client: int, data_dir, seed: int):
    kw: dict[str, Any] = {"seed": seed}
    if dataset == "synthetic-cifar10":
        kw.update(n_train=n_clients * per_client, n_test=100)
    ds = load_dataset(dataset, data_dir=data_dir, download=False, **kw)
    if ds.x_train.shape[0] < n_clients * per_client:
        raise ValueError(f"{dataset} has fewer than {n_clients * per_client} training samples")
    rng = np.random.default_rng(0)  # the split is fixed across runs (spec §5.2)
    perm = rng.permutation(ds.x_train.shape[0])[: n_clients * per_client]
    train, test = split_train_test(list(perm.reshape(n_clients, per_client)))
    return (
        ds,
        stack_partitions(ds.x_train, ds.y_train, train),
        stack_partitions(ds.x_train, ds.y_train, test),
    )


def train_and_evaluate(
    *,
    model_name: str,
    ds,
    train,
    test,
    method: str,
    eps: list[float] | None,
    reported: list[float] | None,
    batch_sizes: list[int],
    lr: float,
    rounds: int,
    seed: int,
    rpca: dict[str, Any],
) -> dict[str, Any]:
    """One federated run; returns accuracy, final weights and the true aggregate noise."""
    model = build_model(model_name, in_shape=ds.input_shape, n_classes=ds.n_classes)
    private = method != "fedavg"
    cfg = FederatedConfig(
        batch_sizes=tuple(batch_sizes),
        lr=lr,
        rounds=rounds,
        epsilons=tuple(eps) if private else None,
        reported_epsilons=tuple(reported) if private and reported else None,
    )
    opts = {"reestimate_every": None, **rpca} if method == "robust-hdp" else {}
    fl = FederatedDPSGD(model, train, config=cfg, aggregator=build_aggregator(method, **opts))
    params = model.init(n_nodes=1, generator=torch.Generator().manual_seed(seed))
    state = fl.init(params, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RPCANotConvergedWarning)
        for _ in range(rounds):
            state, info = fl.step(state)
    acc = evaluate_clients(model, state.theta, test)["accuracy"]
    w = info["weights"].double().numpy()
    # Table 3's normalisation: sigma_i^2 / (p eta_l^2), so methods with different lrs compare
    s = (
        fl.true_update_variance() / (model.num_parameters() * lr**2)
        if private
        else np.zeros(len(w))
    )
    out = {
        "accuracy": float(100 * acc.mean()),
        "weights": w.tolist(),
        "noise": float((w**2 * s).sum()),
        "oracle_noise": float(1 / (1 / s).sum()) if private else 0.0,
        "oracle_weights": ((1 / s) / (1 / s).sum()).tolist() if private else None,
    }
    if private:
        budgets = fl.client_budgets(state.participated)
        out["max_accounted_over_target"] = max(
            b["accounted"]["epsilon"] / b["nominal"]["epsilon"] for b in budgets
        )
    return out


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def _accuracy_table(preset_name: str):
    def run(out_dir: Path, *, quick: bool, data_dir: str | None = None) -> dict[str, Any]:
        pre = load_preset(preset_name)
        mode = pre["quick" if quick else "full"]
        dataset = mode.get("dataset", pre["dataset"])
        n, per = mode["n_clients"], mode["samples_per_client"]
        ds, train, test = _federated_data(
            dataset, n_clients=n, per_client=per, data_dir=data_dir, seed=0
        )
        rpca = {k: mode[k] for k in ("chunk_rows", "max_blocks") if k in mode}
        rpca["max_iter"] = 500 if quick else 5000
        b = list(BATCH_SIZES_20[:n]) if n <= 20 else None
        results: dict[str, dict[str, Any]] = {}
        for dist in mode["dists"]:
            d = int(dist[4:]) - 1
            eps = list(EPS_LISTS_20[dist][:n])
            for method in METHODS:
                results.setdefault(method, {})[dist] = train_and_evaluate(
                    model_name=mode["model"],
                    ds=ds,
                    train=train,
                    test=test,
                    method=method,
                    eps=eps,
                    reported=None,
                    batch_sizes=b,
                    lr=pre["lr"][method][d],
                    rounds=mode["rounds"],
                    seed=1,
                    rpca=rpca,
                )
        checks = {}
        for dist in mode["dists"]:
            r = results["robust-hdp"][dist]
            checks[f"{dist}: RHDP weights rank-correlate with oracle (>= 0.8)"] = (
                _spearman(r["weights"], r["oracle_weights"]) >= 0.8
            )
            checks[f"{dist}: RHDP noise <= 1.5 x oracle"] = r["noise"] <= 1.5 * r["oracle_noise"]
            checks[f"{dist}: RHDP noise < WeiAvg, DPFedAvg noise"] = r["noise"] < min(
                results[m][dist]["noise"] for m in ("weiavg", "dpfedavg")
            )
            checks[f"{dist}: accounted eps <= 1.01 x target"] = all(
                results[m][dist]["max_accounted_over_target"] <= 1.01
                for m in METHODS
                if m != "fedavg"
            )
        if not quick:
            for dist in mode["dists"]:
                d = int(dist[4:]) - 1
                checks[f"{dist}: RHDP within 2 points of paper"] = (
                    abs(results["robust-hdp"][dist]["accuracy"] - pre["paper"]["robust-hdp"][d])
                    <= 2.0
                )
        out_dir.mkdir(parents=True, exist_ok=True)
        series = {m: [results[m][dd]["accuracy"] for dd in mode["dists"]] for m in METHODS}
        _plot(out_dir / "accuracy.png", series, mode["dists"], ylabel="avg client test acc %")
        rows = []
        for m in METHODS:
            cells = []
            for dist in mode["dists"]:
                d = int(dist[4:]) - 1
                cells.append(
                    f"{results[m][dist]['accuracy']:.2f} ({pre['paper'][m][d]:.2f}) "
                    f"noise {results[m][dist]['noise']:.3g}"
                )
            rows.append(f"| {m} | " + " | ".join(cells) + " |")
        note = (
            "QUICK mode: "
            f"{n} clients x {per} samples, {mode['rounds']} rounds, model {mode['model']}, "
            f"data {dataset}: accuracies are NOT comparable with the paper's (in parentheses); "
            "the checks concern the noise-aware weights."
            if quick
            else f"FULL mode: {n} clients, {mode['rounds']} rounds, model {mode['model']}."
        )
        report = "\n".join(
            [
                f"# Robust-HDP {pre['paper_table']}: average client test accuracy ({dataset})",
                "",
                note,
                "noise = NoiseAgg of Table 3: sum_i w_i^2 sigma_i^2 / (p eta_l^2), TRUE Eq. 7 variances.",
                "",
                "| method | " + " | ".join(mode["dists"]) + " |",
                "|---|" + "---|" * len(mode["dists"]),
                *rows,
                "",
                "![accuracy](accuracy.png)",
                "",
                "Checks: "
                + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items()),
            ]
        )
        summary = {"mode": "quick" if quick else "full", "results": results, "checks": checks}
        return write_outputs(out_dir, report_md=report, summary=summary)

    return run


# --------------------------------------------------------------------------- falsification
def run_falsified(out_dir: Path, *, quick: bool, data_dir: str | None = None) -> dict[str, Any]:
    """Spec §6: client 0 (true eps 0.95 in Dist5) reports eps' > 0.95 to the server."""
    n, per, rounds = (6, 200, 2) if quick else (20, 3000, 200)
    grid = [0.95, 50.0] if quick else [0.95, 2.0, 5.0, 10.0, 20.0, 50.0]
    model_name = "linear" if quick else "cnn-mnist"
    ds, train, test = _federated_data(
        "mnist", n_clients=n, per_client=per, data_dir=data_dir, seed=0
    )
    eps = list(EPS_LISTS_20["Dist5"][:n])
    lrs = load_preset("robust-hdp-mnist")["lr"]
    rpca = {"chunk_rows": 1000, "max_iter": 500} if quick else {"max_iter": 5000}
    results: dict[str, list[dict[str, Any]]] = {}
    for method in ("robust-hdp", "weiavg", "pfa", "dpfedavg"):
        for fake in grid:
            reported = [fake, *eps[1:]]
            results.setdefault(method, []).append(
                train_and_evaluate(
                    model_name=model_name,
                    ds=ds,
                    train=train,
                    test=test,
                    method=method,
                    eps=eps,
                    reported=reported,
                    batch_sizes=list(BATCH_SIZES_20[:n]),
                    lr=lrs[method][4],
                    rounds=rounds,
                    seed=1,
                    rpca=rpca,
                )
            )
    rh, wa = results["robust-hdp"], results["weiavg"]
    checks = {
        "RHDP weights unchanged by the falsified eps": all(
            r["weights"] == rh[0]["weights"] for r in rh
        ),
        "RHDP accuracy flat": max(r["accuracy"] for r in rh) - min(r["accuracy"] for r in rh)
        <= 1e-9,
        "WeiAvg falsifier weight grows with eps'": all(
            a["weights"][0] < b["weights"][0] for a, b in zip(wa, wa[1:], strict=False)
        ),
        "WeiAvg aggregate noise grows with eps'": all(
            a["noise"] < b["noise"] for a, b in zip(wa, wa[1:], strict=False)
        ),
        "WeiAvg at largest eps' noisier than RHDP": wa[-1]["noise"] > rh[-1]["noise"],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    series = {m: [r["accuracy"] for r in rs] for m, rs in results.items()}
    _plot(out_dir / "falsified.png", series, [str(g) for g in grid], ylabel="avg test acc %")
    rows = [
        f"| {m} | "
        + " | ".join(f"{r['accuracy']:.2f} / w0={r['weights'][0]:.3f}" for r in rs)
        + " |"
        for m, rs in results.items()
    ]
    report = "\n".join(
        [
            "# Robust-HDP Fig. 5 (right): a client falsifies its reported epsilon",
            "",
            f"MNIST, {n} clients, Dist5, client 0 trains with eps 0.95 and reports eps'. "
            f"{'QUICK (linear model, few rounds)' if quick else 'FULL'}. Paper (qualitative): "
            "WeiAvg and PFA degrade as eps' grows, Robust-HDP is unaffected.",
            "",
            "| method | " + " | ".join(f"eps'={g}" for g in grid) + " |",
            "|---|" + "---|" * len(grid),
            *rows,
            "",
            "![falsified](falsified.png)",
            "",
            "Checks: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items()),
        ]
    )
    summary = {"grid": grid, "results": results, "checks": checks}
    return write_outputs(out_dir, report_md=report, summary=summary)


REPRODUCTIONS = [
    Reproduction(
        name="robust-hdp-table3",
        paper="Robust-HDP (ICML 2024)",
        description="Table 3: closed-form aggregate noise of WeiAvg, DPFedAvg, minEps, Oracle",
        run=run_table3,
        full_runtime="~15 s (same as quick)",
    ),
    Reproduction(
        name="robust-hdp-mnist",
        paper="Robust-HDP (ICML 2024)",
        description="Table 12: MNIST accuracy of RHDP and baselines over eps distributions",
        run=_accuracy_table("robust-hdp-mnist"),
        full_runtime="estimated 2-4 days on 2 CPU cores (54 runs x 200 rounds x ~150 CNN "
        "DP-SGD steps on 20 clients); hours on one GPU",
    ),
    Reproduction(
        name="robust-hdp-fmnist",
        paper="Robust-HDP (ICML 2024)",
        description="Table 13: Fashion-MNIST accuracy of RHDP and baselines",
        run=_accuracy_table("robust-hdp-fmnist"),
        full_runtime="estimated 2-4 days on 2 CPU cores; hours on one GPU",
    ),
    Reproduction(
        name="robust-hdp-cifar10",
        paper="Robust-HDP (ICML 2024)",
        description="Table 14: CIFAR-10 (quick: synthetic stand-in) accuracy of RHDP and baselines",
        run=_accuracy_table("robust-hdp-cifar10"),
        full_runtime="GPU only (ResNet-18, 54 runs x 200 rounds); not measured",
    ),
    Reproduction(
        name="robust-hdp-falsified",
        paper="Robust-HDP (ICML 2024)",
        description="Fig. 5 right: a client reports a larger eps; WeiAvg/PFA degrade, RHDP not",
        run=run_falsified,
        full_runtime="estimated 1-2 days on 2 CPU cores (24 CNN runs x 200 rounds)",
    ),
]
