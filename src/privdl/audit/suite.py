"""``privdl audit --suite``: every algorithm and threat model audited, one table and one figure
each (the preset ``privdl/presets/audit-suite.toml``, data like the reproductions' presets).

Each entry has a ``kind`` (:data:`KINDS`): independent trials with gradient canaries
(``multi-run``), input canaries of the gossip family (``example``), one-run audits
(``one-run``), known-position canaries (``known-position``), PrivSGP with gradient canaries and
PrivSGP / PrivSGP-VR with input canaries (``privsgp``), and mislabelled images in a shared CNN
(``cnn``); ``kinds`` chooses which run (:data:`DEFAULT_KINDS` by default)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from privdl.audit.api import AuditResult, audit
from privdl.errors import ConfigError

__all__ = ["DEFAULT_KINDS", "KINDS", "accounted_label", "run_suite", "suite_table"]

#: The kinds of audit in the preset, and those run by default (``cnn`` trains a CNN: slower).
KINDS = ("multi-run", "example", "one-run", "known-position", "privsgp", "cnn")
DEFAULT_KINDS = ("multi-run", "example", "one-run", "known-position", "privsgp")


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def accounted_label(r: AuditResult) -> str:
    """The accounted epsilon's label: accountant, privacy unit, neighbouring relation, threat
    model, delta."""
    acc = r.accounted
    return (
        f"{acc.get('accountant')}, {acc.get('unit')}, {acc.get('neighbouring')}, "
        f"{acc.get('threat_model')}, delta {r.delta:g}"
    )


def _canary(r: AuditResult) -> str:
    kind = str(r.canary["kind"])
    return kind.split(" (")[0] + (", black box" if "black box" in kind else "")


def _size(r: AuditResult) -> str:
    game = r.one_run
    if not game:
        return f"{r.trials} trials"
    if "reference" in game:  # gossip: half the canaries fit the test, half are guessed
        return (
            f"{game['canaries'] + game['reference']} canaries ({game['canaries']} guessed), one run"
        )
    return f"{game['canaries']} canaries, one run"


def suite_table(results: list[AuditResult], kinds: list[str] | None = None) -> list[str]:
    """The markdown table: each audit's lower bounds beside its accounted epsilon and label
    (``kinds``: each result's kind of audit, a column when given)."""
    head = "| kind " if kinds is not None else ""
    rows = [
        f"{head}| algorithm | threat model | canary | accounted epsilon (accountant, unit, "
        "relation, threat model, delta) | lower (clopper-pearson or one-run) | lower (gdp) | "
        "confidence | test | size | within | seconds |",
        ("|---" if kinds is not None else "") + "|---" * 11 + "|",
    ]
    for k, r in enumerate(results):
        kind = f"| {kinds[k]} " if kinds is not None else ""
        rows.append(
            f"{kind}| {r.algorithm} | {r.threat_model} | {_canary(r)} | "
            f"{_fmt(r.epsilon_accounted)} ({accounted_label(r)}) | {_fmt(r.epsilon_lower)} | "
            f"{_fmt(r.epsilon_lower_gdp)} | {r.confidence:.0%} | {r.test} | {_size(r)} | "
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
    kinds: tuple[str, ...] | None = None,
) -> list[AuditResult]:
    """Run the audits of the preset whose kind is in ``kinds`` (default :data:`DEFAULT_KINDS`;
    trials and a one-run entry's canaries times ``scale``) and write ``out``/report.md,
    ``summary.json`` (each audit's ``to_dict`` with its ``kind`` and accounted ``label``) and
    one trade-off figure per audit; returns the results. An ``out`` that already holds a report
    is refused unless ``overwrite``."""
    from privdl.audit.plot import tradeoff_figure
    from privdl.experiments import load_preset
    from privdl.records import make_dir

    if not scale > 0:
        raise ConfigError(f"the trials scale must be > 0, got {scale}")
    if (out / "report.md").exists() and not overwrite:
        raise ConfigError(
            f"{out} already holds an audit report: choose another --out or --overwrite"
        )
    chosen = DEFAULT_KINDS if kinds is None else tuple(kinds)
    unknown = sorted(set(chosen) - set(KINDS))
    if unknown or not chosen:
        raise ConfigError(f"suite kinds are {', '.join(KINDS)}; got {', '.join(unknown) or 'none'}")
    entries: list[dict[str, Any]] = [
        dict(e) for e in load_preset("audit-suite")["audit"]
        if e.get("kind", "multi-run") in chosen
    ]  # fmt: skip
    make_dir(out)
    results, kind_of = [], []
    for k, entry in enumerate(entries):
        kind = entry.pop("kind", "multi-run")
        trials = max(64, int(round(entry.pop("trials", 20_000) * scale)))
        if "canaries" in entry:  # one run: the canaries scale as the trials do
            entry["canaries"] = max(40, int(round(entry["canaries"] * scale)))
        result = audit(entry.pop("algorithm"), trials=trials, confidence=confidence, seed=seed,
                       **entry)  # fmt: skip
        name = f"{k:02d}-{kind}-{result.algorithm}-{result.threat_model.replace(':', '')}.png"
        tradeoff_figure(result, out / name)
        results.append(result)
        kind_of.append(kind)
    lines = [
        "# Audits: empirical lower bounds beside the accounted epsilon",
        "",
        f"Confidence {confidence:.0%}; seed {seed}; docs/auditing.md says what each audit runs "
        "and what its adversary sees.",
        "",
        *suite_table(results, kind_of),
        "",
    ]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    summary = [
        {"kind": kind, "label": accounted_label(r), **r.to_dict()}
        for kind, r in zip(kind_of, results, strict=True)
    ]
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return results
