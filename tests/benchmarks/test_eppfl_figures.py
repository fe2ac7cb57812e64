"""benchmarks/eppfl_figures.py: its rows' configs, its cost estimate, and the section it renders
from records (hand-made records; nothing is trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedge.experiment.build import method_config
from tests_helpers import benchmark_script

bench = benchmark_script("eppfl_figures")


def test_rows_set_the_mechanism_and_nothing_else_of_the_no_dp_row():
    paper, rigorous = (method_config(bench.config(f"dp-{m}-eps5")) for m in ("paper", "rigorous"))
    assert (paper.dp.sensitivity, paper.dp.clip, paper.dp.epsilon) == ("paper", None, 5.0)
    assert (rigorous.dp.sensitivity, rigorous.dp.clip) == ("rigorous", bench.CLIP)
    plain = method_config(bench.config("vanilla-E2"))
    assert plain.dp is None and plain.theta_a == plain.theta_g == 1.0 and plain.local_epochs == 2
    eppfl = method_config(bench.config("eppfl-paper-eps5-t0.5"))
    assert (eppfl.theta_a, eppfl.theta_g) == (0.5, 0.5)
    fig2 = bench.config("fig2-E10")
    assert fig2.rounds == bench.ROUNDS_FIG2 and method_config(fig2).local_epochs == 10
    assert method_config(bench.config("fedavg-E2")).name == "fedavg"
    assert bench.config("dp-paper-eps1", seed=2).seed == 2


def test_estimate_is_rounds_times_seeds_times_the_measured_round_cost():
    # paper: vanilla-E2 metered (2.0 s x 10 rounds x 3 seeds x 1.15) + 5 rows of 2.0 x 10 x 3
    assert bench.estimate(["paper"], [0, 1, 2])["paper"] == pytest.approx((69 + 5 * 60) / 60)
    # fig2: (2.0 + 4.4 + 8.8) s x 40 rounds x 3 seeds
    assert bench.estimate(["fig2"], [0, 1, 2])["fig2"] == pytest.approx(15.2 * 40 * 3 / 60)


def _record(root: Path, label: str, seed: int, acc: float) -> None:
    run = root / "runs" / f"seed-{seed}" / f"{label}.json"
    fig = root / "figures" / f"seed-{seed}" / f"{label}.json"
    run.parent.mkdir(parents=True, exist_ok=True)
    fig.parent.mkdir(parents=True, exist_ok=True)
    result = {"final_test_accuracy": acc, "best_test_accuracy": acc, "wall_s": 60.0}
    run.write_text(json.dumps({"config": {}, "result": result}))
    round1 = {"clients": 4, "bytes.client->edge": 4 * 1000, "bytes.edge->client": 4 * 500}
    fig.write_text(json.dumps({"round1": round1, "last": {}}))


def test_verdicts_pair_seeds_and_give_direction_and_size_apart(tmp_path):
    # ε = 10 vs ε = 1, paper +17.94 points; here +20, +22, +24 (mean 22, interval 17.0 to 27.0)
    for seed, (a, b) in enumerate([(0.60, 0.40), (0.62, 0.40), (0.64, 0.40)]):
        _record(tmp_path, "dp-paper-eps10", seed, a)
        _record(tmp_path, "dp-paper-eps1", seed, b)
    rows = bench.load_rows(tmp_path)
    assert rows["dp-paper-eps10"]["seeds"] == 3 and rows["dp-paper-eps10"]["mean"] == pytest.approx(
        0.62
    )
    row = bench.verdict_row("c", "paper", "dp-paper-eps10", "dp-paper-eps1", 17.94, rows)
    assert row[:3] == ["c", "paper", "+17.94"]
    assert row[3] == "+22.00 (+17.0 to +27.0; paper's sign on 3 of 3 seeds)"
    assert row[4:] == ["same direction", "size matches"]
    # against the opposite sign, with the paper's figure outside the interval
    assert bench.verdict_row("c", "paper", "dp-paper-eps1", "dp-paper-eps10", 5.0, rows)[4:] == [
        "opposite direction",
        "-4.4× the paper's",
    ]
    missing = bench.verdict_row("c", "paper", "dp-paper-eps5", "dp-paper-eps1", 14.79, rows)
    assert missing[3] == "awaiting `dp-paper-eps5` (group `paper`)"


def test_section_renders_what_is_recorded_and_names_what_is_not(tmp_path):
    _record(tmp_path, "vanilla-E2", 0, 0.75)
    text = bench.section(tmp_path)
    assert "| no DP (vanilla E = 2) | none | — | 1 | 75.00 (one seed) | 75.92 |" in text
    assert (
        "| dp-rigorous-eps1 | rigorous | 1 | 1 | not run yet (group `rigorous`) | 54.59 |" in text
    )
    assert "| vanilla-E2 | 2 | 1.0 | 1.0 | 1,000 | 3,277,200 | 500 |" in text
    assert "awaiting `fedavg-E2` (group `selection`)" in text
    assert "no DP guarantee: the scale depends on the data it protects" in text
