"""Benchmark tables and cells: the columns show what some variant logged, the cells and notes say
what the records hold."""

from __future__ import annotations

from fedge.bench.tables import (
    cost_note,
    machines_note,
    mean_cell,
    per_seed_cell,
    run_notes,
    variants_markdown,
)


def test_optional_columns_appear_when_some_variant_logged_them():
    base = {
        "overrides": [],
        "final_test_accuracy": 0.5,
        "best_test_accuracy": 0.6,
        "bytes_up_per_client_round": 10,
        "bytes_down_per_client_round": 20,
        "client_flops_per_round": 3e9,
        "wall_s": 1.0,
    }
    report = {
        "base": "p",
        "common": [],
        "results": [
            {
                **base,
                "label": "dense",
                "client_flops_effective_per_round": None,
                "client_tensor_peak_bytes": 2**21,
            },
            {
                **base,
                "label": "sparse",
                "client_flops_effective_per_round": 1e9,
                "client_tensor_peak_bytes": None,
            },
        ],
    }
    lines = variants_markdown(report, "cmd", "").splitlines()
    header = next(x for x in lines if x.startswith("| variant"))
    assert (
        "executed" in header
        and "effective GFLOP/client/round" in header
        and "client peak MiB" in header
    )
    # rows without per-client FLOPs (records written before they existed) show the sum, marked
    assert any(x.startswith("| dense |") and "| 3.0 (sum) | - | 2.00 |" in x for x in lines)
    assert any(x.startswith("| sparse |") and "| 3.0 (sum) | 1.0 (sum) | - |" in x for x in lines)
    per_client = {
        **report["results"][1],
        "client_flops_per_client_round": 1.5e9,
        "client_flops_effective_per_client_round": 5e8,
    }
    row = next(
        x
        for x in variants_markdown({**report, "results": [per_client]}, "cmd", "").splitlines()
        if x.startswith("| sparse")
    )
    assert "| 1.50 | 0.50 |" in row and "GFLOP/client/round" in header


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
