"""plot_run / plot_comparison write real PNGs of a sane size, without touching pyplot."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import matplotlib

from fedge.report import load_run, plot_comparison, plot_run
from fedge.report.plots import FIGSIZE_IN, PLOT_DPI

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which the PNG spec puts first."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_sane_png(path: Path) -> None:
    w, h = png_size(path)
    expected = (FIGSIZE_IN[0] * PLOT_DPI, FIGSIZE_IN[1] * PLOT_DPI)
    assert abs(w - expected[0]) <= 2 and abs(h - expected[1]) <= 2, (w, h)
    assert path.stat().st_size > 5_000  # axes, lines and text, not a blank canvas


def test_plot_run_writes_the_standard_pngs(make_run, tmp_path):
    pyplot_loaded = "matplotlib.pyplot" in sys.modules
    backend = matplotlib.rcParams._get("backend")
    paths = plot_run(load_run(make_run()), tmp_path / "plots")
    names = [p.name for p in paths]
    assert names == [
        "accuracy.png",
        "accuracy_vs_bytes.png",
        "loss.png",
        "bytes.png",
        "accuracy_vs_flops.png",
    ]
    for p in paths:
        assert_sane_png(p)
    # drawing went through FigureCanvasAgg: no pyplot import, the user's backend untouched
    assert ("matplotlib.pyplot" in sys.modules) == pyplot_loaded
    assert matplotlib.rcParams._get("backend") == backend


def test_no_flops_plot_without_flops(make_run, tmp_path):
    paths = plot_run(load_run(make_run(flops=0)), tmp_path / "plots")
    assert "accuracy_vs_flops.png" not in [p.name for p in paths]


def test_run_with_no_rounds_yet_gets_no_plots(make_run, tmp_path):
    path = make_run(complete=False)
    (path / "metrics.jsonl").write_text("")
    assert plot_run(load_run(path), tmp_path / "plots") == []


def test_plot_comparison_overlays_runs_and_draws_memory_bars(make_run, tmp_path):
    runs = [load_run(make_run("a", peak_bytes=10**7)), load_run(make_run("b"))]
    paths = plot_comparison(runs, tmp_path / "cmp")
    assert [p.name for p in paths] == [
        "accuracy.png",
        "accuracy_vs_bytes.png",
        "accuracy_vs_flops.png",
        "peak_memory.png",
    ]
    for p in paths:
        assert_sane_png(p)


def test_plot_comparison_draws_effective_flops_when_a_run_is_sparse(make_run, tmp_path):
    sparse = load_run(make_run("sparse", extra={"cum_client_flops_effective": 123.0}))
    dense = load_run(make_run("dense"))
    paths = plot_comparison([sparse, dense], tmp_path / "cmp")
    assert "accuracy_vs_effective_flops.png" in [p.name for p in paths]
    assert_sane_png(tmp_path / "cmp" / "accuracy_vs_effective_flops.png")


def test_round_axes_tick_whole_rounds_and_the_bytes_lines_stay_visible(
    make_run, tmp_path, monkeypatch
):
    import fedge.report.plots as plots

    figs = {}
    real = plots._save

    def keep(fig, path):  # noqa: ANN001, ANN202
        figs[path.name] = fig
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    four = [0.2, 0.4, 0.6, 0.8]  # 4 rounds: matplotlib's own ticks are 1, 1.5, 2, 2.5, ...
    plot_run(load_run(make_run(accuracies=four, extra={"bytes_up": 1_000_000})), tmp_path / "a")
    for name in ("accuracy.png", "loss.png", "bytes.png"):
        ax = figs[name].axes[0]
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), (name, ticks)
    ax = figs["bytes.png"].axes[0]  # down == up each round
    down, up = ax.get_lines()
    assert (down.get_label(), up.get_label()) == ("down", "up")
    assert list(down.get_ydata()) == list(up.get_ydata())
    # "up" drawn over "down" must not hide it: down is wider and up is dashed
    assert down.get_linewidth() >= 2 * up.get_linewidth() and up.get_linestyle() == "--"
    top = max(max(ln.get_ydata()) for ln in ax.get_lines())
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1.1 * top  # off the top border


def test_a_run_with_simulated_time_gets_accuracy_against_it(make_run, tmp_path):
    run = load_run(make_run(sim_time_s=90.0))
    paths = plot_run(run, tmp_path / "plots")
    assert paths[-1].name == "accuracy_vs_time.png"
    assert_sane_png(paths[-1])
    xs, ys = run.series("test_accuracy", x="sim_time_total_s")
    assert xs == [90.0, 270.0, 450.0] and ys == [0.2, 0.5, 0.875]  # evaluated rounds 1, 3, 5
    untimed = plot_run(load_run(make_run("b")), tmp_path / "plots-b")
    assert "accuracy_vs_time.png" not in [p.name for p in untimed]


def test_plot_comparison_draws_simulated_time_for_the_runs_that_have_it(make_run, tmp_path):
    runs = [load_run(make_run("a", sim_time_s=10.0)), load_run(make_run("b"))]
    paths = plot_comparison(runs, tmp_path / "cmp")
    assert "accuracy_vs_time.png" in [p.name for p in paths]
    assert "accuracy_vs_time.png" not in [
        p.name for p in plot_comparison(runs[1:], tmp_path / "cmp-b")
    ]
