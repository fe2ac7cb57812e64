"""benchmarks/baffle_table2.py: its learning-rate screen grows past a winning edge and picks on
validation only (hand-made screen rows; nothing is trained)."""

from __future__ import annotations

from tests_helpers import benchmark_script

bench = benchmark_script("baffle_table2")

PLAN = bench.Plan()


def _rows(vals: dict[tuple[str, str, float], float]) -> list[dict]:
    """Screen rows (family, partition, lr) -> validation accuracy; the test accuracy says the opposite."""
    return [{"label": f"screen {f}, {p}, lr={lr}", "final_val_accuracy": v, "final_test_accuracy": 1 - v}
            for (f, p, lr), v in vals.items()]  # fmt: skip


def _all(per_family: dict[str, dict[float, float]]) -> dict[tuple[str, str, float], float]:
    return {(f, p, lr): v for f, curve in per_family.items() for p in bench.PARTITIONS for lr, v in curve.items()}


def test_the_screen_starts_on_the_grid_and_waits_for_every_run() -> None:
    labels = list(bench.screen_variants(PLAN))
    assert len(labels) == 2 * 2 * len(bench.SCREEN_LRS) and labels[0].startswith("screen BAFFLE K=100")  # costly first
    assert bench.picks(PLAN, {"results": []}) is None


def test_an_edge_that_wins_adds_the_next_lr_and_the_pick_waits_for_it() -> None:
    interior = {0.003: 0.3, 0.01: 0.5, 0.03: 0.4}
    rising = {0.003: 0.2, 0.01: 0.3, 0.03: 0.4}
    results = _rows(_all({"BAFFLE K=100": rising, "BP FedAvg": interior}))
    grown = bench.screen_variants(PLAN, results)
    new = sorted(set(grown) - set(bench.screen_variants(PLAN)))
    assert new == ["screen BAFFLE K=100, Dirichlet 0.3, lr=0.1", "screen BAFFLE K=100, IID, lr=0.1"]
    assert "method.client_optimizer.lr=0.1" in grown[new[0]] and "method.k=100" in grown[new[0]]
    assert bench.picks(PLAN, {"results": results}) is None  # 0.1 not screened yet
    done = results + _rows({("BAFFLE K=100", p, 0.1): 0.35 for p in bench.PARTITIONS})
    assert bench.screen_variants(PLAN, done).keys() == grown.keys()  # bracketed: it stops growing
    chosen = bench.picks(PLAN, {"results": done})
    assert chosen == {("BAFFLE", p): 0.03 for p in bench.PARTITIONS} | {("BP FedAvg", p): 0.01 for p in bench.PARTITIONS}
    main = bench.main_variants(PLAN, chosen)
    assert "method.client_optimizer.lr=0.03" in main["BAFFLE K=200, IID"]  # the larger K reuse BAFFLE's pick
