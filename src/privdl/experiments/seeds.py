"""Mean +- std over seeds for the reproductions that repeat a run on several seeds (PORTER
Figs 2-3, the PrivSGP-VR sweeps of Figs 6-10).

Pure functions of lists of numbers or of curves (a curve: a list of points, one dict of metrics
each, all seeds evaluated at the same iterations). The spread is the sample standard deviation
(ddof = 1) over the seeds; with one seed it is None, so a report prints the number alone and a
figure draws no band, and a one-seed summary keeps the numbers of the run itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean over seeds and the sample std (ddof 1; None for one seed). One seed's mean is
    its value itself (no arithmetic on it)."""
    if not values:
        raise ValueError("mean_std needs at least one value")
    if len(values) == 1:
        return float(values[0]), None
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1))


def mean_curve(
    curves: Sequence[Sequence[dict[str, Any]]], metrics: Sequence[str], *, x: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Point by point over seeds: the mean curve (``x`` and every metric) and its std curve
    (None for one seed). The seeds' curves must share their ``x`` values."""
    first = curves[0]
    for c in curves[1:]:
        if [p[x] for p in c] != [p[x] for p in first]:
            raise ValueError(f"the seeds' curves are evaluated at different {x!r} values")
    if len(curves) == 1:
        return [{x: p[x], **{m: p[m] for m in metrics}} for p in first], None
    means, stds = [], []
    for i, p in enumerate(first):
        row, spread = {x: p[x]}, {x: p[x]}
        for m in metrics:
            row[m], spread[m] = mean_std([c[i][m] for c in curves])
        means.append(row)
        stds.append(spread)
    return means, stds


def pm(mean: float, std: float | None, fmt: str = ".4f") -> str:
    """``mean +- std`` for a report (the mean alone for one seed)."""
    return f"{mean:{fmt}}" if std is None else f"{mean:{fmt}} +- {std:{fmt}}"
