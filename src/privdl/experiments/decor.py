"""Reproductions of the DECOR paper (Allouah et al., ICML 2024): Fig 1a/1b/1c, Fig 2, Fig 3.

Presets are data (``privdl/presets/decor-*.toml``, values from the authors' reference code;
docs/reproductions-decor.md). Every run goes through the library (``runner.build``: task,
topology, calibration, :class:`~privdl.algorithms.decor.Decor`/D-SGD, accountant); the loop here
only records the metrics the paper plots.

* ``decor-fig1a`` -- least squares (s.6.1), optimality gap (1/n) sum ||x_i - x*||^2 averaged over
  the last 199 iterates as the code computes it, and L(xbar) - L*; the paper's (sigma_cdp,
  sigma_cor) pairs with their accounted epsilon beside our conservative calibration.
* ``decor-fig1b`` -- logistic regression on the a9a rebuild (s.6.1), gap = train BCE - L*.
* ``decor-fig1c`` -- MNIST MLP, example-level (s.6.2): the paper's budgets (the code's uncomposed
  per-step number, labelled as not a valid guarantee) and correctly accounted budgets.
* ``decor-fig2`` / ``decor-fig3`` -- the accountant curves (App. D.1).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privdl.accounting import account_decor
from privdl.accounting.conversion import step_rdp_for_epsilon
from privdl.algorithms.base import Keys
from privdl.engine.grads import evaluate
from privdl.errors import ConfigError
from privdl.experiments import (
    Reproduction,
    RunCells,
    apply_overrides,
    load_preset,
    write_outputs,
)
from privdl.experiments.figures import LABEL_SIZE, LEGEND_SIZE, wrap_title
from privdl.loop import build_run
from privdl.privacy import decor_pair_for_step_rdp
from privdl.registry import make_config
from privdl.topology import parse_graph

COLOURS = {"cdp": "purple", "decor": "green", "ldp": "orange"}
MARKERS = {"cdp": "D", "decor": "o", "ldp": "^"}
LINESTYLES = {"complete": "-", "torus": "--", "ring": ":"}
#: Each method's (eps, 1e-5) holds under its own threat model (the paper's Fig 1 caption says
#: "SecLDP against an external eavesdropper" for all three, but CDP protects only the final model)
CAPTION = (
    "(eps, 1e-5) per method under its own threat model: DECOR against an external eavesdropper "
    "(SecLDP), LDP against every other node (ldp), CDP against an observer of the final model "
    "only (central; it needs a trusted aggregator)"
)
SHORT_CAPTION = "(eps, 1e-5): DECOR eavesdropper, LDP local, CDP central"


def labels_line(rows: Any) -> str:
    """The labels an 'accounted eps' column shares (its cells add the threat model)."""
    labels = sorted(
        {
            (b["accountant"], b["unit"], b["neighbouring"], b["delta"])
            for r in rows
            if (b := r.get("privacy"))
        }
    )
    if not labels:
        return ""
    return (
        "Accounted eps: "
        + "; ".join(f"delta {d:g}, {u}-level, {n}, accountant {a}" for a, u, n, d in labels)
        + " (the threat model in brackets)."
    )


def accounted_cell(r: dict[str, Any]) -> str:
    """A row's accounted epsilon with its threat model (rows written before session 16: bare)."""
    threat = (r.get("privacy") or {}).get("threat_model")
    return f"{r['epsilon_accounted']:.4g}" + (f" ({threat})" if threat else "")


# --- shared pieces ------------------------------------------------------------------------------


