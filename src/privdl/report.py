"""Reports from run records: a markdown table and PNG plots (never from live training).

Runs whose configs differ only in their seeds (``seed``, ``data_seed``) are repeats of one
experiment: the table shows their mean and sample standard deviation with the number of seeds,
and the plots their mean with a band of one standard deviation (``group=False`` keeps one row
and one line per run). Repeats that spent different budgets show the largest epsilon.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privdl.errors import ConfigError, PrivdlError
from privdl.records import (
    RecordsWarning,
    RunRecords,
    make_dir,
    missing_steps,
    seed_run_dirs,
    steps_text,
)
from privdl.report_privacy import privacy_curves_figure

#: Config keys that only pick random draws: runs differing only in these are repeats.
SEED_KEYS = ("seed", "data_seed")
#: Column names of the metrics: ``loss`` is the training objective at the average model and
#: ``accuracy`` its test accuracy (privdl.tasks).
HEADERS = {"loss": "train loss", "accuracy": "test accuracy", "optimality_gap": "optimality gap",
           "consensus_distance": "consensus distance", "epsilon": "epsilon spent"}  # fmt: skip
#: The file ``report --csv`` writes into the report's directory.
CSV_FILE = "metrics.csv"
#: Metrics plotted against the step when present, in this order (``epsilon``: the privacy
#: spent, from each row's privacy record).
PLOT_METRICS = ("loss", "accuracy", "optimality_gap", "loss_gap", "consensus_distance", "epsilon")
LOG_SCALE = {"loss_gap", "optimality_gap", "consensus_distance"}


def run_label(cfg: dict[str, Any]) -> str:
    """A short label of a run: the user's label, or algorithm and graph."""
    if cfg.get("label"):
        return str(cfg["label"])
    graph = "complete (W=J)" if _central(cfg) else cfg.get("graph", "?")
    if graph == "server":  # a federated run: clients, budgets, participation
        parts = [f"{cfg.get('clients', '?')} clients"]
        if cfg.get("budgets"):
            parts.append(f"budgets {cfg['budgets']}")
        elif cfg.get("epsilon") is not None:
            parts.append(f"eps {cfg['epsilon']:g} each")
        if cfg.get("clients_per_round"):
            parts.append(f"{cfg['clients_per_round']} a round")
        graph = ", ".join(parts)
    return f"{cfg.get('algorithm', '?')} / {graph}"


def _central(cfg: dict[str, Any]) -> bool:
    """Whether the run's noise is central (exact averaging over the complete graph, W = J)."""
    # heavy: the registry imports torch and every recipe; the report reads records without them
    from privdl.registry import recipe_for

    try:
        return getattr(recipe_for(cfg), "noise", None) == "central"
    except ConfigError:  # an algorithm registered by a module not loaded here
        return False


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell (no column break, no line break)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def distinct_labels(groups: list[list[dict[str, Any]]]) -> list[str]:
    """:func:`run_label` of each group, with the config values that tell apart groups sharing
    a label (``lr=0.05``; ``seed=2`` when repeats are shown one by one)."""
    labels = [run_label(g[0]["config"]) for g in groups]
    for label in set(labels):
        same = [i for i, x in enumerate(labels) if x == label]
        if len(same) < 2:
            continue
        cfgs = [groups[i][0]["config"] for i in same]
        keys = sorted({k for c in cfgs for k in c} - {"label"}, key=_field_order)
        differ = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in cfgs}) > 1]
        for i, c in zip(same, cfgs, strict=True):
            if differ:
                labels[i] = (
                    f"{label} ({', '.join(f'{k}={_short_value(c.get(k))}' for k in differ)})"
                )
    for label in set(labels):  # the same config (say a copy of a run): name the directories
        same = [i for i, x in enumerate(labels) if x == label]
        if len(same) > 1:
            for i in same:
                labels[i] = f"{label} [{Path(groups[i][0]['dir']).name}]"
    return labels


def _short_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _field_order(key: str) -> tuple[int, str]:
    """Config keys in the order of the configuration models (seed before data_seed)."""
    fields = _config_fields()
    return (fields.get(key, len(fields)), key)


@functools.cache
def _config_fields() -> dict[str, int]:
    # heavy: the registry imports torch and every recipe; the report reads records without them
    from privdl.registry import config_fields

    return {name: i for i, name in enumerate(config_fields())}


