"""PrivSGP-VR reproductions (Zhu et al.): MNIST two-layer network (Appendix E, Figs 6-10)
and ResNet-18 on CIFAR-10 (Section 5.1, Figs 2 and 4; synthetic stand-in in quick mode).

Presets: ``privdl/presets/privsgp-*.toml`` (a ``[quick]`` and a ``[full]`` table each).
Evaluation (the paper does not state it; docs/privsgp-vr.md): training loss and test accuracy of
``xbar = mean_i x_i`` (equal to the w-weighted mean of the z_i) on a fixed train subset and the
test split.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from privdl.accounting import privsgp_optimal_steps, privsgp_plan
from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.nominal import nominal_ldp_budget, privsgp_accounted_sigma, privsgp_vr_budget
from privdl.algorithms.base import Keys, StepSize
from privdl.algorithms.dp2sgd import DP2SGD, ring_matching
from privdl.algorithms.privsgp import (
    ModelSamples,
    PrivSGP,
    describe_table,
    noise_plan,
    optimal_steps,
    rdp_noise_multiplier,
)
from privdl.comm.local import LocalCommunicator
from privdl.data import load_dataset
from privdl.engine.grads import evaluate
from privdl.engine.threads import one_thread
from privdl.errors import ConfigError
from privdl.experiments import (
    Reproduction,
    RunCells,
    apply_overrides,
    load_preset,
    write_outputs,
)
from privdl.experiments.figures import (
    LABEL_SIZE,
    LEGEND_SIZE,
    TITLE_SIZE,
    legend_outside,
    wrap_title,
)
from privdl.experiments.seeds import mean_curve, mean_std, pm
from privdl.models import build_model
from privdl.topology import mixing_matrix, ring
from privdl.topology.timevarying import ExponentialGraph

PAPER = "Zhu et al., PrivSGP-VR: Differentially Private Variance-Reduced Stochastic Gradient Push"


# --------------------------------------------------------------------------- shared pieces
def _single_threaded(fn):
    """Run with one intra-op thread (restored after) on the CPU: the per-step kernels here are
    small and a shared 2-core machine loses ~50x to thread contention otherwise (measured). On a
    GPU the CPU threads are left alone (the noise keystream may be made on the CPU)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if str(kwargs.get("device", "cpu")) != "cpu":
            return fn(*args, **kwargs)
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper


