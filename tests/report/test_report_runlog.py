"""load_run and RunLog: parsing, incomplete runs, damaged files, headline numbers."""

from __future__ import annotations

import json

import pytest

from fedge.core.errors import FedgeError
from fedge.report import CUM_BYTES, NotARunDirError, RunDirError, RunLogWarning, load_run


def test_load_run_parses_every_file(make_run):
    run = load_run(make_run("fedavg-a"))
    assert run.label == "fedavg-a"
    assert (run.method, run.model, run.dataset, run.seed) == ("fedavg", "cnn", "cifar10", 7)
    assert run.config["clients"]["num"] == 4
    assert [m["round"] for m in run.metrics] == [1, 2, 3, 4, 5]
    assert run.partition["num_clients"] == 4
    assert run.complete and run.status == "complete"
    assert run.rounds_done == 5 and run.rounds_planned == 5


def test_series_skips_rounds_that_were_not_evaluated(make_run):
    run = load_run(make_run())
    assert run.series("test_accuracy") == ([1, 3, 5], [0.2, 0.5, 0.875])
    # cumulative bytes (down + up) after rounds 1, 3, 5
    xs, _ = run.series("test_accuracy", x=CUM_BYTES)
    assert xs == [1_250_000, 3_750_000, 6_250_000]
    assert run.series("no_such_key") == ([], [])


def test_unknown_numeric_keys_stay_available(make_run):
    run = load_run(make_run(extra={"zo_grad_norm": 3.5}))
    assert "zo_grad_norm" in run.numeric_keys()
    assert run.series("zo_grad_norm")[1] == [3.5] * 5


def test_headline_numbers_match_the_summary(make_run):
    run = load_run(make_run(peak_bytes=12_345_678))
    assert run.final_accuracy == 0.875 and run.best_accuracy == 0.875 and run.best_round == 5
    assert run.total_bytes_down == 5_000_000 and run.total_bytes_up == 1_250_000
    assert run.total_client_flops == 10_000_000_000
    assert run.peak_memory == 12_345_678
    assert (run.model_params, run.model_bytes, run.wall_s) == (62_006, 248_024, 2.5)


def test_bytes_to_accuracy_is_cumulative_bytes_at_first_crossing(make_run):
    run = load_run(make_run())
    assert run.bytes_to_accuracy(0.5) == 3 * 1_250_000  # reached at round 3
    assert run.bytes_to_accuracy(0.3) == 3 * 1_250_000  # round 1 (0.2) is below
    assert run.bytes_to_accuracy(0.9) is None


def test_run_without_summary_is_incomplete_and_uses_metrics_so_far(make_run):
    run = load_run(make_run(accuracies=(0.3, 0.6, None), complete=False))
    assert run.summary is None and not run.complete
    assert run.status == "incomplete (3 rounds so far)"
    assert run.final_accuracy == 0.6 and run.best_accuracy == 0.6
    assert run.total_bytes_down == 3_000_000 and run.total_bytes_up == 750_000
    assert run.wall_s == 1.5 and run.model_params is None


def test_summary_with_other_status_is_incomplete(make_run):
    path = make_run()
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps(summary | {"status": "failed"}))
    run = load_run(path)
    assert not run.complete
    assert run.status.startswith("incomplete (5 rounds so far)")


def test_truncated_last_line_is_ignored_with_a_warning(make_run):
    path = make_run(complete=False)
    with (path / "metrics.jsonl").open("a") as f:
        f.write('{"round": 6, "test_accura')  # crash mid-write
    with pytest.warns(RunLogWarning, match="line 6 is truncated"):
        run = load_run(path)
    assert run.rounds_done == 5


def test_corrupt_middle_line_is_an_error_naming_the_line(make_run):
    path = make_run()
    lines = (path / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match="line 2"):
        load_run(path)


def test_repeated_round_keeps_the_last_with_a_warning(make_run):
    path = make_run(complete=False)
    with (path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"round": 5, "test_accuracy": 0.9}) + "\n")
    with pytest.warns(RunLogWarning, match="round 5 more than once"):
        run = load_run(path)
    assert run.rounds_done == 5 and run.final_accuracy == 0.9


def test_empty_metrics_is_a_run_with_no_rounds_yet(make_run):
    path = make_run(complete=False)
    (path / "metrics.jsonl").write_text("")
    run = load_run(path)
    assert run.status == "incomplete (0 rounds so far)"
    assert run.final_accuracy is None and run.total_bytes_down is None


def test_complete_run_whose_metrics_lost_rounds_warns_naming_them(make_run):
    path = make_run()  # complete, 5 rounds
    lines = (path / "metrics.jsonl").read_text().splitlines()
    (path / "metrics.jsonl").write_text("\n".join(lines[:2] + lines[3:4]) + "\n")  # rounds 1, 2, 4
    with pytest.warns(
        RunLogWarning, match=r"completed 5 rounds but .*holds rounds 1-4 \(3 lines\); missing 3, 5"
    ):
        run = load_run(path)
    assert [m["round"] for m in run.metrics] == [1, 2, 4]
    (path / "metrics.jsonl").write_text("")
    with pytest.warns(
        RunLogWarning, match="completed 5 rounds but .*holds no rounds: .*restore it"
    ):
        load_run(path)


def test_intact_and_unfinished_runs_load_without_a_rounds_warning(make_run, recwarn):
    load_run(make_run("done"))
    partial = make_run("partial", complete=False)
    lines = (partial / "metrics.jsonl").read_text().splitlines()
    (partial / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    load_run(partial)
    assert not [w for w in recwarn if issubclass(w.category, RunLogWarning)]


def test_missing_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(NotARunDirError, match="does not exist") as e:
        load_run(missing)
    assert str(missing) in str(e.value)
    assert isinstance(e.value, FedgeError) and isinstance(e.value, FileNotFoundError)


def test_directory_without_metrics_is_not_a_run_directory(tmp_path):
    with pytest.raises(NotARunDirError, match="not a fedge run directory.*metrics.jsonl"):
        load_run(tmp_path)


def test_effective_flops_fall_back_to_executed_flops_for_dense_runs(make_run):
    from fedge.report import CUM_EFFECTIVE_FLOPS

    dense = load_run(make_run("dense", accuracies=(0.1, 0.2), flops=5))
    assert dense.series("test_accuracy", x=CUM_EFFECTIVE_FLOPS) == ([5, 10], [0.1, 0.2])
    sparse = load_run(
        make_run(
            "sparse", accuracies=(0.1, 0.2), flops=5, extra={"cum_client_flops_effective": 2.0}
        )
    )
    assert sparse.series("test_accuracy", x=CUM_EFFECTIVE_FLOPS) == ([2.0, 2.0], [0.1, 0.2])
