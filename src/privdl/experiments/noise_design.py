"""``privdl reproduce noise-design``: residual noise of DECOR's noise forms in Whisper's setting.

Whisper D-SGD (arXiv 2501.14644, Section 5): n = 20 nodes, Erdos-Renyi graphs with p in
{0.2, 0.4, 0.6, 0.8, 1.0}, epsilon = 10, delta = 1e-5. For each graph (the same graph seeds for
every method) and threat model, the residual noise sum_{k=1..K} tr(W^k Sigma W^k^T) (Metropolis
W) at the same accounted epsilon of:

* LDP (independent noise only), DECOR with its best scalar sigma_cor (same objective), the
  edge-optimized design (ours, certified by the design accountant), CDP (a trusted curator's noise
  on the average: a reference, not decentralized);
* Whisper's free covariance (eavesdropper only; needs a trusted dealer).

K = 1 is Whisper's one-step objective; K = 10 is the multi-step one (docs/noise-design.md).

Accuracy at equal accounted epsilon: DECOR with its best scalar pair against the edge-optimized
design, both trained by ``privdl run decor`` on one Erdos-Renyi graph (n = 20, p = 0.4): a9a
logistic regression at user level (eavesdropper and curious users) and the MNIST MLP at example
level (eavesdropper). Each method's noise is scaled until the run's own accountant gives the
target epsilon (the design's shape and the scalar pair's ratio are kept), so the two differ only
in how the noise is spread over nodes and edges. Quick mode: a9a only, a short run, one seed.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from privdl.experiments import Reproduction, write_outputs

PS = (0.2, 0.4, 0.6, 0.8, 1.0)
METHODS = ("ldp", "decor_scalar", "design", "whisper", "cdp")


def run(out: Path, *, quick: bool = False, data_dir: str | None = None) -> dict[str, Any]:
    """Write report.md, summary.json and accuracy.png into ``out`` (``data_dir``: MNIST's files)."""
    import time

    started = time.perf_counter()
    from privdl.accounting.secrdp import PrivacyWarning
    from privdl.design.api import design_noise
    from privdl.topology.graphs import erdos_renyi

    seeds = (1,) if quick else (1, 2, 3)
    horizons = (1,) if quick else (1, 10)
    adversaries = ("eavesdropper",) if quick else ("eavesdropper", "curious")
    n, epsilon, delta, steps = (12 if quick else 20), 10.0, 1e-5, 1000
    rows: list[dict[str, Any]] = []
    for adversary in adversaries:
        for horizon in horizons:
            for p in PS:
                for seed in _connected_seeds(n, p, len(seeds)):
                    topo = erdos_renyi(n, p, seed)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", PrivacyWarning)
                        result = design_noise(
                            topo, epsilon=epsilon, delta=delta, steps=steps, clip=1.0,
                            adversary=adversary, horizon=horizon,
                            whisper=adversary == "eavesdropper",
                        )  # fmt: skip
                    res = result.to_dict()["residual"]
                    rows.append(
                        {
                            "adversary": adversary,
                            "horizon": horizon,
                            "p": p,
                            "seed": seed,
                            "epsilon_accounted": result.account.epsilon,
                            "label": result.account.budget.label(),
                            **{m: res[{"decor_scalar": "decor_scalar"}.get(m, m)] for m in METHODS},
                            "ratio_vs_decor": result.residual_ratio_vs_decor,
                            "ratio_vs_whisper": (
                                result.residual / res["whisper"] if res["whisper"] else None
                            ),
                        }
                    )
    residual_seconds = time.perf_counter() - started
    accuracy = _accuracy_runs(out, quick=quick, data_dir=data_dir, epsilon=epsilon, delta=delta)
    report = _report(rows, n=n, epsilon=epsilon, delta=delta, steps=steps)
    report += _accuracy_report(accuracy)
    report += (
        f"\nRun time: residual tables {residual_seconds:.0f} s, accuracy runs "
        f"{sum(r['seconds'] for r in accuracy):.0f} s (wall, this machine).\n"
    )
    summary = {"setting": {"n": n, "epsilon": epsilon, "delta": delta, "steps": steps,
                           "seeds": list(seeds)}, "rows": rows,
               "accuracy_setting": _accuracy_settings(quick), "accuracy": accuracy,
               "seconds": {"residual": residual_seconds,
                           "total": time.perf_counter() - started}}  # fmt: skip
    return write_outputs(out, report_md=report, summary=summary)


#: Accuracy runs: one graph, each dataset's run settings (``level``: the privacy unit).
ACCURACY_GRAPH = "er:20:0.4:1"
ACCURACY: dict[str, dict[str, Any]] = {
    "a9a": {
        "run": {
            "task": "a9a",
            "steps": 1000,
            "lr": 0.1,
            "clip": 0.1,
            "batch_size": 64,
            "clip_mode": "batch_mean",
        },  # fmt: skip
        "level": "user",
        "adversaries": ("eavesdropper", "curious"),
    },
    "mnist": {
        "run": {
            "task": "mnist",
            "model": "mlp",
            "steps": 300,
            "lr": 1.0,
            "clip": 1.0,
            "batch_size": 64,
            "clip_mode": "per_sample",
        },  # fmt: skip
        "level": "example",
        "adversaries": ("eavesdropper",),
    },
}
QUICK_ACCURACY = {"a9a": {**ACCURACY["a9a"], "run": {**ACCURACY["a9a"]["run"], "steps": 100},
                          "adversaries": ("eavesdropper",)}}  # fmt: skip
ACCURACY_METHODS = ("decor_scalar", "design")


def _accuracy_settings(quick: bool) -> dict[str, Any]:
    table = QUICK_ACCURACY if quick else ACCURACY
    return {
        "graph": ACCURACY_GRAPH,
        "seeds": [1] if quick else [1, 2, 3],
        "horizon": 10,
        "common": {
            "partition": "dirichlet:10",
            "mixing": "metropolis",
            "lr_decay": 5000.0,
            "sampling": "without_replacement",
            "data_seed": 1,
        },  # fmt: skip
        "datasets": {k: {**v, "adversaries": list(v["adversaries"])} for k, v in table.items()},
    }


def _scaled_to_epsilon(epsilon_of: Any, target: float) -> float:
    """The factor f with epsilon_of(f) <= target, within 1e-6 relative of equality (epsilon is
    decreasing in the noise variance's factor f; bisection on log f)."""
    lo, hi = 1.0, 1.0
    while epsilon_of(lo) <= target:
        lo /= 2.0
    while epsilon_of(hi) > target:
        hi *= 2.0
    while hi / lo > 1.0 + 1e-7:
        mid = float(np.sqrt(lo * hi))
        if epsilon_of(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def _run_epsilon(
    cfg: Any,
    topo: Any,
    task: Any,
    factor: float,
    *,
    sigma: float = 0.0,
    sigma_cor: float = 0.0,
    design: Any = None,
) -> float:
    """The run's own accounted epsilon after ``cfg.steps`` steps with every noise variance of the
    scalar pair (``sigma``, ``sigma_cor``) or of ``design`` times ``factor``."""
    from privdl.privacy import spent

    at = spent(
        cfg, topo, task, noise="correlated", adversary=cfg.adversary, sigma=sigma * factor**0.5,
        sigma_cor=sigma_cor * factor**0.5, design=None if design is None else design.scaled(factor),
    )  # fmt: skip
    return float(at(cfg.steps)["epsilon"])


def _accuracy_runs(
    out: Path, *, quick: bool, data_dir: str | None, epsilon: float, delta: float
) -> list[dict[str, Any]]:
    """Train DECOR with its best scalar pair and with the design at the same accounted epsilon."""
    import tempfile
    import time

    from privdl.accounting.secrdp import PrivacyWarning
    from privdl.design.api import design_noise
    from privdl.experiments.decor import _simulate, non_private
    from privdl.mechanisms.noise_design import save_design
    from privdl.registry import make_config
    from privdl.tasks import build_task
    from privdl.topology import parse_graph

    setting = _accuracy_settings(quick)
    topo = parse_graph(ACCURACY_GRAPH)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        for dataset, spec in setting["datasets"].items():
            base = {**setting["common"], **spec["run"], "graph": ACCURACY_GRAPH, "delta": delta,
                    "eval_every": 10**9, "algorithm": "decor"}  # fmt: skip
            if data_dir is not None:
                base["data_dir"] = data_dir
            cfg = make_config({**non_private(base), "sigma": 1.0})
            task = build_task(cfg)
            for adversary in spec["adversaries"]:
                designed = design_noise(
                    topo, epsilon=epsilon, delta=delta, steps=int(base["steps"]),
                    clip=float(base["clip"]), adversary=adversary, horizon=setting["horizon"],
                )  # fmt: skip
                s_cdp, s_cor = designed.decor_sigmas
                acfg = make_config({**base, "adversary": adversary, "sigma": 1.0})

                run_eps = partial(_run_epsilon, acfg, topo, task)
                f_scalar = _scaled_to_epsilon(
                    partial(run_eps, sigma=s_cdp, sigma_cor=s_cor), epsilon
                )
                f_design = _scaled_to_epsilon(partial(run_eps, design=designed.design), epsilon)
                path = Path(tmp) / f"{dataset}-{adversary}.json"
                save_design(designed.design.scaled(f_design), path)
                extras = {
                    "decor_scalar": {
                        "sigma": s_cdp * f_scalar**0.5,
                        "sigma_cor": s_cor * f_scalar**0.5,
                    },
                    "design": {"noise_design": str(path)},
                }
                for method in ACCURACY_METHODS:
                    for seed in setting["seeds"]:
                        t0 = time.perf_counter()
                        got = _simulate({**base, **extras[method], "adversary": adversary,
                                         "seed": seed})  # fmt: skip
                        privacy = got["privacy"]
                        rows.append({
                            "dataset": dataset, "level": spec["level"], "adversary": adversary,
                            "method": method, "seed": seed,
                            "accuracy": float(got["final"]["accuracy"]),
                            "test_loss": float(got["final"]["test_loss"]),
                            "epsilon_accounted": float(privacy["epsilon"]),
                            "label": _label(privacy),
                            "residual_ratio_vs_decor": designed.residual_ratio_vs_decor,
                            "noise_scale": f_scalar if method == "decor_scalar" else f_design,
                            "seconds": time.perf_counter() - t0,
                        })  # fmt: skip
    _accuracy_figure(out, rows)
    return rows


def _label(privacy: dict[str, Any]) -> str:
    return (
        f"delta {privacy['delta']:g}, {privacy['unit']}-level, {privacy['neighbouring']}, "
        f"accountant {privacy['accountant']}, threat model {privacy['threat_model']}"
    )


def _accuracy_figure(out: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["dataset"], r["adversary"]) for r in rows))
    if not groups:
        return
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 3.4), squeeze=False)
    for ax, (dataset, adversary) in zip(axes[0], groups, strict=True):
        means, stds = [], []
        for method in ACCURACY_METHODS:
            acc = [r["accuracy"] for r in rows if (r["dataset"], r["adversary"], r["method"])
                   == (dataset, adversary, method)]  # fmt: skip
            means.append(float(np.mean(acc)))
            stds.append(float(np.std(acc)))
        ax.bar(["DECOR scalar", "edge-optimized"], means, yerr=stds, capsize=4,
               color=["green", "tab:blue"])  # fmt: skip
        low = min(m - s for m, s in zip(means, stds, strict=True))
        ax.set_ylim(max(0.0, low - 0.05), min(1.0, max(means) + 0.05))
        ax.set_title(f"{dataset}, {adversary}", fontsize=9)
        ax.set_ylabel("test accuracy", fontsize=9)
    fig.suptitle("equal accounted epsilon = 10 (delta 1e-5)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=150)
    plt.close(fig)


def _accuracy_report(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    lines = [
        "",
        "## Accuracy at equal accounted epsilon",
        "",
        f"Graph {ACCURACY_GRAPH} (Metropolis W), each method's noise scaled until the run's own "
        "accountant gives epsilon = 10; test accuracy and test loss of the average model, mean ± "
        "std over training seeds. Figure: accuracy.png.",
        "",
        "| dataset | level | threat model | residual ratio (K = 10) | method | accuracy | "
        "test loss | accounted eps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dataset, adversary in dict.fromkeys((r["dataset"], r["adversary"]) for r in rows):
        for method in ACCURACY_METHODS:
            at = [r for r in rows if (r["dataset"], r["adversary"], r["method"])
                  == (dataset, adversary, method)]  # fmt: skip
            name = {"decor_scalar": "DECOR scalar", "design": "edge-optimized"}[method]
            lines.append(
                f"| {dataset} | {at[0]['level']} | {adversary} | "
                f"{at[0]['residual_ratio_vs_decor']:.3f} | {name} | "
                f"{_cell([r['accuracy'] for r in at])} | {_cell([r['test_loss'] for r in at])} | "
                f"{max(r['epsilon_accounted'] for r in at):.6g} |"
            )
    labels = sorted({r["label"] for r in rows})
    lines += ["", "epsilon: " + "; ".join(labels), ""]
    seeds = sorted({r["seed"] for r in rows})
    lines.append(f"Training seeds: {seeds}; data seed 1.")
    return "\n".join(lines) + "\n"


def _connected_seeds(n: int, p: float, count: int) -> list[int]:
    """The first ``count`` seeds (from 1) whose Erdos-Renyi draw is connected (DECOR needs it)."""
    from privdl.topology.graphs import erdos_renyi

    found: list[int] = []
    seed = 1
    while len(found) < count:
        if erdos_renyi(n, p, seed, require_connected=False).is_connected:
            found.append(seed)
        seed += 1
    return found


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    arr = np.asarray(values, dtype=float)
    return f"{arr.mean():.4g} ± {arr.std():.2g}" if len(arr) > 1 else f"{arr[0]:.4g}"


def _report(rows: list[dict[str, Any]], **setting: Any) -> str:
    lines = [
        "# Noise design: residual noise at equal accounted epsilon",
        "",
        f"n = {setting['n']}, Erdos-Renyi graphs, epsilon = {setting['epsilon']}, "
        f"delta = {setting['delta']}, T = {setting['steps']} steps, user level, Metropolis W; "
        "mean ± std over graph seeds. Whisper's free covariance needs a trusted dealer "
        "and holds against the eavesdropper only; CDP is a trusted curator's reference.",
    ]
    for adversary in dict.fromkeys(r["adversary"] for r in rows):
        for horizon in dict.fromkeys(r["horizon"] for r in rows):
            sel = [r for r in rows if r["adversary"] == adversary and r["horizon"] == horizon]
            if not sel:
                continue
            lines += [
                "",
                f"## {adversary}, K = {horizon}",
                "",
                "| p | LDP | DECOR scalar | edge-optimized | Whisper | CDP | ours / DECOR | "
                "ours / Whisper |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for p in PS:
                at = [r for r in sel if r["p"] == p]
                cells = [_cell([r[m] for r in at if r[m] is not None]) for m in METHODS]
                ratio = _cell([r["ratio_vs_decor"] for r in at])
                vs_w = _cell([r["ratio_vs_whisper"] for r in at if r["ratio_vs_whisper"]])
                lines.append(f"| {p} | {' | '.join(cells)} | {ratio} | {vs_w} |")
            lines.append(f"\nepsilon: {sel[0]['label']}")
            lines += _short_of_target(sel)
    return "\n".join(lines) + "\n"


def _short_of_target(sel: list[dict[str, Any]]) -> list[str]:
    """A note for every irregular graph (p <= 0.6) where the design is short of 10% below DECOR."""
    notes = []
    for p in PS:
        at = [r for r in sel if r["p"] == p]
        if p > 0.6 or not at or float(np.mean([r["ratio_vs_decor"] for r in at])) <= 0.9:
            continue
        scalar_is_ldp = sum(r["decor_scalar"] >= r["ldp"] * (1 - 1e-9) for r in at)
        notes.append(
            f"\np = {p}: ours / DECOR = {np.mean([r['ratio_vs_decor'] for r in at]):.3f}, short "
            "of the 10% target. The design problem is convex and the conic solution is its "
            "global optimum (the first-order solver reaches the same value), so no edge-wise "
            f"design does better here; DECOR's best scalar pair is LDP itself (sigma_cor = 0) "
            f"on {scalar_is_ldp} of {len(at)} graphs (docs/noise-design.md)."
        )
    return notes


REPRODUCTIONS = [
    Reproduction(
        name="noise-design",
        paper="Whisper D-SGD",
        description="Residual noise of LDP, DECOR scalar, edge-optimized, Whisper, CDP",
        run=run,
        full_runtime="about 12 minutes on 2 idle cores (residual tables 7, accuracy runs 5)",
    )
]


#: The accuracy grid (issue 33): every method at equal accounted epsilon on every p.
GRID_METHODS = ("ldp", "decor_scalar", "design", "whisper", "cdp")
GRID_NAMES = {
    "ldp": "LDP",
    "decor_scalar": "DECOR scalar",
    "design": "edge-optimized",
    "whisper": "Whisper (trusted dealer)",
    "cdp": "CDP",
}
#: the methods whose noise and accountant do not depend on the threat model of DECOR's family
#: (LDP: each node's own noise, the ``ldp`` closed form; CDP: the central Gaussian)
THREAT_FREE = ("ldp", "cdp")


def run_accuracy_grid(
    out: Path,
    *,
    cells: Path,
    seeds: tuple[int, ...] = (1, 2, 3),
    ps: tuple[float, ...] = PS,
    steps: int | None = None,
    epsilon: float = 10.0,
    delta: float = 1e-5,
    adversary: str = "eavesdropper",
    methods: tuple[str, ...] | None = None,
    dataset: str = "a9a",
    data_dir: str | None = None,
) -> dict[str, Any]:
    """``dataset`` (:data:`ACCURACY`: a9a logistic regression at user level, or the MNIST MLP at
    example level; ``data_dir`` as ``--data-dir``) at equal accounted epsilon against ``adversary`` for
    LDP, DECOR's best scalar pair, the edge-optimized design (K = 10), Whisper's free covariance
    (eavesdropper only: drawn by a simulated trusted dealer, :mod:`privdl.mechanisms.dealer`) and
    CDP, on the first connected Erdos-Renyi graph (n = 20) of every p, training seeds ``seeds``;
    every finished run is a cell under ``cells`` (:class:`~privdl.experiments.RunCells`: a
    cut-off grid resumes). LDP and CDP are calibrated by the run itself (``epsilon``), the others
    by scaling their variances until the run's own accountant gives ``epsilon``. ``methods``
    (default: every method valid against ``adversary``) picks a subset. Returns the rows and the
    table (``summary.json: accuracy_grid``, or ``accuracy_grid_<adversary>``)."""
    import time

    from privdl.accounting.secrdp import PrivacyWarning
    from privdl.design.api import design_noise
    from privdl.experiments import RunCells
    from privdl.experiments.decor import _simulate, non_private
    from privdl.registry import make_config
    from privdl.tasks import build_task
    from privdl.topology import parse_graph

    valid = tuple(m for m in GRID_METHODS if adversary == "eavesdropper" or m != "whisper")
    methods = valid if methods is None else methods
    if set(methods) - set(valid):
        raise ValueError(
            f"methods {sorted(set(methods) - set(valid))} not valid against {adversary}"
        )
    started = time.perf_counter()
    store = RunCells(cells, resume=True)
    spec = ACCURACY[dataset]
    run_spec = {**spec["run"], **({"steps": steps} if steps else {})}
    common = _accuracy_settings(False)["common"]
    rows: list[dict[str, Any]] = []
    data = {} if data_dir is None else {"data_dir": data_dir}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        for p in ps:
            graph = f"er:20:{p}:{_connected_seeds(20, p, 1)[0]}"
            topo = parse_graph(graph)
            base = {**common, **run_spec, "graph": graph, "delta": delta, "eval_every": 10**9,
                    "algorithm": "decor", "adversary": adversary}  # fmt: skip
            designed = design_noise(
                topo, epsilon=epsilon, delta=delta, steps=int(base["steps"]),
                clip=float(base["clip"]), adversary=adversary, horizon=10,
                whisper="whisper" in methods,
            )  # fmt: skip
            s_cdp, s_cor = designed.decor_sigmas
            task = build_task(make_config({**non_private(base), **data, "sigma": 1.0}))
            run_eps = partial(_run_epsilon, make_config({**base, "sigma": 1.0}), topo, task)
            extras: dict[str, dict[str, Any]] = {
                "ldp": {"algorithm": "ldp", "epsilon": epsilon},
                "cdp": {"algorithm": "cdp", "epsilon": epsilon},
            }
            scales: dict[str, float] = {}
            if "decor_scalar" in methods:
                f = _scaled_to_epsilon(partial(run_eps, sigma=s_cdp, sigma_cor=s_cor), epsilon)
                extras["decor_scalar"] = {"sigma": s_cdp * f**0.5, "sigma_cor": s_cor * f**0.5}
            noises: dict[str, Any] = {"design": designed.design, "whisper": designed.whisper}
            for method in ("design", "whisper"):
                if method in methods:
                    f = scales[method] = _scaled_to_epsilon(
                        partial(run_eps, design=noises[method]), epsilon
                    )
                    path = cells / f"{dataset}-{method}-{adversary}-{graph.replace(':', '_')}.json"
                    scaled = noises[method].scaled(f).to_dict()  # what load_design reads
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(scaled) + "\n")
                    extras[method] = {"noise_design": str(path), "_noise": scaled}
            for method in methods:
                for seed in seeds:
                    extra = dict(extras[method])
                    noise = extra.pop("_noise", None)
                    values = {**base, **extra, **data, "seed": seed}
                    if method in THREAT_FREE:  # their runs are the same against any adversary
                        values["adversary"] = "eavesdropper"
                    # the run's identity: not where the data or the noise file lie
                    key = {"grid": "noise-design-accuracy", **values,
                           "design_scale": scales.get(method)}  # fmt: skip
                    key.pop("data_dir", None)
                    if noise is not None:  # the file's path is not part of the run's identity
                        key["noise_design"] = noise

                    def compute(values: dict[str, Any] = values) -> dict[str, Any]:
                        t0 = time.perf_counter()
                        got = _simulate(values)
                        privacy = got["privacy"]
                        return {
                            "accuracy": float(got["final"]["accuracy"]),
                            "test_loss": float(got["final"]["test_loss"]),
                            "epsilon_accounted": float(privacy["epsilon"]),
                            "label": _label(privacy),
                            "seconds": time.perf_counter() - t0,
                        }

                    got = store.run(key, compute)
                    rows.append({"p": p, "graph": graph, "method": method, "seed": seed,
                                 "adversary": adversary, "dataset": dataset,
                                 "residual_ratio_vs_decor": designed.residual_ratio_vs_decor,
                                 **got})  # fmt: skip
    return {
        "setting": {
            "dataset": dataset,
            "level": spec["level"],
            "adversary": adversary,
            "epsilon": epsilon,
            "delta": delta,
            "horizon": 10,
            "seeds": list(seeds),
            "run": {**common, **run_spec},
        },  # fmt: skip
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "cells_reused": store.kept,
        "train_seconds": sum(r["seconds"] for r in rows),
    }


def _grid_table(rows: list[dict[str, Any]]) -> str:
    methods = [m for m in GRID_METHODS if any(r["method"] == m for r in rows)]
    lines = [
        "| p | graph | " + " | ".join(GRID_NAMES[m] for m in methods) + " |",
        "|---|---|" + "---|" * len(methods),
    ]
    for p in dict.fromkeys(r["p"] for r in rows):
        at = [r for r in rows if r["p"] == p]
        cells = [_cell([r["accuracy"] for r in at if r["method"] == m]) for m in methods]
        lines.append(f"| {p} | {at[0]['graph']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _grid_figure(out: Path, rows: list[dict[str, Any]], name: str, title: str) -> None:
    """The grid's figure ``out / name``: mean +- std per method and p."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    out.mkdir(parents=True, exist_ok=True)
    ps = list(dict.fromkeys(r["p"] for r in rows))
    methods = [m for m in GRID_METHODS if any(r["method"] == m for r in rows)]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for k, method in enumerate(methods):
        acc = [[r["accuracy"] for r in rows if r["p"] == p and r["method"] == method] for p in ps]
        ax.errorbar(
            np.asarray(ps) + 0.012 * (k - (len(methods) - 1) / 2), [np.mean(a) for a in acc],
            yerr=[np.std(a) for a in acc], marker="o", capsize=3, label=GRID_NAMES[method],
        )  # fmt: skip
    ax.set_xlabel("Erdos-Renyi p (n = 20)")
    ax.set_ylabel("test accuracy")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / name, dpi=150)
    plt.close(fig)


def merge_grid(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    *,
    borrowed: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """``new``'s rows over ``old``'s (a run of the same p, method and seed replaces the old one),
    plus ``borrowed`` rows of the threat-model-free methods (:data:`THREAT_FREE`) that neither
    has (a curious grid shows the eavesdropper grid's LDP and CDP runs: the same runs).
    Rows are ordered by p, then method, then seed."""
    rows = {(r["p"], r["method"], r["seed"]): r for r in (old or {}).get("rows", [])}
    rows.update({(r["p"], r["method"], r["seed"]): r for r in new["rows"]})
    taken = []
    for r in borrowed:
        if r["method"] in THREAT_FREE and (r["p"], r["method"], r["seed"]) not in rows:
            rows[(r["p"], r["method"], r["seed"])] = {**r, "borrowed_from": "eavesdropper"}
            taken.append(r["method"])
    order = {m: k for k, m in enumerate(GRID_METHODS)}
    merged = sorted(rows.values(), key=lambda r: (r["p"], order[r["method"]], r["seed"]))
    runs = list((old or {}).get("runs", []))
    if old is not None and not runs:  # a grid written before runs were listed
        runs = [{"seconds": old.get("seconds"), "train_seconds": old.get("train_seconds"),
                 "cells_reused": old.get("cells_reused")}]  # fmt: skip
    runs.append({
        "methods": sorted({r["method"] for r in new["rows"]}), "seconds": new["seconds"],
        "train_seconds": new["train_seconds"], "cells_reused": new["cells_reused"],
    })  # fmt: skip
    return {
        "setting": new["setting"],
        "rows": merged,
        "table": _grid_table(merged),
        "borrowed": sorted(set(taken)),
        "runs": runs,
    }


def _main() -> None:
    """``python -m privdl.experiments.noise_design OUT CELLS [--adversary A] [--methods M,...]
    [--dataset a9a|mnist] [--data-dir DIR]``: the accuracy grid into OUT's summary.json (key
    :func:`grid_key`), report.md (one section per grid) and its figure; rows of methods not run
    are kept from the summary, and a grid against insiders shows the eavesdropper grid's LDP and
    CDP runs where it did not run them (:func:`merge_grid`)."""
    import argparse

    from privdl.records import write_json_atomic

    parser = argparse.ArgumentParser(prog="python -m privdl.experiments.noise_design")
    parser.add_argument("out", type=Path)
    parser.add_argument("cells", type=Path)
    parser.add_argument("--adversary", default="eavesdropper")
    parser.add_argument("--methods", default=None, help="comma-separated (default: all valid)")
    parser.add_argument("--dataset", default="a9a", choices=sorted(ACCURACY))
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    out = args.out
    methods = tuple(args.methods.split(",")) if args.methods else None
    grid = run_accuracy_grid(
        out, cells=args.cells, adversary=args.adversary, methods=methods, dataset=args.dataset,
        data_dir=args.data_dir,
    )  # fmt: skip
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    key = grid_key(args.adversary, args.dataset)
    eavesdropper = summary.get(grid_key("eavesdropper", args.dataset), {})
    borrowed = eavesdropper.get("rows", []) if args.adversary != "eavesdropper" else []
    merged = merge_grid(summary.get(key), grid, borrowed=borrowed)
    merged["figure"] = key + ".png"
    summary[key] = merged
    render_grid_figures(out, summary)
    write_json_atomic(summary_path, summary)
    report_path = out / "report.md"
    report = report_path.read_text() if report_path.exists() else ""
    sections = [_grid_report(summary[k]) for k in sorted(summary) if k.startswith("accuracy_grid")]
    report = report.split(GRID_HEADING)[0].rstrip("\n") + "\n\n" + "\n".join(sections)
    report_path.write_text(report)


def grid_key(adversary: str, dataset: str = "a9a") -> str:
    """The summary key of a grid: ``accuracy_grid`` (a9a, eavesdropper), with ``_<dataset>``
    and ``_<adversary>`` appended for the others."""
    return (
        "accuracy_grid"
        + ("" if dataset == "a9a" else f"_{dataset}")
        + ("" if adversary == "eavesdropper" else f"_{adversary}")
    )


#: how the reports and figures name each grid's dataset and model
GRID_DATASETS = {"a9a": "a9a logistic regression", "mnist": "MNIST MLP 784-128-10"}


def _grid_title(setting: dict[str, Any]) -> str:
    dataset = GRID_DATASETS[setting["dataset"]]
    return (
        f"{dataset}, {setting['level']} level, {setting['adversary']}\n"
        f"equal accounted epsilon = {setting['epsilon']:g} (delta {setting['delta']:g})"
    )


def render_grid_figures(out: Path, summary: dict[str, Any]) -> None:
    """Every grid's figure in ``summary`` (``accuracy_grid*`` keys) into ``out``."""
    for key in sorted(summary):
        if key.startswith("accuracy_grid"):
            grid = summary[key]
            setting = {"dataset": "a9a", "level": "user", **grid["setting"]}
            _grid_figure(out, grid["rows"], grid.get("figure", key + ".png"), _grid_title(setting))


GRID_HEADING = "## Accuracy grid: every method and p"


def _grid_report(grid: dict[str, Any]) -> str:
    s = grid["setting"]
    labels = sorted({r["label"] for r in grid["rows"]})
    whisper = (
        "Whisper's free covariance is drawn by a simulated trusted dealer (Z = L xi over the "
        "nodes' own streams) and accounted against the eavesdropper (label "
        "`eavesdropper+trusted-dealer`)."
        if any(r["method"] == "whisper" for r in grid["rows"])
        else "Whisper's free covariance is not valid against this threat model (it needs a "
        "trusted dealer) and is not trained."
    )
    borrowed = (
        f" The {', '.join(GRID_NAMES[m] for m in grid['borrowed'])} columns are the "
        "eavesdropper grid's runs: their noise and accountant do not depend on the threat model."
        if grid.get("borrowed")
        else ""
    )
    runs = "; ".join(
        f"{', '.join(r.get('methods') or ['first grid'])}: {r['seconds']:.0f} s wall "
        f"({r['train_seconds']:.0f} s training, {r['cells_reused']} runs reused from cells)"
        for r in grid.get("runs", [grid])
    )
    dataset = s.get("dataset", "a9a")
    heading = GRID_HEADING + (
        ""
        if (dataset, s["adversary"]) == ("a9a", "eavesdropper")
        else f" ({dataset}, {s['adversary']})"
    )
    return (
        f"{heading}\n\n{GRID_DATASETS[dataset]}, {s.get('level', 'user')} level, {s['adversary']}, equal accounted "
        f"epsilon = {s['epsilon']} (delta {s['delta']}): the first connected Erdos-Renyi graph "
        "(n = 20) of every p, Metropolis W; test accuracy of the average model, mean ± std over "
        f"training seeds {s['seeds']}. LDP and CDP calibrated by the run, DECOR's pair, the "
        f"design (K = 10) and Whisper scaled until the run's accountant gives the target. "
        f"{whisper}{borrowed} Figure: {grid.get('figure', 'accuracy_grid.png')}.\n\n{grid['table']}\nepsilon: "
        + "; ".join(labels)
        + f"\n\nRun time: {runs}.\n"
    )


if __name__ == "__main__":
    _main()