def privacy_text(priv: dict[str, Any] | None) -> str:
    """``eps=3.00 (delta=1e-05, secrdp+classic, eavesdropper, user-level)`` or ``non-private``."""
    if not priv:
        return "non-private"
    eps = priv.get("epsilon")
    # None: a non-finite epsilon (JSON null; records before schema version 2 wrote "inf")
    eps_s = f"{eps:.3g}" if isinstance(eps, float) else "non-finite" if eps is None else str(eps)
    if str(priv.get("notes", "")).startswith("largest of the"):  # federated: per client
        eps_s = f"{eps_s} (largest client)"
    tag = " NOMINAL" if priv.get("nominal") else ""
    return (
        f"eps={eps_s}{tag} (delta={priv.get('delta')}, {priv.get('accountant')}, "
        f"{priv.get('threat_model')}, {priv.get('unit')}-level, {priv.get('neighbouring')})"
    )


def load_runs(dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The records of each run in ``dirs``; a directory ``--seeds`` wrote stands for its runs."""
    runs = []
    expanded: list[str | Path] = []
    for d in dirs:
        repeats = [] if (Path(d) / "config.json").is_file() else seed_run_dirs(d)
        expanded.extend(repeats or [d])
    seen: set[Path] = set()
    for d in expanded:
        where = Path(d).resolve()
        if where in seen:
            warnings.warn(f"{d} is given twice; reported once", RecordsWarning, stacklevel=2)
            continue
        seen.add(where)
        rec = RunRecords(d)
        cfg = rec.config()
        rows, bad = rec.read_rows()
        if not rows:
            raise PrivdlError(f"{d} has no metrics yet")
        summary = rec.summary()
        if bad:
            warnings.warn(
                f"{rec.metrics_path}: {bad} unreadable line(s) skipped",
                RecordsWarning,
                stacklevel=2,
            )
        last = max(r["step"] for r in rows)
        if summary is not None and summary.get("steps_done") not in (None, last):
            warnings.warn(
                f"{rec.metrics_path} ends at step {last} but its summary.json at step "
                f"{summary.get('steps_done')}: the metrics are incomplete",
                RecordsWarning,
                stacklevel=2,
            )
        rows.sort(key=lambda r: r["step"])
        gaps = _gaps(rows, cfg)
        if gaps:
            warnings.warn(
                f"{rec.metrics_path} lacks the rows of step(s) {steps_text(gaps)} (lost to a "
                "cut or torn file before a resume): the curves skip them",
                RecordsWarning,
                stacklevel=2,
            )
        runs.append({"dir": str(d), "config": cfg, "rows": rows, "summary": summary,
                     "gaps": gaps})  # fmt: skip
    return runs


def _gaps(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> list[int]:
    """The evaluation steps up to a run's last row that have no row."""
    every, steps = cfg.get("eval_every"), cfg.get("steps")
    if not isinstance(every, int) or not isinstance(steps, int) or every < 1:
        return []
    last = rows[-1]["step"]
    return missing_steps({r["step"] for r in rows}, eval_every=every, steps=steps, upto=last)


def group_repeats(runs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Runs grouped by their config without :data:`SEED_KEYS`, in first-seen order. Runs with
    the same seeds are not independent repeats (say one run launched on 2 processes and once on
    one): the second with a seed already in its group starts another group."""
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for r in runs:
        key = {k: v for k, v in r["config"].items() if k not in SEED_KEYS}
        lists = groups.setdefault(json.dumps(key, sort_keys=True, default=str), [])
        home = next((g for g in lists if _seeds(r) not in {_seeds(x) for x in g}), None)
        if home is None:
            lists.append([r])
        else:
            home.append(r)
    return [g for lists in groups.values() for g in lists]


def _seeds(run: dict[str, Any]) -> tuple:
    return tuple(run["config"].get(k) for k in SEED_KEYS)


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _largest_budget(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The privacy record with the largest epsilon among ``rows`` (None: all non-private)."""
    present = [r["privacy"] for r in rows if r.get("privacy")]
    return max(present, key=_eps) if present else None


def _eps(priv: dict[str, Any]) -> float:
    eps = priv.get("epsilon")
    return float(eps) if isinstance(eps, int | float) else math.inf


def markdown_table(runs: list[dict[str, Any]], *, group: bool = True) -> str:
    """One row per run, or per group of repeats (mean ± sample std over ``seeds``)."""
    metrics = [
        m
        for m in ("loss", "accuracy", "optimality_gap", "consensus_distance")
        if any(m in r["rows"][-1] for r in runs)
    ]
    groups = group_repeats(runs) if group else [[r] for r in runs]
    repeats = any(len(g) > 1 for g in groups)
    head = "| run | steps | " + ("seeds | " if repeats else "")
    head += " | ".join(HEADERS.get(m, m) for m in metrics)
    head += " | privacy | complete |"
    sep = "|" + "---|" * (len(metrics) + 4 + repeats)
    lines = [head, sep]
    uneven = False
    for g, label in zip(groups, distinct_labels(groups), strict=True):
        lasts = [r["rows"][-1] for r in g]
        vals = []
        for m in metrics:
            xs = [x[m] for x in lasts if isinstance(x.get(m), float) and math.isfinite(x[m])]
            if not xs or len(xs) < len(lasts):
                vals.append("-" if not xs else f"{len(xs)}/{len(lasts)} finite")
            elif len(xs) == 1:
                vals.append(f"{xs[0]:.4g}")
            else:
                mean, std = _mean_std(xs)
                vals.append(f"{mean:.4g} ± {std:.2g}")
        steps = sorted({x.get("step") for x in lasts})
        steps_s = "/".join(map(str, steps))
        if len(g) > 1 and len(steps) > 1:
            steps_s, uneven = steps_s + " *", True
        done = sum(bool(r["summary"] and r["summary"].get("completed")) for r in g)
        done_s = "yes" if done == len(g) else ("no" if done == 0 else f"{done}/{len(g)}")
        diverged = sum(bool(x.get("diverged")) for x in lasts)
        if diverged:
            done_s = "diverged" if diverged == len(g) else f"{done_s}, {diverged} diverged"
        lines.append(
            f"| {_cell(label)} | {steps_s} | "
            + (f"{len(g)} | " if repeats else "")
            + " | ".join(vals)
            + f" | {privacy_text(_largest_budget(lasts))} | {done_s} |"
        )
    if uneven:
        lines += ["", "\\* the repeats stopped at different steps: their last values are averaged."]
    seeded = [
        label
        for g, label in zip(groups, distinct_labels(groups), strict=True)
        if any("from the seed" in str((r["rows"][-1].get("privacy") or {}).get("notes")) for r in g)
    ]
    if seeded:  # the records' key notes (privdl.privacy.KEY_NOTES), said where readers look
        lines += [
            "",
            f"Noise keys and sampling of {', '.join(_cell(x) for x in seeded)} derived from the "
            "seed: a reproducible simulation; whoever knows the seed can rebuild the noise, so "
            "the privacy guarantee holds only against an adversary who does not "
            "(`--key-source os` draws them from the OS).",
        ]
    return "\n".join(lines)


def _value(row: dict[str, Any], metric: str) -> Any:
    """``row[metric]``; ``epsilon`` is the privacy record's (None in a non-private row)."""
    if metric == "epsilon":
        return (row.get("privacy") or {}).get("epsilon")
    return row.get(metric)


def _curve(group: list[dict[str, Any]], metric: str) -> tuple[list, list, list]:
    """Steps every repeat has, with the mean and the sample std of ``metric`` over repeats."""
    per_run = [
        {x["step"]: v for x in r["rows"] if isinstance(v := _value(x, metric), float)}
        for r in group
    ]
    steps = sorted(set.intersection(*(set(p) for p in per_run)))
    stats = [_mean_std([p[t] for p in per_run]) for t in steps]
    return steps, [m for m, _ in stats], [s for _, s in stats]


def plot_runs(runs: list[dict[str, Any]], out: Path, *, group: bool = True) -> list[Path]:
    """One PNG per metric present: a line per run, or per group of repeats with a ±1 std band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group_repeats(runs) if group else [[r] for r in runs]
    paths = []
    labels = distinct_labels(groups)
    for metric in PLOT_METRICS:
        series = []
        for g, label in zip(groups, labels, strict=True):
            steps, mean, std = _curve(g, metric)
            if steps:
                label = " ".join(label.split()) + (f" ({len(g)} seeds)" if len(g) > 1 else "")
                series.append((label, steps, mean, std, len(g) > 1))
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, steps, mean, std, band in series:
            (line,) = ax.plot(steps, mean, label=label)
            if band:
                lo = [m - s for m, s in zip(mean, std, strict=True)]
                hi = [m + s for m, s in zip(mean, std, strict=True)]
                ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel("step")
        ax.set_ylabel(HEADERS.get(metric, metric.replace("_", " ")))
        if metric == "epsilon":  # each run's accountant, delta and threat model: the legend's
            ax.set_title(_epsilon_title(groups), fontsize=8)
        if metric in LOG_SCALE and any(y > 0 for s in series for y in s[2]):  # the means
            # a zero (the consensus distance at step 0: every node starts at one model) is
            # left out of a log axis rather than forcing a linear one
            ax.set_yscale("log", nonpositive="mask")
        ax.grid(alpha=0.3)
        if len(series) > 5:  # many runs: the legend beside the axes (the saved image grows)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        else:
            ax.legend(fontsize=8)
            fig.tight_layout()
        p = out / f"{metric}.png"
        fig.savefig(p, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)
    return paths


def _epsilon_title(groups: list[list[dict[str, Any]]]) -> str:
    """The labels of the epsilons plotted (delta, accountant, threat model, unit; NOMINAL)."""
    labels = []
    for g in groups:
        priv = _largest_budget([r["rows"][-1] for r in g])
        if priv:
            text = (
                f"delta={priv.get('delta')}, {priv.get('accountant')}, "
                f"{priv.get('threat_model')}, {priv.get('unit')}-level"
                + (", NOMINAL" if priv.get("nominal") else "")
            )
            if text not in labels:
                labels.append(text)
    return "; ".join(labels)


def flat_row(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A metrics row as flat columns: nested records joined with dots (``privacy.epsilon``),
    lists indexed (``client_epsilons.0``)."""
    out: dict[str, Any] = {}
    items = row.items() if isinstance(row, dict) else enumerate(row)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, dict | list):
            out.update(flat_row(value, f"{name}."))  # type: ignore[arg-type]
        else:
            out[name] = value
    return out


def write_csv(runs: list[dict[str, Any]], path: Path) -> Path:
    """One CSV of every run's metrics rows (``run``: its directory, ``label``: the report's
    label, then the flattened row); an empty cell is a value the row lacks or a non-finite
    number (JSON null)."""
    import csv

    labels = distinct_labels([[r] for r in runs])
    table = [
        {"run": r["dir"], "label": label, **flat_row(row)}
        for r, label in zip(runs, labels, strict=True)
        for row in r["rows"]
    ]
    columns = dict.fromkeys(["run", "label", "step", "timestamp", "wall_time", "schema_version"])
    for line in table:
        columns.update(dict.fromkeys(line))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
        writer.writeheader()
        for line in table:
            writer.writerow({k: "" if v is None else v for k, v in line.items()})
    return path


def make_report(
    dirs: list[str | Path], out: str | Path, *, group: bool = True, csv: bool = False
) -> Path:
    """Write ``report.md`` and PNG plots for the runs in ``dirs`` into ``out``; ``group`` merges
    repeats that differ only in their seeds (mean ± std); ``csv`` also writes every run's
    metrics rows into ``out/metrics.csv``."""
    return write_report(load_runs(dirs), out, group=group, csv=csv)


def write_report(
    runs: list[dict[str, Any]], out: str | Path, *, group: bool = True, csv: bool = False
) -> Path:
    """:func:`make_report` for runs already loaded (:func:`load_runs`)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PrivdlError(f"report --out {str(out)!r} is a file, not a directory")
    if (out / "config.json").is_file() and (out / "metrics.jsonl").exists():
        raise PrivdlError(
            f"report --out {str(out)!r} is a run's directory: write the report elsewhere"
        )
    make_dir(out)
    if csv:
        write_csv(runs, out / CSV_FILE)
    plots = plot_runs(runs, out, group=group)
    body = ["# privdl report", "", markdown_table(runs, group=group), ""]
    for r in runs:
        if r.get("gaps"):
            body += [f"**Gap**: {r['dir']} has no metrics rows at step(s) "
                     f"{steps_text(r['gaps'])} (lost before a resume).", ""]  # fmt: skip
    for p in plots:
        body.append(f"![{p.stem}]({p.name})")
    groups = group_repeats(runs) if group else [[r] for r in runs]
    entries = [
        (label, _largest_budget([r["rows"][-1] for r in g]))
        for g, label in zip(groups, distinct_labels(groups), strict=True)
    ]
    curves, lines = privacy_curves_figure(entries, out)  # runs recorded as mu-GDP
    if curves is not None:
        for line in [*lines, f"![privacy curves]({curves.name})"]:
            body += ["", line]
    path = out / "report.md"
    path.write_text("\n".join(body) + "\n")
    return path
