"""``--compare``, ``--curve`` and ``--curve-out`` of ``privdl account dpsgd|decor``.

``--compare`` lists every applicable accountant's epsilon side by side (labelled; the tightest
certified row marked ``*``); ``--curve`` prints the mechanism's (epsilon, delta) curve over
deltas 1e-10..1e-2 and its trade-off curve beta(alpha); ``--curve-out FILE.json|FILE.csv`` writes
both. With ``--json`` the rows and curves go into the JSON object (``compare``, ``curves``).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from privdl.errors import PrivacyError

#: The type I errors at which ``--curve`` prints the trade-off curve (all are on its grid).
PRINT_ALPHAS = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def compare_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The three options, as one decorator (keyword arguments compare, curve, curve_out)."""
    fn = click.option(
        "--curve-out",
        type=click.Path(dir_okay=False),
        default=None,
        help="Write the (epsilon, delta) and trade-off curves to FILE (.json or .csv).",
    )(fn)
    fn = click.option(
        "--curve",
        is_flag=True,
        help="Also print the privacy curves: epsilon over deltas 1e-10..1e-2 and the trade-off "
        "curve beta(alpha) (exact for mu-GDP, else a certified lower bound).",
    )(fn)
    return click.option(
        "--compare",
        is_flag=True,
        help="Also list every applicable accountant's epsilon side by side (labelled; the "
        "tightest certified one marked).",
    )(fn)


def check_curve_out(path: str | None) -> None:
    """Refuse a ``--curve-out`` that is neither .json nor .csv before computing anything."""
    if path is not None and Path(path).suffix.lower() not in (".json", ".csv"):
        raise PrivacyError(f"--curve-out must end in .json or .csv, got {path!r}")


def write_curves(path: str | Path, curves: dict[str, Any]) -> Path:
    """``curves`` (:func:`privdl.accounting.compare.privacy_curves`) as JSON, or as a long CSV
    with columns ``curve, x, y, accountant`` (``epsilon_delta``: x = delta, y = epsilon;
    ``tradeoff``: x = alpha, y = beta)."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(curves, indent=1, allow_nan=True) + "\n")
        return path
    ed, to = curves["epsilon_delta"], curves["tradeoff"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["curve", "x", "y", "accountant"])
        for d, e, name in zip(ed["deltas"], ed["epsilons"], ed["accountants"], strict=True):
            w.writerow(["epsilon_delta", repr(d), repr(e), name])
        for a, b in zip(to["alphas"], to["betas"], strict=True):
            w.writerow(["tradeoff", repr(a), repr(b), to["kind"]])
    return path


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def print_compare(rows: list[dict[str, Any]], title: str) -> None:
    """The rows as a table: accountant, epsilon, certified, tightest (``*``), note."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True)
    for col in ("accountant", "epsilon", "delta", "certified", "tightest", "note"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["accountant"], _fmt(r["epsilon"]), f"{r['delta']:.3g}",
                      "yes" if r["certified"] else ("NOMINAL" if r["epsilon"] is not None else "-"),
                      "*" if r["tightest"] else "", r["note"])  # fmt: skip
    Console().print(table)


def print_curves(curves: dict[str, Any]) -> None:
    """The (epsilon, delta) curve and the trade-off curve at :data:`PRINT_ALPHAS`."""
    from rich.console import Console
    from rich.table import Table

    mu = curves.get("mu")
    head = f"(epsilon, delta) curve{f', mu-GDP mu = {mu:.6g}' if mu is not None else ''}"
    ed = Table(title=head, show_header=True)
    for col in ("delta", "epsilon", "accountant"):
        ed.add_column(col)
    e = curves["epsilon_delta"]
    for d, eps, name in zip(e["deltas"], e["epsilons"], e["accountants"], strict=True):
        ed.add_row(f"{d:.3g}", _fmt(eps), name)
    t = curves["tradeoff"]
    to = Table(title=f"trade-off curve ({t['kind']})", show_header=True)
    to.add_column("alpha (type I error)")
    to.add_column("beta (smallest type II error)")
    for a, b in zip(t["alphas"], t["betas"], strict=True):
        if any(math.isclose(a, p, rel_tol=1e-9) for p in PRINT_ALPHAS):
            to.add_row(f"{a:.4g}", f"{b:.6g}")
    console = Console()
    console.print(ed)
    console.print(to)


def finish(
    out: dict[str, Any],
    *,
    as_json: bool,
    emit: Callable[[dict[str, Any], bool, str], None],
    title: str,
    rows: list[dict[str, Any]] | None,
    curves: dict[str, Any] | None,
    curve_out: str | None,
    show_curves: bool,
) -> None:
    """Print ``out`` (by ``emit``) with the comparison and curves, and write ``--curve-out``."""
    if curve_out is not None and curves is not None:
        out["curve_file"] = str(write_curves(curve_out, curves))
    if as_json:
        if rows is not None:
            out["compare"] = rows
        if curves is not None and show_curves:
            out["curves"] = curves
        emit(out, True, title)
        return
    emit(out, False, title)
    if rows is not None:
        print_compare(rows, f"{title}: every applicable accountant (* = tightest certified)")
    if curves is not None and show_curves:
        print_curves(curves)
