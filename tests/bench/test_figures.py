"""A run directory's figures, checked against hand-computed values on hand-written logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedge.bench.figures import (
    communication_reduction,
    few_seeds_note,
    mean_over_seeds,
    mib,
    read_run_logs,
    run_figures,
)


def _run(
    tmp_path: Path, name: str, *, accuracy: float, wall: tuple[float, float], peak: int | None
) -> Path:
    d = tmp_path / name
    d.mkdir()
    summary = {
        "final_test_accuracy": accuracy,
        "trainable_fraction": 0.25,
        "total_client_flops": 8000,
        "rounds": 2,
        "client_tensor_peak_bytes": peak,
        "client_peak_bytes": None,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    lines = [
        {"round": 1, "clients": 4, "bytes_down": 400, "bytes_up": 200, "client_wall_s": wall[0]},
        {"round": 2, "clients": 4, "bytes_down": 800, "bytes_up": 120, "client_wall_s": wall[1]},
    ]
    (d / "metrics.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines) + "\n\n"
    )  # a trailing blank line
    return d


def test_read_run_logs_reads_the_summary_and_every_round(tmp_path):
    summary, lines = read_run_logs(_run(tmp_path, "a", accuracy=0.5, wall=(1.0, 3.0), peak=None))
    assert summary["rounds"] == 2 and [x["round"] for x in lines] == [1, 2]


def test_run_figures_are_per_client_last_round_bytes_and_mean_time(tmp_path):
    f = run_figures(_run(tmp_path, "a", accuracy=0.5, wall=(1.0, 3.0), peak=2**20))
    # bytes: the last round's over its 4 clients; FLOPs: 8000 over 2 rounds and 4 clients; time: mean of 1/4 and 3/4
    assert f == {
        "accuracy": 0.5,
        "trainable_fraction": 0.25,
        "bytes_down": 200.0,
        "bytes_up": 30.0,
        "client_flops": 1000.0,
        "client_s": 0.5,
        "tensor_peak": 2**20,
        "rss_peak": None,
    }


def test_mean_over_seeds_averages_skips_missing_and_gives_the_accuracy_std(tmp_path):
    a = run_figures(_run(tmp_path, "a", accuracy=0.5, wall=(1.0, 3.0), peak=2**20))
    b = run_figures(_run(tmp_path, "b", accuracy=0.7, wall=(2.0, 6.0), peak=None))
    m = mean_over_seeds([a, b])
    assert m["accuracy"] == pytest.approx(0.6) and m["accuracy_std"] == pytest.approx(0.1 * 2**0.5)
    assert m["client_s"] == pytest.approx(0.75) and m["seeds"] == 2
    assert (
        m["tensor_peak"] == 2**20 and m["rss_peak"] is None
    )  # one seed measured it; none measured RSS
    assert mean_over_seeds([a])["accuracy_std"] == 0.0


def test_reduction_and_mib_cells():
    assert (
        communication_reduction(
            {"bytes_down": 300, "bytes_up": 100}, {"bytes_down": 30, "bytes_up": 10}
        )
        == 10.0
    )
    assert mib(3 * 2**19) == "1.5" and mib(3 * 2**19, 2) == "1.50" and mib(None) == "n/a"


def test_few_seeds_note_names_the_fewest_seeds_and_is_empty_with_enough():
    assert few_seeds_note({"a": {"seeds": 3}, "b": {"seeds": 4}}) == ""
    assert few_seeds_note({"a": {"seeds": 3}, "b": {"seeds": 1}}) == (
        " Only 1 seed(s) were run (the script's default is 3; rerun to add them)."
    )
    assert few_seeds_note({"a": {"seeds": 3}}, default=5).startswith(" Only 3 seed(s)")
