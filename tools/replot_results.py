"""Redraw the committed results' figures from the data beside them (``summary.json``), without
training: after a change to a reproduction's plotting code, the figures in ``experiments/results``
take the new form while every number stays the one the run recorded.

    python tools/replot_results.py [--results experiments/results]

What it redraws (each by the function ``privdl reproduce`` itself draws with):

* ``porter-a9a``, ``porter-mnist``: ``{a9a,mnist}_{dp,gc}.png`` from the curves in
  ``summary.json`` (:func:`privdl.experiments.porter.replot`), the seeds' mean with a band of
  +- one std where the summary keeps their spread (``curves_std``);
* ``robust-hdp-mnist`` (and its ``dist*-baselines`` reports), ``robust-hdp-fmnist``:
  ``accuracy.png`` from the cells' accuracies in ``summary.json``
  (:func:`privdl.experiments.robust_hdp.replot_table`).

Figures whose data was never committed (a curve the run did not keep) are left as they are; the
folder's README says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from privdl.experiments import porter, robust_hdp


def replot_all(results: Path) -> list[Path]:
    """Every figure this tool knows how to redraw under ``results``; returns the paths written."""
    written: list[Path] = []
    for name in ("porter-a9a", "porter-mnist"):
        if (results / name / "summary.json").is_file():
            written += porter.replot(results / name)
    for name in ("robust-hdp-mnist", "robust-hdp-fmnist"):
        folder = results / name
        for sub in [folder, *sorted(folder.glob("dist*-baselines"))]:
            if (sub / "summary.json").is_file():
                written.append(robust_hdp.replot_table(sub))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("experiments/results"))
    args = parser.parse_args()
    for path in replot_all(args.results):
        print(path)


if __name__ == "__main__":
    main()
