"""``privacy-curves.png`` of ``privdl report``: the privacy curves of runs recorded as mu-GDP.

A run whose last privacy record carries ``mu`` (its mechanism composes to a Gaussian mechanism,
Dong, Roth and Su 2019) has exact curves: epsilon over delta (Balle and Wang 2018, Thm 8,
inverted) and the trade-off curve ``beta(alpha) = Phi(Phi^-1(1 - alpha) - mu)``. Both are drawn,
one line per run (or group of repeats); runs without ``mu`` are named in the report instead.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

#: The file name of the figure.
PRIVACY_CURVES = "privacy-curves.png"


def _mu(priv: dict[str, Any] | None) -> float | None:
    mu = (priv or {}).get("mu")
    if isinstance(mu, bool) or not isinstance(mu, int | float):
        return None
    return float(mu) if math.isfinite(mu) and mu >= 0 else None


def privacy_curves_figure(
    entries: list[tuple[str, dict[str, Any] | None]], out: Path
) -> tuple[Path | None, list[str]]:
    """Draw ``entries`` (label, last privacy record) that carry ``mu`` into ``out`` /
    :data:`PRIVACY_CURVES`; returns its path (None when no entry has mu: no figure) and the
    report.md lines that say what is drawn and which runs were skipped and why."""
    drawn = [(label, priv, mu) for label, priv in entries if (mu := _mu(priv)) is not None]
    if not drawn:
        return None, []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from privdl.accounting.compare import DEFAULT_ALPHAS, epsilon_delta_curve, tradeoff_curve

    deltas = np.logspace(-12, -1, 45)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, priv, mu in drawn:
        curve = epsilon_delta_curve(mu, deltas=deltas)
        (line,) = left.plot(curve["deltas"], curve["epsilons"], label=f"{label} (mu={mu:.3g})")
        eps, delta = (priv or {}).get("epsilon"), (priv or {}).get("delta")
        if isinstance(eps, int | float) and isinstance(delta, int | float):
            left.plot([delta], [eps], "o", color=line.get_color(), markersize=4)
        right.plot(DEFAULT_ALPHAS, tradeoff_curve(mu), color=line.get_color())
    left.set_xscale("log")
    left.set_xlabel("delta")
    left.set_ylabel("epsilon")
    left.set_title("(epsilon, delta): exact for mu-GDP (dot: recorded)")
    right.plot([0, 1], [1, 0], "--", color="grey", linewidth=0.8, label="perfect privacy")
    right.set_xlabel("alpha (type I error)")
    right.set_ylabel("beta (smallest type II error)")
    right.set_title("trade-off curve G_mu")
    right.set_aspect("equal")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    path = out / PRIVACY_CURVES
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    lines = [
        f"Privacy curves ({PRIVACY_CURVES}): the exact (epsilon, delta) and trade-off curves of "
        "the runs whose last privacy record is mu-GDP (`mu`)."
    ]
    skipped = [
        f"{label} ({'non-private' if not priv else 'no mu: not a Gaussian mechanism overall'})"
        for label, priv in entries
        if _mu(priv) is None
    ]
    if skipped:
        lines.append(f"Not in {PRIVACY_CURVES}: {'; '.join(skipped)}.")
    return path, lines
