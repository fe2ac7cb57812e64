"""Reading run directories (:func:`load_run`) and turning them into plots (:func:`plot_run`),
reports (:func:`render_report`) and comparisons (:func:`compare_runs`).
"""

from fedge.report.compare import Comparison, ComparisonWarning, compare_runs
from fedge.report.plots import plot_comparison, plot_run
from fedge.report.report import (
    format_accuracy,
    format_bytes,
    format_duration,
    format_flops,
    render_report,
)
from fedge.report.runlog import (
    CUM_BYTES,
    CUM_EFFECTIVE_FLOPS,
    NotARunDirError,
    RunDirError,
    RunLog,
    RunLogWarning,
    load_run,
)

__all__ = [
    "CUM_BYTES",
    "CUM_EFFECTIVE_FLOPS",
    "Comparison",
    "ComparisonWarning",
    "NotARunDirError",
    "RunDirError",
    "RunLog",
    "RunLogWarning",
    "compare_runs",
    "format_accuracy",
    "format_bytes",
    "format_duration",
    "format_flops",
    "load_run",
    "plot_comparison",
    "plot_run",
    "render_report",
]
