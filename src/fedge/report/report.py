"""The report of one run, in Markdown and in self-contained HTML.

The pieces: :mod:`fedge.report.format` (number formats), :mod:`fedge.report.content` (what the
report says), :mod:`fedge.report.document` (the block list and its Markdown/HTML renderers).
"""

from __future__ import annotations

from pathlib import Path

from fedge.core.rundir_schema import PLOTS, REPORT_HTML, REPORT_MD
from fedge.experiment.storage import storage_error
from fedge.report.content import document, title
from fedge.report.document import to_html, to_markdown
from fedge.report.format import format_accuracy, format_bytes, format_duration, format_flops
from fedge.report.plots import plot_run
from fedge.report.runlog import load_run

__all__ = [
    "format_accuracy",
    "format_bytes",
    "format_duration",
    "format_flops",
    "render_report",
]


def render_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write ``plots/*.png``, ``report.md`` and ``report.html`` into a run directory.

    Works on runs still in progress (the report then says "incomplete (N rounds so far)"),
    so it can be re-run at any time; each call overwrites the previous report.

    Args:
        run_dir: a directory written by ``fedge run``.

    Returns:
        ``(report_md_path, report_html_path)``.

    Raises:
        NotARunDirError: ``run_dir`` is missing or has no ``metrics.jsonl``.
        RunDirError: a file in it is malformed.
        StorageError: the report cannot be written there (read-only, full), naming the file.
    """
    run = load_run(run_dir)
    md_path, html_path = run.path / REPORT_MD, run.path / REPORT_HTML
    try:
        plots = plot_run(run, run.path / PLOTS)
        blocks = document(run, plots)
        md_path.write_text(to_markdown(blocks, run.path), encoding="utf-8")
        html_path.write_text(to_html(blocks, title(run)), encoding="utf-8")
    except OSError as exc:  # a read-only or full run directory: one line naming the file
        raise storage_error(
            exc.filename or run.path,
            "write",
            exc,
            "the report is written into the run directory: make it writable, or copy the run "
            "to a writable place and run fedge report there",
        ) from None
    return md_path, html_path
