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
Accuracy runs (a9a, MNIST) are not part of this reproduction yet.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from privdl.experiments import Reproduction, write_outputs

PS = (0.2, 0.4, 0.6, 0.8, 1.0)
METHODS = ("ldp", "decor_scalar", "design", "whisper", "cdp")


def run(out: Path, *, quick: bool = False) -> dict[str, Any]:
    """Write report.md and summary.json into ``out``."""
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
    report = _report(rows, n=n, epsilon=epsilon, delta=delta, steps=steps)
    summary = {"setting": {"n": n, "epsilon": epsilon, "delta": delta, "steps": steps,
                           "seeds": list(seeds)}, "rows": rows}  # fmt: skip
    return write_outputs(out, report_md=report, summary=summary)


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
    return "\n".join(lines) + "\n"


REPRODUCTIONS = [
    Reproduction(
        name="noise-design",
        paper="Whisper D-SGD",
        description="Residual noise of LDP, DECOR scalar, edge-optimized, Whisper, CDP",
        run=run,
        full_runtime="about 7 minutes on 2 idle cores",
    )
]
