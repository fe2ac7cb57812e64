"""benchmarks/fleet_time.py at a tiny size: every row runs, the table and the docs section
come from the records, and a second invocation reads them instead of training again."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_time.py"
TINY = [
    "--seeds",
    "1",
    "--rounds",
    "1",
    "--set",
    "dataset.limit_train=100",
    "--set",
    "dataset.limit_test=50",
]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_time", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fleet_time"] = mod
    spec.loader.exec_module(mod)
    return mod


bench = _load()


def test_time_to_target_is_the_first_round_at_or_above_it_over_the_seeds_reaching_it() -> None:
    runs = [
        {"accuracy_by_round": [0.1, 0.5, 0.6], "sim_time_total_by_round": [2.0, 4.0, 6.0]},
        {"accuracy_by_round": [None, 0.55, 0.7], "sim_time_total_by_round": [1.0, 3.0, 5.0]},
        {"accuracy_by_round": [0.1, 0.2, 0.3], "sim_time_total_by_round": [1.0, 2.0, 3.0]},
    ]
    assert bench.time_to(runs, 0.5) == (3.5, 2)  # (4 + 3) / 2; the third never gets there
    assert bench.time_to(runs, 0.9) == (None, 0)


def test_the_deadline_is_twice_the_median_first_round_client_time() -> None:
    t = {"down_s": 1.0, "compute_s": 0.5, "up_s": 1.5}  # 3 s
    runs = [{"sim_clients_round1": {"0": t, "1": {**t, "up_s": 5.5}, "2": t}}]
    assert bench.median_client_time(runs) == 3.0 and bench._deadline(3.0) == 6.0


def test_the_benchmark_runs_records_and_rereads_at_a_tiny_size(
    tmp_path: Path, fake_fashion_mnist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n")
    records = tmp_path / "records"
    argv = [*TINY, "--out", str(tmp_path / "runs"), "--records", str(records)]
    assert bench.main([*argv, "--docs", str(docs)]) == 0
    first = capsys.readouterr().out
    text = docs.read_text()
    assert "<!-- bench:fleet-time -->" in text and "<!-- /bench:fleet-time -->" in text
    assert (tmp_path / "figures" / "fleet-time" / "accuracy-vs-time.png").stat().st_size > 0
    for method in ("FedAvg", "BAFFLE", "FedPT", "FedKSeed", "DeComFL"):
        assert f"| {method}, wait |" in text and f"| {method}, deadline |" in text
    assert sorted(p.name for p in (records / "figures" / "seed-0").iterdir()) == sorted(
        f"{m.lower()}-{row}.json" for m in bench.METHODS for row in ("wait", "deadline")
    )
    # the run directories gone, the records alone give the same table
    import shutil

    shutil.rmtree(tmp_path / "runs")
    assert bench.main(argv) == 0
    second = capsys.readouterr().out
    assert first.split("| method, rows")[1] == second.split("| method, rows")[1]


def test_the_reading_compares_each_methods_deadline_row_with_its_wait_row() -> None:
    row = {"seeds": 3, "skipped": 0.0, "reached": 3}
    report = {
        "methods": {"FedAvg": {}},
        "rows": {
            "FedAvg, wait": {**row, "time_to_target_s": 60.0, "accuracy_mean": 0.50},
            "FedAvg, deadline": {
                **row,
                "time_to_target_s": 20.0,
                "accuracy_mean": 0.52,
                "reached": 2,
                "skipped": 1.0,
            },
        },
    }
    assert bench.reading(report) == (
        "What the deadline with over-selection buys against waiting: FedAvg reaches its target "
        "in 20.0 s against 60.0 s, 3.0x sooner (2 of 3 seeds), ends +2.00 points and skips 1.0 "
        "of its rounds."
    )
