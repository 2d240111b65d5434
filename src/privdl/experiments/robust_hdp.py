"""Robust-HDP reproductions (Malekmohammadi, Yu & Cao, ICML 2024): Table 3, Tables 12-14, Fig. 5.

* ``robust-hdp-table3`` (module :mod:`privdl.experiments.robust_hdp_table3`): the closed form
  NoiseAgg(w) of every weighting rule (Table 3).
* ``robust-hdp-mnist`` / ``robust-hdp-fmnist`` / ``robust-hdp-cifar10``: average client test
  accuracy of Robust-HDP, WeiAvg, PFA, DPFedAvg, minEps and FedAvg (Tables 12-14). Quick mode is
  CI-sized (6 clients, a linear model, a few rounds; CIFAR-10 on the synthetic stand-in): its
  checks are about the noise-aware weights, not about the paper's accuracies.
* ``robust-hdp-falsified``: one client reports a larger eps (Fig. 5 right, Section 4.2 RQ3).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from privdl.algorithms.aggregators import RobustHDP, build_aggregator, two_means_split
from privdl.algorithms.federated import evaluate_clients, split_train_test
from privdl.data import load_dataset, stack_partitions
from privdl.data.batching import StackedData
from privdl.errors import ConfigError
from privdl.experiments import Reproduction, cells_dir, load_preset, write_outputs
from privdl.experiments.figures import LABEL_SIZE, bars_from_zero, legend_outside
from privdl.models import build_model
from privdl.records import load_torch_safe, plain_data, save_torch_atomic, write_json_atomic
from privdl.robust import RPCANotConvergedWarning
from privdl.robust.table3 import BATCH_SIZES_20, EPS_LISTS_20
from privdl.robust.trainer import FederatedConfig, FederatedDPSGD

METHODS = ("robust-hdp", "weiavg", "pfa", "dpfedavg", "mineps", "fedavg")


def _plot(
    path: Path,
    series: dict[str, list[float]],
    labels: list[str],
    *,
    ylabel: str,
    log: bool = False,
    paper: dict[str, list[float]] | None = None,
    errors: dict[str, list[float]] | None = None,
) -> None:
    """Grouped bars, one group per label, in the form of the paper's bar charts: a linear y
    axis from 0 (a bar's height is its value) and the legend outside the bars. ``paper`` (same
    keys as ``series``) adds the paper's value on each bar as a black tick; ``errors`` (same
    keys) the std over seeds as error bars. The table beside the figure gives the point
    differences the bars cannot show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(labels) + 2.5), 3.2))
    width = 0.8 / max(1, len(series))
    seen: list[float] = []
    for j, (name, vals) in enumerate(series.items()):
        x = np.arange(len(labels)) + j * width
        err = (errors or {}).get(name)
        ax.bar(x, vals, width, label=name, yerr=err, capsize=2 if err else 0)
        seen += [
            v + (e if err else 0.0) for v, e in zip(vals, err or [0.0] * len(vals), strict=True)
        ]
        if paper and name in paper:
            ax.scatter(
                x, paper[name], marker="_", s=300, color="black", zorder=3,
                label="paper" if j == 0 else None,
            )  # fmt: skip
            seen += paper[name]
    ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    if log:
        ax.set_yscale("log")
    else:
        bars_from_zero(ax, seen)
    legend_outside(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


# --------------------------------------------------------------------------- overrides, device
TABLE_OVERRIDES = ("dists", "methods", "rounds", "seeds")
DISTS = tuple(f"Dist{d}" for d in range(1, 10))


def parse_overrides(
    overrides: dict[str, str] | None, *, accepted: tuple[str, ...], methods: tuple[str, ...]
) -> dict[str, Any]:
    """``--set KEY=VALUE`` strings to typed values: ``dists``/``methods`` (comma lists, subsets of
    the preset's), ``rounds``/``seeds`` (positive integers), ``reported`` (the falsification's
    reported eps', a comma list of numbers >= the falsifier's true eps). Unknown keys raise
    ConfigError."""
    out: dict[str, Any] = {}
    for key, raw in (overrides or {}).items():
        if key not in accepted:
            raise ConfigError(
                f"unknown override {key!r}; accepted: {', '.join(accepted) or 'none'}"
            )
        value = str(raw).strip()
        if key == "reported":
            out[key] = _reported_grid(value)
        elif key in ("dists", "methods"):
            allowed = DISTS if key == "dists" else methods
            items = [v.strip() for v in value.split(",") if v.strip()]
            if key == "methods":
                items = [v.lower() for v in items]
            bad = [v for v in items if v not in allowed]
            if not items or bad:
                raise ConfigError(f"--set {key}: {bad or value!r} not in {', '.join(allowed)}")
            out[key] = list(dict.fromkeys(items))
        else:
            try:
                out[key] = int(value)
            except ValueError:
                out[key] = 0
            if out[key] < 1:
                raise ConfigError(f"--set {key} needs a positive integer, got {value!r}")
    return out


FALSIFIER_EPS = 0.95  # client 0's true eps in Dist5 ("client 12" in the paper, Section 4.2)
FALSIFIED_METHODS = ("robust-hdp", "weiavg", "pfa", "dpfedavg")


def _reported_grid(value: str) -> list[float]:
    """The falsification sweep's reported eps': sorted, unique, each >= the true eps."""
    try:
        grid = sorted({float(v) for v in value.split(",") if v.strip()})
    except ValueError:
        grid = []
    if not grid or not all(np.isfinite(g) and g >= FALSIFIER_EPS for g in grid):
        raise ConfigError(
            f"--set reported needs a comma list of numbers >= {FALSIFIER_EPS} (the falsifier's "
            f"true eps), got {value!r}"
        )
    return grid


def _on_device(data: StackedData, device: torch.device) -> StackedData:
    """Stacked client data on ``device`` (inputs float32), so every round runs there."""
    return StackedData(
        data.x.to(device=device, dtype=torch.float32), data.y.to(device), data.counts.to(device)
    )


def _progress(msg: str) -> None:
    print(f"[privdl reproduce] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- accuracy tables
def _federated_data(dataset: str, *, n_clients: int, per_client: int, data_dir, seed: int):
    kw: dict[str, Any] = {"seed": seed}
    if dataset == "synthetic-cifar10":
        kw.update(n_train=n_clients * per_client, n_test=100)
    ds = load_dataset(dataset, data_dir=data_dir, download=False, **kw)
    if ds.x_train.shape[0] < n_clients * per_client:
        raise ValueError(f"{dataset} has fewer than {n_clients * per_client} training samples")
    rng = np.random.default_rng(0)  # the split is fixed across runs (as in the reference code)
    perm = rng.permutation(ds.x_train.shape[0])[: n_clients * per_client]
    train, test = split_train_test(list(perm.reshape(n_clients, per_client)))
    return (
        ds,
        stack_partitions(ds.x_train, ds.y_train, train),
        stack_partitions(ds.x_train, ds.y_train, test),
    )


CHECKPOINT_EVERY_S = 60.0  # a cut-off cell loses at most this much work


def _save_checkpoint(path: Path, key, state, aggregator, last_weights) -> None:
    """Write the run's state (atomically: :func:`privdl.records.save_torch_atomic`)."""
    blob = {
        "key": key,
        "round": state.round,
        "theta": {k: v.detach().cpu() for k, v in state.theta.items()},
        "participated": state.participated.cpu(),
        "generator": state.generator.get_state(),
        "aggregator": aggregator.state_dict(),
        "last_weights": last_weights.cpu(),
    }
    save_torch_atomic(path, plain_data(blob))


def _load_checkpoint(path: Path, key, state, aggregator, dev: torch.device):
    # weights-only (nothing in the file runs code); a truncated, foreign or crafted file: one line
    blob = load_torch_safe(path, fix="delete it to run the cell afresh")
    if not isinstance(blob, dict) or blob.get("key") != key:
        raise ConfigError(
            f"checkpoint {path} was made with other settings; use another --out for a new run"
        )
    state.generator.set_state(blob["generator"])
    aggregator.load_state_dict(blob["aggregator"])
    theta = {k: v.to(dev) for k, v in blob["theta"].items()}
    state = replace(state, theta=theta, round=int(blob["round"]), participated=blob["participated"])
    return state, blob["last_weights"]


class CellStore:
    """Finished cells of a table reproduction, one JSON file each under ``out_dir/cells``, and
    the checkpoint of the cell in progress, so ``privdl reproduce ... --resume`` continues a run
    that was cut off (a time limit, a lost machine) instead of starting again.

    Without ``resume`` a folder that already holds cells is refused (nothing is overwritten).
    A cell or checkpoint is reused only if it was made with the same settings (its ``key``).
    """

    def __init__(self, out_dir: Path, *, resume: bool) -> None:
        self.dir = cells_dir(out_dir, resume=resume)

    def checkpoint(self, name: str) -> Path:
        return self.dir / f"{name}.pt"

    def load(self, name: str, key: dict[str, Any]) -> dict[str, Any] | None:
        path = self.dir / f"{name}.json"
        if not path.exists():
            return None
        blob = json.loads(path.read_text())
        if blob.get("key") != key:
            raise ConfigError(
                f"cell {path} was run with other settings; use another --out for a new run"
            )
        return blob["result"]

    def save(self, name: str, key: dict[str, Any], result: dict[str, Any]) -> None:
        write_json_atomic(self.dir / f"{name}.json", {"key": key, "result": result})
        self.checkpoint(name).unlink(missing_ok=True)

    def run(self, name: str, key: dict[str, Any], **train: Any) -> dict[str, Any]:
        """The cell's result: from an earlier run, or trained now (resuming its checkpoint)."""
        done = self.load(name, key)
        if done is not None and _accounted_before_default(done):
            # made before privdl recorded the certifying accountant (then RDP alone): the noise
            # the run used is unchanged, so its privacy is re-accounted by today's default
            done = {**done, **account_cell(**train)}
            self.save(name, key, done)
            _progress(f"  {name}: kept from the earlier run, re-accounted by the default")
        elif done is not None:
            _progress(f"  {name}: kept from the earlier run")
        if done is not None:
            return done
        result = train_and_evaluate(**train, checkpoint=self.checkpoint(name), key=key)
        self.save(name, key, result)
        return result


def _accounted_before_default(result: dict[str, Any]) -> bool:
    """A private cell made before its accountant was recorded (accounted by RDP alone)."""
    return result.get("max_accounted_over_target") is not None and "accountant" not in result


def _federated(
    *,
    model_name: str,
    ds,
    train: StackedData,
    method: str,
    eps: list[float] | None,
    reported: list[float] | None,
    batch_sizes: list[int],
    lr: float,
    rounds: int,
    rpca: dict[str, Any],
) -> tuple[Any, FederatedDPSGD]:
    """The model and the federated run of one cell (nothing trained yet)."""
    model = build_model(model_name, in_shape=ds.input_shape, n_classes=ds.n_classes)
    private = method != "fedavg"
    cfg = FederatedConfig(
        batch_sizes=tuple(batch_sizes),
        lr=lr,
        rounds=rounds,
        epsilons=tuple(cast("list[float]", eps)) if private else None,  # given to private methods
        reported_epsilons=tuple(reported) if private and reported else None,
        calibration="reference",  # the paper's setting: its eps_i are nominal (report says so)
    )
    opts = {"reestimate_every": None, **rpca} if method == "robust-hdp" else {}
    return model, FederatedDPSGD(
        model, train, config=cfg, aggregator=build_aggregator(method, **opts)
    )


def _privacy_fields(fl: FederatedDPSGD, participated: Any) -> dict[str, Any]:
    """The largest accounted-over-target ratio of the clients and the certifying accountant."""
    budgets = fl.client_budgets(participated)
    return {
        "max_accounted_over_target": max(
            b["accounted"]["epsilon"] / b["nominal"]["epsilon"] for b in budgets
        ),
        # the certifying accountant (the default, tightest: pld, or rdp where it is smaller)
        "accountant": sorted({b["accounted"]["accountant"] for b in budgets}),
    }


#: What :func:`_federated` takes of a cell's training arguments (:meth:`CellStore.run`).
_CELL_SETUP = (
    "model_name",
    "ds",
    "train",
    "method",
    "eps",
    "reported",
    "batch_sizes",
    "lr",
    "rpca",
)


def account_cell(*, rounds: int, **cell: Any) -> dict[str, Any]:
    """The privacy fields of a finished private cell, by the default accountant, without
    training: every client takes part in every round (the tables' setting, no client sampling),
    so its participation is ``rounds`` and its noise multiplier is the one the cell used.
    ``cell``: the cell's training arguments (those of :func:`train_and_evaluate`)."""
    _, fl = _federated(rounds=rounds, **{k: cell[k] for k in _CELL_SETUP})
    if fl.config.clients_per_round not in (None, fl.n):
        raise ConfigError("re-accounting a cell needs full participation")
    return _privacy_fields(fl, torch.full((fl.n,), rounds, dtype=torch.int64))


def train_and_evaluate(
    *,
    model_name: str,
    ds,
    train: StackedData,
    test: StackedData,
    method: str,
    eps: list[float] | None,
    reported: list[float] | None,
    batch_sizes: list[int],
    lr: float,
    rounds: int,
    seed: int,
    rpca: dict[str, Any],
    device: str | torch.device = "cpu",
    checkpoint: Path | None = None,
    key: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One federated run on ``device``; returns accuracy, final weights and the true aggregate
    noise. Robust-HDP estimates its weights once, after round 1, and freezes them (the authors'
    reference code's schedule, used for Tables 12-14; docs/robust-hdp.md), so RPCA runs once per
    run.

    With ``checkpoint``, the run's state (server model, round, participation, generator state,
    the aggregator's estimates) is saved there every :data:`CHECKPOINT_EVERY_S` seconds, and a
    run that finds one made with the same ``key`` continues from it; the result is the same,
    bit for bit, as an uninterrupted run's (tested)."""
    dev = torch.device(device)
    private = method != "fedavg"
    train, test = _on_device(train, dev), _on_device(test, dev)
    model, fl = _federated(
        model_name=model_name,
        ds=ds,
        train=train,
        method=method,
        eps=eps,
        reported=reported,
        batch_sizes=batch_sizes,
        lr=lr,
        rounds=rounds,
        rpca=rpca,
    )
    params = model.init(
        n_nodes=1, generator=torch.Generator().manual_seed(seed), dtype=torch.float32, device=dev
    )
    state = fl.init(params, seed=seed)
    last_weights = None
    if checkpoint is not None and checkpoint.exists():
        state, last_weights = _load_checkpoint(checkpoint, key, state, fl.aggregator, dev)
        _progress(f"  {method}: resumed at round {state.round}/{rounds} from {checkpoint}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RPCANotConvergedWarning)
        started = saved = time.perf_counter()
        for r in range(state.round, rounds):
            state, info = fl.step(state)
            last_weights = info["weights"]
            if checkpoint is not None and time.perf_counter() - saved >= CHECKPOINT_EVERY_S:
                _save_checkpoint(checkpoint, key, state, fl.aggregator, last_weights)
                saved = time.perf_counter()
            if rounds >= 20 and (r + 1) % max(1, rounds // 10) == 0:  # a cell can take minutes
                _progress(
                    f"  {method}: round {r + 1}/{rounds}, {time.perf_counter() - started:.0f} s"
                )
    if last_weights is None:
        raise ConfigError(f"rounds must be >= 1, got {rounds}")
    acc = evaluate_clients(model, state.theta, test)["accuracy"]
    w = last_weights.double().cpu().numpy()
    # Table 3's normalisation: sigma_i^2 / (p eta_l^2), so methods with different lrs compare
    s = (
        fl.true_update_variance() / (model.num_parameters() * lr**2)
        if private
        else np.zeros(len(w))
    )
    out = {
        "accuracy": float(100 * acc.double().mean()),
        "weights": w.tolist(),
        # PFA projects the private updates: sum_i w_i^2 sigma_i^2 is not its aggregate noise, and
        # Table 3 leaves PFA out ("computation of its noise variance was not possible")
        "noise": None if method == "pfa" else float((w**2 * s).sum()),
        "oracle_noise": float(1 / (1 / s).sum()) if private else 0.0,
        "oracle_weights": ((1 / s) / (1 / s).sum()).tolist() if private else None,
    }
    if method == "robust-hdp":  # RPCA solves that stopped at max_iter (their warning is silenced)
        out["rpca_not_converged"] = cast(RobustHDP, fl.aggregator).rpca_not_converged
    if private:
        out.update(_privacy_fields(fl, state.participated))
    return out


def _privacy_note(results: dict[str, dict[Any, dict[str, Any]]]) -> str:
    """What the Dist budgets mean: nominal per-client targets, and what is certified."""
    cells = [
        r
        for per_dist in results.values()
        for r in per_dist.values()
        if r.get("max_accounted_over_target") is not None
    ]
    ratios = [r["max_accounted_over_target"] for r in cells]
    labels = sorted({a for r in cells for a in r.get("accountant", ["rdp"])})
    certified = (
        f"at most {max(ratios):.3f} x eps_i for every client in the cells run"
        if ratios
        else "not computed (no private cell run)"
    )
    return (
        f"Privacy: client i's eps_i (its Dist's list; delta = {FederatedConfig.delta:g}) sets its "
        "noise multiplier z_i by the reference code's accountant, so eps_i is NOMINAL (that "
        "accountant's claim). What privdl's accountant certifies for z_i over the rounds the "
        "client took part in (the tightest certified by default: the smaller of dp-accounting's "
        "PLD and RDP; Poisson q_i = b_i / N_i, add/remove, example level, threat model server: "
        f"the untrusted server sees every update; accountant {', '.join(labels) or 'none'}): "
        f"{certified}."
    )


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def table_checks(
    results: dict[str, dict[str, dict[str, Any]]],
    paper: dict[str, list[float]],
    dists: list[str],
    *,
    quick: bool,
) -> dict[str, bool]:
    """Checks over the (method, dist) cells completed so far (partial reports are valid)."""
    checks: dict[str, bool] = {}
    rh = results.get("robust-hdp", {})
    for dist in dists:
        if dist not in rh:
            continue
        r = rh[dist]
        checks[f"{dist}: RHDP weights rank-correlate with oracle (>= 0.8)"] = (
            _spearman(r["weights"], r["oracle_weights"]) >= 0.8
        )
        checks[f"{dist}: RHDP noise <= 1.5 x oracle"] = r["noise"] <= 1.5 * r["oracle_noise"]
        rivals = [
            results[m][dist]["noise"] for m in ("weiavg", "dpfedavg") if dist in results.get(m, {})
        ]
        if rivals:
            checks[f"{dist}: RHDP noise < WeiAvg, DPFedAvg noise"] = r["noise"] < min(rivals)
    for dist in dists:
        ratios = [
            results[m][dist]["max_accounted_over_target"]
            for m in results
            if m != "fedavg" and dist in results[m]
        ]
        if ratios:
            checks[f"{dist}: accounted eps <= 1.01 x target"] = max(ratios) <= 1.01
    done = [d for d in dists if d in rh]
    if not quick and done:
        close = [abs(rh[d]["accuracy"] - paper["robust-hdp"][int(d[4:]) - 1]) <= 2.0 for d in done]
        need = min(3, len(done))
        checks[f"RHDP within 2 points of paper for >= {need} of the {len(done)} dists run"] = (
            sum(close) >= need
        )
    return checks


def _plot_table(
    path: Path,
    *,
    results: dict[str, dict[str, dict[str, Any]]],
    paper: dict[str, list[float]],
    methods: list[str],
    dists: list[str],
) -> None:
    """Table 12-14's accuracies as bars (a cell not run is a gap), the paper's as ticks."""
    nan = float("nan")
    series = {
        m: [results.get(m, {}).get(d, {}).get("accuracy", nan) for d in dists] for m in methods
    }
    several = any(
        len(r.get("accuracy_seeds", [])) > 1 for m in results.values() for r in m.values()
    )
    errors = (
        {
            m: [results.get(m, {}).get(d, {}).get("accuracy_std", 0.0) for d in dists]
            for m in methods
        }
        if several
        else None
    )
    _plot(
        path,
        series,
        dists,
        ylabel="avg client test acc %" + (" (bars: mean +- std over seeds)" if several else ""),
        paper={m: [paper[m][int(d[4:]) - 1] for d in dists] for m in methods},
        errors=errors,
    )


def replot_table(out_dir: Path) -> Path:
    """Redraw ``accuracy.png`` of a finished (or partial) table from its ``summary.json``: the
    committed results' figure in the current form, without training."""
    s = json.loads((Path(out_dir) / "summary.json").read_text())
    path = Path(out_dir) / "accuracy.png"
    _plot_table(
        path, results=s["results"], paper=s["paper"], methods=s["methods"], dists=s["dists"]
    )
    return path


def _write_table(
    out_dir: Path,
    *,
    pre: dict[str, Any],
    dataset: str,
    note: str,
    methods: list[str],
    dists: list[str],
    results: dict[str, dict[str, dict[str, Any]]],
    quick: bool,
    elapsed: dict[str, float],
    complete: bool,
) -> dict[str, Any]:
    paper = pre["paper"]
    checks = table_checks(results, paper, dists, quick=quick)
    out_dir.mkdir(parents=True, exist_ok=True)
    _plot_table(
        out_dir / "accuracy.png", results=results, paper=paper, methods=methods, dists=dists
    )
    rows = []
    for m in methods:
        cells = []
        for dist in dists:
            p = paper[m][int(dist[4:]) - 1]
            r = results.get(m, {}).get(dist)
            if r is None:
                cells.append(f"not run ({p:.2f})")
                continue
            sd = f" ± {r['accuracy_std']:.2f}" if len(r["accuracy_seeds"]) > 1 else ""
            noise = "n/a (projection)" if m == "pfa" else f"{r['noise']:.3g}"
            cells.append(
                f"{r['accuracy']:.2f}{sd} ({p:.2f}, {r['accuracy'] - p:+.2f}) noise {noise}"
            )
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    status = "complete" if complete else "PARTIAL (written after every finished cell)"
    report = "\n".join(
        [
            f"# Robust-HDP {pre['paper_table']}: average client test accuracy ({dataset})",
            "",
            note,
            _privacy_note(results),
            f"Status: {status}. Cells: ours (paper, ours - paper); ± is the std over seeds.",
            "noise = NoiseAgg of Table 3: sum_i w_i^2 sigma_i^2 / (p eta_l^2), TRUE Eq. 7 "
            "variances (none for PFA, whose projection of the private updates the formula does "
            "not describe; Table 3 leaves PFA out too). Robust-HDP weights: RPCA once after round 1, then frozen (the "
            "authors' reference code).",
            "",
            "| method | " + " | ".join(dists) + " |",
            "|---|" + "---|" * len(dists),
            *rows,
            "",
            "![accuracy](accuracy.png)",
            "",
            "Checks: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items()),
        ]
    )
    summary = {
        "mode": "quick" if quick else "full",
        "complete": complete,
        "methods": methods,
        "dists": dists,
        "results": results,
        "paper": {m: paper[m] for m in methods},
        "seconds": elapsed,
        "checks": checks,
    }
    return write_outputs(out_dir, report_md=report, summary=summary)


def _cell_name(method: str, dist: str, lr: float, seed: int) -> str:
    """The cell a (method, dist, seed) result is stored under. Non-private FedAvg never reads
    the Dist's budgets (its run depends on the data, the model, the lr and the seed only), so
    its cell is named by its lr and one run serves every Dist with that lr."""
    if method == "fedavg":
        return f"fedavg_lr{lr:g}_seed{seed}"
    return f"{method}_{dist}_seed{seed}"


def _accuracy_table(preset_name: str):
    def run(
        out_dir: Path,
        *,
        quick: bool,
        data_dir: str | None = None,
        device: str = "cpu",
        overrides: dict[str, str] | None = None,
        resume: bool = False,
    ) -> dict[str, Any]:
        """Tables 12-14 (App. F.1); ``overrides``: dists, methods, rounds, seeds. ``resume``
        keeps the finished cells of an earlier run in ``out_dir`` and continues its cut-off
        cell (:class:`CellStore`)."""
        pre = load_preset(preset_name)
        mode = pre["quick" if quick else "full"]
        opt = parse_overrides(overrides, accepted=TABLE_OVERRIDES, methods=METHODS)
        dists, methods = opt.get("dists", list(mode["dists"])), opt.get("methods", list(METHODS))
        rounds, seeds = opt.get("rounds", mode["rounds"]), opt.get("seeds", 1)
        dataset = mode.get("dataset", pre["dataset"])
        n, per = mode["n_clients"], mode["samples_per_client"]
        ds, train, test = _federated_data(
            dataset, n_clients=n, per_client=per, data_dir=data_dir, seed=0
        )
        dev = torch.device(device)
        train, test = _on_device(train, dev), _on_device(test, dev)  # once; no-op per cell
        rpca = {k: mode[k] for k in ("chunk_rows", "max_blocks") if k in mode}
        rpca["max_iter"] = 500 if quick else 5000
        b = list(BATCH_SIZES_20[:n]) if n <= 20 else None
        note = (
            f"QUICK mode: {n} clients x {per} samples, {rounds} rounds, model {mode['model']}, "
            f"data {dataset}: accuracies are NOT comparable with the paper's; the checks concern "
            "the noise-aware weights."
            if quick
            else f"FULL mode: {n} clients x {per} samples (80% train), {rounds} rounds "
            f"(paper: 200), model {mode['model']}, {seeds} seed(s), device {device}."
        )
        results: dict[str, dict[str, dict[str, Any]]] = {}
        elapsed: dict[str, float] = {}
        summary: dict[str, Any] = {}
        t_start, total, done = time.perf_counter(), len(dists) * len(methods), 0
        store = CellStore(out_dir, resume=resume)
        for dist in dists:
            d = int(dist[4:]) - 1
            eps = list(EPS_LISTS_20[dist][:n])
            for method in methods:
                t0 = time.perf_counter()
                lr = pre["lr"][method][d]
                runs = [
                    store.run(
                        _cell_name(method, dist, lr, s),
                        {
                            "preset": preset_name,
                            "quick": quick,
                            "rounds": rounds,
                            "clients": n,
                            "per_client": per,
                            "device": torch.device(device).type,
                            "rpca": rpca,
                        },
                        model_name=mode["model"],
                        ds=ds,
                        train=train,
                        test=test,
                        method=method,
                        eps=eps,
                        reported=None,
                        batch_sizes=b,
                        lr=lr,
                        rounds=rounds,
                        seed=s,
                        rpca=rpca,
                        device=device,
                    )
                    for s in range(1, seeds + 1)
                ]
                accs = [r["accuracy"] for r in runs]
                results.setdefault(method, {})[dist] = {
                    **runs[0],
                    "accuracy": float(np.mean(accs)),
                    "accuracy_std": float(np.std(accs)),
                    "accuracy_seeds": accs,
                }
                if any("rpca_not_converged" in r for r in runs):  # over every seed's cell
                    results[method][dist]["rpca_not_converged"] = sum(
                        r.get("rpca_not_converged", 0) for r in runs
                    )
                done += 1
                elapsed[f"{method}/{dist}"] = time.perf_counter() - t0
                _progress(
                    f"{preset_name} {method} {dist}: acc {np.mean(accs):.2f}% "
                    f"(paper {pre['paper'][method][d]:.2f}) in {elapsed[f'{method}/{dist}']:.1f} s"
                    f"; {done}/{total} done, {time.perf_counter() - t_start:.0f} s elapsed"
                )
                summary = _write_table(
                    out_dir,
                    pre=pre,
                    dataset=dataset,
                    note=note,
                    methods=methods,
                    dists=dists,
                    results=results,
                    quick=quick,
                    elapsed=elapsed,
                    complete=done == total,
                )
        return summary

    return run


# --------------------------------------------------------------------------- falsification
def run_falsified(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Fig. 5 right (Section 4.2): client 0 (true eps 0.95 in Dist5) reports eps' > 0.95.

    ``overrides``: ``rounds``, ``methods`` (subset of :data:`FALSIFIED_METHODS`), ``reported``
    (the eps' grid); ``resume``: as for the tables (:class:`CellStore`)."""
    opt = parse_overrides(
        overrides, accepted=("methods", "reported", "rounds"), methods=FALSIFIED_METHODS
    )
    n, per, rounds = (6, 200, 2) if quick else (20, 3000, 200)
    rounds = opt.get("rounds", rounds)
    grid = opt.get("reported", [0.95, 50.0] if quick else [0.95, 2.0, 5.0, 10.0, 20.0, 50.0])
    methods = [m for m in FALSIFIED_METHODS if m in opt.get("methods", FALSIFIED_METHODS)]
    model_name = "linear" if quick else "cnn-mnist"
    ds, train, test = _federated_data(
        "mnist", n_clients=n, per_client=per, data_dir=data_dir, seed=0
    )
    eps = list(EPS_LISTS_20["Dist5"][:n])
    assert eps[0] == FALSIFIER_EPS
    lrs = load_preset("robust-hdp-mnist")["lr"]
    rpca = {"chunk_rows": 1000, "max_iter": 500} if quick else {"max_iter": 5000}
    results: dict[str, list[dict[str, Any]]] = {}
    store = CellStore(out_dir, resume=resume)
    key = {
        "preset": "robust-hdp-falsified",
        "quick": quick,
        "rounds": rounds,
        "device": torch.device(device).type,
    }
    started = time.perf_counter()
    for method in methods:
        for fake in grid:
            reported = [fake, *eps[1:]]
            results.setdefault(method, []).append(
                store.run(
                    f"{method}_reported{fake:g}",
                    key,
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
                    device=device,
                )
            )
            _progress(
                f"falsified {method} eps'={fake:g}: acc {results[method][-1]['accuracy']:.2f}%; "
                f"{time.perf_counter() - started:.0f} s elapsed"
            )
    checks = falsified_checks(results, grid, eps=eps, quick=quick)
    out_dir.mkdir(parents=True, exist_ok=True)
    series = {m: [r["accuracy"] for r in rs] for m, rs in results.items()}
    _falsified_plot(out_dir / "falsified.png", series, grid)
    rows = [
        f"| {m} | "
        + " | ".join(f"{r['accuracy']:.2f} / w0={r['weights'][0]:.3f}" for r in rs)
        + " |"
        for m, rs in results.items()
    ]
    setting = (
        "QUICK (linear model, 6 clients x 200 samples, 2 rounds)"
        if quick
        else f"FULL data (20 clients x 3000 samples, the paper's CNN, Table 5), {rounds} rounds"
        + ("" if rounds == 200 else " (the paper's 200 rounds cut; z_i calibrated for these)")
    )
    report = "\n".join(
        [
            "# Robust-HDP Fig. 5 (right): a client falsifies its reported epsilon",
            "",
            f"MNIST, {n} clients, Dist5; client 0 trains with its true eps {FALSIFIER_EPS} and "
            f"reports eps' to the server. {setting}, seed 1. Paper (qualitative): WeiAvg and "
            "PFA degrade as eps' grows, Robust-HDP is unaffected.",
            "",
            _privacy_note({m: dict(enumerate(rs)) for m, rs in results.items()})
            + " The falsifier's privacy is that of its true eps; what it reports changes only "
            "its weight.",
            "",
            "Cells: average test accuracy % / the falsifier's aggregation weight w0.",
            "",
            "| method | " + " | ".join(f"eps'={g:g}" for g in grid) + " |",
            "|---|" + "---|" * len(grid),
            *rows,
            "",
            "PFA's public cluster (2-means on the reported eps), clients: "
            + ", ".join(
                f"{int(mask.sum())} at eps'={g:g}"
                for mask, g in zip(pfa_public_clusters(grid, eps), grid, strict=True)
            )
            + ".",
            "",
            "![falsified](falsified.png)",
            "",
            "Checks: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items()),
        ]
    )
    summary = {"grid": grid, "rounds": rounds, "results": results, "checks": checks}
    return write_outputs(out_dir, report_md=report, summary=summary)


def _falsified_plot(path: Path, series: dict[str, list[float]], grid: list[float]) -> None:
    """Accuracy against the reported eps' (log axis), one line per method: Fig. 5 (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, vals in series.items():
        ax.plot(grid, vals, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xticks(grid, [f"{g:g}" for g in grid])
    ax.minorticks_off()
    ax.set_xlabel("reported eps' of client 0 (true eps 0.95)")
    ax.set_ylabel("avg test acc %")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pfa_public_clusters(grid: list[float], eps: list[float]) -> list[np.ndarray]:
    """PFA's public-cluster mask (2-means on the reported eps) for each falsifier's eps'."""
    return [two_means_split(np.array([g, *eps[1:]])) for g in grid]


FALSIFIED_DROP_POINTS = 1.0  # "degrades markedly": at least this many accuracy points (full)


def falsified_checks(
    results: dict[str, list[dict[str, Any]]],
    grid: list[float],
    *,
    eps: list[float],
    quick: bool,
) -> dict[str, bool]:
    """The checks of Fig. 5 right (Section 4.2, RQ3) over the methods that ran (``grid`` order).

    Robust-HDP and DPFedAvg never read the reported eps: identical weights and accuracy.
    WeiAvg's falsifier weight is ``eps'/(eps' + sum of the others)`` and its aggregate noise is
    larger at the largest eps' than at the smallest; PFA's public cluster (2-means on the
    reported eps) narrows to the falsifier, whose noisy update then shapes the projection
    subspace. In full mode both lose at least :data:`FALSIFIED_DROP_POINTS` accuracy points from
    the smallest to the largest eps' (the quick linear model's 2 rounds are too short for
    accuracy to say anything)."""
    checks: dict[str, bool] = {}
    if len(grid) < 2:
        return checks
    for m, label in (("robust-hdp", "RHDP"), ("dpfedavg", "DPFedAvg")):
        rs = results.get(m)
        if rs:
            checks[f"{label} weights unchanged by the falsified eps"] = all(
                r["weights"] == rs[0]["weights"] for r in rs
            )
            checks[f"{label} accuracy flat"] = (
                max(r["accuracy"] for r in rs) - min(r["accuracy"] for r in rs) <= 1e-9
            )
    wa, pf = results.get("weiavg"), results.get("pfa")
    others = float(sum(eps[1:]))
    if wa:
        checks["WeiAvg falsifier weight = eps'/(eps' + sum of the others)"] = all(
            abs(r["weights"][0] - g / (g + others)) <= 1e-6 for r, g in zip(wa, grid, strict=True)
        )
        # not monotone: the noise dips while w0 nears the falsifier's inverse-noise share
        # (Dist5, 20 clients: 4.59 at eps' = 0.95, 4.43 at 2, 22.0 at 50)
        checks["WeiAvg aggregate noise larger at the largest eps' than at the smallest"] = (
            wa[-1]["noise"] > wa[0]["noise"]
        )
        if results.get("robust-hdp"):
            checks["WeiAvg at largest eps' noisier than RHDP"] = (
                wa[-1]["noise"] > results["robust-hdp"][-1]["noise"]
            )
    if pf:
        public = pfa_public_clusters(grid, eps)
        checks["PFA's public cluster narrows to the falsifier as eps' grows"] = bool(
            public[-1][0] and public[-1].sum() < public[0].sum()
        )
    if not quick:
        for rs, label in ((wa, "WeiAvg"), (pf, "PFA")):
            if rs:
                checks[
                    f"{label} loses >= {FALSIFIED_DROP_POINTS:g} accuracy points at the largest eps'"
                ] = rs[0]["accuracy"] - rs[-1]["accuracy"] >= FALSIFIED_DROP_POINTS
    return checks


REPRODUCTIONS = [
    Reproduction(
        name="robust-hdp-mnist",
        paper="Robust-HDP (ICML 2024)",
        description="Table 12: MNIST accuracy of RHDP and baselines over eps distributions",
        run=_accuracy_table("robust-hdp-mnist"),
        full_runtime="one 20-client CNN round 14.8 s on 2 quiet CPU cores (2026-11-23, batch-size "
        "classes + ghost path), so ~50 min per (method, dist) on 2 cores (measured cells: ~110 min "
        "on one thread) and ~2 days for 54 cells; ~17 min per cell on one H100 (measured before "
        "those changes) (use --set methods=/dists= to fit a budget)",
    ),
    Reproduction(
        name="robust-hdp-fmnist",
        paper="Robust-HDP (ICML 2024)",
        description="Table 13: Fashion-MNIST accuracy of RHDP and baselines",
        run=_accuracy_table("robust-hdp-fmnist"),
        full_runtime="as robust-hdp-mnist (same CNN size and clients): ~50 min per cell on 2 "
        "CPU cores, ~17 min on one H100",
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
        description="Fig. 5 right: a client reports a larger eps; WeiAvg/PFA degrade, RHDP not "
        "(--set methods=, reported=, rounds= to fit a budget)",
        run=run_falsified,
        full_runtime="24 CNN runs x 200 rounds: ~50 min each on 2 CPU cores (measured round), "
        "~17 min each on one H100",
    ),
]
