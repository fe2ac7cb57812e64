"""Variant tables: runs are resumed or read rather than rerun, and the table shows what was logged."""

from __future__ import annotations

import json

import pytest

from fedge.bench.variants import run_variants, variants_markdown
from fedge.core.errors import ConfigError

COMMON = ["rounds=2", "eval_every=1", "clients.num=4", "clients.per_round=2", "threads=1"]


def test_run_variants_runs_then_reads_complete_runs(tmp_path):
    variants = {"a": ["method.local_epochs=1"], "b": ["method.local_epochs=2"]}
    first = run_variants("quickstart", variants, out_root=tmp_path, common=COMMON)
    assert [r["label"] for r in first["results"]] == ["a", "b"] and first["missing"] == []
    metrics = tmp_path / "a" / "metrics.jsonl"
    stamp = metrics.stat().st_mtime_ns
    again = run_variants("quickstart", variants, out_root=tmp_path, common=COMMON)
    assert metrics.stat().st_mtime_ns == stamp  # read, not rerun
    assert again["results"] == first["results"]
    r = first["results"][0]
    assert len(r["accuracy_by_round"]) == 2 and 0 <= r["final_test_accuracy"] <= 1
    assert r["bytes_up_per_client_round"] > 0 and r["client_flops_per_round"] > 0
    assert r["client_flops_effective_per_round"] is None and r["client_tensor_peak_bytes"] is None
    table = variants_markdown(first, "cmd", "intro")
    assert "effective GFLOP/round" not in table and "client peak MiB" not in table
    assert table.count("\n| a |") == 1 and "Command: `cmd`" in table


def test_run_variants_without_running_lists_the_missing(tmp_path):
    report = run_variants("quickstart", {"x": []}, out_root=tmp_path, common=COMMON, run=False)
    assert report["results"] == [] and report["missing"] == ["x"]
    assert "Not run yet (the command resumes them): x" in variants_markdown(report, "cmd", "intro")


def test_optional_columns_appear_when_some_variant_logged_them():
    base = {"overrides": [], "final_test_accuracy": 0.5, "best_test_accuracy": 0.6, "bytes_up_per_client_round": 10,
            "bytes_down_per_client_round": 20, "client_flops_per_round": 3e9, "wall_s": 1.0}  # fmt: skip
    report = {
        "base": "p",
        "common": [],
        "results": [
            {**base, "label": "dense", "client_flops_effective_per_round": None, "client_tensor_peak_bytes": 2**21},
            {**base, "label": "sparse", "client_flops_effective_per_round": 1e9, "client_tensor_peak_bytes": None},
        ],
    }
    lines = variants_markdown(report, "cmd", "").splitlines()
    header = next(x for x in lines if x.startswith("| variant"))
    assert "executed" in header and "effective GFLOP/round" in header and "client peak MiB" in header
    assert any(x.startswith("| dense |") and "| 3.0 | - | 2.00 |" in x for x in lines)
    assert any(x.startswith("| sparse |") and "| 3.0 | 1.0 | - |" in x for x in lines)


def test_more_rounds_extend_a_finished_variant_and_a_changed_one_is_refused(tmp_path):
    import pytest


    run_variants("quickstart", {"a": []}, out_root=tmp_path, common=COMMON)
    longer = [x if not x.startswith("rounds=") else "rounds=3" for x in COMMON]
    (r,) = run_variants("quickstart", {"a": []}, out_root=tmp_path, common=longer)["results"]
    assert len(r["accuracy_by_round"]) == 3
    with pytest.raises(ConfigError, match="different config"):
        run_variants("quickstart", {"a": ["method.local_epochs=5"]}, out_root=tmp_path, common=longer)
    with pytest.raises(ConfigError, match="different config"):  # never shortened
        run_variants("quickstart", {"a": []}, out_root=tmp_path, common=COMMON)


def test_seeded_variants_aggregate_mean_and_std_over_seeds(tmp_path):
    import statistics

    from fedge.bench.variants import run_seeded_variants, seeded_markdown

    common = [*COMMON, "dataset.validation=0.1"]
    report = run_seeded_variants("quickstart", {"a": [], "b": ["method.local_epochs=2"]}, seeds=[0, 1, 2],
                                 out_root=tmp_path, common=common)
    row = report["results"][0]
    finals = [r["final_test_accuracy"] for r in row["runs"]]
    assert row["seeds"] == 3 and len({r["run_dir"] for r in row["runs"]}) == 3
    assert row["final_test_accuracy"] == statistics.mean(finals)
    assert row["final_test_accuracy_std"] == statistics.stdev(finals)
    assert row["test_accuracy_at_best_val"] == statistics.mean(r["test_accuracy_at_best_val"] for r in row["runs"])
    text = seeded_markdown(report, "cmd", "intro")
    assert text.count(" ± ") >= 6 and "test acc at best val" in text


def test_records_outlive_the_run_directory_and_guard_their_config(tmp_path):
    import shutil

    first = run_variants("quickstart", {"a": []}, out_root=tmp_path / "runs", common=COMMON, records=tmp_path / "rec")
    record = json.loads((tmp_path / "rec" / "a.json").read_text())
    assert record["config"]["rounds"] == first["results"][0]["accuracy_by_round"].__len__()
    shutil.rmtree(tmp_path / "runs")  # the machine that ran it is gone; the committed record is not
    again = run_variants("quickstart", {"a": []}, out_root=tmp_path / "runs", common=COMMON, records=tmp_path / "rec")
    assert not (tmp_path / "runs").exists()  # read from the record, nothing rerun
    (row,) = again["results"]
    assert row["final_test_accuracy"] == first["results"][0]["final_test_accuracy"] and row["run_dir"] is None
    with pytest.raises(ConfigError, match="different config"):
        run_variants("quickstart", {"a": ["method.local_epochs=3"]}, out_root=tmp_path / "runs", common=COMMON,
                     records=tmp_path / "rec")
