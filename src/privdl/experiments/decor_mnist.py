"""DECOR Fig 1c reproduction: MNIST MLP 784-128-10, example-level privacy (DECOR Section 6.2).

The paper's budgets {1e-3, 1e-2, 0.1, 1} are the reference code's uncomposed per-step value
(docs/accounting.md section 6): they are run as published, calibrated with that legacy accountant
and labelled "legacy, not a valid (eps, delta) guarantee", beside correctly accounted (eps, 1e-5)
budgets.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from privdl.errors import ConfigError
from privdl.experiments import Reproduction, RunCells, apply_overrides, write_outputs
from privdl.experiments.decor import (
    _checks_md,
    _mean_std,
    _methods,
    _pick,
    _plot,
    _preset,
    _simulate,
    _table,
    accounted_cell,
    labels_line,
    non_private,
)
from privdl.privacy import (
    LEGACY_LABEL,
    decor_pair_for_step_rdp,
    legacy_example_epsilon,
    legacy_step_rdp_for_epsilon,
)
from privdl.registry import make_config, recipe_for
from privdl.tasks import SupervisedTask, build_task
from privdl.topology import parse_graph

# --- Fig 1c: MNIST, example level ----------------------------------------------------------------


def _legacy_sigmas(alg, topo_spec, *, eps, clip, batch, rate, grid, cor_max):
    """Noise for a legacy (uncomposed) budget, calibrated as the reference code does (App. D.1)."""
    rho = legacy_step_rdp_for_epsilon(eps, sampling_rate=rate)
    c = clip / batch
    s_ldp = c * math.sqrt(2.0 / rho)
    g = parse_graph(topo_spec)
    if alg == "ldp":
        return s_ldp * (1 + 1e-9), 0.0
    if alg == "cdp":
        return s_ldp / math.sqrt(g.n) * (1 + 1e-9), 0.0
    return decor_pair_for_step_rdp(
        g.graph,
        step_rdp=rho,
        clip=c,
        sigma_cdp_grid=np.asarray(grid) * clip,
        sigma_cor_max=cor_max * clip,
    )


def _accounted_decor_pair(
    values: dict[str, Any], spec: str, *, batch: int, cor_max: float, points: int
) -> tuple[float, float]:
    """DECOR's pair for a correctly accounted budget, chosen by the reference code's rule.

    The LDP calibration gives sigma_ldp = c sqrt(2 / rho) (c = C / batch, rho the composed,
    subsampled per-step RDP slope that meets (eps, delta) over T); DECOR takes the smallest
    sigma_cdp in linspace(sigma_ldp / sqrt(n), sigma_ldp, points) whose sigma_cor (SecRDP
    slope <= rho) is at most ``cor_max`` -- the rule the code applies to its legacy budgets
    (DECOR App. D.1), here with the composed accountant, so the run's accounted epsilon meets the
    target.
    """
    cfg = make_config(dict(values, algorithm="ldp", graph=spec))
    topo = parse_graph(spec)
    sigma_ldp = recipe_for(cfg).calibrate(cfg, topo, build_task(cfg)).sigma
    c = float(cast(float, cfg.clip)) / batch  # set: calibrate refuses a target eps without it
    rho = 2.0 * c * c / (sigma_ldp * sigma_ldp)
    grid = np.linspace(sigma_ldp / math.sqrt(topo.n), sigma_ldp, points)[1:]
    return decor_pair_for_step_rdp(
        topo.graph, step_rdp=rho, clip=c, sigma_cdp_grid=grid, sigma_cor_max=cor_max
    )


def fig1c_base(p: dict[str, Any], *, data_dir: str | None, device: str) -> dict[str, Any]:
    """The run settings every Fig 1c run shares (preset ``p``); a run adds its algorithm, graph,
    seed, (lr, C) and budget."""
    return dict(
        task="mnist",
        model=p["model"],
        steps=p["steps"],
        batch_size=p["batch_size"],
        lr_decay=p["lr_decay"],
        weight_decay=p["weight_decay"],
        partition=p["partition"],
        mixing=p["mixing"],
        delta=p["delta"],
        data_seed=p["data_seed"],
        clip_mode="per_sample",
        sampling="without_replacement",
        data_dir=data_dir,
        eval_every=10**9,
        device=device,
    )


def _accounted_hyper(p: dict[str, Any], alg: str, topo: str, eps: float) -> tuple[float, float]:
    """(lr, C) for a correctly accounted budget: ``hyper.default`` for every method, or with
    ``accounted_hyper = "tuned"`` the method's ``[hyper_accounted]`` entry where it has one (tuned
    per algorithm on the paper's grid, as App. D.2 does; experiments/studies/tune_fig1c.py)."""
    mode = p.get("accounted_hyper", "default")
    if mode not in ("default", "tuned"):
        raise ConfigError(f"accounted_hyper must be 'default' or 'tuned', got {mode!r}")
    key = alg if alg == "cdp" else f"{alg}_{topo}"
    table = p.get("hyper_accounted", {})
    if mode == "tuned" and key in table:
        return _pick(table[key], eps)
    lr, clip = p["hyper"]["default"]
    return float(lr), float(clip)


