"""benchmarks/ntk_table3.py: its learning-rate screen grows past a winning edge and picks on
validation only (hand-made screen rows; nothing is trained)."""

from __future__ import annotations

from tests_helpers import benchmark_script

bench = benchmark_script("ntk_table3")

PLAN = bench.Plan()
FAMILIES = (f"NTK-BAFFLE K={PLAN.kmid}", f"BAFFLE (dense) K={PLAN.kmid}", "BP FedAvg")


def _rows(curves: dict[tuple[str, str], dict[float, float]]) -> list[dict]:
    return [{"label": f"screen {o} {f} lr={lr}", "final_val_accuracy": v, "final_test_accuracy": 1 - v,
             "val_accuracy_by_round": [None, v, None, v]}  # the screen's score: the mean of its last evaluations
            for (o, f), curve in curves.items() for lr, v in curve.items()]  # fmt: skip


def _bracketed(lrs: tuple[float, ...]) -> dict[float, float]:
    return {lr: 0.5 if i == 1 else 0.3 for i, lr in enumerate(lrs)}


def test_a_low_edge_that_wins_adds_the_lr_below_and_picks_are_per_optimizer_and_family() -> None:
    curves = {(o, f): _bracketed(PLAN.screen_lrs(o)) for o in bench.OPTIMIZERS for f in FAMILIES}
    low = PLAN.screen_lrs("SGD")
    curves["SGD", FAMILIES[0]] = {lr: 0.6 - 0.1 * i for i, lr in enumerate(low)}  # the smallest wins
    results = _rows(curves)
    new = sorted(set(bench.screen_variants(PLAN, results)) - set(bench.screen_variants(PLAN)))
    assert new == ["screen SGD NTK-BAFFLE K=100 lr=0.003"]  # the 1-3-10 ladder below 0.01
    assert bench.picks(PLAN, {"results": results}) is None
    done = results + _rows({("SGD", FAMILIES[0]): {0.003: 0.1}})
    chosen = bench.picks(PLAN, {"results": done})
    assert chosen is not None and chosen["SGD", "NTK-BAFFLE"] == low[0]  # 0.01, now bracketed by 0.003
    assert chosen["Adam", "BP FedAvg"] == PLAN.screen_lrs("Adam")[1]
