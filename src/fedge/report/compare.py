"""Side-by-side comparison of runs: one table, overlaid plots.

Example (two short quick-start runs, two client learning rates):
    >>> import fedge
    >>> for lr in (0.1, 0.03):
    ...     _ = fedge.run("quickstart", overrides={"rounds": 2, "method.client_optimizer.lr": lr},
    ...                   out=f"runs/lr-{lr}")
    >>> cmp = compare_runs(["runs/lr-0.1", "runs/lr-0.03"], "compare-out", target_accuracy=0.6)
    >>> print(cmp.table_markdown())
    | run | method | model | dataset | rounds | final acc | best acc | bytes down | bytes up | bytes to 60.00% | client FLOPs | wall time |
    |---|---|---|---|---|---|---|---|---|---|---|---|
    | lr-0.1 | fedavg | mlp | digits | 2 | ...% | ...% | 4.42 MB | 4.42 MB | 4.42 MB | 1.74 GFLOP | ... s |
    | lr-0.03 | fedavg | mlp | digits | 2 | ...% | ...% | 4.42 MB | 4.42 MB | 4.42 MB | 1.74 GFLOP | ... s |
    >>> table = cmp.table_rich()      # a rich.table.Table: what `fedge compare` prints
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from fedge.core.errors import ConfigError
from fedge.report.format import format_accuracy, format_bytes, format_duration, format_flops
from fedge.report.plots import plot_comparison
from fedge.report.privacy import PRIVACY_COLUMNS, privacy_cells
from fedge.report.runlog import RunLog, load_run

__all__ = ["Comparison", "ComparisonWarning", "compare_runs"]


class ComparisonWarning(UserWarning):
    """The runs can be compared but perhaps should not be (different datasets)."""


@dataclass
class Comparison:
    """Runs side by side.

    Attributes:
        runs: the runs, in the order given, with distinct labels.
        target_accuracy: if set, the table shows bytes needed to first reach it.
        out_dir: where plots and ``comparison.md`` were written, or ``None``.
        plots: the PNGs written into ``out_dir``.
    """

    runs: list[RunLog]
    target_accuracy: float | None = None
    out_dir: Path | None = None
    plots: list[Path] = field(default_factory=list)

    def columns(self) -> list[str]:
        """Table headers; the target and memory columns only appear when they have content."""
        cols = [
            "run",
            "method",
            "model",
            "dataset",
            "rounds",
            "final acc",
            "best acc",
            "bytes down",
            "bytes up",
        ]
        if self.target_accuracy is not None:
            cols.append(f"bytes to {format_accuracy(self.target_accuracy)}")
        cols += ["client FLOPs", "wall time"]
        if any(r.sim_time_s is not None for r in self.runs):
            cols.append("simulated time")
        if any(r.peak_memory is not None for r in self.runs):
            cols.append("peak memory")
        return cols + self._privacy_columns()

    def _privacy_columns(self) -> list[str]:
        """The privacy columns some run has attack results for (``fedge attack``), in order."""
        have = set().union(*(privacy_cells(r.path) for r in self.runs)) if self.runs else set()
        return [c for c in PRIVACY_COLUMNS if c in have]

    def rows(self) -> list[list[str]]:
        """One formatted row per run, matching :meth:`columns`."""
        show_mem = any(r.peak_memory is not None for r in self.runs)
        show_sim = any(r.sim_time_s is not None for r in self.runs)
        out = []
        for r in self.runs:
            rounds = str(r.rounds_done)
            if not r.complete:
                planned = f" of {r.rounds_planned}" if r.rounds_planned is not None else ""
                rounds += f"{planned} (incomplete)"
            row = [
                r.label,
                r.method,
                r.model,
                r.dataset,
                rounds,
                format_accuracy(r.final_accuracy),
                format_accuracy(r.best_accuracy),
                format_bytes(r.total_bytes_down),
                format_bytes(r.total_bytes_up),
            ]
            if self.target_accuracy is not None:
                b = r.bytes_to_accuracy(self.target_accuracy)
                row.append("not reached" if b is None else format_bytes(b))
            row += [format_flops(r.total_client_flops), format_duration(r.wall_s)]
            if show_sim:
                row.append(format_duration(r.sim_time_s))
            if show_mem:
                row.append(format_bytes(r.peak_memory))
            cells = privacy_cells(r.path)
            row += [cells.get(c, "—") for c in self._privacy_columns()]
            out.append(row)
        return out

    def table_markdown(self) -> str:
        """The comparison as a Markdown table (no trailing newline)."""

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        cols = self.columns()
        lines = [line(cols), "|" + "|".join("---" for _ in cols) + "|"]
        return "\n".join(lines + [line(r) for r in self.rows()])

    def table_rich(self) -> Table:
        """The comparison as a ``rich.table.Table`` (for the CLI)."""
        table = Table(title="fedge runs")
        text_cols = {"run", "method", "model", "dataset"}
        for c in self.columns():
            table.add_column(c, justify="left" if c in text_cols else "right", no_wrap=c == "run")
        for r in self.rows():
            table.add_row(*r)
        return table


def _distinct_labels(runs: list[RunLog]) -> list[RunLog]:
    """Runs whose directory names collide get ``parent/name`` (then a ``#i`` suffix)."""
    counts = Counter(r.label for r in runs)
    out = [
        dataclasses.replace(r, name=f"{r.path.resolve().parent.name}/{r.label}")
        if counts[r.label] > 1
        else r
        for r in runs
    ]
    counts = Counter(r.label for r in out)
    seen: Counter[str] = Counter()
    for i, r in enumerate(out):
        if counts[r.label] > 1:
            seen[r.label] += 1
            out[i] = dataclasses.replace(r, name=f"{r.label}#{seen[r.label]}")
    return out


def compare_runs(
    run_dirs: Sequence[str | Path | RunLog],
    out_dir: str | Path | None = None,
    *,
    target_accuracy: float | None = None,
) -> Comparison:
    """Load runs and compare them.

    Args:
        run_dirs: run directories (or already-loaded :class:`RunLog`\\ s); incomplete runs are
            compared on the rounds they have.
        out_dir: where to write the overlaid plots (``accuracy.png``, ``accuracy_vs_bytes.png``,
            ``accuracy_vs_flops.png``, ``accuracy_vs_time.png``, ``peak_memory.png``) and
            ``comparison.md``; ``None``
            writes nothing (table only).
        target_accuracy: a fraction in (0, 1]; adds a "bytes to reach it" column.

    Raises:
        ConfigError: no runs, or ``target_accuracy`` out of range.
        NotARunDirError: a path is not a run directory.

    Warns:
        ComparisonWarning: the runs use different datasets.
    """
    if not run_dirs:
        raise ConfigError("compare_runs got no run directories; pass at least one")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ConfigError(
            f"target_accuracy is a fraction in (0, 1], got {target_accuracy!r}; for 80% pass 0.8"
        )
    runs = _distinct_labels([r if isinstance(r, RunLog) else load_run(r) for r in run_dirs])
    datasets = sorted({r.dataset for r in runs})
    if len(datasets) > 1:
        warnings.warn(
            f"comparing runs on different datasets ({', '.join(datasets)}); "
            "their accuracies are not directly comparable",
            ComparisonWarning,
            stacklevel=2,
        )
    cmp = Comparison(runs=runs, target_accuracy=target_accuracy)
    if out_dir is not None:
        cmp.out_dir = Path(out_dir)
        cmp.plots = plot_comparison(runs, cmp.out_dir)
        images = "\n\n".join(f"![{p.stem}]({p.name})" for p in cmp.plots)
        (cmp.out_dir / "comparison.md").write_text(
            f"# Comparison of {len(runs)} runs\n\n{cmp.table_markdown()}\n\n{images}\n",
            encoding="utf-8",
        )
    return cmp
