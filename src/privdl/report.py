"""Reports from run records: a markdown table and PNG plots (never from live training)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privdl.errors import PrivdlError
from privdl.records import RunRecords

#: Metrics plotted against the step when present, in this order.
PLOT_METRICS = ("loss", "accuracy", "optimality_gap", "loss_gap", "consensus_distance")
LOG_SCALE = {"loss_gap", "optimality_gap", "consensus_distance"}


def run_label(cfg: dict[str, Any]) -> str:
    """A short label of a run: the user's label, or algorithm and graph."""
    if cfg.get("label"):
        return str(cfg["label"])
    graph = "complete (W=J)" if cfg.get("algorithm") == "cdp" else cfg.get("graph", "?")
    return f"{cfg.get('algorithm', '?')} / {graph}"


def privacy_text(priv: dict[str, Any] | None) -> str:
    """``eps=3.00 (delta=1e-05, secrdp+classic, eavesdropper, user-level)`` or ``non-private``."""
    if not priv:
        return "non-private"
    eps = priv.get("epsilon")
    eps_s = f"{eps:.3g}" if isinstance(eps, float) else str(eps)
    tag = " NOMINAL" if priv.get("nominal") else ""
    return (
        f"eps={eps_s}{tag} (delta={priv.get('delta')}, {priv.get('accountant')}, "
        f"{priv.get('threat_model')}, {priv.get('unit')}-level, {priv.get('neighbouring')})"
    )


def load_runs(dirs: list[str | Path]) -> list[dict[str, Any]]:
    runs = []
    for d in dirs:
        rec = RunRecords(d)
        cfg = rec.config()
        rows = list(rec.rows())
        if not rows:
            raise PrivdlError(f"{d} has no metrics yet")
        runs.append({"dir": str(d), "config": cfg, "rows": rows, "summary": rec.summary()})
    return runs


def markdown_table(runs: list[dict[str, Any]]) -> str:
    metrics = [
        m
        for m in ("loss", "accuracy", "optimality_gap", "consensus_distance")
        if any(m in r["rows"][-1] for r in runs)
    ]
    head = "| run | steps | " + " | ".join(metrics) + " | privacy | complete |"
    sep = "|" + "---|" * (len(metrics) + 4)
    lines = [head, sep]
    for r in runs:
        last = r["rows"][-1]
        vals = [f"{last[m]:.4g}" if isinstance(last.get(m), float) else "-" for m in metrics]
        done = "yes" if r["summary"] and r["summary"].get("completed") else "no"
        lines.append(
            f"| {run_label(r['config'])} | {last.get('step')} | "
            + " | ".join(vals)
            + f" | {privacy_text(last.get('privacy'))} | {done} |"
        )
    return "\n".join(lines)


def plot_runs(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per metric present, every run as one line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for metric in PLOT_METRICS:
        series = [
            (
                run_label(r["config"]),
                [(x["step"], x[metric]) for x in r["rows"] if isinstance(x.get(metric), float)],
            )
            for r in runs
        ]
        series = [(lab, pts) for lab, pts in series if pts]
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for lab, pts in series:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, label=lab)
        ax.set_xlabel("step")
        ax.set_ylabel(metric.replace("_", " "))
        if metric in LOG_SCALE and all(y > 0 for _, pts in series for _, y in pts):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = out / f"{metric}.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def make_report(dirs: list[str | Path], out: str | Path) -> Path:
    """Write ``report.md`` and PNG plots for the runs in ``dirs`` into ``out``."""
    runs = load_runs(dirs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_runs(runs, out)
    body = ["# privdl report", "", markdown_table(runs), ""]
    for p in plots:
        body.append(f"![{p.stem}]({p.name})")
    path = out / "report.md"
    path.write_text("\n".join(body) + "\n")
    return path