def run_fig1c(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Fig 1c (DECOR Section 6.2): MNIST test accuracy, legacy budgets and correctly accounted ones.

    Each run is kept as a cell (:class:`~privdl.experiments.RunCells`); ``resume`` reuses the
    finished ones (``privdl reproduce decor-fig1c --resume`` continues a grid cut off).

    ``overrides`` (``--set``) replace top-level preset values, e.g. ``seeds=1,123``,
    ``topologies=torus``, ``epsilons=3,10``, ``legacy_epsilons=`` (none), ``steps=1000``.
    """
    p = _preset("decor-fig1c", quick)
    p = apply_overrides(p, overrides, name="decor-fig1c")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = RunCells(out, resume=resume)
    base = fig1c_base(p, data_dir=data_dir, device=device)
    # MNIST: a supervised task
    probe = cast(
        SupervisedTask, build_task(make_config(dict(non_private(base), graph="ring:16", clip=1.0)))
    )
    rate = probe.sampling_rate
    gl = p["sigma_cdp_grid"]
    grid = np.linspace(gl[0], gl[1], int(gl[2]))
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    budgets = [("legacy", e) for e in p["legacy_epsilons"]] + [
        ("accounted", e) for e in p["epsilons"]
    ]
    for kind, eps in budgets:
        for alg, topo in _methods(p["topologies"]):
            spec = p["graphs"][topo]
            if kind == "legacy":
                key = alg if alg == "cdp" else f"{alg}_{topo}"
                lr, clip = _pick(p["hyper"][key], eps)
                s, c = _legacy_sigmas(
                    alg,
                    spec,
                    eps=eps,
                    clip=clip,
                    batch=p["batch_size"],
                    rate=rate,
                    grid=grid,
                    cor_max=p["sigma_cor_max"],
                )
                extra: dict[str, Any] = {"sigma": s} | ({"sigma_cor": c} if c > 0 else {})
            else:
                lr, clip = _accounted_hyper(p, alg, topo, eps)
                extra = {"epsilon": float(eps)}
                if alg == "decor" and p["accounted_decor_rule"] == "paper-grid":
                    s, c = _accounted_decor_pair(
                        dict(base, lr=lr, clip=clip, epsilon=float(eps)),
                        spec,
                        batch=p["batch_size"],
                        cor_max=p["sigma_cor_max"] * clip,
                        points=int(gl[2]),
                    )
                    extra = {"sigma": s, "sigma_cor": c}
            runs = []
            for seed in p["seeds"]:
                v = dict(base, algorithm=alg, graph=spec, seed=seed, lr=lr, clip=clip, **extra)
                kept = {k: x for k, x in v.items() if k not in ("data_dir", "device")}
                runs.append(
                    cells.run(
                        {"values": kept, "metric": "mnist accuracy"}, lambda v=v: _simulate(v)
                    )
                )
            am, asd = _mean_std([r["final"]["accuracy"] for r in runs])
            print(
                f"[decor-fig1c {time.perf_counter() - t0:7.1f}s] {kind} eps={eps} {alg}/{topo}: "
                f"accuracy {am:.4f} over {len(runs)} seed(s)",
                file=sys.stderr,
                flush=True,
            )
            r0 = runs[0]
            cfg = make_config(dict(base, algorithm=alg, graph=spec, lr=lr, clip=clip))
            topo_obj = parse_graph(spec if alg != "cdp" else "complete:16")
            task = build_task(cfg)  # the runs' data (a cell keeps no task): its sampling rates
            rho = recipe_for(cfg).step_rdp(  # type: ignore[attr-defined]
                cfg, topo_obj, task, sigma=r0["sigma"], sigma_cor=r0["sigma_cor"]
            )
            results[f"{kind}/{alg}/{topo}/{eps}"] = dict(
                budget=kind,
                algorithm=alg,
                topology=topo,
                epsilon=eps,
                lr=lr,
                clip=clip,
                accuracy=am,
                accuracy_std=asd,
                sigma=r0["sigma"],
                sigma_cor=r0["sigma_cor"],
                legacy_epsilon=legacy_example_epsilon(rho, sampling_rate=rate),
                epsilon_accounted=r0["privacy"]["epsilon"],
                privacy=r0["privacy"],
            )
    wall = time.perf_counter() - t0
    checks = []
    within = p["checks"]["decor_torus_within_points"]
    for kind, eps in budgets:
        cdp = results[f"{kind}/cdp/complete/{eps}"]["accuracy"]
        for topo in p["topologies"]:
            dec = results[f"{kind}/decor/{topo}/{eps}"]["accuracy"]
            ldp = results[f"{kind}/ldp/{topo}/{eps}"]["accuracy"]
            checks.append(
                {
                    "name": f"{kind} eps={eps} {topo}: DECOR > LDP (accuracy)",
                    "pass": dec > ldp,
                    "kind": "utility",
                    "detail": f"DECOR {dec:.4f}, LDP {ldp:.4f}",
                }
            )
            checks.append(
                {
                    "name": f"{kind} eps={eps} {topo}: CDP >= DECOR - {within} point",
                    "pass": cdp >= dec - within / 100,
                    "kind": "utility",
                    "detail": f"CDP {cdp:.4f}, DECOR {dec:.4f}",
                }
            )
            if topo == "torus":
                checks.append(
                    {
                        "name": f"{kind} eps={eps}: DECOR-torus within {within} point of CDP",
                        "pass": abs(cdp - dec) <= within / 100,
                        "kind": "utility",
                        "detail": f"|{cdp:.4f} - {dec:.4f}| = {abs(cdp - dec):.4f}",
                    }
                )
    for r in results.values():
        if r["budget"] == "legacy":
            ok = r["legacy_epsilon"] <= r["epsilon"] * (1 + 1e-6)
            what = f"legacy eps {r['legacy_epsilon']:.4g} <= {r['epsilon']:g}"
        else:
            ok = r["epsilon_accounted"] <= r["epsilon"] * (1 + 1e-6)
            what = f"accounted eps {r['epsilon_accounted']:.4g} <= {r['epsilon']:g}"
        checks.append(
            {
                "name": f"{r['budget']} {r['algorithm']} {r['topology']}: calibration",
                "pass": bool(ok),
                "detail": what,
                "kind": "accounting",
            }
        )
    for kind, label in (
        ("legacy", "paper budgets (" + LEGACY_LABEL + ")"),
        ("accounted", "correctly accounted (eps, 1e-5)"),
    ):
        eps_list = p["legacy_epsilons"] if kind == "legacy" else p["epsilons"]
        series = []
        for alg, topo in _methods(p["topologies"]):
            pts = [results[f"{kind}/{alg}/{topo}/{e}"] for e in eps_list]
            series.append(
                dict(
                    algorithm=alg,
                    topology=topo,
                    label=f"{alg.upper()} {topo}",
                    x=eps_list,
                    y=[r["accuracy"] for r in pts],
                    err=[r["accuracy_std"] for r in pts],
                )
            )
        _plot(
            out / f"fig1c_{kind}.png",
            series,
            xlabel="epsilon",
            ylabel="test accuracy",
            title=f"Fig 1c MNIST, {label}",
            logx=True,
            logy=False,
        )
    rows = [
        [
            r["budget"],
            f"{r['algorithm']} {r['topology']}",
            f"{r['epsilon']:g}",
            f"{r['lr']}/{r['clip']}",
            f"{r['sigma']:.4g}",
            f"{r['sigma_cor']:.4g}",
            f"{r['legacy_epsilon']:.3g}",
            accounted_cell(r),
            f"{r['accuracy']:.4f} +/- {r['accuracy_std']:.3f}",
        ]
        for r in results.values()
    ]
    md = "\n\n".join(
        [
            f"# decor-fig1c: MNIST MLP 784-128-10 (DECOR Fig 1c){' -- quick' if quick else ''}",
            f"Example-level: per-example clipping, batch {p['batch_size']} without replacement "
            f"(sampling rate {rate:.4g}), T = {p['steps']}, lr0/(1 + t/{p['lr_decay']:g}), "
            f"Dirichlet(10) split, seeds {p['seeds']}.",
            f"**Paper budgets** {p['legacy_epsilons']}: the reference code's per-step subsampled "
            f"value, ignoring T and delta -- {LEGACY_LABEL} (docs/accounting.md). Noise calibrated with that "
            "legacy accountant as the code does (smallest sigma_cdp on [C/1000, C/20] with sigma_cor "
            "<= C/10). The column 'accounted eps' gives the correctly composed (eps, 1e-5) of the "
            "same run (dp-accounting RDP, fixed-size sampling, replace-one), with the threat model "
            "it holds under in brackets: DECOR's against an external eavesdropper, LDP's against "
            "every other node, CDP's against an observer of the final model only.",
            f"**Correctly accounted budgets** {p['epsilons']}: calibrated by the library (composed "
            "over T, subsampled RDP); DECOR's pair: "
            + (
                "the code's rule (smallest sigma_cdp on linspace(sigma_cdp^CDP, sigma_ldp) with "
                "sigma_cor <= C/10), with the composed accountant."
                if p["accounted_decor_rule"] == "paper-grid"
                else "the library default (sigma_cdp = sqrt(2) sigma_cdp^CDP, sigma_cor solved); the "
                "code's rule picks a large sigma_cor that pays off only over many steps "
                "(Theorem 2's O(1/T^2) term), not in a 40-step quick run."
            ),
            (
                "(lr, C) at the accounted budgets: "
                + (
                    "tuned per method on the paper's grid (lr {0.5, 1, 2, 5} x C {0.5, 1, 1.5, 3, "
                    "5}, seed 1, T = 500; preset [hyper_accounted]) where the preset has them, "
                    "else (1, 1); see the lr/C column."
                    if p.get("accounted_hyper", "default") == "tuned"
                    else "(1, 1) for every method (untuned; `--set accounted_hyper=tuned` uses "
                    "per-method values tuned as the paper does)."
                )
            ),
            "![legacy](fig1c_legacy.png)",
            "![accounted](fig1c_accounted.png)",
            _table(
                [
                    "budget",
                    "method",
                    "eps",
                    "lr/C",
                    "sigma",
                    "sigma_cor",
                    "legacy eps",
                    "accounted eps",
                    "test accuracy",
                ],
                rows,
            ),
            labels_line(results.values()),
            "Expected (paper): DECOR matches CDP and beats LDP on every topology and budget; CDP-LDP "
            "gap almost 10 points at the smallest budget; DECOR-ring/torus within 1 point of CDP.",
            "## Checks",
            _checks_md(checks),
            f"Run time: {wall:.0f} s.",
        ]
    )
    summary = {
        "reproduction": "decor-fig1c",
        "quick": quick,
        "sampling_rate": rate,
        "legacy_label": LEGACY_LABEL,
        "results": list(results.values()),
        "checks": checks,
        "wall_s": wall,
    }
    return write_outputs(out, report_md=md, summary=summary)


REPRODUCTIONS = [
    Reproduction(
        name="decor-fig1c",
        paper="DECOR (ICML'24)",
        description="MNIST MLP, example level: legacy and correctly accounted budgets",
        run=run_fig1c,
        full_runtime=(
            "~30-40 min on one H100 (measured: 9-11.5 s per 1000-step run, 196 runs); ~2-2.5 h on 2"
            " CPU cores (measured: 36-49 s per 1000-step run)"
        ),
    ),
]
