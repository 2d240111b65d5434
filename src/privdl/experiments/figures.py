"""Small pieces shared by the reproductions' figures: titles that fit, bars from zero with the
legend outside them, and log axes without the round-0 point.

Each is a pure function of matplotlib objects or arrays, so a test can check what a reader of the
saved PNG sees (the title inside the figure, the y axis from 0, no point at x <= 0 on a log axis)
without rendering a pixel.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Font sizes legible once a figure is printed at a paper's column or page width (the figures are
#: 3.5-7 inches wide: at that size 8 pt is the smallest text a journal accepts).
TITLE_SIZE = 9
LABEL_SIZE = 9
LEGEND_SIZE = 8


def wrap_title(fig: Any, ax: Any, title: str, *, fontsize: float = TITLE_SIZE) -> None:
    """Set ``ax``'s title, broken into lines that fit the figure's width (a ``\n`` in ``title``
    is kept as a break).

    An average character of the default sans-serif font is about 0.55 em wide; the budget is the
    figure's width, less a 4% margin, in characters of ``fontsize`` points.
    """
    width_pt = fig.get_figwidth() * 72.0 * 0.96
    chars = max(20, int(width_pt / (0.55 * fontsize)))
    lines = [w for part in title.split("\n") for w in (textwrap.wrap(part, chars) or [""])]
    ax.set_title("\n".join(lines), fontsize=fontsize)


def text_inside_figure(fig: Any, artist: Any, *, slack_px: float = 1.0) -> bool:
    """Whether ``artist`` (a title, a legend) lies inside the figure's canvas once drawn."""
    fig.canvas.draw()
    box = artist.get_window_extent(renderer=fig.canvas.get_renderer())
    canvas = fig.bbox
    return bool(
        box.x0 >= canvas.x0 - slack_px
        and box.x1 <= canvas.x1 + slack_px
        and box.y0 >= canvas.y0 - slack_px
        and box.y1 <= canvas.y1 + slack_px
    )


def bars_from_zero(ax: Any, values: Sequence[float], *, headroom: float = 0.08) -> None:
    """A bar chart's y axis from 0 to just above its largest finite value (a bar's height is
    then its value, as in the paper's bar charts)."""
    finite = [float(v) for v in values if np.isfinite(v)]
    top = max(finite) if finite else 1.0
    ax.set_ylim(0.0, top * (1.0 + headroom) if top > 0 else 1.0)


def legend_outside(ax: Any, *, fontsize: float = LEGEND_SIZE, ncol: int = 1) -> Any:
    """The legend right of the axes, where it covers no bar or curve (the saved image grows to
    hold it with ``bbox_inches="tight"``)."""
    return ax.legend(
        fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
        ncol=ncol, frameon=False,
    )  # fmt: skip


def positive_x(x: Sequence[float], *ys: Sequence[float]) -> tuple[np.ndarray, ...]:
    """The points with x > 0, for a log x axis: round 0 (0 bits sent) has no place on it, and
    shifting it to 1 bit would draw a point the run never had."""
    xa = np.asarray(x, dtype=float)
    keep = xa > 0
    return (xa[keep], *(np.asarray(y, dtype=float)[keep] for y in ys))
