"""A screened table read back from its records: nothing runs, and what was recorded is what is read."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from fedge.bench.screened import (
    cost_note,
    machines_note,
    mean_cell,
    per_seed_cell,
    read_plan_screen,
    recorded_screen,
    recorded_seeded,
    run_notes,
    run_plan,
    when_picked,
)
from fedge.bench.variants import run_seeded_variants, run_variants

COMMON = ["rounds=2", "eval_every=1", "clients.num=4", "clients.per_round=2", "threads=1"]


def test_recorded_helpers_read_what_the_runs_recorded_and_run_nothing(tmp_path):
    ran = run_seeded_variants(
        "quickstart",
        {"a": []},
        seeds=[0, 1],
        out_root=tmp_path / "runs",
        common=COMMON,
        records=tmp_path / "rec",
    )
    run_variants(
        "quickstart",
        {"s": []},
        out_root=tmp_path / "runs",
        common=COMMON,
        records=tmp_path / "rec" / "screen",
    )
    shutil.rmtree(tmp_path / "runs")
    both = {"a": [], "b": ["method.local_epochs=2"]}
    read = recorded_seeded(
        "quickstart", both, seeds=[0, 1], common=COMMON, records=tmp_path / "rec"
    )
    assert (
        not (tmp_path / "runs").exists()
        and read["missing"] == ["b"]
        and [r["label"] for r in read["results"]] == ["a"]
    )
    (row,) = read["results"]
    assert (
        row["seeds"] == 2 and row["final_test_accuracy"] == ran["results"][0]["final_test_accuracy"]
    )
    screen = recorded_screen(
        "quickstart",
        {"s": [], "t": ["method.local_epochs=2"]},
        common=COMMON,
        records=tmp_path / "rec",
    )
    assert [r["label"] for r in screen["results"]] == ["s"] and screen["missing"] == ["t"]


def test_when_picked_builds_the_variants_once_the_pick_is_made():
    main = when_picked(
        lambda screen: screen.get("lr"), lambda lr: {"a": [f"method.client_optimizer.lr={lr}"]}
    )
    assert main({}) is None  # a screen run is missing: run_screened waits
    assert main({"lr": 0.03}) == {"a": ["method.client_optimizer.lr=0.03"]}


def test_per_seed_cell_lists_every_seed_in_order():
    row = {
        "runs": [
            {"final_test_accuracy": 0.81234, "x": 1.0},
            {"final_test_accuracy": 0.5, "x": 0.25},
        ]
    }
    assert per_seed_cell(row) == "0.8123, 0.5000" and per_seed_cell(row, "x") == "1.0000, 0.2500"


def test_mean_cell_shows_a_spread_only_where_there_are_seeds_to_spread():
    row = {
        "seeds": 3,
        "final_test_accuracy": 0.81234,
        "final_test_accuracy_std": 0.00571,
        "x": 0.5,
        "x_std": 0.0,
    }
    assert mean_cell(row) == "0.8123 ± 0.0057" and mean_cell(row, "x") == "0.5000 ± 0.0000"
    assert (
        mean_cell({**row, "seeds": 1}) == "0.8123 (one seed)"
    )  # not "± 0.0000": one seed has no spread


def test_machines_note_names_each_machines_runs_and_rounds():
    a = {"cpu": "AMD EPYC 7B13", "isa": "avx2", "cores": 2, "torch": "2.13.0+cpu"}
    b = {"cpu": "Xeon", "isa": None, "cores": 16, "torch": "2.11.0"}
    rows = [
        {
            "label": "K=100",
            "runs": [{"seed": 0}, {"seed": 1, "machines": [{"rounds": [1, 20], "machine": a}]}],
        },
        {
            "label": "K=200",
            "runs": [
                {
                    "seed": 0,
                    "machines": [
                        {"rounds": [1, 3], "machine": None},
                        {"rounds": [4, 9], "machine": b},
                        {"rounds": [10, 20], "machine": a},
                    ],
                }
            ],
        },
    ]
    assert machines_note(rows) == (
        "Where the runs ran (from the records; a run resumed on another machine is the same run up to float roundoff): "
        "AMD EPYC 7B13 (avx2, 2 cores), torch 2.13.0+cpu: K=100 seed 1, K=200 seed 0 (rounds 10-20); "
        "not recorded: K=200 seed 0 (rounds 1-3); Xeon (16 cores), torch 2.11.0: K=200 seed 0 (rounds 4-9); "
        "1 run recorded before records named their machine."
    )


def test_cost_note_gives_each_rows_minutes_over_its_seeds():
    rows = [
        {"label": "BP", "runs": [{"seed": 0, "wall_s": 650.0}, {"seed": 1, "wall_s": 910.0}]},
        {
            "label": "K=100",
            "runs": [{"seed": 0, "wall_s": 3800.0}, {"seed": 2, "wall_s": 3820.0}],
        },  # both 63-64
        {"label": "K=200", "runs": [{"seed": 0, "wall_s": 6638.0}]},
        {"label": "old", "runs": [{"seed": 0}]},
    ]
    assert cost_note(rows).endswith("): BP 11-15; K=100 63-64; K=200 111.")
    assert cost_note([{"label": "old", "runs": [{"seed": 0}]}]) == ""
    # The section's closing lines: each note after a blank line, none for an empty note.
    assert run_notes(rows[:1]) == ["", cost_note(rows[:1]), "", machines_note(rows[:1])]
    assert run_notes([{"label": "x", "runs": []}]) == []


def test_cost_note_never_mixes_machines_in_one_range():
    def on(*isas: str) -> list[dict]:
        return [
            {"machine": {"isa": isa, "cpu": "AMD EPYC", "cores": 2}, "rounds": [i + 1, i + 1]}
            for i, isa in enumerate(isas)
        ]

    rows = [
        {
            "label": "K=200",
            "runs": [
                {"seed": 0, "wall_s": 3300.0, "machines": on("avx2")},
                {"seed": 1, "wall_s": 3540.0, "machines": on("avx2")},
                {"seed": 2, "wall_s": 900.0, "machines": on("avx512f")},
            ],
        },
        {
            "label": "K=50",
            "runs": [
                {"seed": 0, "wall_s": 600.0, "machines": on("avx2", "avx512f")},
                {"seed": 1, "wall_s": 660.0},
            ],
        },
    ]
    note = cost_note(rows)
    assert note.endswith(
        "grouped by the machine's instruction set). On avx2: K=200 55-59. On avx512f: K=200 15. "
        "Resumed across machines: K=50 10. Machine not recorded: K=50 11."
    )
    # One known kind of machine throughout (old records without one do not count): no labels.
    assert cost_note([{"label": "K=200", "runs": rows[0]["runs"][:2]}]).endswith("): K=200 55-59.")
    assert cost_note(
        [{"label": "K=200", "runs": [*rows[0]["runs"][:2], {"seed": 2, "wall_s": 60.0}]}]
    ).endswith("): K=200 1-59.")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a script's Plan gives run_plan (fedge.bench.screened.Plan)."""

    records: Path
    seeds: tuple[int, ...] = (0, 1)

    def protocol(self) -> list[str]:
        return COMMON

    def screen_common(self) -> list[str]:
        return [*COMMON, "rounds=1", "seed=0"]


def test_run_plan_records_where_the_readers_look(tmp_path):
    plan = _Plan(records=tmp_path / "rec")
    screen = {"s": [], "t": ["method.local_epochs=2"]}
    picked = when_picked(
        lambda rep: None if rep["missing"] else "s", lambda label: {"a": [], "b": screen[label]}
    )
    run_plan("quickstart", plan, screen, picked, out=tmp_path / "runs", shard=0, shards=1)
    files = sorted(p.relative_to(plan.records).as_posix() for p in plan.records.rglob("*.json"))
    assert files == [
        "screen/s.json",
        "screen/t.json",
        "seed-0/a.json",
        "seed-0/b.json",
        "seed-1/a.json",
        "seed-1/b.json",
    ]
    assert [r["label"] for r in read_plan_screen("quickstart", plan, screen)["results"]] == [
        "s",
        "t",
    ]
    seeded = recorded_seeded(
        "quickstart",
        {"a": [], "b": []},
        seeds=plan.seeds,
        common=plan.protocol(),
        records=plan.records,
    )
    assert [(r["label"], r["seeds"]) for r in seeded["results"]] == [("a", 2), ("b", 2)]
