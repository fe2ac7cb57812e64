"""benchmarks/peer_comparison.py: each row's figures and its cost to the target worked by hand from
made records, rows with incomplete records listed with what they await (never dropped), the
figure's data (mean over seeds per round) and its round trip through the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests_helpers import benchmark_script

bench = benchmark_script("peer_comparison")
zf = benchmark_script("zo_frontier")

PEERS = ["fedkseed", "decomfl", "feedsign"]


def _result(acc: list[float], up: float, down: float, rounds: list[int] | None = None) -> dict:
    rounds = rounds or list(range(1, len(acc) + 1))
    return {
        "rounds": rounds,
        "test_accuracy_by_round": acc,
        "val_accuracy_by_round": acc,
        "cum_client_flops_by_round": [None] * len(acc),
        "cum_bytes_up_per_client_by_round": [up * r for r in rounds],
        "cum_bytes_down_per_client_by_round": [down * r for r in rounds],
        "client_tensor_peak_bytes": None,
        "forward_mode_ad": False,
        "client_flops_round1": None,
        "wall_s": 1.0,
    }


def _write(records: Path, label: str, unit: str, result: dict) -> None:
    p = records / zf.slug(label) / f"{unit}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"config": {}, "result": result}))


def _screen(records: Path, label: str, lrs: tuple[float, ...], best: float) -> None:
    for lr in lrs:
        _write(records, label, f"lr={lr:g}", _result([0.9 if lr == best else 0.5], 1, 1))


# BP FedAvg: 4 rounds; seed 0 reaches 0.70 at round 2, seed 1 at round 3, seed 2 at round 2
BP_CURVES = {0: [0.6, 0.7, 0.8, 0.82], 1: [0.5, 0.65, 0.71, 0.80], 2: [0.6, 0.75, 0.8, 0.84]}
# FedKSeed: 2 of 3 seeds, no probe; seed 0 never reaches 0.70, seed 1 at round 4
KSEED_CURVES = {0: [0.3, 0.5, 0.6, 0.65], 1: [0.4, 0.5, 0.6, 0.72]}


def _made(records: Path) -> None:
    _screen(records, "BP FedAvg", zf.ADAM_LRS, 0.003)
    for seed, acc in BP_CURVES.items():
        _write(records, "BP FedAvg", f"seed-{seed}", _result(acc, up=100.0, down=200.0))
    probe = {**_result([0.1], 1, 1), "client_flops_round1": 1e6, "client_tensor_peak_bytes": 3e6}
    _write(records, "BP FedAvg", "probe", probe)
    _screen(records, "FedKSeed", (1e-4, 3e-4, 1e-3), 3e-4)
    for seed, acc in KSEED_CURVES.items():
        _write(records, "FedKSeed", f"seed-{seed}", _result(acc, up=10.0, down=5.0))


def test_row_figures_and_the_cost_to_the_target_by_hand(tmp_path: Path) -> None:
    _made(tmp_path)
    state = zf.read_records(tmp_path, PEERS)
    bp = bench.row_figures(state["rows"]["BP FedAvg"], state)
    assert bp["lr"] == 0.003 and bp["seeds"] == [0, 1, 2] and bp["awaits"] == []
    assert bp["mean"] == pytest.approx((0.82 + 0.80 + 0.84) / 3)
    assert bp["std"] == pytest.approx(0.02)
    # bytes: 100 up, 200 down a client a round; totals: 4 rounds x 10 clients
    assert (bp["up_round"], bp["down_round"]) == (100.0, 200.0)
    assert (bp["up_total"], bp["down_total"]) == (4000.0, 8000.0)
    # FLOPs: the probe's 1e6 a client-round x 10 clients x 4 rounds
    assert bp["flops_round"] == 1e6 and bp["flops_total"] == pytest.approx(4e7)
    assert bp["memory"] == 3e6
    # to 0.70: rounds 2, 3, 2 -> 7/3; bytes (100 + 200) x 10 clients x those rounds; FLOPs 1e7 each
    assert bp["reached"] == 3
    assert bp["round_to_target"] == pytest.approx(7 / 3)
    assert bp["bytes_to_target"] == pytest.approx(3000 * 7 / 3)
    assert bp["flops_to_target"] == pytest.approx(1e7 * 7 / 3)
    ks = bench.row_figures(state["rows"]["FedKSeed"], state)
    assert ks["awaits"] == ["seed 2", "probe"]
    assert ks["flops_total"] is None and ks["flops_to_target"] is None
    assert ks["reached"] == 1 and ks["round_to_target"] == 4  # seed 1 only
    assert ks["bytes_to_target"] == pytest.approx(15 * 10 * 4)


def test_the_table_lists_incomplete_rows_with_what_they_await(tmp_path: Path) -> None:
    _made(tmp_path)
    text, figs = bench.table(tmp_path, PEERS)
    assert set(figs) == set(bench.ROWS)  # every row, recorded or not
    for label in bench.ROWS:
        assert sum(line.startswith(f"| {label} |") for line in text.splitlines()) == 2, label
    assert (
        "| BP FedAvg | 0.003 (client_optimizer.lr) | 3/3 | 20 | 0.8200 ± 0.0200 | 1.00e+06 "
        "| 4.00e+07 | 100 / 200 | 0.00 / 0.01 | 3.00 |" in text
    )
    assert "| FedKSeed | 0.0003 (lr) | 2/3 | 20 | 0.6850 ± 0.0495 | - | - | 10 / 5 |" in text
    assert "| BP FedAvg | 3/3 | 2.3 | 2.33e+07 | 0.01 |" in text
    assert "| FedKSeed | 1/2 | 4 | awaiting the probe | 0.00 |" in text
    assert "| FeedSign | awaiting screen | 0/3 | 1000 | awaiting records |" in text
    assert "| DeComFL | awaiting records | | | |" in text
    awaiting = next(line for line in text.splitlines() if line.startswith("Awaiting records: "))
    assert "FedKSeed (seed 2, probe)" in awaiting
    assert f"{zf.BP_TOPK} (screen, seeds 0, 1, 2, probe)" in awaiting
    assert "BP FedAvg (" not in awaiting
    # no forward-only row has every seed: no comparison is read off
    assert text.endswith(
        "Read: awaiting records (BP FedAvg and a forward-only row with every seed)."
    )


def test_a_row_that_misses_the_target_says_so_with_its_best(tmp_path: Path) -> None:
    _made(tmp_path)
    _write(tmp_path, "FedKSeed", "seed-1", _result(KSEED_CURVES[0], 10.0, 5.0))
    text, _ = bench.table(tmp_path, PEERS)
    assert "| FedKSeed | 0/2: not reached (best 0.6500) | | | |" in text


def test_the_read_compares_the_best_complete_forward_row_with_bp(tmp_path: Path) -> None:
    _made(tmp_path)
    _write(tmp_path, "FedKSeed", "seed-2", _result([0.4, 0.5, 0.71, 0.74], 10.0, 5.0))
    probe = {**_result([0.1], 1, 1), "client_flops_round1": 2e6}
    _write(tmp_path, "FedKSeed", "probe", probe)
    text, figs = bench.table(tmp_path, PEERS)
    ks = figs["FedKSeed"]
    assert ks["mean"] == pytest.approx((0.65 + 0.72 + 0.74) / 3)
    # FedKSeed: 8e7 total FLOPs against BP's 4e7; (15 x 10 x 4) / (300 x 10 x 4) bytes = 0.05
    assert (
        "Read: of the forward-only rows with every seed recorded, FedKSeed ends highest, at "
        "0.7033, 11.67 points below BP FedAvg (0.8200), at 2.0x its total client FLOPs and "
        "0.0500x its total bytes (up + down). Fewest total bytes to the target on every seed: "
        "BP FedAvg, 0.01 MB in 2.3 rounds." in text
    )


def test_curves_are_the_mean_over_seeds_and_travel_in_the_png(tmp_path: Path) -> None:
    _made(tmp_path)
    data = bench.curves(zf.read_records(tmp_path, PEERS))
    assert data["target"] == bench.TARGET
    assert set(data["curves"]) == {"BP FedAvg", "FedKSeed"}  # the rows with a recorded seed
    bp = data["curves"]["BP FedAvg"]
    assert bp["seeds"] == 3 and bp["rounds"] == [1, 2, 3, 4]
    assert bp["accuracy"] == pytest.approx(
        [sum(c[i] for c in BP_CURVES.values()) / 3 for i in range(4)]
    )
    assert bp["flops"] == pytest.approx([1e7, 2e7, 3e7, 4e7])
    assert bp["bytes"] == pytest.approx([3000.0, 6000.0, 9000.0, 12000.0])
    assert data["curves"]["FedKSeed"]["flops"] is None  # no probe: left out of the FLOPs panel
    path = bench.figure(data, tmp_path / "fig.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench.figure_data(path) == json.loads(json.dumps(data))


def test_every_row_is_a_row_of_the_frontier_and_one_step_rows_run_50x_the_rounds() -> None:
    from fedge.methods import method_names

    every = zf.rows({}, method_names())
    assert set(bench.ROWS) <= set(every)
    one_step = {r for r in bench.ROWS if bench.rounds_of(every[r]) == 50 * zf.ROUNDS}
    assert one_step == {"BP FedSGD", "BAFFLE K=100 (batch mode)", "FeedSign"}
    assert all(bench.rounds_of(every[r]) == zf.ROUNDS for r in set(bench.ROWS) - one_step)
