"""benchmarks/baffle_table2.py: its learning-rate screen grows past a winning edge and picks on
validation only (hand-made screen rows; nothing is trained)."""

from __future__ import annotations

from tests_helpers import benchmark_script

bench = benchmark_script("baffle_table2")

PLAN = bench.Plan()


def _rows(vals: dict[tuple[str, str, float], float]) -> list[dict]:
    """Screen rows (family, partition, lr) -> validation accuracy; the test accuracy says the opposite."""
    return [
        {
            "label": f"screen {f}, {p}, lr={lr}",
            "final_val_accuracy": v,
            "final_test_accuracy": 1 - v,
        }
        for (f, p, lr), v in vals.items()
    ]


def _all(per_family: dict[str, dict[float, float]]) -> dict[tuple[str, str, float], float]:
    return {
        (f, p, lr): v
        for f, curve in per_family.items()
        for p in bench.PARTITIONS
        for lr, v in curve.items()
    }


def test_the_screen_starts_on_the_grid_and_waits_for_every_run() -> None:
    labels = list(bench.screen_variants(PLAN))
    assert len(labels) == 2 * 2 * len(bench.SCREEN_LRS) and labels[0].startswith(
        "screen BAFFLE K=100"
    )  # costly first
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
    assert chosen == {("BAFFLE", p): 0.03 for p in bench.PARTITIONS} | {
        ("BP FedAvg", p): 0.01 for p in bench.PARTITIONS
    }
    main = bench.main_variants(PLAN, chosen)
    assert (
        "method.client_optimizer.lr=0.03" in main["BAFFLE K=200, IID"]
    )  # the larger K reuse BAFFLE's pick


def test_the_context_screens_bp_at_full_length_fresh_and_persistent_and_picks_on_validation() -> (
    None
):
    cplan = bench.context_plan(PLAN)
    assert cplan.screen_rounds == PLAN.rounds and cplan.records == PLAN.records / "context"
    assert cplan.screen_common()[-3:] == [f"rounds={PLAN.rounds}", "seed=0", "eval_every=10"]
    assert "eval_every=10" not in cplan.protocol() and PLAN.screen_common() == [
        *PLAN.protocol(),
        "rounds=10",
        "seed=0",
    ]
    labels = bench.context_screen_variants(cplan)
    assert len(labels) == 2 * 2 * len(bench.SCREEN_LRS)
    persistent = labels["screen BP FedAvg, persistent Adam, IID, lr=0.01"]
    assert (
        "method.client_optimizer.state=persistent" in persistent
        and "method.name=fedavg" in persistent
    )
    assert not any("state=" in o for o in labels["screen BP FedAvg, fresh Adam, IID, lr=0.01"])
    assert bench.context_picks(cplan, {"results": []}) is None
    interior = {0.003: 0.3, 0.01: 0.5, 0.03: 0.4}
    later = {
        0.003: 0.6,
        0.01: 0.5,
        0.03: 0.4,
    }  # the smallest lr wins at full length: the grid grows below it
    results = _rows(_all({"BP FedAvg, fresh Adam": interior, "BP FedAvg, persistent Adam": later}))
    grown = bench.context_screen_variants(cplan, results)
    assert sorted(set(grown) - set(labels)) == [
        f"screen BP FedAvg, persistent Adam, {p}, lr=0.001" for p in bench.PARTITIONS
    ]
    assert bench.context_picks(cplan, {"results": results}) is None
    done = results + _rows(
        {("BP FedAvg, persistent Adam", p, 0.001): 0.55 for p in bench.PARTITIONS}
    )
    chosen = bench.context_picks(cplan, {"results": done})
    assert chosen == {("fresh Adam", p): 0.01 for p in bench.PARTITIONS} | {
        ("persistent Adam", p): 0.003 for p in bench.PARTITIONS
    }
    rows = bench.context_variants(chosen)
    assert "method.client_optimizer.lr=0.003" in rows["BP FedAvg, persistent Adam, Dirichlet 0.3"]
    assert "partition.alpha=0.3" in rows["BP FedAvg, persistent Adam, Dirichlet 0.3"]


def test_baffle_with_persistent_adam_is_screened_as_the_table_s_baffle_and_picked_on_validation() -> (
    None
):
    zplan = bench.zo_context_plan(PLAN)
    assert (
        zplan.screen_common() == PLAN.screen_common()
        and zplan.records == PLAN.records / "context-baffle-persistent"
    )
    labels = bench.zo_context_screen_variants(zplan)
    assert len(labels) == 2 * len(bench.SCREEN_LRS)
    one = labels["screen BAFFLE K=100, persistent Adam, IID, lr=0.01"]
    assert (
        "method.client_optimizer.state=persistent" in one
        and "method.k=100" in one
        and "partition.name=iid" in one
    )
    assert bench.zo_context_picks(zplan, {"results": []}) is None
    results = _rows(_all({"BAFFLE K=100, persistent Adam": {0.003: 0.3, 0.01: 0.5, 0.03: 0.4}}))
    chosen = bench.zo_context_picks(zplan, {"results": results})
    assert chosen == dict.fromkeys(bench.PARTITIONS, 0.01)
    rows = bench.zo_context_variants(zplan, chosen)
    assert "method.client_optimizer.lr=0.01" in rows["BAFFLE K=100, persistent Adam, Dirichlet 0.3"]