def _preset(name: str, quick: bool, overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The preset's values, its ``[quick]`` table over them when ``quick``, then ``--set`` ones."""
    p = load_preset(name)
    if quick:
        p.update(p.get("quick", {}))
    p = apply_overrides(p, overrides, name=name)
    unknown = [t for t in p.get("topologies", []) if t not in p.get("graphs", {})]
    if unknown:
        raise ConfigError(
            f"{name}: unknown topologies {unknown}; choose from {sorted(p.get('graphs', {}))}"
        )
    if name == "decor-fig1a":  # the paper's sigma_cdp/sigma_cor are listed per grid epsilon
        grid = load_preset(name)["epsilons"]
        off = [e for e in p["epsilons"] if e not in grid]
        if off:
            raise ConfigError(f"{name}: epsilons must come from the paper's grid {grid}; got {off}")
        if p["accountant"] not in ("rdp", "tightest"):
            raise ConfigError(
                f"{name}: accountant must be rdp or tightest, got {p['accountant']!r}"
            )
    return p


def _simulate(values: dict[str, Any], *, window: int = 0, metric=None) -> dict[str, Any]:
    """Build and run one configuration; average ``metric(task, params)`` over the last iterates.

    ``window`` w reproduces the code's ``errors[-w:-1]``: the iterates after steps T-w+1..T-1.
    """
    cfg = make_config(values)
    built = build_run(cfg)
    task, algo = built.task, built.algorithm
    state = algo.init(
        task.init_params(seed=cfg.seed), task.oracle, built.comm, keys=Keys.from_seed(cfg.seed)
    )
    steps = cfg.steps
    sums: dict[str, float] = {}
    count = 0
    while state.t < steps:
        state, _ = algo.step(state, task.oracle, built.comm)
        if window and steps - window < state.t < steps:
            for k, v in metric(task, state.params).items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    out: dict[str, Any] = {k: v / count for k, v in sums.items()} if count else {}
    out["final"] = task.evaluate(state.params)
    out["sigma"] = built.cfg.sigma
    out["sigma_cor"] = built.cfg.sigma_cor
    out["privacy"] = built.privacy(steps) if built.privacy is not None else None
    out["_task"] = task
    out["_params"] = state.params
    return out


def _mean_std(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs, dtype=float)
    return float(a.mean()), float(a.std())


def _plot(
    path: Path,
    series: list[dict[str, Any]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
    logy: bool = True,
) -> None:
    """Fig 1 style: colour by algorithm, line style by topology, +/- 1 std error bars; the title
    wrapped to the figure's width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for s in series:
        ax.errorbar(
            s["x"],
            s["y"],
            yerr=s.get("err"),
            color=COLOURS[s["algorithm"]],
            marker=MARKERS[s["algorithm"]],
            linestyle=LINESTYLES[s["topology"]],
            label=s["label"],
            capsize=2,
            markersize=5,
        )
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    wrap_title(fig, ax, title)  # the Fig 1 caption's labels: two lines where one does not fit
    ax.legend(fontsize=LEGEND_SIZE)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def fig1a_figures(
    out: Path,
    results: dict[str, dict[str, Any]],
    *,
    epsilons: list[float],
    topologies: list[str],
) -> list[Path]:
    """Fig 1a's two figures against eps, our calibration (``results[f"{alg}/{topo}/ours/{eps}"]``):
    ``fig1a.png``, the code's optimality gap, and ``fig1a_loss_gap.png``, the paper's
    training-loss gap L(xbar) - L* of the averaged model. Each point is the seeds' mean with
    +- 1 std error bars (``gap_std``, ``loss_gap_std``)."""
    paths = []
    for metric, name, ylabel, title in (
        ("gap", "fig1a.png", "optimality gap (code's metric)",
         f"Fig 1a least squares\n{SHORT_CAPTION}"),
        ("loss_gap", "fig1a_loss_gap.png", "L(xbar) - L*",
         "Fig 1a, training-loss gap of the averaged model"),
    ):  # fmt: skip
        series = []
        for alg, topo in _methods(topologies):
            pts = [results[f"{alg}/{topo}/ours/{e}"] for e in epsilons]
            series.append(
                dict(
                    algorithm=alg,
                    topology=topo,
                    label=f"{alg.upper()} {topo}",
                    x=epsilons,
                    y=[r[metric] for r in pts],
                    err=[r[metric + "_std"] for r in pts],
                )
            )
        _plot(out / name, series, xlabel="epsilon", ylabel=ylabel, title=title)
        paths.append(out / name)
    return paths


def _methods(topologies: list[str]) -> list[tuple[str, str]]:
    """CDP once (complete graph, W = J), then DECOR and LDP on each topology
    (DECOR Section 6, Fig 1)."""
    return [("cdp", "complete")] + [(a, t) for a in ("decor", "ldp") for t in topologies]


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _checks_md(checks: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"- [{'PASS' if c['pass'] else 'FAIL'}] {c['name']}: {c['detail']}" for c in checks
    )


# --- Fig 1a: least squares ----------------------------------------------------------------------


def _ls_metric(task, params) -> dict[str, float]:
    ev = task.evaluate(params)
    return {"gap": ev["optimality_gap"], "loss_gap": ev["loss_gap"]}


def run_fig1a(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Fig 1a (DECOR s.6.1): optimality gap vs eps for CDP, DECOR and LDP on three topologies.
    Each run is kept as a cell (:class:`RunCells`); ``resume`` reuses the finished ones."""
    p = _preset("decor-fig1a", quick, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = RunCells(out, resume=resume)
    grid = load_preset("decor-fig1a")["epsilons"]
    base = dict(
        task="least-squares",
        steps=p["steps"],
        lr=p["lr"],
        clip=p["clip"],
        clip_mode="batch_mean",
        delta=p["delta"],
        mixing=p["mixing"],
        ls_dim=p["dim"],
        data_seed=p["data_seed"],
        dtype="float64",
        adversary="eavesdropper",
        accountant=p["accountant"],
    )
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for eps in p["epsilons"]:
        k = grid.index(eps)
        for alg, topo in _methods(p["topologies"]):
            variants: list[tuple[str, dict[str, Any]]] = [("ours", {})]
            if alg == "decor":
                paper_s = p["paper"]["sigma_cdp"][topo][k]
                paper_c = p["paper"]["sigma_cor"][topo][k]
                variants = [("ours", {"sigma": paper_s})]
                if p["train_paper_pairs"]:
                    variants.append(("paper", {"sigma": paper_s, "sigma_cor": paper_c}))
            for tag, extra in variants:
                runs = []
                for seed in p["seeds"]:
                    v = dict(base, algorithm=alg, graph=p["graphs"][topo], seed=seed, **extra)
                    if "sigma_cor" not in extra:
                        v["epsilon"] = float(eps)
                    runs.append(
                        cells.run(
                            {"values": v, "window": p["window"], "metric": "least-squares gap"},
                            lambda v=v: _simulate(v, window=p["window"], metric=_ls_metric),
                        )
                    )
                gm, gs = _mean_std([r["gap"] for r in runs])
                lm, ls = _mean_std([r["loss_gap"] for r in runs])
                results[f"{alg}/{topo}/{tag}/{eps}"] = dict(
                    algorithm=alg,
                    topology=topo,
                    variant=tag,
                    epsilon=eps,
                    gap=gm,
                    gap_std=gs,
                    loss_gap=lm,
                    loss_gap_std=ls,
                    sigma=runs[0]["sigma"],
                    sigma_cor=runs[0]["sigma_cor"],
                    epsilon_accounted=runs[0]["privacy"]["epsilon"],
                    privacy=runs[0]["privacy"],
                )
    wall = time.perf_counter() - t0
    # the paper's pairs, accounted by our SecRDP accountant (cheap; also in --quick)
    paper_rows = []
    for topo in p["topologies"]:
        g = parse_graph(p["graphs"][topo]).graph
        for eps in p["epsilons"]:
            k = grid.index(eps)
            s, c = p["paper"]["sigma_cdp"][topo][k], p["paper"]["sigma_cor"][topo][k]
            acc = account_decor(  # under the runs' accountant (rdp: the classic conversion)
                g, sigma_cdp=s, sigma_cor=c, clip=p["clip"], steps=p["steps"], delta=p["delta"],
                conversion="classic" if p["accountant"] == "rdp" else None,
            )  # fmt: skip
            classic = account_decor(  # the reference code's conversion (ACC-1): its listed totals
                g, sigma_cdp=s, sigma_cor=c, clip=p["clip"], steps=p["steps"], delta=p["delta"],
                conversion="classic",
            )  # fmt: skip
            ours = results.get(f"decor/{topo}/ours/{eps}", {})
            paper_rows.append(
                dict(
                    topology=topo,
                    epsilon=eps,
                    sigma_cdp=s,
                    sigma_cor_paper=c,
                    epsilon_paper_pair=acc.epsilon,
                    epsilon_paper_pair_classic=classic.epsilon,
                    privacy=acc.budget.to_dict(),  # the pair's eps with its label
                    epsilon_spec=p["paper"]["epsilon_achieved"][topo][k],
                    sigma_cor_ours=ours.get("sigma_cor"),
                    gap_paper=p["paper"]["gap"][topo][k],
                    gap_ours=ours.get("gap"),
                    gap_paper_pair=results.get(f"decor/{topo}/paper/{eps}", {}).get("gap"),
                )
            )
    checks = []
    ck = p["checks"]
    for eps in p["epsilons"]:
        if eps > ck["eps_max"]:
            continue
        cdp = results[f"cdp/complete/ours/{eps}"]["gap"]
        for topo in ("torus", "ring"):
            if topo not in p["topologies"]:
                continue
            dec = results[f"decor/{topo}/ours/{eps}"]["gap"]
            ldp = results[f"ldp/{topo}/ours/{eps}"]["gap"]
            checks.append(
                dict(
                    name=f"eps={eps} {topo}: DECOR/CDP <= {ck['decor_over_cdp_max']}",
                    pass_=dec / cdp <= ck["decor_over_cdp_max"],
                    detail=f"DECOR {dec:.4g}, CDP {cdp:.4g}, ratio {dec / cdp:.3g}",
                )
            )
            checks.append(
                dict(
                    name=f"eps={eps} {topo}: LDP/DECOR >= {ck['ldp_over_decor_min']}",
                    pass_=ldp / dec >= ck["ldp_over_decor_min"],
                    detail=f"LDP {ldp:.4g}, DECOR {dec:.4g}, ratio {ldp / dec:.3g}",
                )
            )
    for row in paper_rows:
        checks.append(
            dict(
                name=f"paper pair {row['topology']} eps={row['epsilon']}: ours = the code's value",
                pass_=abs(row["epsilon_paper_pair_classic"] - row["epsilon_spec"])
                <= 0.01 + 0.01 * row["epsilon_spec"],
                detail=f"ours (classic conversion, as the code) {row['epsilon_paper_pair_classic']:.4g}"
                f" vs code {row['epsilon_spec']}",
            )
        )
    checks = [
        {
            "name": c["name"],
            "pass": bool(c["pass_"]),
            "detail": c["detail"],
            "kind": "accounting" if c["name"].startswith("paper pair") else "utility",
        }
        for c in checks
    ]
    fig1a_figures(out, results, epsilons=p["epsilons"], topologies=p["topologies"])
    head = ["method", "eps", "sigma", "sigma_cor", "accounted eps", "gap (code)", "L(xbar)-L*"]
    rows = [
        [
            f"{r['algorithm']} {r['topology']} ({r['variant']})",
            str(r["epsilon"]),
            f"{r['sigma']:.4g}",
            f"{r['sigma_cor']:.4g}",
            accounted_cell(r),
            f"{r['gap']:.4g} +/- {r['gap_std']:.2g}",
            f"{r['loss_gap']:.4g}",
        ]
        for r in results.values()
    ]
    prow = [
        [
            r["topology"],
            str(r["epsilon"]),
            f"{r['sigma_cdp']:.4g}",
            f"{r['sigma_cor_paper']:.4g}",
            f"{r['epsilon_paper_pair']:.4g} (classic {r['epsilon_paper_pair_classic']:.4g}, "
            f"code {r['epsilon_spec']})",
            "-" if r["sigma_cor_ours"] is None else f"{r['sigma_cor_ours']:.4g}",
            f"{r['gap_paper']:.4g}",
            "-" if r["gap_ours"] is None else f"{r['gap_ours']:.4g}",
            "-" if r["gap_paper_pair"] is None else f"{r['gap_paper_pair']:.4g}",
        ]
        for r in paper_rows
    ]
    md = "\n\n".join(
        [
            f"# decor-fig1a: least squares (DECOR Fig 1a){' -- quick' if quick else ''}",
            f"{CAPTION}; n = 16, d = {p['dim']}, T = {p['steps']}, eta = {p['lr']}, C = {p['clip']}, "
            f"seeds {p['seeds']}, W = 1/(deg+1). Gap = (1/n) sum_i ||x_i - x*||^2 averaged over the "
            "last 199 iterates (the code's metric); L(xbar) - L* is also recorded (the paper's "
            "'training loss'). Our calibration keeps the paper's sigma_cdp and re-solves sigma_cor "
            "conservatively (accounted eps <= target).",
            "![fig1a](fig1a.png)",
            "## Runs",
            _table(head, rows),
            labels_line(results.values()),
            "## The paper's (sigma_cdp, sigma_cor) pairs vs ours",
            (
                "Under the classic conversion the reference code uses (ACC-1; its listed totals "
                "in brackets) the paper's pairs overshoot their nominal eps (code tolerance 1e-4 "
                "absolute per step); "
                + (
                    "under this report's accountant they overshoot too. "
                    if any(r["epsilon_paper_pair"] > r["epsilon"] for r in paper_rows)
                    else "under this report's accountant they stay within it. "
                )
            )
            + "'eps target' is the paper's NOMINAL figure for its pair; "
            + labels_line(paper_rows)
            .replace("Accounted eps", "the accounted eps of the pair")
            .replace(" (the threat model in brackets).", ", eavesdropper."),
            _table(
                [
                    "topology",
                    "eps target",
                    "sigma_cdp",
                    "sigma_cor paper",
                    "accounted eps of paper pair",
                    "sigma_cor ours",
                    "gap paper (tuning run)",
                    "gap ours",
                    "gap with paper pair",
                ],
                prow,
            ),
            "Expected (DECOR s.6.1, Fig 1a): CDP <= DECOR-complete <= DECOR-torus <= DECOR-ring << "
            "LDP; LDP about 20-150x CDP.",
            "## Checks",
            _checks_md(checks),
            f"Run time: {wall:.0f} s"
            + (f" ({cells.kept} runs kept from an earlier run, --resume)." if cells.kept else "."),
        ]
    )
    summary = {
        "reproduction": "decor-fig1a",
        "quick": quick,
        "results": list(results.values()),
        "paper_pairs": paper_rows,
        "checks": checks,
        "wall_s": wall,
        "cells_kept": cells.kept,
    }
    return write_outputs(out, report_md=md, summary=summary)


# --- Fig 1b: a9a --------------------------------------------------------------------------------


def _pick(table: list[list[float]], eps: float) -> tuple[float, float]:
    for eps_max, lr, clip in table:
        if eps <= eps_max:
            return float(lr), float(clip)
    raise ValueError(f"no hyper-parameters for eps={eps}")


def a9a_optimum(task) -> float:
    """Non-private L* of the a9a logistic regression (mean BCE, with bias) on the full train split.

    Full-batch L-BFGS in float64 (the paper's L* = 0.3236 is for the authors' split: recomputed for
    ours).
    """
    x = task.dataset.x_train.double()
    y = task.dataset.y_train.double()
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=300,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y))


def _full_train_loss(task, params) -> float:
    avg = {k: v.mean(dim=0) for k, v in params.items()}
    x = task.dataset.x_train.to(next(iter(avg.values())).dtype)
    loss, _ = evaluate(task.model, avg, x, task.dataset.y_train, loss=task.loss_name)
    return float(loss[0])


def _decor_grid_pair(graph, *, eps, steps, delta, clip, n, points, cor_max_factor):
    """The authors' reference code's a9a rule: smallest sigma_cdp in
    linspace(sigma_cdp^CDP, sigma_ldp, 50) with a sigma_cor
    (conservative, <= 10 sigma_ldp as in the code's search range)."""
    rho = step_rdp_for_epsilon(eps, steps=steps, delta=delta)
    s_ldp = clip * math.sqrt(2.0 / rho)
    grid = np.linspace(s_ldp / math.sqrt(n), s_ldp, points)[1:]
    return decor_pair_for_step_rdp(
        graph, step_rdp=rho, clip=clip, sigma_cdp_grid=grid, sigma_cor_max=cor_max_factor * s_ldp
    )


class _GapRuns:
    """Fig 1b's runs as cells: each run's gap ``BCE(xbar) - L*`` on the full training set, with
    ``L*`` (:func:`a9a_optimum`, computed once, by the first run trained here, or read back
    from a kept cell) kept beside it."""

    def __init__(self, cells: RunCells) -> None:
        self.cells = cells
        self.l_star: float | None = None

    def run(self, v: dict[str, Any], *, metric: str) -> dict[str, Any]:
        key = {"values": {k: x for k, x in v.items() if k != "data_dir"}, "metric": metric}
        r = self.cells.run(key, lambda: self._gap(v))
        if self.l_star is None:
            self.l_star = float(r["l_star"])
        return r

    def _gap(self, v: dict[str, Any]) -> dict[str, Any]:
        r = _simulate(v)
        if self.l_star is None:
            self.l_star = a9a_optimum(r["_task"])
        r["gap"] = _full_train_loss(r["_task"], r["_params"]) - self.l_star
        r["l_star"] = self.l_star
        return r


def _add_noise_free_floors(
    results: dict[str, dict[str, Any]],
    p: dict[str, Any],
    base: dict[str, Any],
    *,
    gaps: _GapRuns,
) -> None:
    """Each result's noise-free gap: D-SGD on its graph with its (lr, C) and no noise.

    The gap a method can reach with the code's step size and clipping alone, whatever the noise;
    ``gap - floor_gap`` is what the noise costs. CDP's graph is the complete one with W = J, so
    its floor is also DECOR-complete's at the same (lr, C). One run per (graph, lr, C, seed).
    """
    floors: dict[tuple[str, float, float], tuple[float, float]] = {}
    for r in results.values():
        graph = p["graphs"][r["topology"]]  # CDP's topology is "complete" (W = J)
        key = (graph, r["lr"], r["clip"])
        if key not in floors:
            floor: list[float] = []
            for seed in p["seeds"]:
                v = dict(
                    non_private(base), algorithm="dsgd", graph=graph, seed=seed, lr=r["lr"],
                    clip=r["clip"],
                )  # fmt: skip
                # a cell, its gap to the same L* as the private runs'
                floor.append(gaps.run(v, metric="a9a BCE gap, noise-free floor")["gap"])
            floors[key] = _mean_std(floor)
        r["floor_gap"], r["floor_gap_std"] = floors[key]


def non_private(values: dict[str, Any]) -> dict[str, Any]:
    """Run settings without a privacy target (a noise-free D-SGD run refuses one)."""
    return {k: v for k, v in values.items() if k not in ("epsilon", "delta")}


def run_fig1b(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Fig 1b (DECOR Section 6.1): a9a logistic regression, gap = train BCE(xbar) - L* vs eps.
    Each run (and each noise-free floor run) is kept as a cell (:class:`RunCells`, with its gap
    and L*); ``resume`` reuses the finished ones."""
    p = _preset("decor-fig1b", quick, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = RunCells(out, resume=resume)
    base = dict(
        task="a9a",
        steps=p["steps"],
        batch_size=p["batch_size"],
        lr_decay=p["lr_decay"],
        weight_decay=p["weight_decay"],
        partition=p["partition"],
        mixing=p["mixing"],
        delta=p["delta"],
        data_seed=p["data_seed"],
        clip_mode="batch_mean",
        sampling="without_replacement",
        data_dir=data_dir,
        eval_every=10**9,
    )
    results: dict[str, dict[str, Any]] = {}
    l_star = None
    t0 = time.perf_counter()
    gaps = _GapRuns(cells)
    for eps in p["epsilons"]:
        for alg, topo in _methods(p["topologies"]):
            key = alg if alg != "decor" else f"decor_{topo}"
            lr, clip = _pick(p["hyper"][key], eps)
            extra: dict[str, Any] = {"epsilon": float(eps)}
            if alg == "decor":
                g = parse_graph(p["graphs"][topo])
                s, c = _decor_grid_pair(
                    g.graph,
                    eps=eps,
                    steps=p["steps"],
                    delta=p["delta"],
                    clip=clip,
                    n=g.n,
                    points=p["sigma_cdp_grid_points"],
                    cor_max_factor=p["sigma_cor_max_factor"],
                )
                extra = {"sigma": s, "sigma_cor": c}
            runs = []
            for seed in p["seeds"]:
                v = dict(
                    base,
                    algorithm=alg,
                    graph=p["graphs"][topo],
                    seed=seed,
                    lr=lr,
                    clip=clip,
                    **extra,
                )
                r = gaps.run(v, metric="a9a BCE gap")
                l_star = r["l_star"]
                runs.append(r)
            gm, gs = _mean_std([r["gap"] for r in runs])
            am, asd = _mean_std([r["final"]["accuracy"] for r in runs])
            results[f"{alg}/{topo}/{eps}"] = dict(
                algorithm=alg,
                topology=topo,
                epsilon=eps,
                lr=lr,
                clip=clip,
                gap=gm,
                gap_std=gs,
                accuracy=am,
                accuracy_std=asd,
                sigma=runs[0]["sigma"],
                sigma_cor=runs[0]["sigma_cor"],
                epsilon_accounted=runs[0]["privacy"]["epsilon"],
                privacy=runs[0]["privacy"],
            )
    if p["noise_free_floor"]:
        # l_star is set by the first run (and unused when nothing ran)
        _add_noise_free_floors(results, p, base, gaps=gaps)
    wall = time.perf_counter() - t0
    checks = []
    tol = p["checks"]["cdp_over_decor_max"]
    for eps in p["epsilons"]:
        cdp = results[f"cdp/complete/{eps}"]
        for topo in p["topologies"]:
            dec, ldp = results[f"decor/{topo}/{eps}"], results[f"ldp/{topo}/{eps}"]
            checks.append(
                dict(
                    name=f"eps={eps} {topo}: CDP >= DECOR (gap, factor {tol})",
                    **{"pass": cdp["gap"] <= tol * dec["gap"], "kind": "utility"},
                    detail=f"CDP {cdp['gap']:.4g}, DECOR {dec['gap']:.4g}",
                )
            )
            checks.append(
                dict(
                    name=f"eps={eps} {topo}: DECOR > LDP (gap)",
                    **{"pass": dec["gap"] < ldp["gap"], "kind": "utility"},
                    detail=f"DECOR {dec['gap']:.4g}, LDP {ldp['gap']:.4g}",
                )
            )
        for r in [x for x in results.values() if x["epsilon"] == eps]:
            checks.append(
                dict(
                    name=f"eps={eps} {r['algorithm']} {r['topology']}: accounted <= eps",
                    **{"pass": r["epsilon_accounted"] <= eps * (1 + 1e-6), "kind": "accounting"},
                    detail=f"{r['epsilon_accounted']:.5g}",
                )
            )
    series = []
    for alg, topo in _methods(p["topologies"]):
        pts = [results[f"{alg}/{topo}/{e}"] for e in p["epsilons"]]
        series.append(
            dict(
                algorithm=alg,
                topology=topo,
                label=f"{alg.upper()} {topo}",
                x=p["epsilons"],
                y=[max(r["gap"], 1e-8) for r in pts],
                err=[r["gap_std"] for r in pts],
            )
        )
    _plot(
        out / "fig1b.png",
        series,
        xlabel="epsilon",
        ylabel="train BCE(xbar) - L*",
        title=f"Fig 1b a9a (rebuild)\n{SHORT_CAPTION}",
    )
    rows = [
        [
            f"{r['algorithm']} {r['topology']}",
            str(r["epsilon"]),
            f"{r['lr']}/{r['clip']}",
            f"{r['sigma']:.4g}",
            f"{r['sigma_cor']:.4g}",
            accounted_cell(r),
            f"{r['gap']:.4g} +/- {r['gap_std']:.2g}",
            f"{r['floor_gap']:.4g}" if "floor_gap" in r else "-",
            f"{r['accuracy']:.4f}",
        ]
        for r in results.values()
    ]
    md = "\n\n".join(
        [
            f"# decor-fig1b: a9a logistic regression (DECOR Fig 1b){' -- quick' if quick else ''}",
            f"{CAPTION}; user-level, n = 16, T = {p['steps']}, batch {p['batch_size']}, "
            f"lr0/(1 + t/{p['lr_decay']:g}), weight decay {p['weight_decay']}, Dirichlet(10) split "
            f"(disjoint), seeds {p['seeds']}. a9a is rebuilt from UCI Adult (not the byte-identical "
            f"LIBSVM file). L* = {l_star:.4f} for our split (paper: {p['paper_l_star']} for theirs).",
            "![fig1b](fig1b.png)",
            _table(
                [
                    "method",
                    "eps",
                    "lr/C",
                    "sigma",
                    "sigma_cor",
                    "accounted eps",
                    "gap",
                    "noise-free gap",
                    "test acc",
                ],
                rows,
            ),
            labels_line(results.values()),
            "Expected (paper): DECOR closely matches CDP on all topologies and budgets, about an "
            "order of magnitude better than LDP.",
            "*Noise-free gap*: D-SGD on the same graph with the same (lr, C) and no noise (preset "
            "key `noise_free_floor`). On this convex task the noise does not lower the gap "
            "beyond seed spread, so the ratio of two methods' gaps is bounded by what their "
            "(lr, C) allow; gap - noise-free gap is what the noise costs.",
            "## Checks",
            _checks_md(checks),
            f"Run time: {wall:.0f} s.",
        ]
    )
    summary = {
        "reproduction": "decor-fig1b",
        "quick": quick,
        "l_star": l_star,
        "paper_l_star": p["paper_l_star"],
        "results": list(results.values()),
        "checks": checks,
        "wall_s": wall,
    }
    return write_outputs(out, report_md=md, summary=summary)


REPRODUCTIONS = [
    Reproduction(
        name="decor-fig1a",
        paper="DECOR (ICML'24)",
        description="least squares: optimality gap vs eps, CDP/DECOR/LDP, 3 topologies",
        run=run_fig1a,
        full_runtime="measured 25 min on 2 CPU cores (400 runs of T = 3500)",
    ),
    Reproduction(
        name="decor-fig1b",
        paper="DECOR (ICML'24)",
        description="a9a (rebuild) logistic regression: BCE gap vs eps, user level",
        run=run_fig1b,
        full_runtime="measured 23-33 min per seed on 2 CPU cores (63 runs of T = 5000), plus "
        "about a quarter for the noise-free floors; the preset's 4 seeds: 2-2.5 h",
    ),
]
