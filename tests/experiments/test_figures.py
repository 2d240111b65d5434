"""The reproductions' figures in the paper's form (issue 34): titles inside the figure, bar charts
from 0 with the legend off the bars, no round-0 point on a log bits axis, Fig. 7 as curves per K.
Each test draws with the function ``privdl reproduce`` draws with and inspects the figure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from privdl.experiments import decor, porter, privsgp, robust_hdp  # noqa: E402
from privdl.experiments.figures import positive_x, text_inside_figure, wrap_title  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


@pytest.fixture
def figures(monkeypatch) -> list:
    """The figures the plotting functions close, kept open for the test to inspect."""
    kept: list = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        real_close(fig)


def test_a_long_title_is_wrapped_to_fit_and_would_not_fit_unwrapped() -> None:
    title = f"Fig 1a least squares, {decor.SHORT_CAPTION} and some more words to be sure"
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.set_title(title, fontsize=9)
    assert not text_inside_figure(fig, ax.title)  # the check can fail: this is the clipped title
    wrap_title(fig, ax, title)
    assert text_inside_figure(fig, ax.title)
    assert ax.get_title().replace("\n", " ") == title
    plt.close(fig)


def test_decor_fig1_title_fits_inside_the_figure(figures, tmp_path) -> None:
    series = [
        dict(algorithm="cdp", topology="complete", label="CDP complete", x=[1, 10], y=[5, 0.1])
    ]
    decor._plot(
        tmp_path / "f.png", series, xlabel="epsilon", ylabel="gap",
        title=f"Fig 1a least squares\n{decor.SHORT_CAPTION}",
    )  # fmt: skip
    (fig,) = figures
    assert text_inside_figure(fig, fig.axes[0].title)
    assert (tmp_path / "f.png").is_file()


def test_robust_hdp_bars_start_at_zero_with_the_legend_off_the_bars(figures, tmp_path) -> None:
    series = {"robust-hdp": [91.1, 90.1], "weiavg": [90.2, 89.2]}
    paper = {"robust-hdp": [89.8, 90.7], "weiavg": [90.1, 88.3]}
    robust_hdp._plot(tmp_path / "a.png", series, ["Dist1", "Dist2"], ylabel="acc %", paper=paper)
    (fig,) = figures
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert low == 0.0 and 91.1 <= high <= 100.0
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the axes: covers no bar


def test_committed_robust_hdp_figure_redraws_from_its_summary(figures, tmp_path) -> None:
    shutil.copytree(RESULTS / "robust-hdp-mnist" / "dist2-baselines", tmp_path / "d2")
    robust_hdp.replot_table(tmp_path / "d2")
    (fig,) = figures
    heights = sorted(p.get_height() for p in fig.axes[0].patches)
    accs = json.loads((tmp_path / "d2" / "summary.json").read_text())["results"]
    assert heights == pytest.approx(sorted(r["Dist2"]["accuracy"] for r in accs.values()))
    assert fig.axes[0].get_ylim()[0] == 0.0


def test_robust_hdp_bars_carry_the_std_over_seeds_where_there_are_several(
    figures, tmp_path
) -> None:
    cell = {"accuracy": 90.0, "accuracy_seeds": [89.0, 91.0], "accuracy_std": 1.0}
    paper = {"robust-hdp": [89.83] * 9}
    robust_hdp._plot_table(
        tmp_path / "a.png", results={"robust-hdp": {"Dist1": cell}}, paper=paper,
        methods=["robust-hdp"], dists=["Dist1"],
    )  # fmt: skip
    (fig,) = figures
    ax = fig.axes[0]
    caps = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(caps) == 1
    (segments,) = caps[0].lines[2]
    (low, high) = segments.get_segments()[0][:, 1]
    assert (low, high) == pytest.approx((89.0, 91.0))
    assert "std over seeds" in ax.get_ylabel()


def test_positive_x_drops_round_zero_and_nothing_else() -> None:
    x, y = positive_x([0, 10, 20], [3.0, 2.0, 1.0])
    assert list(x) == [10.0, 20.0] and list(y) == [2.0, 1.0]


def test_porter_bits_panel_has_no_point_at_zero_bits(figures, tmp_path) -> None:
    shutil.copytree(RESULTS / "porter-a9a", tmp_path / "p", ignore=shutil.ignore_patterns("tuning"))
    porter.replot(tmp_path / "p")
    curves = json.loads((tmp_path / "p" / "summary.json").read_text())["curves"]
    dp = figures[0]
    bits_ax = dp.axes[1]
    assert bits_ax.get_xscale() == "log"
    for line in bits_ax.get_lines():
        xs = line.get_xdata()
        assert min(xs) > 0
    smallest = min(min(b for b in c["bits"] if b > 0) for c in curves.values())
    assert min(min(line.get_xdata()) for line in bits_ax.get_lines()) == smallest
    assert text_inside_figure(dp, dp._suptitle)


def test_ksweep_curves_per_k_and_nothing_without_curves(figures, tmp_path) -> None:
    def run(k: int, points: int) -> dict:
        curve = [
            {"k": round(k * i / points), "loss": 2.0 - i / points, "accuracy": 0.1 + i / points / 2}
            for i in range(points + 1)
        ]
        return {"K": k, "curve": curve, "final": curve[-1]}

    assert not privsgp.ksweep_curves_plot(tmp_path / "c.png", {"10": run(10, 1)}, k_star=10)
    assert not (tmp_path / "c.png").exists()
    results = {str(k): run(k, 4) for k in (5, 10, 20)}
    assert privsgp.ksweep_curves_plot(tmp_path / "c.png", results, k_star=10)
    (fig,) = figures
    loss_ax, acc_ax = fig.axes
    assert [max(line.get_xdata()) for line in loss_ax.get_lines()] == [5, 10, 20]
    assert [line.get_label() for line in acc_ax.get_lines()] == ["K = 5", "K = 10 (K*)", "K = 20"]


def test_committed_porter_figure_draws_the_seeds_band(figures, tmp_path) -> None:
    """The committed 3-seed a9a figure: each curve is the seeds' mean (the summary's curve) with
    one band around it, whose top at the last round is mean + std from the summary."""
    from matplotlib.collections import PolyCollection

    shutil.copytree(RESULTS / "porter-a9a", tmp_path / "p", ignore=shutil.ignore_patterns("tuning"))
    porter.replot(tmp_path / "p")
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert len(summary["facts"]["seeds"]) >= 3
    dp = figures[0]
    acc_ax = dp.axes[2]
    bands = [c for c in acc_ax.collections if isinstance(c, PolyCollection)]
    labels = [line.get_label().replace("NOMINAL eps=", "eps=") for line in acc_ax.get_lines()]
    assert sorted(labels) == sorted(
        k for k in summary["curves"] if k.startswith(("PORTER-DP", "SoteriaFL"))
    )
    assert len(bands) == len(labels)
    for band, label in zip(bands, labels, strict=True):
        top = band.get_paths()[0].vertices[:, 1].max()
        mean = summary["curves"][label]["accuracy"]
        std = summary["curves_std"][label]["accuracy"]
        assert top == pytest.approx(max(m + s for m, s in zip(mean, std, strict=True)))
    assert "mean +- std over 3 seeds" in dp._suptitle.get_text()
    assert text_inside_figure(dp, dp._suptitle)


def test_ksweep_curves_draw_a_band_where_there_are_seeds(figures, tmp_path) -> None:
    curve = [{"k": k, "loss": 1.0, "accuracy": 0.5} for k in (0, 5, 10)]
    spread = [{"k": k, "loss": 0.1, "accuracy": 0.02} for k in (0, 5, 10)]
    results = {"10": {"K": 10, "curve": curve, "curve_std": spread, "seeds": 3}}
    results["20"] = {"K": 20, "curve": curve}  # one seed: no band
    assert privsgp.ksweep_curves_plot(tmp_path / "c.png", results, k_star=10)
    (fig,) = figures
    loss_ax, acc_ax = fig.axes
    assert len(loss_ax.collections) == len(acc_ax.collections) == 1
    assert "mean +- std over 3 seeds" in fig._suptitle.get_text()


@pytest.mark.parametrize("folder", ["porter-a9a", "porter-mnist"])
def test_porter_legend_is_under_the_panels_off_every_curve(figures, tmp_path, folder) -> None:
    """One legend for the three panels, in a strip below them: inside the accuracy panel it
    covered the curves (porter-mnist, eps = 0.1). Every curve keeps its label in it."""
    (tmp_path / "p").mkdir()
    shutil.copy(RESULTS / folder / "summary.json", tmp_path / "p")
    porter.replot(tmp_path / "p")
    for fig in figures:
        fig.canvas.draw()
        assert all(ax.get_legend() is None for ax in fig.axes)
        (legend,) = fig.legends
        box = legend.get_window_extent()
        lowest = min(ax.get_tightbbox().y0 for ax in fig.axes)  # tick labels and axis titles
        assert box.y1 <= lowest and box.y0 >= 0  # under every panel, inside the figure
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1
        names = [t.get_text() for t in legend.get_texts()]
        assert names == [line.get_label() for line in fig.axes[2].get_lines()]


def test_decor_fig1a_figures_draw_the_std_of_both_gaps(figures, tmp_path) -> None:
    """Both Fig 1a figures, redrawn from the committed four-seed summary: every point carries
    error bars of +- 1 std over the seeds, the code's gap and the training-loss gap alike."""
    summary = json.loads((RESULTS / "decor-fig1a" / "summary.json").read_text())
    results = {
        f"{r['algorithm']}/{r['topology']}/{r['variant']}/{r['epsilon']}": r
        for r in summary["results"]
    }
    epsilons = sorted({r["epsilon"] for r in summary["results"]})
    topologies = ["complete", "torus", "ring"]
    decor.fig1a_figures(tmp_path, results, epsilons=epsilons, topologies=topologies)
    assert [fig.axes[0].get_ylabel() for fig in figures] == [
        "optimality gap (code's metric)",
        "L(xbar) - L*",
    ]
    for fig, metric in zip(figures, ("gap", "loss_gap"), strict=True):
        ax = fig.axes[0]
        bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
        assert [b.get_label() for b in bars] == [
            "CDP complete", "DECOR complete", "DECOR torus", "DECOR ring",
            "LDP complete", "LDP torus", "LDP ring",
        ]  # fmt: skip
        for bar in bars:
            alg, topo = bar.get_label().split()
            (segments,) = bar.lines[2]
            for eps, seg in zip(epsilons, segments.get_segments(), strict=True):
                r = results[f"{alg.lower()}/{topo}/ours/{eps}"]
                low, high = seg[:, 1]
                assert high - r[metric] == pytest.approx(r[metric + "_std"], rel=1e-9)
                assert r[metric] - low == pytest.approx(r[metric + "_std"], rel=1e-9)