def _seeded(label: str, accs: list[float]) -> dict:
    return {
        "label": label,
        "runs": [{"seed": s, "final_test_accuracy": a} for s, a in enumerate(accs)],
    }


def test_the_optimizer_state_lines_pair_persistent_with_fresh_by_seed_and_say_the_direction() -> (
    None
):
    iid, skew = "IID", "Dirichlet 0.3"
    ctx = {
        f"BP FedAvg, persistent Adam, {iid}": _seeded("", [0.70, 0.66, 0.68]),
        f"BP FedAvg, fresh Adam, {iid}": _seeded("", [0.50, 0.46, 0.49]),
        f"BP FedAvg, persistent Adam, {skew}": _seeded("", [0.40, 0.41, 0.39]),
        f"BP FedAvg, fresh Adam, {skew}": _seeded("", [0.50, 0.50, 0.50]),
    }
    agg = {f"BAFFLE K=100, {skew}": _seeded("", [0.45, 0.45])}
    zo = {f"BAFFLE K=100, persistent Adam, {skew}": _seeded("", [0.44, 0.47])}
    lines = bench._optimizer_state_lines(PLAN, agg, ctx, zo)
    bullets = [line for line in lines if line.startswith("- ")]
    assert len(bullets) == 3  # only the pairs with both rows
    (bp_skew,) = [b for b in bullets if b.startswith(f"- {skew}: BP FedAvg")]
    assert "-10.00 ± 1.00 points" in bp_skew and bp_skew.endswith("→ the fresh Adam ahead.")
    (bp,) = [b for b in bullets if b.startswith(f"- {iid}: BP FedAvg")]
    # hand: diffs +0.20, +0.20, +0.19 -> mean +19.67 points, std 0.58; every seed ahead -> resolved
    assert (
        "persistent − fresh Adam: +19.67 ± 0.58 points over seeds [0, 1, 2]" in bp
        and bp.endswith("→ the persistent Adam ahead.")
    )
    (zo_line,) = [b for b in bullets if b.startswith(f"- {skew}: BAFFLE K=100 (10-round screens)")]
    # hand: diffs -0.01, +0.02 -> mean +0.50 points, std 2.12; the interval holds 0
    assert "+0.50 ± 2.12 points over seeds [0, 1]" in zo_line and zo_line.endswith(
        "→ not resolved (the interval holds 0)."
    )
    assert bench._optimizer_state_lines(PLAN, {}, {}, {}) == []


def _final_row(accs: dict[int, float]) -> dict:
    return {
        "seeds": len(accs),
        "runs": [{"seed": s, "final_test_accuracy": a} for s, a in accs.items()],
    }


def test_skew_cost_verdicts_give_direction_and_size_against_the_paper() -> None:
    # BP: IID 0.60 above Dirichlet by 14, 15, 16 points: mean 15.00, std 1, interval
    # 15 ± 4.303 / sqrt(3) = 12.5..17.5, holding the paper's +14.34.
    # K=100 (no paper row): 5, 6, 7 points → a cost, no size. K=200: 2, 3, 4 points,
    # interval 0.5..5.5, the paper's +13.57 outside: 3 / 13.57 = 0.22.
    iid = {0: 0.60, 1: 0.60, 2: 0.60}

    def skewed(gaps: tuple[float, ...]) -> dict:
        return _final_row({s: 0.60 - g for s, g in zip(iid, gaps, strict=True)})

    agg = {
        "BP FedAvg, IID": _final_row(iid),
        "BP FedAvg, Dirichlet 0.3": skewed((0.14, 0.15, 0.16)),
        "BAFFLE K=100, IID": _final_row(iid),
        "BAFFLE K=100, Dirichlet 0.3": skewed((0.05, 0.06, 0.07)),
        "BAFFLE K=200, IID": _final_row(iid),
        "BAFFLE K=200, Dirichlet 0.3": skewed((0.02, 0.03, 0.04)),
    }
    lines = bench.verdicts(PLAN, agg)

    def line(start: str) -> str:
        (found,) = [x for x in lines if x.startswith(f"- {start}")]
        return found

    assert line("BP FedAvg:").endswith("+14.34) → same direction; size matches.")
    assert line("BAFFLE K=100:").endswith(
        "the paper has no row at this K) → same direction; no figure in the paper to size against."
    )
    assert line("BAFFLE K=200:").endswith("+13.57) → same direction; 0.22× the paper's.")
    # K=200 − BP: 2-14, 3-15, 4-16 = -12 points on every seed (std 0: the interval is the point),
    # against the paper's 13.57 - 14.34 = -0.77: 12 / 0.77 = 15.6
    assert line("BAFFLE K=200 − BP:").endswith("paper -0.77) → same direction; 16× the paper's.")
