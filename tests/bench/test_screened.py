"""A screened table read back from its records: nothing runs, and what was recorded is what is read."""

from __future__ import annotations

import shutil

from fedge.bench.screened import per_seed_cell, recorded_screen, recorded_seeded, when_picked
from fedge.bench.variants import run_seeded_variants, run_variants

COMMON = ["rounds=2", "eval_every=1", "clients.num=4", "clients.per_round=2", "threads=1"]


def test_recorded_helpers_read_what_the_runs_recorded_and_run_nothing(tmp_path):
    ran = run_seeded_variants("quickstart", {"a": []}, seeds=[0, 1], out_root=tmp_path / "runs", common=COMMON,
                              records=tmp_path / "rec")  # fmt: skip
    run_variants("quickstart", {"s": []}, out_root=tmp_path / "runs", common=COMMON, records=tmp_path / "rec" / "screen")
    shutil.rmtree(tmp_path / "runs")
    both = {"a": [], "b": ["method.local_epochs=2"]}
    read = recorded_seeded("quickstart", both, seeds=[0, 1], common=COMMON, records=tmp_path / "rec")
    assert not (tmp_path / "runs").exists() and read["missing"] == ["b"] and [r["label"] for r in read["results"]] == ["a"]
    (row,) = read["results"]
    assert row["seeds"] == 2 and row["final_test_accuracy"] == ran["results"][0]["final_test_accuracy"]
    screen = recorded_screen("quickstart", {"s": [], "t": ["method.local_epochs=2"]}, common=COMMON, records=tmp_path / "rec")
    assert [r["label"] for r in screen["results"]] == ["s"] and screen["missing"] == ["t"]


def test_when_picked_builds_the_variants_once_the_pick_is_made():
    main = when_picked(lambda screen: screen.get("lr"), lambda lr: {"a": [f"method.client_optimizer.lr={lr}"]})
    assert main({}) is None  # a screen run is missing: run_screened waits
    assert main({"lr": 0.03}) == {"a": ["method.client_optimizer.lr=0.03"]}


def test_per_seed_cell_lists_every_seed_in_order():
    row = {"runs": [{"final_test_accuracy": 0.81234, "x": 1.0}, {"final_test_accuracy": 0.5, "x": 0.25}]}
    assert per_seed_cell(row) == "0.8123, 0.5000" and per_seed_cell(row, "x") == "1.0000, 0.2500"
