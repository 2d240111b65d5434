"""The figure of an audit: the fitted test's observed (FPR, FNR) against the accountant's curve.

A mechanism that is (epsilon, delta)-DP admits no test below the line
``FNR >= max(0, 1 - delta - e^epsilon FPR, e^-epsilon (1 - delta - FPR))`` (Kairouz, Oh and
Viswanath 2015); one that is mu-GDP none below ``G_mu`` (Dong, Roth and Su 2022, Def. 2.7). The
observed points of a correct implementation lie above both (up to sampling error); a point well
below them is a test the accountant says cannot exist.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from privdl.accounting.compare import DEFAULT_ALPHAS, tradeoff_curve
from privdl.audit.api import AuditResult

__all__ = ["epsilon_delta_tradeoff", "tradeoff_figure"]


def epsilon_delta_tradeoff(epsilon: float, delta: float, alphas: np.ndarray) -> np.ndarray:
    """The smallest FNR at FPR ``alphas`` that (epsilon, delta)-DP allows."""
    a = np.asarray(alphas, float)
    e = math.exp(min(epsilon, 700.0))
    return np.maximum.reduce([np.zeros_like(a), 1 - delta - e * a, (1 - delta - a) / e])


def tradeoff_figure(result: AuditResult, path: str | Path) -> Path:
    """Write the trade-off figure of ``result`` to ``path`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alphas = np.asarray(DEFAULT_ALPHAS)
    fig, ax = plt.subplots(figsize=(5.2, 5.0))
    acc = result.accounted
    label = acc.get("accountant", "accountant")
    ax.plot(alphas, epsilon_delta_tradeoff(result.epsilon_accounted, result.delta, alphas),
            label=f"{label}: eps={result.epsilon_accounted:.3g}, delta={result.delta:.0e}")  # fmt: skip
    mu = acc.get("mu")
    if isinstance(mu, int | float) and math.isfinite(mu):
        ax.plot(alphas, tradeoff_curve(float(mu)), label=f"{label}: G_mu, mu={mu:.3g}")
    pts = np.asarray(result.tradeoff, float)
    game = result.one_run
    observed = (
        f"observed (the one-run score, {'guessed' if 'reference' in game else 'all'} canaries)"
        if game
        else "observed (fitted test, held-out trials)"
    )
    ax.plot(pts[:, 0], pts[:, 1], "o", markersize=3, label=observed)
    ax.plot([0, 1], [1, 0], "--", color="grey", linewidth=0.8, label="perfect privacy")
    ax.set_xlabel("FPR (type I error)")
    ax.set_ylabel("FNR (type II error)")
    title = (
        f"one-run audit of {result.algorithm} ({result.threat_model}), "
        f"{result.trials} canaries\nlower bound {result.epsilon_lower:.3g} (one-run, "
        f"{game['correct']} of {game['guesses']} guesses right)"
        if game
        else f"audit of {result.algorithm} ({result.threat_model}), {result.trials} trials\n"
        f"lower bound {result.epsilon_lower:.3g} (clopper-pearson), "
        f"{result.epsilon_lower_gdp:.3g} (gdp)"
    )
    ax.set_title(title, fontsize=9)
    ax.set_aspect("equal")
    ax.legend(fontsize=7, loc="upper right")
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
