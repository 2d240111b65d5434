"""``privdl audit --suite``: every algorithm and threat model audited, one table and one figure
each (the preset ``privdl/presets/audit-suite.toml``, data like the reproductions' presets)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from privdl.audit.api import AuditResult, audit
from privdl.errors import ConfigError

__all__ = ["run_suite", "suite_table"]


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def suite_table(results: list[AuditResult]) -> list[str]:
    """The markdown table: each audit's lower bounds beside its accounted epsilon and label."""
    rows = [
        "| algorithm | threat model | accounted epsilon (accountant, unit, relation) | lower "
        "(clopper-pearson) | lower (gdp) | test | trials | within | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        acc = r.accounted
        label = f"{acc.get('accountant')}, {acc.get('unit')}, {acc.get('neighbouring')}"
        rows.append(
            f"| {r.algorithm} | {r.threat_model} | {_fmt(r.epsilon_accounted)} ({label}) | "
            f"{_fmt(r.epsilon_lower)} | {_fmt(r.epsilon_lower_gdp)} | {r.test} | {r.trials} | "
            f"{'yes' if r.within_accounted else 'NO'} | {r.seconds:.1f} |"
        )
    return rows


def run_suite(
    out: Path,
    *,
    scale: float = 1.0,
    confidence: float = 0.95,
    seed: int = 0,
    overwrite: bool = False,
) -> list[AuditResult]:
    """Run every audit of the preset (trials times ``scale``) and write ``out``/report.md,
    ``summary.json`` and one trade-off figure per audit; returns the results. An ``out`` that
    already holds a report is refused unless ``overwrite``."""
    from privdl.audit.plot import tradeoff_figure
    from privdl.experiments import load_preset
    from privdl.records import make_dir

    if not scale > 0:
        raise ConfigError(f"the trials scale must be > 0, got {scale}")
    if (out / "report.md").exists() and not overwrite:
        raise ConfigError(
            f"{out} already holds an audit report: choose another --out or --overwrite"
        )
    entries: list[dict[str, Any]] = list(load_preset("audit-suite")["audit"])
    make_dir(out)
    results = []
    for k, entry in enumerate(entries):
        entry = dict(entry)
        trials = max(64, int(round(entry.pop("trials", 20_000) * scale)))
        result = audit(entry.pop("algorithm"), trials=trials, confidence=confidence, seed=seed,
                       **entry)  # fmt: skip
        name = f"{k:02d}-{result.algorithm}-{result.threat_model.replace(':', '')}.png"
        tradeoff_figure(result, out / name)
        results.append(result)
    lines = [
        "# Audits: empirical lower bounds beside the accounted epsilon",
        "",
        f"Confidence {confidence:.0%}; seed {seed}; docs/auditing.md says what each audit runs "
        "and what its adversary sees.",
        "",
        *suite_table(results),
        "",
    ]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    summary = [r.to_dict() for r in results]
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return results
