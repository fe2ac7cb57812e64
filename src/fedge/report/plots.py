"""PNG plots of one run or several, drawn with matplotlib's Agg canvas (never ``pyplot``).
Design notes: docs/decisions.md#experiment-and-reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedge.report.runlog import CUM_BYTES, CUM_EFFECTIVE_FLOPS, SIM_TIME_TOTAL_S, RunLog

__all__ = ["FIGSIZE_IN", "PLOT_DPI", "plot_comparison", "plot_run"]

FIGSIZE_IN = (6.4, 4.0)  # -> 640 x 400 px at PLOT_DPI
PLOT_DPI = 100
_LOG_SPAN = 100.0  # max/min ratio above which an axis goes logarithmic
_MARKER_MAX = 40  # draw point markers when a line has at most this many points
_LINESTYLES = ("-", "--", "-.", ":")
_HEADROOM = 1.12  # top of a linear axis from zero: this times the highest value

_Line = tuple[str, Sequence[float], Sequence[float]]  # (legend label, xs, ys)


def _byte_unit(max_bytes: float) -> tuple[float, str]:
    """The decimal unit that keeps ``max_bytes`` readable: (divisor, name)."""
    for div, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if max_bytes >= div:
            return div, name
    return 1.0, "B"


def _wide_span(values: Sequence[float]) -> bool:
    pos = [v for v in values if v > 0]
    return len(pos) >= 2 and max(pos) / min(pos) > _LOG_SPAN and len(pos) == len(values)


def _new_axes(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=FIGSIZE_IN, dpi=PLOT_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    # Software=None drops the matplotlib version from the PNG, so equal plots give equal bytes.
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def _line_plot(
    path: Path,
    lines: Sequence[_Line],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    xscale: float = 1.0,
    yscale: float = 1.0,
    log_x: bool = False,
    log_y: bool = False,
    y_from_zero: bool = False,
    styles: Sequence[dict[str, Any]] = (),
) -> Path | None:
    """Draw ``lines`` (values divided by ``x/yscale``) into ``path``; None if nothing to draw.
    An x axis labelled "round" ticks at whole rounds; ``y_from_zero`` leaves headroom above
    the highest value (a constant line is not drawn on the top border); ``styles[i]`` overrides
    line i's matplotlib keywords."""
    lines = [ln for ln in lines if len(ln[1]) > 0]
    if not lines:
        return None
    fig, ax = _new_axes(title, xlabel, ylabel)
    if xlabel == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for i, (label, xs, ys) in enumerate(lines):
        style: dict[str, Any] = {
            "linestyle": _LINESTYLES[(i // 10) % len(_LINESTYLES)],  # 10 colours, then restyle
            "marker": "o" if len(xs) <= _MARKER_MAX else None,
            "markersize": 3,
            **(styles[i] if i < len(styles) else {}),
        }
        ax.plot([x / xscale for x in xs], [y / yscale for y in ys], label=label, **style)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    elif y_from_zero:
        top = max((y / yscale for _, _, ys in lines for y in ys), default=0.0)
        ax.set_ylim(0, top * _HEADROOM if top > 0 else 1.0)
    if len(lines) > 1 or lines[0][0]:
        ax.legend(fontsize="small")
    return _save(fig, path)


def _accuracy_lines(runs: Sequence[RunLog], x: str, *, named: bool) -> list[_Line]:
    out: list[_Line] = []
    for run in runs:
        xs, ys = run.series("test_accuracy", x=x)
        out.append((run.label if named else "test top-1", xs, [100 * y for y in ys]))
    return out


def _accuracy_vs(
    path: Path, runs: Sequence[RunLog], x: str, *, named: bool, title: str
) -> Path | None:
    """Accuracy against a cumulative cost (``CUM_BYTES`` in MB, or ``cum_client_flops``)."""
    lines = _accuracy_lines(runs, x, named=named)
    xs_all = [v for _, xs, _ in lines for v in xs]
    if x == CUM_BYTES:
        scale, xlabel = 1e6, "cumulative bytes, down + up (MB)"
    elif x == SIM_TIME_TOTAL_S:
        top = max(xs_all, default=0.0)
        scale, unit = (
            (3600.0, "h") if top >= 3 * 3600 else (60.0, "min") if top >= 180 else (1.0, "s")
        )
        xlabel = f"simulated time on the device fleet ({unit})"
    elif x == CUM_EFFECTIVE_FLOPS:
        scale, xlabel = 1.0, "cumulative client FLOPs, non-zero weights (dense runs: executed)"
    else:
        scale, xlabel = 1.0, "cumulative client FLOPs"
    return _line_plot(
        path,
        lines,
        title=title,
        xlabel=xlabel,
        ylabel="test accuracy (%)",
        xscale=scale,
        log_x=_wide_span(xs_all),
    )


def plot_run(run: RunLog, out_dir: str | Path) -> list[Path]:
    """Write the standard plots of one run into ``out_dir`` (created if needed).

    Writes ``accuracy.png`` (test accuracy vs round, top-5 too when logged),
    ``accuracy_vs_bytes.png`` (vs cumulative bytes down + up, MB), ``loss.png`` (test and,
    when logged, train loss), ``bytes.png`` (bytes down and up per round) and, when the run
    counted any client FLOPs, ``accuracy_vs_flops.png``; when it simulated time on a device
    fleet (``clients.profiles`` with the time model), ``accuracy_vs_time.png`` (vs cumulative
    simulated time). A plot with no data to draw (e.g. before the first evaluated round) is
    skipped.

    Returns:
        The paths written, in the order above.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{run.method} on {run.dataset} ({run.model})"
    written: list[Path | None] = []

    acc = _accuracy_lines([run], "round", named=False)
    r5, top5 = run.series("test_top5")
    acc.append(("test top-5", r5, [100 * y for y in top5]))
    written.append(
        _line_plot(
            out / "accuracy.png", acc, title=title, xlabel="round", ylabel="test accuracy (%)"
        )
    )
    written.append(
        _accuracy_vs(out / "accuracy_vs_bytes.png", [run], CUM_BYTES, named=False, title=title)
    )

    loss = [("test loss", *run.series("test_loss")), ("train loss", *run.series("train_loss"))]
    loss_vals = [v for _, _, ys in loss for v in ys]
    written.append(
        _line_plot(
            out / "loss.png",
            loss,
            title=title,
            xlabel="round",
            ylabel="loss",
            log_y=_wide_span(loss_vals),
        )
    )

    per_round = [("down", *run.series("bytes_down")), ("up", *run.series("bytes_up"))]
    byte_vals = [v for _, _, ys in per_round for v in ys]
    div, unit = _byte_unit(max(byte_vals, default=0.0))
    written.append(
        _line_plot(
            out / "bytes.png",
            per_round,
            title=f"{title}: bytes per round",
            xlabel="round",
            ylabel=f"bytes per round ({unit})",
            yscale=div,
            log_y=_wide_span(byte_vals),
            y_from_zero=True,
            # down wide and pale underneath, up dashed on top: equal counts show both
            styles=({"linewidth": 4.5, "alpha": 0.45}, {"linestyle": "--", "linewidth": 1.5}),
        )
    )

    if (run.total_client_flops or 0) > 0:
        written.append(
            _accuracy_vs(
                out / "accuracy_vs_flops.png", [run], "cum_client_flops", named=False, title=title
            )
        )
    if run.simulated_time:
        written.append(
            _accuracy_vs(
                out / "accuracy_vs_time.png", [run], SIM_TIME_TOTAL_S, named=False, title=title
            )
        )
    return [p for p in written if p is not None]


def plot_comparison(runs: Sequence[RunLog], out_dir: str | Path) -> list[Path]:
    """Overlay several runs: ``accuracy.png``, ``accuracy_vs_bytes.png``,
    ``accuracy_vs_flops.png`` (if any run counted FLOPs), ``accuracy_vs_effective_flops.png``
    (if any run is sparse and logged its non-zero FLOPs; dense runs are drawn at their executed
    FLOPs), ``accuracy_vs_time.png`` (if any run simulated time on a device fleet; the runs
    without it are left out) and ``peak_memory.png`` (bars, if any run measured client memory),
    written into ``out_dir``.

    Returns:
        The paths written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path | None] = [
        _line_plot(
            out / "accuracy.png",
            _accuracy_lines(runs, "round", named=True),
            title="test accuracy",
            xlabel="round",
            ylabel="test accuracy (%)",
        ),
        _accuracy_vs(
            out / "accuracy_vs_bytes.png",
            runs,
            CUM_BYTES,
            named=True,
            title="accuracy vs communication",
        ),
    ]
    if any((r.total_client_flops or 0) > 0 for r in runs):
        written.append(
            _accuracy_vs(
                out / "accuracy_vs_flops.png",
                runs,
                "cum_client_flops",
                named=True,
                title="accuracy vs client compute",
            )
        )
    if any(CUM_EFFECTIVE_FLOPS in row for r in runs for row in r.metrics):
        written.append(
            _accuracy_vs(
                out / "accuracy_vs_effective_flops.png",
                runs,
                CUM_EFFECTIVE_FLOPS,
                named=True,
                title="accuracy vs client compute (non-zero weights only)",
            )
        )
    timed = [r for r in runs if r.simulated_time]
    if timed:
        written.append(
            _accuracy_vs(
                out / "accuracy_vs_time.png",
                timed,
                SIM_TIME_TOTAL_S,
                named=True,
                title="accuracy vs simulated time",
            )
        )
    mem = [(r.label, r.peak_memory) for r in runs if r.peak_memory is not None]
    if mem:
        div, unit = _byte_unit(max(m for _, m in mem))
        fig, ax = _new_axes("client peak memory", "", f"peak memory ({unit})")
        ax.bar([lbl for lbl, _ in mem], [m / div for _, m in mem])
        ax.tick_params(axis="x", labelrotation=30 if len(mem) > 3 else 0)
        written.append(_save(fig, out / "peak_memory.png"))
    return [p for p in written if p is not None]
