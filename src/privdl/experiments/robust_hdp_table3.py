"""Robust-HDP Table 3 (Malekmohammadi, Yu & Cao, ICML 2024): closed-form aggregate noise.

``robust-hdp-table3``: NoiseAgg(w) of WeiAvg, DPFedAvg, minEps and the Oracle for Dist1..Dist9
(Eq. 3 and Eq. 7; docs/robust-hdp.md), the paper's values beside ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privdl.experiments import Reproduction, write_outputs
from privdl.experiments.robust_hdp import _plot, parse_overrides
from privdl.robust.table3 import EPS_LISTS_20, table3_row

PAPER_TABLE3 = {
    "WeiAvg": [1.02, 1.89, 0.92, 3.22, 4.58, 28.29, 9.85, 48.15, 34.91],
    "DPFedAvg": [1.27, 16.94, 16.28, 26.87, 25.64, 70.71, 18.50, 85.70, 43.20],
    "minEps": [4.68, 103.91, 103.91, 127.18, 103.91, 1868.45, 74.41, 241.37, 87.15],
    "Oracle": [0.27, 0.47, 0.07, 0.64, 0.39, 7.60, 2.25, 13.81, 5.93],
}
# cells our closed form does not match (smallest eps lists; Oracle Dist3 printed below its rounding)
TABLE3_EXCEPTIONS = {("DPFedAvg", 6), ("minEps", 6), ("minEps", 8), ("Oracle", 3)}


# --------------------------------------------------------------------------- Table 3
def run_table3(
    out_dir: Path,
    *,
    quick: bool,
    data_dir: str | None = None,
    device: str = "cpu",
    overrides: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Table 3 closed form (Eq. 3 and Eq. 7) for Dist1..Dist9, paper values beside ours.

    A closed form: ``device`` is ignored and no override is accepted."""
    parse_overrides(overrides, accepted=(), methods=())
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
    _plot(
        out_dir / "table3.png",
        ours,
        dists,
        ylabel="NoiseAgg (bars: ours)",
        log=True,
        paper={rule: list(v) for rule, v in PAPER_TABLE3.items()},
    )
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
            "Cells not expected within 2%: DPFedAvg Dist6 and minEps Dist6/Dist8 "
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


REPRODUCTIONS = [
    Reproduction(
        name="robust-hdp-table3",
        paper="Robust-HDP (ICML 2024)",
        description="Table 3: closed-form aggregate noise of WeiAvg, DPFedAvg, minEps, Oracle",
        run=run_table3,
        full_runtime="~15 s (same as quick)",
    ),
]