def _setup(
    cfg: dict,
    n: int,
    *,
    data_dir: str | None,
    dataset: str = "mnist",
    seed: int = 0,
    device: str | torch.device = "cpu",
):
    """Load, subsample and split the data IID over ``n`` nodes (floor and drop, docs/privsgp-vr.md);
    the node-stacked data and the evaluation sets are moved to ``device``."""
    kw = {"n_train": cfg["n_train"], "n_test": cfg["n_test"]} if "synthetic" in dataset else {}
    ds = load_dataset(dataset, data_dir=data_dir, seed=seed, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    perm = torch.randperm(ds.x_train.shape[0], generator=g)[: cfg["n_train"]]
    j = cfg["n_train"] // n
    x = ds.x_train[perm[: n * j]].reshape(n, j, *ds.x_train.shape[1:])
    y = ds.y_train[perm[: n * j]].reshape(n, j)
    if "width" in cfg:
        model = build_model(
            "resnet18-gn", in_shape=tuple(ds.input_shape), n_classes=10, width=cfg["width"]
        )
    else:
        model = build_model(
            "mlp", in_shape=tuple(ds.input_shape), n_classes=10, hidden=(cfg["hidden"],)
        )
    test = (ds.x_test[: cfg["n_test"]].to(device), ds.y_test[: cfg["n_test"]].to(device))
    train = (
        ds.x_train[perm[: cfg["n_test"]]].to(device),
        ds.y_train[perm[: cfg["n_test"]]].to(device),
    )
    return model, x.to(device), y.to(device), train, test


def _eval(model, params: dict, train, test) -> dict[str, float]:
    avg = {k: v.mean(0, keepdim=True) for k, v in params.items()}
    tr_loss, _ = evaluate(model, avg, *train, loss="cross_entropy")
    _, te_acc = evaluate(model, avg, *test, loss="cross_entropy")
    return {"loss": float(tr_loss[0]), "accuracy": float(te_acc[0])}


def _run(
    alg,
    model,
    x,
    y,
    train,
    test,
    comm,
    *,
    steps: int,
    cfg: dict,
    eval_points: int,
    seed: int = 0,
    label: str = "",
    deadline: float | None = None,
    progress: bool = False,
    on_eval=None,
    t_origin: float | None = None,
) -> dict[str, Any]:
    """Train ``steps`` iterations; evaluate ``eval_points`` times along the way.

    The parameters are initialised from a CPU generator and moved to the data's device (the same
    ``x^0`` on every device). ``deadline`` (a ``time.time()`` value): stop after the first step
    past it and evaluate there (``stopped_early`` in the result). ``progress``: one line per
    evaluation on stderr with the time elapsed since ``t_origin`` (default: this call).
    ``on_eval(partial_result)`` after each evaluation.
    """
    t0 = time.time()
    clock = t0 if t_origin is None else t_origin
    oracle = ModelSamples(model, x, y, block_size=cfg["block_size"], clip=cfg["clip"])
    params = model.init(
        n_nodes=x.shape[0], generator=torch.Generator().manual_seed(seed), device=x.device
    )
    vr = getattr(alg, "variance_reduction", False)
    table = describe_table(oracle) if vr else "none"
    if progress:
        _say(f"{label}: init (SAGA table: {table})", clock)
    state = alg.init(params, oracle, comm, keys=Keys.from_seed(seed))
    marks = sorted({max(1, round(steps * (i + 1) / eval_points)) for i in range(eval_points)})
    curve = [{"k": 0, **_eval(model, params, train, test)}]
    init_s = time.time() - t0
    out: dict[str, Any] = {"curve": curve, "final": curve[-1], "table": table}
    out.update(steps_planned=steps, steps_done=0, stopped_early=False, init_s=round(init_s, 2))
    for k in range(steps):
        state, _ = alg.step(state, oracle, comm)
        late = deadline is not None and time.time() > deadline and k + 1 < steps
        if k + 1 in marks or late:
            curve.append({"k": k + 1, **_eval(model, state.params, train, test)})
            out.update(final=curve[-1], steps_done=k + 1, stopped_early=late)
            out["train_s"] = round(time.time() - t0 - init_s, 2)
            if progress:
                p = curve[-1]
                _say(
                    f"{label}: k={k + 1}/{steps} loss={p['loss']:.4f} acc={p['accuracy']:.4f}",
                    clock,
                )
            if on_eval is not None:
                on_eval(out)
            if late:
                if progress:
                    _say(f"{label}: time limit reached, stopping at k={k + 1} of {steps}", clock)
                break
    return out


def _say(msg: str, t0: float) -> None:
    print(f"[privsgp {time.time() - t0:8.1f}s] {msg}", file=sys.stderr, flush=True)


def _plot(path: Path, series: list[dict], *, xlabel: str, ylabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for s in series:
        (line,) = ax.plot(s["x"], s["y"], marker="o", markersize=3, label=s["label"])
        if s.get("std") is not None:  # mean +- std over the seeds, as a band
            y, sd = np.asarray(s["y"], dtype=float), np.asarray(s["std"], dtype=float)
            ax.fill_between(s["x"], y - sd, y + sd, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    wrap_title(fig, ax, title, fontsize=TITLE_SIZE + 1)
    ax.legend(fontsize=LEGEND_SIZE)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _seed_std(curves: list[list[dict[str, float]]], metric: str) -> list[float] | None:
    """The sample std over seeds (ddof 1) of ``metric`` at each point of the curves; None for
    one seed (no band to draw)."""
    if len(curves) < 2:
        return None
    return np.std([[p[metric] for p in c] for c in curves], axis=0, ddof=1).tolist()


def _cfg(name: str, quick: bool, overrides: dict[str, str] | None = None) -> tuple[dict, dict]:
    """The preset's top-level values and its ``[quick]``/``[full]`` table, with ``--set``
    overrides (``KEY=VALUE`` strings parsed as the preset value's type; unknown keys refused)."""
    preset = load_preset(name)
    cfg = dict(preset["quick" if quick else "full"])
    top = {k: v for k, v in preset.items() if k not in ("quick", "full")}
    merged = apply_overrides({**top, **cfg}, overrides, name=name)  # the mode's table wins
    cfg = {k: merged[k] for k in cfg}
    top = {k: top[k] if k in cfg else merged[k] for k in top}
    _check_values(merged, name=name)
    return top, cfg


#: Preset values that may be 0 (constants of the analysis, noise levels, "no time limit").
_MAY_BE_ZERO = {"time_limit_s", "sigma2", "sigma2_at_kstar", "f0", "x0_sq", "b2"}


def _check_values(values: dict[str, Any], *, name: str) -> None:
    """Every number of a PrivSGP preset (after ``--set``) is finite and positive (``n``: at
    least 2 nodes; ``delta`` in (0, 1); :data:`_MAY_BE_ZERO` may be 0), lists are not empty:
    one line for what would otherwise be a ZeroDivisionError or a silently wrong report."""
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            raise ConfigError(f"{name}: {key} needs at least one value")
        for v in items:
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            low = 2 if key == "n" else 0
            ok = math.isfinite(v) and (
                0 < v < 1 if key == "delta" else v >= low if key in _MAY_BE_ZERO or low else v > 0
            )
            if not ok:
                need = {"delta": "in (0, 1)", "n": "at least 2"}.get(
                    key, ">= 0" if key in _MAY_BE_ZERO else "> 0"
                )
                raise ConfigError(f"{name}: {key} must be {need} and finite, got {v}")


def _check_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device}: CUDA is not available on this machine")
    return dev


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _report(title: str, intro: str, body: list[str], checks: dict[str, bool]) -> str:
    lines = [f"# {title}", "", intro, "", *body, "", "## Checks", ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in checks.items()]
    return "\n".join(lines) + "\n"


def _finish(
    out_dir: Path,
    name: str,
    title: str,
    *,
    quick: bool,
    body: list[str],
    checks: dict[str, bool],
    results: dict,
    t0: float,
    **extra: Any,
) -> dict[str, Any]:
    """Write report.md and summary.json (with ``extra`` summary fields) for reproduction ``name``."""
    summary = {**_summary(name, quick, checks, results, t0), **extra}
    intro = f"Preset {name} ({'quick' if quick else 'full'})."
    return write_outputs(out_dir, report_md=_report(title, intro, body, checks), summary=summary)


def _summary(name: str, quick: bool, checks: dict[str, bool], results: dict, t0: float) -> dict:
    return {
        "reproduction": name,
        "paper": PAPER,
        "quick": quick,
        "checks": checks,
        "passed": all(checks.values()),
        "results": results,
        "runtime_s": round(time.time() - t0, 1),
    }


# --------------------------------------------------------------------------- Fig 6: speedup
@_single_threaded
def run_speedup(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Linear speedup: with 2n nodes, K/2 iterations reach about the loss of n nodes at K.
    Every (n, seed) run is a cell under ``out_dir/cells``; ``resume`` keeps the finished ones."""
    t0 = time.time()
    top, cfg = _cfg("privsgp-mnist-speedup", quick, overrides)
    dev = _check_device(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = RunCells(out_dir, resume=resume)
    key = _cell_key("privsgp-mnist-speedup", top, cfg, quick=quick, device=dev)

    results = {}
    for n in cfg["n"]:
        k = round(cfg["k_base"] * cfg["n"][0] / n)
        gamma = top["c_gamma"] * math.sqrt(n / k)
        model, x, y, train, test = _setup(cfg, n, data_dir=data_dir, device=dev)
        alg = PrivSGP(StepSize(gamma), sigmas=math.sqrt(top["sigma2"]))
        comm = LocalCommunicator(ExponentialGraph(n), dtype=torch.float32, device=dev)
        runs = _over_seeds(
            alg, model, x, y, train, test, comm, steps=k, cfg=cfg, cells=cells, key={**key, "n": n}
        )
        # The checks use the loss averaged over seeds: one short run is dominated by its noise
        # draw (sigma = 0.1 on each of ~25k coordinates), not by n.
        loss_curve = [
            {"k": point["k"], "loss": sum(r["curve"][i]["loss"] for r in runs) / len(runs)}
            for i, point in enumerate(runs[0]["curve"])
        ]
        results[str(n)] = {
            "K": k,
            "gamma": gamma,
            **runs[0],
            "seeds": len(runs),
            "final_loss_per_seed": [r["final"]["loss"] for r in runs],
            "final_accuracy_mean": sum(r["final"]["accuracy"] for r in runs) / len(runs),
            "mean_curve": loss_curve,
            "final_loss_std": mean_std([r["final"]["loss"] for r in runs])[1],
            "curve_per_seed": [r["curve"] for r in runs],
            "train_s_per_seed": [r.get("train_s") for r in runs],
        }
    ns = [str(n) for n in cfg["n"]]
    series = [
        {
            "label": f"n={n}, K={results[n]['K']}",
            "x": [p["k"] * int(n) for p in results[n]["mean_curve"]],
            "y": [p["loss"] for p in results[n]["mean_curve"]],
            "std": _seed_std(results[n]["curve_per_seed"], "loss"),
        }
        for n in ns
    ]
    _plot(
        out_dir / "speedup_loss.png",
        series,
        xlabel="iterations x n",
        ylabel="training loss",
        title="Fig 6: linear speedup (sigma^2 = 0.01)"
        + (f", mean +- std over {len(runs)} seeds" if len(runs) > 1 else ""),
    )
    finals = [results[n]["mean_curve"][-1]["loss"] for n in ns]
    init = results[ns[0]]["mean_curve"][0]["loss"]
    half = {n: results[n]["mean_curve"][len(results[n]["mean_curve"]) // 2]["loss"] for n in ns}
    checks = {
        "every n reaches about the same final loss at K_n = K_base n_base / n (within 25%)": max(
            finals
        )
        <= 1.25 * min(finals),
        "training progresses (final loss < 60% of the initial loss) for every n": all(
            f < 0.6 * init for f in finals
        ),
        "2n nodes beat n nodes at equal iterations (K/2)": all(
            results[b]["mean_curve"][-1]["loss"] < half[a] * 1.05
            for a, b in zip(ns, ns[1:], strict=False)
        ),
    }
    rows = [
        [
            n,
            results[n]["K"],
            f"{results[n]['gamma']:.3f}",
            pm(results[n]["mean_curve"][-1]["loss"], results[n]["final_loss_std"]),
            " / ".join(f"{v:.3f}" for v in results[n]["final_loss_per_seed"]),
            f"{results[n]['final_accuracy_mean']:.4f}",
        ]
        for n in ns
    ]
    body = [
        "Paper (Fig. 6): with sigma_i^2 = 0.01, n in {25, 50, 100}, curves line up against "
        "iterations x n (doubling n halves the iterations). No numbers are given in the text.",
        f"Losses are means over {results[ns[0]]['seeds']} seed(s) (model, sampling and noise).",
        "",
        _table(
            ["n", "K", "gamma = sqrt(n/K)", "final loss", "per seed", "test accuracy"],
            rows,
        ),
        "",
        f"SAGA table: {results[ns[-1]]['table']}",
        "",
        "![speedup](speedup_loss.png)",
    ]
    return _finish(
        out_dir,
        "privsgp-mnist-speedup",
        "PrivSGP-VR linear speedup (MNIST, Fig. 6)",
        quick=quick,
        body=body,
        checks=checks,
        results=results,
        t0=t0,
    )


# --------------------------------------------------------------------------- Figs 7-8 pieces
_BUDGET_HEADER = [
    "sigma (nominal)",
    "sigma (Poisson approx., same eps)",
    "sigma (certified, same eps)",
    "eps accounted (run's sigma)",
    "gamma",
    "final loss",
    "test accuracy",
]


def _budget_run(
    k: int,
    sigma: float,
    eps: float,
    data: tuple,
    *,
    top: dict,
    cfg: dict,
    j_b: int,
    cells: RunCells | None = None,
    key: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """PrivSGP-VR for ``K = k`` steps at noise ``sigma`` with Theorem 1's gamma = c sqrt(n/K),
    and two noise levels for the same K at (eps, delta): the paper-style approximation
    (sensitivity 3G, G = clip, Poisson rate 1/J_b, add/remove; docs/privsgp-vr.md, not certified:
    the SAGA mean touches every sample) and the certified one ``privdl run privsgp-vr`` calibrates
    to (no amplification, replace-one sensitivity (4 - 2/J_b) G / B, privdl.privacy).

    The run is repeated on seeds ``0 .. cfg["seeds"] - 1`` (x^0, samples and noise; one seed
    when the preset has no ``seeds``), each kept as a cell of ``cells`` under ``key`` plus its
    K, sigma and seed. With several seeds ``final`` and ``curve`` are the seeds' means, with
    ``final_std``, ``curve_std`` and every seed's curve (``curve_per_seed``) beside them."""
    model, x, y, train, test, comm = data
    gamma = top["c_gamma"] * math.sqrt(x.shape[0] / k)
    alg = PrivSGP(StepSize(gamma), sigmas=sigma)
    points = int(cfg.get("curve_points", 1))  # evaluations along the run (no effect on it)

    def one(seed: int) -> dict[str, Any]:
        return _run(
            alg, model, x, y, train, test, comm, steps=k, cfg=cfg, eval_points=points, seed=seed
        )

    per_seed = [
        one(seed)
        if cells is None
        else cells.run({**(key or {}), "K": k, "sigma": sigma, "seed": seed}, lambda s=seed: one(s))
        for seed in range(int(cfg.get("seeds", 1)))
    ]
    out: dict[str, Any] = {"K": k, "sigma": sigma, "gamma": gamma, **_seed_means(per_seed)}
    return {**out, **_budget_accounting(k, sigma, eps, top=top, cfg=cfg, j_b=j_b)}


def _seed_means(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """``final`` and ``curve`` of :func:`_run` over seeds: one seed's as they are; for several,
    their means with the std (ddof 1) and each seed's curve and run time."""
    if len(per_seed) == 1:
        return {"final": per_seed[0]["final"], "curve": per_seed[0]["curve"]}
    metrics = ("loss", "accuracy")
    curve, curve_std = mean_curve([r["curve"] for r in per_seed], metrics, x="k")
    final, final_std = {}, {}
    for m in metrics:
        final[m], final_std[m] = mean_std([r["final"][m] for r in per_seed])
    return {
        "final": final,
        "final_std": final_std,
        "curve": curve,
        "curve_std": curve_std,
        "seeds": len(per_seed),
        "final_per_seed": [r["final"] for r in per_seed],
        "curve_per_seed": [r["curve"] for r in per_seed],
        "train_s_per_seed": [r.get("train_s") for r in per_seed],
    }


def _budget_accounting(
    k: int, sigma: float, eps: float, *, top: dict, cfg: dict, j_b: int
) -> dict[str, Any]:
    """The privacy columns of one :func:`_budget_run` (no training): what the run's sigma
    certifies (the default figure of ``privdl run privsgp-vr``: K Gaussian steps, exact
    composition), the paper-style Poisson approximation and the certified sigma for ``eps``."""
    z = rdp_noise_multiplier(eps, top["delta"], 1.0 / j_b, k)
    spent = privsgp_vr_budget(
        sigma=sigma,
        clip=cfg["clip"],
        entries=j_b,
        steps=k,
        delta=top["delta"],
        block_size=cfg["block_size"],
    )
    return {
        # what the run's (nominal) sigma certifies: the default figure of `privdl run`
        "accounted": spent.to_dict() | {"label": spent.label()},
        "sigma_poisson_approximation": 3.0 * cfg["clip"] * z,
        "sigma_certified": privsgp_accounted_sigma(
            clip=cfg["clip"],
            steps=k,
            delta=top["delta"],
            entries=j_b,
            epsilon=eps,
            block_size=cfg["block_size"],
        ),  # fmt: skip
    }


def _entries_per_block(cfg: dict) -> int:
    """J_b: the blocks of ``block_size`` in a node's J = n_train // n samples (:func:`_setup`)."""
    return (cfg["n_train"] // cfg["n"]) // cfg["block_size"]


#: What the sigma columns of the K and eps sweeps are (per node, example level, threat model
#: ldp, replace-one; the runs themselves use the nominal sigma, so their budgets are nominal).
_BUDGET_NOTE = (
    "The runs use the nominal sigma of eq. (11): their ({eps}, {delta}) is NOMINAL (per node, "
    "example level, threat model ldp). The Poisson column is the paper-style approximation "
    "(RDP at sensitivity 3G, G = clip, Poisson rate 1/J_b, add/remove; docs/privsgp-vr.md), "
    "which no theorem certifies: the SAGA mean touches every sample. The certified column is "
    "the noise "
    "`privdl run privsgp-vr` calibrates to for the same budget (K Gaussian steps, no "
    "subsampling amplification, replace-one sensitivity (4 - 2/J_b) G / B, {conversion}). "
    "The nominal noise is far below both. The accounted column is the epsilon "
    "that analysis certifies for the noise the run actually used (delta as above, replace-one, "
    "example level, threat model ldp, accountant {accountant})."
)


def _budget_note(runs: list[dict[str, Any]], *, eps: str, delta: str) -> str:
    """:data:`_BUDGET_NOTE` naming the accountant the ``runs`` were accounted with."""
    names = sorted({r["accounted"]["accountant"] for r in runs if "accounted" in r}) or ["none"]
    conversion = (
        "composed exactly as one Gaussian mechanism (mu-GDP)"
        if names == ["gaussian"]
        else "RDP with the classic conversion"
    )
    return _BUDGET_NOTE.format(
        eps=eps, delta=delta, conversion=conversion, accountant=", ".join(names)
    )


def _std_or_none(runs: list[dict[str, Any]], metric: str) -> list[float] | None:
    """The runs' std over seeds of their final ``metric`` (None where one seed ran)."""
    stds = [r.get("final_std", {}).get(metric) for r in runs]
    return None if None in stds else stds


def _seeds_note(runs: list[dict[str, Any]], *, kept: int) -> str:
    """How many seeds the table's losses and accuracies are over, what the seeds draw, the
    training time per seed, and how many runs ``--resume`` kept."""
    seeds = max(int(r.get("seeds", 1)) for r in runs)
    if seeds == 1:
        text = "One seed (seed 0: x^0, samples and noise)."
    else:
        times = [sum(t) for t in zip(*(r["train_s_per_seed"] for r in runs), strict=True)]
        text = (
            f"Final loss and test accuracy are mean +- std (sample std, ddof 1) over {seeds} "
            f"seeds (0 .. {seeds - 1}: x^0, samples and noise; the data split is the same); "
            "the figures draw the spread. Training time per seed, all runs: "
            + ", ".join(f"{t:.0f} s" for t in times)
            + "."
        )
    return text + (f" {kept} runs kept from an earlier run (--resume)." if kept else "")


def _nominal_budget(epsilon: float, delta: float) -> dict[str, Any]:
    """The labelled budget the sweeps' runs are named by (nominal: eq. (11)'s sigma)."""
    notes = "per node; runs use eq. (11)'s sigma, which no accountant certifies for it"
    return nominal_ldp_budget(epsilon, delta, formula="privsgp-thm2", notes=notes).to_dict()


def _budget_cells(run: dict[str, Any]) -> list[str]:
    """A :func:`_budget_run` as the cells of :data:`_BUDGET_HEADER`."""
    return [
        f"{run['sigma']:.3f}",
        f"{run.get('sigma_poisson_approximation', run.get('sigma_accounted')):.2f}",
        f"{run['sigma_certified']:.1f}" if "sigma_certified" in run else "-",
        f"{run['accounted']['epsilon']:.4g}" if "accounted" in run else "-",
        f"{run['gamma']:.3f}",
        pm(run["final"]["loss"], run.get("final_std", {}).get("loss")),
        pm(run["final"]["accuracy"], run.get("final_std", {}).get("accuracy")),
    ]


def ksweep_curves_plot(path: Path, results: dict[str, Any], *, k_star: float) -> bool:
    """Fig. 7 in the paper's form: training loss and test accuracy against the iteration, one
    curve per K (K* drawn thicker). Needs each run's ``curve`` with more than its start and end
    point (preset key ``curve_points``); returns False and draws nothing otherwise. A run over
    several seeds is drawn as its mean with a band of mean +- std (``curve_std``)."""
    runs = [r for r in results.values() if len(r.get("curve", [])) > 2]
    if not runs:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.2))
    for r in runs:
        ks = [p["k"] for p in r["curve"]]
        star = r["K"] == round(k_star)
        style = {
            "linewidth": 2.2 if star else 1.2,
            "label": f"K = {r['K']}" + (" (K*)" if star else ""),
        }
        for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
            y = np.asarray([p[metric] for p in r["curve"]], dtype=float)
            (line,) = ax.plot(ks, y, **style)
            if r.get("curve_std"):
                sd = np.asarray([p[metric] for p in r["curve_std"]], dtype=float)
                ax.fill_between(ks, y - sd, y + sd, color=line.get_color(), alpha=0.18, lw=0)
    axes[0].set_ylabel("training loss", fontsize=LABEL_SIZE)
    axes[1].set_ylabel("test accuracy", fontsize=LABEL_SIZE)
    for ax in axes:
        ax.set_xlabel("iteration k", fontsize=LABEL_SIZE)
        ax.grid(alpha=0.3)
    legend_outside(axes[1])
    seeds = max(int(r.get("seeds", 1)) for r in runs)
    fig.suptitle(
        f"Fig 7: PrivSGP-VR at a fixed budget, K around K* = {k_star:g}"
        + (f" (mean +- std over {seeds} seeds)" if seeds > 1 else ""),
        fontsize=TITLE_SIZE,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- Fig 7: K sweep
@_single_threaded
def run_ksweep(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Accuracy vs K at a fixed budget: sigma(K) grows like sqrt(K) (eq. 11), gamma = sqrt(n/K).
    Every (K, seed) run is a cell under ``out_dir/cells``; ``resume`` keeps the finished ones."""
    t0 = time.time()
    top, cfg = _cfg("privsgp-mnist-ksweep", quick, overrides)
    dev = _check_device(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = RunCells(out_dir, resume=resume)
    key = _cell_key("privsgp-mnist-ksweep", top, cfg, quick=quick, device=dev)

    n, k_star = cfg["n"], cfg["k_star"]
    model, x, y, train, test = _setup(cfg, n, data_dir=data_dir, device=dev)
    comm = LocalCommunicator(ExponentialGraph(n), dtype=torch.float32, device=dev)
    j_b = _entries_per_block(cfg)  # = x.shape[1] // block_size
    results = {}
    data = (model, x, y, train, test, comm)
    for r in top["k_ratios"]:
        k = max(2, round(r * k_star))
        sigma = math.sqrt(cfg["sigma2_at_kstar"] * k / k_star)
        results[str(k)] = _budget_run(
            k, sigma, top["epsilon"], data, top=top, cfg=cfg, j_b=j_b, cells=cells, key=key
        )
    return _ksweep_outputs(out_dir, results, top, cfg, quick=quick, t0=t0, kept=cells.kept)


def _cell_key(
    name: str, top: dict, cfg: dict, *, quick: bool, device: torch.device
) -> dict[str, Any]:
    """What a sweep's run depends on besides its K, sigma and seed: the preset's values (its
    seed count aside, so more seeds reuse the finished ones) and the device."""
    mode = {k: v for k, v in cfg.items() if k != "seeds"}
    return {"reproduction": name, "quick": quick, "top": top, "mode": mode, "device": device.type}


def _ksweep_outputs(
    out_dir: Path, results: dict, top: dict, cfg: dict, *, quick: bool, t0: float, kept: int = 0
) -> dict[str, Any]:
    """report.md, summary.json and the plot of the K sweep (Fig. 7)."""
    n, k_star = cfg["n"], cfg["k_star"]
    ks = list(results)
    accs = [results[k]["final"]["accuracy"] for k in ks]
    best = ks[max(range(len(ks)), key=accs.__getitem__)]
    i_star = ks.index(str(round(k_star)))
    _plot(
        out_dir / "ksweep_accuracy.png",
        [
            {
                "label": "PrivSGP-VR",
                "x": [int(k) for k in ks],
                "y": accs,
                "std": _std_or_none([results[k] for k in ks], "accuracy"),
            }
        ],
        xlabel="K",
        ylabel="test accuracy",
        title=f"Fig 7: accuracy vs K (K* = {k_star})",
    )
    figures = ["![ksweep](ksweep_accuracy.png)"]
    if ksweep_curves_plot(out_dir / "ksweep_curves.png", results, k_star=k_star):
        figures.append("![ksweep curves](ksweep_curves.png)")
    losses = [results[k]["final"]["loss"] for k in ks]
    best_loss = min(range(len(ks)), key=losses.__getitem__)
    checks = {
        "the best accuracy is at K* or a neighbouring grid point": abs(ks.index(best) - i_star)
        <= 1,
        "the lowest training loss is at K* or a neighbouring grid point": abs(best_loss - i_star)
        <= 1,
    }
    if quick:  # a tiny model is not noise-limited at the largest K: the curve flattens there
        checks["K* beats the smallest K (accuracy; quick: the largest K is informational)"] = (
            accs[i_star] > accs[0]
        )
    else:
        checks["K* beats the smallest and the largest K (accuracy)"] = accs[i_star] > max(
            accs[0], accs[-1]
        )
    rows = [[k, *_budget_cells(results[k])] for k in ks]
    body = [
        f"Paper (Fig. 7): n = 50, (1, 1e-5) per node, K* ~ {top['k_star_paper']} from eq. (12); "
        "K* gives the lowest loss and the highest accuracy. The MNIST constants are not reported, "
        "so K* is taken as given and sigma(K)^2 = sigma*^2 K / K* (eq. 11: sigma ~ sqrt(K)); "
        f"here K* = {k_star}, sigma*^2 = {cfg['sigma2_at_kstar']} (nominal, paper heuristic).",
        "",
        _table(["K", *_BUDGET_HEADER], rows),
        "",
        _seeds_note(list(results.values()), kept=kept),
        "",
        f"Ours: n = {n}, budget ({top['epsilon']:g}, {top['delta']:g}) per node. "
        + _budget_note(
            list(results.values()), eps=f"{top['epsilon']:g}", delta=f"{top['delta']:g}"
        ),
        "",
        " ".join(figures),
    ]
    return _finish(
        out_dir,
        "privsgp-mnist-ksweep",
        "PrivSGP-VR optimal K (MNIST, Fig. 7)",
        quick=quick,
        body=body,
        checks=checks,
        results=results,
        t0=t0,
        budget=_nominal_budget(top["epsilon"], top["delta"]),
    )


# --------------------------------------------------------------------------- Fig 8: eps
@_single_threaded
def run_eps(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Accuracy against the budget (Fig. 8): at each eps, K*(eps) = K*(1) eps^2 (eq. 12) and
    K*/2, 2 K*, each with sigma(K, eps)^2 = sigma*^2 (K / K*(1)) / eps^2 (eq. 11). Every
    (eps, K, seed) run is a cell under ``out_dir/cells``; ``resume`` keeps the finished ones."""
    t0 = time.time()
    top, cfg = _cfg("privsgp-mnist-eps", quick, overrides)
    dev = _check_device(device)
    if not cfg["epsilons"] or any(not e > 0 for e in cfg["epsilons"]):
        raise ConfigError(f"epsilons must be positive numbers, got {cfg['epsilons']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = RunCells(out_dir, resume=resume)
    key = _cell_key("privsgp-mnist-eps", top, cfg, quick=quick, device=dev)

    n, k1 = cfg["n"], cfg["k_star_at_eps1"]
    model, x, y, train, test = _setup(cfg, n, data_dir=data_dir, device=dev)
    comm = LocalCommunicator(ExponentialGraph(n), dtype=torch.float32, device=dev)
    j_b = _entries_per_block(cfg)  # = x.shape[1] // block_size
    data = (model, x, y, train, test, comm)
    results: dict[str, dict] = {}
    out: dict[str, Any] = {}
    for eps in sorted(float(e) for e in cfg["epsilons"]):
        k_star, grid = eps_grid(eps, k1, top["k_ratios"], cfg["sigma2_at_kstar"])
        runs = {
            f"{r:g}": _budget_run(
                k, sigma, eps, data, top=top, cfg=cfg, j_b=j_b, cells=cells, key={**key, "eps": eps}
            )
            for r, (k, sigma) in zip(top["k_ratios"], grid, strict=True)
        }
        results[f"{eps:g}"] = {"k_star": k_star, "runs": runs}
        # after every eps
        out = _eps_outputs(out_dir, results, top, cfg, quick=quick, t0=t0, kept=cells.kept)
    return out


def eps_grid(
    eps: float, k_star_at_eps1: float, k_ratios: list[float], sigma2_at_kstar: float
) -> tuple[int, list[tuple[int, float]]]:
    """Fig. 8's runs at budget ``eps``: ``K*(eps) = K*(1) eps^2`` (eq. 12 with every other
    constant fixed) and, per ratio r, ``(K, sigma)`` with ``K = r K*(eps)`` and
    ``sigma^2 = sigma*^2 (K / K*(1)) / eps^2`` (eq. 11: sigma ~ sqrt(K) / eps)."""
    k_star = max(2, round(k_star_at_eps1 * eps**2))
    grid = []
    for r in k_ratios:
        k = max(2, round(r * k_star))
        grid.append((k, math.sqrt(sigma2_at_kstar * (k / k_star_at_eps1) / eps**2)))
    return k_star, grid


def _eps_outputs(
    out_dir: Path, results: dict, top: dict, cfg: dict, *, quick: bool, t0: float, kept: int = 0
) -> dict[str, Any]:
    """report.md, summary.json and the plot of the eps values finished so far."""
    eps = list(results)
    ratios = [f"{r:g}" for r in top["k_ratios"]]
    star = f"{1.0:g}"

    def acc(e: str, r: str) -> float:
        return results[e]["runs"][r]["final"]["accuracy"]

    at_star = [acc(e, star) for e in eps]
    _plot(
        out_dir / "eps_accuracy.png",
        [
            {
                "label": {"0.5": "K*/2", "1": "K*", "2": "2 K*"}.get(r, f"{r} K*"),
                "x": [float(e) for e in eps],
                "y": [acc(e, r) for e in eps],
                "std": _std_or_none([results[e]["runs"][r] for e in eps], "accuracy"),
            }
            for r in ratios
        ],
        xlabel=f"epsilon (per node, delta = {top['delta']:g}, nominal)",
        ylabel="test accuracy",
        title="Fig 8: accuracy vs epsilon at K*(eps), K*/2, 2 K*",
    )
    wins = [e for e in eps if all(acc(e, star) >= acc(e, r) for r in ratios)]
    complete = len(eps) == len(cfg["epsilons"])
    checks = {
        "accuracy at K*(eps) rises with eps (no step down of more than 0.5 points)": all(
            b >= a - 0.005 for a, b in zip(at_star, at_star[1:], strict=False)
        ),
        "accuracy at K* is higher at the largest eps than at the smallest": len(eps) < 2
        or at_star[-1] > at_star[0],
    }
    rows = []
    for e in eps:
        for r in ratios:
            run = results[e]["runs"][r]
            k = f"{run['K']}" + (" (K*)" if r == star else "")
            rows.append([e, k, *_budget_cells(run)])
    body = [
        'Paper (Fig. 8, cited in its text as "Figure 3"): n = 50, delta = 1e-5, eps in '
        "{0.4, ..., 1.6}; the accuracy maximised over K (at K*) gets worse as eps shrinks. "
        "The figure gives no numbers. Here K*(eps) = K*(1) eps^2 (eq. 12) with "
        f"K*(1) = {cfg['k_star_at_eps1']}, the other two K are K*/2 and 2 K* (our choice), "
        f"and sigma(K, eps)^2 = {cfg['sigma2_at_kstar']} (K / K*(1)) / eps^2 (eq. 11), so "
        "every K* run has the same noise and differs only in its length.",
        ""
        if complete
        else f"**Partial: {len(eps)} of {len(cfg['epsilons'])} eps values finished.**",
        "",
        _table(["eps", "K", *_BUDGET_HEADER], rows),
        "",
        _seeds_note([run for e in eps for run in results[e]["runs"].values()], kept=kept),
        "",
        f"K* has the best accuracy of its three K at {len(wins)} of {len(eps)} eps values "
        "(our reading of the figure; the paper does not state it, so it is not a "
        "check).",
        "",
        _budget_note(
            [run for e in eps for run in results[e]["runs"].values()],
            eps="eps",
            delta=f"{top['delta']:g}",
        ),
        "",
        "![eps](eps_accuracy.png)",
    ]
    return _finish(
        out_dir,
        "privsgp-mnist-eps",
        "PrivSGP-VR accuracy vs epsilon (MNIST, Fig. 8)",
        quick=quick,
        body=body,
        checks=checks,
        results=results,
        t0=t0,
        complete=complete,
        k_star_best_at=wins,
        budgets=[_nominal_budget(float(e), top["delta"]) for e in eps],
    )


# --------------------------------------------------------------------------- Figs 9-10
@_single_threaded
def _over_seeds(
    alg,
    model,
    x,
    y,
    train,
    test,
    comm,
    *,
    steps: int,
    cfg: dict,
    cells: RunCells | None = None,
    key: dict[str, Any] | None = None,
) -> list[dict]:
    """One :func:`_run` per seed ``0 .. cfg["seeds"] - 1`` (model ``x^0``, samples and noise),
    each kept as a cell of ``cells`` under ``key`` plus its seed (``--resume``)."""

    def one(seed: int) -> dict[str, Any]:
        return _run(
            alg,
            model,
            x,
            y,
            train,
            test,
            comm,
            steps=steps,
            cfg=cfg,
            eval_points=cfg["eval_points"],
            seed=seed,
        )  # fmt: skip

    return [
        one(seed)
        if cells is None
        else cells.run({**(key or {}), "seed": seed}, lambda s=seed: one(s))
        for seed in range(int(cfg.get("seeds", 1)))
    ]


def run_vr(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """VR vs no VR (exponential graph), and vs DP2-SGD / A(DP)2SGD (ring), at equal sigma.
    Every (method, seed) run is a cell under ``out_dir/cells``; ``resume`` keeps the finished
    ones."""
    t0 = time.time()
    top, cfg = _cfg("privsgp-mnist-vr", quick, overrides)
    dev = _check_device(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = RunCells(out_dir, resume=resume)
    key = _cell_key("privsgp-mnist-vr", top, cfg, quick=quick, device=dev)

    n, k = cfg["n"], cfg["steps"]
    sigma = math.sqrt(top["sigma2"])
    gamma = top["c_gamma"] * math.sqrt(n / k)
    model, x, y, train, test = _setup(cfg, n, data_dir=data_dir, device=dev)
    expo = LocalCommunicator(ExponentialGraph(n), dtype=torch.float32, device=dev)
    ring_comm = LocalCommunicator(mixing_matrix(ring(n), "decor"), dtype=torch.float32, device=dev)
    pair = LocalCommunicator(lambda t: ring_matching(n, t, seed=0), n_nodes=n, device=dev)
    runs = {
        "PrivSGP-VR (expo)": (PrivSGP(StepSize(gamma), sigmas=sigma), expo),
        "PrivSGP (expo)": (PrivSGP(StepSize(gamma), sigmas=sigma, variance_reduction=False), expo),
        "PrivSGP-VR (ring)": (PrivSGP(StepSize(gamma), sigmas=sigma), ring_comm),
        "DP2-SGD (ring)": (DP2SGD(StepSize(gamma), sigmas=sigma), ring_comm),
        "A(DP)2SGD (ring)": (DP2SGD(StepSize(gamma), sigmas=sigma, asynchronous=True), pair),
    }
    n_seeds = int(cfg.get("seeds", 1))
    results = {}
    for name, (alg, comm) in runs.items():
        per_seed = _over_seeds(
            alg,
            model,
            x,
            y,
            train,
            test,
            comm,
            steps=k,
            cfg=cfg,
            cells=cells,
            key={**key, "method": name},
        )
        # curves and "final" are the seeds' means; per-seed finals are kept beside them
        results[name] = {
            **per_seed[0],
            "curve": [
                {
                    "k": p["k"],
                    **{
                        m: sum(r["curve"][i][m] for r in per_seed) / n_seeds
                        for m in ("loss", "accuracy")
                    },
                }
                for i, p in enumerate(per_seed[0]["curve"])
            ],
            "final": {
                m: sum(r["final"][m] for r in per_seed) / n_seeds for m in ("loss", "accuracy")
            },
            "seeds": n_seeds,
            "final_loss_per_seed": [r["final"]["loss"] for r in per_seed],
            "final_std": {
                m: mean_std([r["final"][m] for r in per_seed])[1] for m in ("loss", "accuracy")
            },
            "train_s_per_seed": [r.get("train_s") for r in per_seed],
            # every seed's curve, so the figure's band (and any later one) comes from the data
            "curve_per_seed": [r["curve"] for r in per_seed],
        }
    for metric in ("loss", "accuracy"):
        _plot(
            out_dir / f"vr_{metric}.png",
            [
                {
                    "label": nm,
                    "x": [p["k"] for p in r["curve"]],
                    "y": [p[metric] for p in r["curve"]],
                    "std": _seed_std(r["curve_per_seed"], metric),
                }
                for nm, r in results.items()
            ],
            xlabel="iteration",
            ylabel=metric,
            title="Figs 9-10 (sigma^2 = 0.01)"
            + (f", mean +- std over {n_seeds} seeds" if n_seeds > 1 else ""),
        )

    def mean_loss(name: str) -> float:  # area under the loss curve (after k = 0)
        c = results[name]["curve"][1:]
        return sum(p["loss"] for p in c) / len(c)

    vr, sgp = "PrivSGP-VR (expo)", "PrivSGP (expo)"
    checks = {
        "Fig 9: PrivSGP-VR has a lower final training loss than PrivSGP": results[vr]["final"][
            "loss"
        ]
        < results[sgp]["final"]["loss"],
        "Fig 9: PrivSGP-VR has a lower loss than PrivSGP on average over the curve": mean_loss(vr)
        < mean_loss(sgp),
        "Fig 10: PrivSGP-VR (ring) has a lower average loss than DP2-SGD and A(DP)2SGD": mean_loss(
            "PrivSGP-VR (ring)"
        )
        < min(mean_loss("DP2-SGD (ring)"), mean_loss("A(DP)2SGD (ring)")),
    }
    rows = [
        [
            nm,
            pm(r["final"]["loss"], r["final_std"]["loss"]),
            f"{mean_loss(nm):.4f}",
            pm(r["final"]["accuracy"], r["final_std"]["accuracy"]),
        ]
        for nm, r in results.items()
    ]
    diffs = [
        a - b
        for a, b in zip(
            results[vr]["final_loss_per_seed"], results[sgp]["final_loss_per_seed"], strict=True
        )
    ]
    paired = (
        f"Final loss, PrivSGP-VR minus PrivSGP, seed by seed (same x^0, samples and noise "
        f"seed): {', '.join(f'{d:+.4f}' for d in diffs)}; lower with VR in "
        f"{sum(d < 0 for d in diffs)} of {n_seeds}."
    )
    body = [
        "Paper: Fig. 9 — PrivSGP-VR outperforms PrivSGP at sigma_i^2 = 0.01 (loss and accuracy); "
        "Fig. 10 — on the undirected ring at (1, 1e-5) per node PrivSGP-VR converges faster "
        "than DP2-SGD and A(DP)2SGD. Here every method gets the SAME sigma (the baselines' own "
        "calibrations are not given by the paper; see docs/privsgp-vr.md): "
        f"sigma^2 = {top['sigma2']:g}, the paper's Fig. 9 noise, so no run here spends the "
        "(1, 1e-5) of Fig. 10 (nor is its privacy accounted: this compares optimisers at equal "
        "noise).",
        f"n = {n}, K = {k}, gamma = sqrt(n/K) = {gamma:.3f}, block size {cfg['block_size']}, "
        f"per-sample clip {cfg['clip']}; {n_seeds} seed(s), losses and accuracies are means "
        "over seeds (+- the sample std, ddof 1, where there are several; the figures' bands).",
        "",
        _table(["method", "final loss", "mean loss over curve", "test accuracy"], rows),
        "",
        paired,
        "",
        "![loss](vr_loss.png) ![accuracy](vr_accuracy.png)",
    ]
    return _finish(
        out_dir,
        "privsgp-mnist-vr",
        "PrivSGP-VR vs PrivSGP and DP baselines (MNIST, Figs. 9-10)",
        quick=quick,
        body=body,
        checks=checks,
        results=results,
        t0=t0,
    )


# --------------------------------------------------------------------------- CIFAR
@_single_threaded
def run_cifar(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
) -> dict[str, Any]:
    """K* planning with the paper's CIFAR constants (nominal vs accounted), and a ResNet-18-GN
    PrivSGP-VR vs PrivSGP run (synthetic stand-in in quick mode, real CIFAR-10 in full mode).

    Progress lines (with the elapsed time) go to stderr; report.md and summary.json are rewritten
    after the planning and after every evaluation, so a run cut short still leaves them. The full
    preset's ``time_limit_s`` caps the training (split between the two runs); a run stopped by it
    says so in the report.
    """
    t0 = time.time()
    top, cfg = _cfg("privsgp-cifar", quick, overrides)
    dev = _check_device(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    _say(f"privsgp-cifar ({'quick' if quick else 'full'}) on {dev}: planning", t0)
    planning = _cifar_planning(top, accounted_k=not quick)
    _say(f"nominal K* = {planning['K_star_nominal']:.1f}", t0)
    plan_checks = {
        f"nominal K* (eq. 12, c2 = {top['c2_paper']}) ~ {top['k_star_paper']}": abs(
            planning["K_star_nominal"] - top["k_star_paper"]
        )
        < 1.0,
        "the Poisson approximation's sigma is > 50x the nominal one (measured: ~70x)": planning[
            "ratio_poisson_approximation_over_nominal"
        ]
        > 50,
    }
    n, k = cfg["n"], cfg["steps"]
    runs: dict[str, dict] = {}

    def save(final: bool) -> dict[str, Any]:
        checks = dict(plan_checks)
        if final:
            checks["both training runs are finite and PrivSGP-VR's loss decreases"] = all(
                math.isfinite(r["final"]["loss"]) for r in runs.values()
            ) and (runs["PrivSGP-VR"]["final"]["loss"] < runs["PrivSGP-VR"]["curve"][0]["loss"])
        return _cifar_outputs(out_dir, top, cfg, planning, runs, checks, quick, t0, dev, final)

    save(final=False)
    model, x, y, train, test = _setup(
        cfg, n, data_dir=data_dir, dataset=cfg["dataset"], device=str(dev)
    )
    _say(f"data {cfg['dataset']}: {tuple(x.shape)} on {x.device}; d = {model.num_parameters()}", t0)
    comm = LocalCommunicator(ExponentialGraph(n), dtype=torch.float32, device=dev)
    gamma = top["c_gamma"] * math.sqrt(n / max(k, 1))
    budget = int(cfg.get("table_budget_gib", 2) * 2**30)
    limit = float(cfg.get("time_limit_s", 0)) or None
    names = (("PrivSGP-VR", True), ("PrivSGP", False))
    for i, (name, vr) in enumerate(names):
        alg = PrivSGP(
            StepSize(gamma),
            sigmas=math.sqrt(top["sigma2"]),
            variance_reduction=vr,
            table_budget=budget,
        )
        deadline = None
        if limit is not None:
            now = time.time()
            deadline = now + (t0 + limit - now) / (len(names) - i)

        def partial(res: dict, name: str = name) -> None:
            runs[name] = res
            save(final=False)

        runs[name] = _run(
            alg,
            model,
            x,
            y,
            train,
            test,
            comm,
            steps=k,
            cfg=cfg,
            eval_points=cfg.get("eval_points", 3),
            label=name,
            deadline=deadline,
            progress=True,
            on_eval=partial,
            t_origin=t0,
        )
        if dev.type == "cuda":
            runs[name]["max_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    _plot(
        out_dir / "cifar_loss.png",
        [
            {"label": nm, "x": [p["k"] for p in r["curve"]], "y": [p["loss"] for p in r["curve"]]}
            for nm, r in runs.items()
        ],
        xlabel="iteration",
        ylabel="training loss",
        title=f"ResNet-18-GN on {cfg['dataset']} (Fig. 4 setting)",
    )
    summary = save(final=True)
    _say(f"done: {out_dir / 'report.md'}", t0)
    return summary


def _cifar_planning(top: dict, *, accounted_k: bool) -> dict[str, Any]:
    """Corollary 1 with the paper's CIFAR constants, nominal and accounted (docs/privsgp-vr.md)."""
    n_paper = 16
    a_const = (
        13 * top["f0"] + 6 * top["smoothness"] * top["x0_sq"] + (18 * top["smoothness"] * top["b2"])
    )
    common = dict(
        A=a_const,
        local_samples=top["local_samples"],
        n=n_paper,
        smoothness=top["smoothness"],
        dim=top["dim"],
        gradient_bound=top["gradient_bound"],
        epsilons=[top["epsilon"]] * n_paper,
        deltas=[top["delta"]] * n_paper,
    )
    k_nom, u_nom = privsgp_optimal_steps(**common, c2=top["c2_paper"])
    k_nom1, _ = privsgp_optimal_steps(**common, c2=1.0)
    plan = privsgp_plan(
        gradient_bound=top["gradient_bound"],
        steps=round(k_nom),
        local_samples=top["local_samples"],
        epsilon=top["epsilon"],
        delta=top["delta"],
        c2=top["c2_paper"],
    )
    plan_args = dict(
        gradient_bound=top["gradient_bound"],
        steps=round(k_nom),
        local_samples=top["local_samples"],
        epsilons=top["epsilon"],
        deltas=top["delta"],
    )
    approx = noise_plan(mode="poisson_approximation", **plan_args)
    acc = noise_plan(mode="accounted", **plan_args)
    k_approx, u_approx = (
        optimal_steps(mode="poisson_approximation", **common) if accounted_k else (None, None)
    )
    k_acc, u_acc = optimal_steps(mode="accounted", **common)  # closed-form sigma(K): fast
    sig_nom = plan.values["sigma"]
    return {
        "A": a_const,
        "K_star_nominal": k_nom,
        "U_star_nominal": u_nom,
        "K_star_c2_1": k_nom1,
        "sigma_nominal": sig_nom,
        "epsilon_accounted_for_nominal_sigma": cast(PrivacyBudget, plan.accounted).epsilon,
        "epsilon_accounted_label": cast(PrivacyBudget, plan.accounted).label(),  # always set
        "epsilon_poisson_approximation": plan.values["epsilon_poisson_approximation"],
        "sigma_poisson_approximation": approx.sigmas[0],
        "noise_multiplier_poisson_approximation": approx.noise_multipliers[0],
        "ratio_poisson_approximation_over_nominal": approx.sigmas[0] / sig_nom,
        "K_star_poisson_approximation": k_approx,
        "U_star_poisson_approximation": u_approx,
        "sigma_accounted": acc.sigmas[0],
        "ratio_accounted_over_nominal": acc.sigmas[0] / sig_nom,
        "K_star_accounted": k_acc,
        "U_star_accounted": u_acc,
    }


def _cifar_outputs(
    out_dir: Path,
    top: dict,
    cfg: dict,
    planning: dict,
    runs: dict,
    checks: dict[str, bool],
    quick: bool,
    t0: float,
    dev: torch.device,
    final: bool,
) -> dict[str, Any]:
    p = planning
    k_approx = p["K_star_poisson_approximation"]
    k_approx_txt = (
        "not computed in quick mode"
        if k_approx is None
        else f"{k_approx:.4g} (U = {p['U_star_poisson_approximation']:.3g})"
    )
    rows = []
    for nm, r in runs.items():
        done = f"{r['steps_done']} of {r['steps_planned']}"
        if r.get("stopped_early"):
            done += " (time limit)"
        rows.append(
            [
                nm,
                done,
                f"{r['final']['loss']:.4f}",
                f"{r['final']['accuracy']:.4f}",
                f"{r.get('init_s', 0):.1f}",
                f"{r.get('train_s', 0):.1f}",
            ]  # fmt: skip
        )
    reduced = cfg["steps"] < top["k_star_paper"] or cfg["width"] != 64
    status = [] if final else ["**Status: RUNNING (partial results; rewritten as it goes).**", ""]
    body = [
        *status,
        f"## Planning with the paper's constants (n = 16, ({top['epsilon']:g}, {top['delta']:g}) "
        "per node, d = 11,173,962)",
        "",
        _table(
            ["quantity", "paper", "ours"],
            [
                ["K* (eq. 12), c2 = 0.3724", "~3120", f"{p['K_star_nominal']:.1f}"],
                ["K* with c2 = 1", "-", f"{p['K_star_c2_1']:.1f}"],
                ["sigma_i at K* (nominal, eq. 11)", "implied ~0.226", f"{p['sigma_nominal']:.4f}"],
                [
                    "epsilon certified for that sigma (RDP, no amplification, (4-2/J) G, "
                    "replace-one)",
                    f"{top['epsilon']:g} (claimed)",
                    f"{p['epsilon_accounted_for_nominal_sigma']:.4g}",
                ],
                [
                    "epsilon of the Poisson approximation for that sigma (3G, rate 1/J, "
                    "add/remove; not certified)",
                    "-",
                    f"{p.get('epsilon_poisson_approximation', float('nan')):.4g}",
                ],
                [
                    f"sigma_i the Poisson approximation needs for eps = {top['epsilon']:g} at K*",
                    "-",
                    f"{p['sigma_poisson_approximation']:.3f} "
                    f"(z = {p['noise_multiplier_poisson_approximation']:.3f})",
                ],
                [
                    "ratio approximation / nominal",
                    "-",
                    f"{p['ratio_poisson_approximation_over_nominal']:.1f}x",
                ],
                ["K* with the approximation's sigma (numeric, eq. 14)", "-", k_approx_txt],
                [
                    f"sigma_i certified for eps = {top['epsilon']:g} at K* (what `privdl run "
                    "privsgp-vr` calibrates to)",
                    "-",
                    f"{p['sigma_accounted']:.4g} ({p['ratio_accounted_over_nominal']:.3g}x "
                    "nominal)",
                ],
                [
                    "K* with the certified sigma (numeric, eq. 14)",
                    "-",
                    f"{p['K_star_accounted']:.4g} (U = {p['U_star_accounted']:.3g})",
                ],
            ],
        ),
        "",
        f"## Training ({cfg['dataset']}, ResNet-18-GN width {cfg['width']}, n = {cfg['n']}, "
        f"K = {cfg['steps']}, block size {cfg['block_size']}, sigma^2 = {top['sigma2']}, "
        f"device {dev})",
        "",
        f"SAGA table: {runs['PrivSGP-VR']['table'] if 'PrivSGP-VR' in runs else 'not built yet'}",
        "",
        _table(["method", "steps done", "final loss", "test accuracy", "init s", "train s"], rows),
        "",
        "![loss](cifar_loss.png)" if final else "",
        "",
    ]
    if reduced:
        body.append(
            f"REDUCED setting: K = {cfg['steps']} (the planner's nominal K* is "
            f"{p['K_star_nominal']:.0f}, the paper's 3120) and ResNet-18 width {cfg['width']} "
            "(the paper's network is width 64, d = 11.2M). "
            + (
                "Quick mode uses the synthetic stand-in and a narrow network; it only checks that "
                "the pipeline runs."
                if quick
                else f"The full preset is sized for about {cfg.get('time_limit_s', 0):.0f} s of "
                "training on one GPU; the paper's setting is `--set width=64 --set steps=3120 "
                "--set block_size=625 --set time_limit_s=0` (GPU hours)."
            )
        )
    results = {"planning": planning, "training": runs, "complete": final}
    return _finish(
        out_dir,
        "privsgp-cifar",
        "PrivSGP-VR on CIFAR-10 / ResNet-18 (Section 5.1)",
        quick=quick,
        body=body,
        checks=checks,
        results=results,
        t0=t0,
        device=str(dev),
    )


REPRODUCTIONS = [
    Reproduction(
        name="privsgp-mnist-speedup",
        paper=PAPER,
        description="Fig. 6: linear speedup of PrivSGP-VR on MNIST, n in {25, 50, 100}",
        run=run_speedup,
        full_runtime="141 s per seed on one CPU core, 3 seeds (measured 2026-11-24)",
    ),
    Reproduction(
        name="privsgp-mnist-ksweep",
        paper=PAPER,
        description="Fig. 7: accuracy vs K around K* ~ 575 at (1, 1e-5), n = 50",
        run=run_ksweep,
        full_runtime="130 s per seed on one CPU core, 3 seeds (measured 2026-11-24)",
    ),
    Reproduction(
        name="privsgp-mnist-eps",
        paper=PAPER,
        description="Fig. 8: accuracy vs eps in {0.4, ..., 1.6} at K*(eps), K*/2 and 2 K*, n = 50",
        run=run_eps,
        full_runtime="9 min 40 s per seed on one CPU core, 3 seeds (measured 2026-11-24)",
    ),
    Reproduction(
        name="privsgp-mnist-vr",
        paper=PAPER,
        description="Figs. 9-10: PrivSGP-VR vs PrivSGP, DP2-SGD and A(DP)2SGD on MNIST",
        run=run_vr,
        full_runtime="328 s per seed on one CPU core, 3 seeds (measured 2026-11-24)",
    ),
    Reproduction(
        name="privsgp-cifar",
        paper=PAPER,
        description="Section 5.1: K* ~ 3120 planning (nominal vs accounted) and ResNet-18 runs",
        run=run_cifar,
        full_runtime=(
            "reduced setting (width 16, K = 780, capped at 380 s of planning + training): about "
            "7-8 min on one GPU (estimated, not measured); the paper's K = 3000 at full width: GPU hours"
        ),
    ),
]
