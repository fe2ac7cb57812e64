"""benchmarks/ntk_table3.py: its learning-rate screen grows past a winning edge and picks on
validation only (hand-made screen rows; nothing is trained)."""

from __future__ import annotations

from tests_helpers import benchmark_script

bench = benchmark_script("ntk_table3")

PLAN = bench.Plan()
FAMILIES = (f"NTK-BAFFLE K={PLAN.kmid}", f"BAFFLE (dense) K={PLAN.kmid}", "BP FedAvg")


def _rows(curves: dict[tuple[str, str], dict[float, float]]) -> list[dict]:
    return [
        {
            "label": f"screen {o} {f} lr={lr}",
            "final_val_accuracy": v,
            "final_test_accuracy": 1 - v,
            "val_accuracy_by_round": [None, v, None, v],
        }  # the screen's score: the mean of its last evaluations
        for (o, f), curve in curves.items()
        for lr, v in curve.items()
    ]


def _bracketed(lrs: tuple[float, ...]) -> dict[float, float]:
    return {lr: 0.5 if i == 1 else 0.3 for i, lr in enumerate(lrs)}


def test_a_low_edge_that_wins_adds_the_lr_below_and_picks_are_per_optimizer_and_family() -> None:
    curves = {(o, f): _bracketed(PLAN.screen_lrs(o)) for o in bench.OPTIMIZERS for f in FAMILIES}
    low = PLAN.screen_lrs("SGD")
    curves["SGD", FAMILIES[0]] = {
        lr: 0.6 - 0.1 * i for i, lr in enumerate(low)
    }  # the smallest wins
    results = _rows(curves)
    new = sorted(set(bench.screen_variants(PLAN, results)) - set(bench.screen_variants(PLAN)))
    assert new == ["screen SGD NTK-BAFFLE K=100 lr=0.003"]  # the 1-3-10 ladder below 0.01
    assert bench.picks(PLAN, {"results": results}) is None
    done = results + _rows({("SGD", FAMILIES[0]): {0.003: 0.1}})
    chosen = bench.picks(PLAN, {"results": done})
    assert (
        chosen is not None and chosen["SGD", "NTK-BAFFLE"] == low[0]
    )  # 0.01, now bracketed by 0.003
    assert chosen["Adam", "BP FedAvg"] == PLAN.screen_lrs("Adam")[1]


CHOSEN = {
    ("SGD", "NTK-BAFFLE"): 0.03,
    ("SGD", "BAFFLE (dense)"): 0.01,
    ("SGD", "BP FedAvg"): 0.1,
    ("Adam", "NTK-BAFFLE"): 0.003,
    ("Adam", "BAFFLE (dense)"): 0.003,
    ("Adam", "BP FedAvg"): 0.01,
}


def test_the_clip_context_differs_from_the_tables_rows_only_by_the_clip() -> None:
    main = bench.main_variants(PLAN, CHOSEN)
    ctx = bench.context_variants(PLAN, CHOSEN)
    ntk, dense = ctx["SGD NTK-BAFFLE K=100, clip 0.3"], ctx["SGD BAFFLE (dense) K=100, clip 0.3"]
    assert [o for o in ntk if o != "method.clip=0.3"] == [
        o for o in main["SGD NTK-BAFFLE K=100"] if o != "method.clip=null"
    ]
    assert "method.clip=null" not in ntk + dense and ntk[-1] == dense[-1] == "method.clip=0.3"
    # dense runs at NTK's lr (0.03, where unclipped dense diverged), not at dense's own pick (0.01)
    assert (
        "method.client_optimizer.lr=0.03" in dense
        and "method.client_optimizer.lr=0.01" not in dense
    )
    assert {o for o in dense if "lr=" not in o} - {"method.clip=0.3"} == {
        o for o in main["SGD BAFFLE (dense) K=100"] if "lr=" not in o
    } - {"method.clip=null"}


def _seeded(label: str, accs: dict[int, float]) -> dict:
    runs = [
        {"seed": s, "test_accuracy_at_best_val": a, "final_test_accuracy": a}
        for s, a in accs.items()
    ]
    mean = sum(accs.values()) / len(accs)
    return {
        "label": label,
        "seeds": len(runs),
        "runs": runs,
        "diverged": [],
        "final_test_accuracy": mean,
        "final_test_accuracy_std": 0.01,
        "test_accuracy_at_best_val": mean,
        "test_accuracy_at_best_val_std": 0.01,
    }


def test_the_clip_context_pairs_seeds_and_says_a_diverged_row() -> None:
    agg = {
        "SGD BAFFLE (dense) K=100": _seeded(
            "SGD BAFFLE (dense) K=100", {0: 0.17, 1: 0.18, 2: 0.16}
        ),
        "SGD NTK-BAFFLE K=100": _seeded("SGD NTK-BAFFLE K=100", {0: 0.70, 1: 0.71, 2: 0.69}),
    }
    context = {
        "results": [
            _seeded("SGD BAFFLE (dense) K=100, clip 0.3", {0: 0.60, 1: 0.62, 2: 0.61}),
            _seeded("SGD NTK-BAFFLE K=100, clip 0.3", {0: 0.65, 1: 0.66, 2: 0.64}),
        ],
        "diverged": {},
    }
    text = "\n".join(bench.context_lines(PLAN, agg, context))
    assert "| SGD BAFFLE (dense) K=100, clip 0.3 | 3 | 0.6100 ± 0.0100 |" in text
    assert (
        "with the clip: NTK-BAFFLE − dense BAFFLE: +4.00 ± 1.00 points" in text
        and text.count("→ same direction; no figure in the paper to size against;") == 2
    )
    context = {
        "results": context["results"][1:],
        "diverged": {"SGD BAFFLE (dense) K=100, clip 0.3": [{"seed": 0, "round": 7}]},
    }
    text = "\n".join(bench.context_lines(PLAN, agg, context))
    assert "| SGD BAFFLE (dense) K=100, clip 0.3 | 0 | seed 0 diverged (round 7) |" in text
    assert "needs both rows on at least 2 common seeds" in text
    assert bench.context_lines(PLAN, agg, None) == []


def test_an_unresolved_direction_says_per_seed_gaps_and_how_many_seeds_agree_in_sign() -> None:
    # NTK above dense on every seed, by very unequal gaps (dense at chance on seed 0): not resolved
    agg = {
        "SGD NTK-BAFFLE K=100": _seeded("SGD NTK-BAFFLE K=100", {0: 0.68, 1: 0.72, 2: 0.70}),
        "SGD BAFFLE (dense) K=100": _seeded(
            "SGD BAFFLE (dense) K=100", {0: 0.10, 1: 0.52, 2: 0.68}
        ),
    }
    (line,) = [
        x for x in bench.verdicts(PLAN, agg) if x.startswith("- SGD, K=100: NTK-BAFFLE − dense")
    ]
    assert "(seeds 0: +58.0, 1: +20.0, 2: +2.0; 95% interval" in line
    # mean +26.67 points, interval holds 0 and the paper's +6.35
    assert line.endswith(
        "→ not resolved (the interval holds 0); size matches; the expected sign on 3 of 3 seeds."
    )
    agg["SGD BAFFLE (dense) K=100"] = _seeded(
        "SGD BAFFLE (dense) K=100", {0: 0.10, 1: 0.52, 2: 0.75}
    )
    (line,) = [
        x for x in bench.verdicts(PLAN, agg) if x.startswith("- SGD, K=100: NTK-BAFFLE − dense")
    ]
    assert line.endswith("the expected sign on 2 of 3 seeds.")


def test_a_resolved_direction_gives_its_size_against_the_paper_or_says_there_is_none() -> None:
    # NTK 10, 11, 12 points above dense: mean 11.00, std 1, interval 11 ± 4.303 / sqrt(3) = 8.5..13.5,
    # outside the paper's +6.35 at K=100: 11 / 6.35 = 1.73
    agg = {
        "SGD NTK-BAFFLE K=100": _seeded("SGD NTK-BAFFLE K=100", {0: 0.70, 1: 0.71, 2: 0.72}),
        "SGD BAFFLE (dense) K=100": _seeded(
            "SGD BAFFLE (dense) K=100", {0: 0.60, 1: 0.60, 2: 0.60}
        ),
        "SGD magnitude-pruned K=100": _seeded(
            "SGD magnitude-pruned K=100", {0: 0.75, 1: 0.76, 2: 0.77}
        ),
    }
    lines = bench.verdicts(PLAN, agg)
    (line,) = [x for x in lines if x.startswith("- SGD, K=100: NTK-BAFFLE − dense")]
    assert "+11.00 ± 1.00 points" in line and "95% interval +8.5 to +13.5" in line
    assert line.endswith("→ same direction; 1.7× the paper's; the expected sign on 3 of 3 seeds.")
    (line,) = [x for x in lines if x.startswith("- SGD, K=100: NTK-BAFFLE − magnitude")]
    assert line.endswith(  # 5 points below magnitude on every seed: NTK should be higher
        "→ opposite direction; no figure in the paper to size against; the expected sign on 0 of 3 "
        "seeds."
    )


def test_departures_state_the_uplink_the_dense_screen_and_the_seeds_it_never_trains() -> None:
    # (0.01, 0.03, 0.1), widened to 0.003 (0.01 won at the low edge): dense picks 0.01
    sgd = PLAN.screen_lrs("SGD")
    screen = {
        "results": _rows({("SGD", FAMILIES[1]): {0.003: 0.10, sgd[0]: 0.11}})
        + [{"label": f"screen SGD {FAMILIES[1]} lr={lr}", "diverged_round": 9} for lr in sgd[1:]]
    }

    def dense(k: int, best: dict[int, float]) -> dict:
        row = _seeded(f"SGD BAFFLE (dense) K={k}", {s: 0.1 for s in best})
        for run in row["runs"]:
            run["best_test_accuracy"] = best[run["seed"]]
        return {**row, "bytes_up_per_client_round": 178060.0}

    agg = {
        "SGD NTK-BAFFLE K=100": {
            **_seeded("SGD NTK-BAFFLE K=100", {0: 0.7, 1: 0.7, 2: 0.7}),
            "bytes_up_per_client_round": 18971.0,
        },
        # seed 0 below 0.2 at both K; seed 1 only at K=100: only seed 0 never trains
        "SGD BAFFLE (dense) K=100": dense(100, {0: 0.18, 1: 0.15, 2: 0.6}),
        "SGD BAFFLE (dense) K=50": dense(50, {0: 0.17, 1: 0.5, 2: 0.6}),
    }
    chosen = {("SGD", "BAFFLE (dense)"): sgd[0]}
    text = "\n".join(bench.departures(PLAN, agg, screen, chosen))
    assert (
        "uploads a model delta of 18,971 bytes per client per round (NTK rows; dense rows 178,060)"
        in text
    )
    assert "4K bytes, 400 at K = 100" in text
    assert (
        f"tried 0.003: 0.1000, {sgd[0]}: 0.1100, {sgd[1]}: diverged (round 9), {sgd[2]}: diverged (round 9); picked {sgd[0]}"
        in text
    )
    assert "at that lr seed 0 never leaves chance at any K" in text
    assert "final: K=100 0.100 (best 0.180), K=50 0.100 (best 0.170)" in text
    assert f"The next lr, {sgd[1]}, diverged; none between the two was tried." in text
    assert "No row of this table runs without it" in text
    agg["SGD BAFFLE (dense) K=50"] = dense(50, {0: 0.3, 1: 0.5, 2: 0.6})  # seed 0 trains at K=50
    text = "\n".join(bench.departures(PLAN, agg, screen, chosen))
    assert "no seed stays below 0.2 best test accuracy at every K" in text


def _screen_row(label: str, val: float | None) -> dict:
    if val is None:
        return {"label": label, "diverged_round": 9}
    return {"label": label, "final_val_accuracy": val, "val_accuracy_by_round": [val] * 5}


def _dense_screen(plan, scores: dict[float, float | None]) -> list[dict]:
    return [_screen_row(bench.dense_sgd_label(plan, lr), v) for lr, v in scores.items()]


# the table's recorded dense SGD screen: chance at 0.003 and 0.01, diverged at 0.03 and 0.1
TABLE_DENSE = {0.003: 0.10, 0.01: 0.11, 0.03: None, 0.1: None}


def test_the_dense_sgd_screen_grows_between_chance_and_divergence_until_an_lr_trains() -> None:
    main = _dense_screen(PLAN, TABLE_DENSE)
    grow = bench.dense_sgd_screen(PLAN, main)
    # the geometric mean of 0.01 (at chance) and 0.03 (diverged): only the new lr is screened
    assert list(grow([])) == ["screen SGD BAFFLE (dense) K=100 lr=0.017"]
    assert grow([])["screen SGD BAFFLE (dense) K=100 lr=0.017"] == bench.dense("SGD", 0.017, 100)
    assert bench.dense_sgd_pick(PLAN, main, []) == (None, None)  # waits for it
    # 0.017 at chance too: between it and 0.03; 0.017 diverged: between 0.01 and it
    at_chance = _dense_screen(PLAN, {0.017: 0.12})
    assert set(grow(at_chance)) == {bench.dense_sgd_label(PLAN, x) for x in (0.017, 0.023)}
    diverged = _dense_screen(PLAN, {0.017: None})
    assert set(grow(diverged)) == {bench.dense_sgd_label(PLAN, x) for x in (0.017, 0.013)}
    # at most 3 lrs are added, then the failure stands with its grid
    three = _dense_screen(PLAN, {0.017: 0.12, 0.023: 0.1, 0.026: 0.1})
    assert bench.dense_sgd_grid(PLAN, main, three) == (0.003, 0.01, 0.017, 0.023, 0.026, 0.03, 0.1)
    lr, score = bench.dense_sgd_pick(PLAN, main, three)
    assert (lr, score) == (0.017, 0.12) and bench.dense_sgd_variants(PLAN, lr, score) == {}
    # 0.017 trains: the grid stops growing, the row runs at it
    trains = _dense_screen(PLAN, {0.017: 0.45})
    assert bench.dense_sgd_grid(PLAN, main, trains) == (0.003, 0.01, 0.017, 0.03, 0.1)
    lr, score = bench.dense_sgd_pick(PLAN, main, trains)
    assert bench.dense_sgd_variants(PLAN, lr, score) == {
        "SGD BAFFLE (dense) K=100, widened screen lr=0.017": bench.dense("SGD", 0.017, 100)
    }


def test_chance_widening_goes_upward_when_no_lr_diverged_and_down_when_all_did() -> None:
    label = str
    up = [_screen_row(label(lr), 0.1) for lr in (0.01, 0.03, 0.1)]
    assert bench.chance_widened((0.01, 0.03, 0.1), label, up, window=5) == (0.01, 0.03, 0.1, 0.3)
    down = [_screen_row(label(lr), None) for lr in (0.01, 0.03)]
    assert bench.chance_widened((0.01, 0.03), label, down, window=5) == (0.003, 0.01, 0.03)
    trains = [_screen_row(label(0.01), 0.1), _screen_row(label(0.03), 0.3)]
    assert bench.chance_widened((0.01, 0.03), label, trains, window=5) == (0.01, 0.03)


def test_the_new_rows_load_batch_rows_upload_k_scalars_and_no_rescale_differs_only_by_it(
    tmp_path,
) -> None:
    """Batch rows are Algorithm 1: mode=batch, the SGD recipe on the server, no clip, K loss
    differences a client (oracle: the uplink payload grows by 8 bytes, one scalar in secure
    aggregation's 64-bit ring, per K per client, one round of the smoke protocol at K and 2K); the no-rescale row is the table's NTK row plus
    ``method.rescale=false``."""
    from fedge.core.config import load_config
    from fedge.experiment.build import build_run

    plan = bench.smoke_plan(tmp_path)
    lrs = dict.fromkeys(bench.batch_families(plan), 0.03)
    variants = bench.batch_variants(plan, lrs)
    assert list(variants) == [
        f"SGD NTK-BAFFLE K={plan.kmid}, batch-level",
        f"SGD BAFFLE (dense) K={plan.kmid}, batch-level",
    ]
    per_round = 5  # smoke: clients.per_round=5
    for (label, overrides), name in zip(variants.items(), ("ntk-baffle", "baffle"), strict=True):
        cfg = load_config(bench.BASE, overrides=[*plan.protocol(), *overrides, "seed=0"])
        m = cfg.method
        assert (m.name, m.mode, m.k, m.clip) == (name, "batch", plan.kmid, None), label
        opt = m.server_optimizer
        assert tuple(opt[x] for x in ("name", "lr", "momentum", "weight_decay", "lr_decay")) == (
            "sgd",
            0.03,
            0.9,
            0.001,
            0.998,
        )
        family = bench.batch_families(plan)[0 if name == "ntk-baffle" else 1]
        up = {}
        for k in (plan.kmid, 2 * plan.kmid):
            over = bench.batch_overrides(plan, family, 0.03, k)
            cfg = load_config(bench.BASE, overrides=[*plan.protocol(), *over, "seed=0"])
            up[k] = build_run(cfg).simulation().run_round(1)["payload_bytes_up"]
        # secure aggregation is on (Eq. 7): each scalar travels in its 64-bit ring, 8 bytes
        assert up[2 * plan.kmid] - up[plan.kmid] == per_round * 8 * plan.kmid, label
    chosen = {("SGD", "NTK-BAFFLE"): 0.03}
    ((label, overrides),) = bench.no_rescale_variants(plan, chosen).items()
    assert label == f"SGD NTK-BAFFLE K={plan.kmid}, no rescale"
    assert overrides == [*bench.ntk(plan, "SGD", 0.03, plan.kmid), "method.rescale=false"]
    cfg = load_config(bench.BASE, overrides=[*plan.protocol(), *overrides, "seed=0"])
    assert cfg.method.rescale is False


def _new(plan, *, batch_rows=(), dense_own=(), batch_screen=()) -> dict:
    """A hand-made :func:`recorded_new_rows` (nothing recorded unless given)."""
    empty = {"results": [], "diverged": {}}
    chosen = bench.batch_picks(plan, {"results": list(batch_screen)})
    breport = {"results": list(batch_rows), "diverged": {}}
    lr, score = bench.dense_sgd_pick(plan, [], list(dense_own))
    return {
        "rows": {r["label"]: r for r in batch_rows},
        "batch": {
            "screen": {"results": list(batch_screen)},
            "chosen": chosen,
            "report": breport,
            "labels": [bench.batch_label(f) for f in bench.batch_families(plan)],
        },
        "dense-sgd": {
            "results": list(dense_own),
            "own": list(dense_own),
            "pick": (lr, score),
            "report": empty,
            "labels": [],
        },
        "no-rescale": {"report": empty, "labels": [bench.no_rescale_label(plan)]},
    }


def test_the_new_rows_render_as_awaiting_their_commands_until_recorded(tmp_path) -> None:
    import dataclasses

    plan = dataclasses.replace(PLAN, records=tmp_path)  # nothing of the table recorded
    own = _dense_screen(plan, {0.01: 0.11, 0.03: None, 0.1: None})
    text = "\n".join(bench.new_rows_lines(plan, {}, _new(plan, dense_own=own)))
    for unit, label in (
        ("batch", "SGD NTK-BAFFLE K=100, batch-level"),
        ("batch", "SGD BAFFLE (dense) K=100, batch-level"),
        ("no-rescale", "SGD NTK-BAFFLE K=100, no rescale"),
    ):
        assert (
            f"| {label} | 0 | awaiting `OMP_NUM_THREADS=1 python benchmarks/ntk_table3.py "
            f"--new-rows {unit}` |" in text
        )
    assert "| 0.01 | awaiting | awaiting |" in text  # the batch screen's grid, not run
    assert (
        "Grid tried: 0.01: 0.1100, 0.017: awaiting (widened), 0.03: diverged (round 9), "
        "0.1: diverged (round 9); awaiting the widened lrs" in text
    )
    assert "- SGD, K=100, batch-level: NTK-BAFFLE − dense BAFFLE: needs both rows" in text
    # recorded: the batch rows show, their verdict is computed; a grid that never trains says so
    rows = [
        {
            **_seeded(bench.batch_label(f), accs),
            "bytes_up_per_client_round": 475.0,
            "bytes_down_per_client_round": 24688.0,
        }
        for f, accs in zip(
            bench.batch_families(plan),
            ({0: 0.70, 1: 0.71, 2: 0.72}, {0: 0.60, 1: 0.60, 2: 0.60}),
            strict=True,
        )
    ]
    own = _dense_screen(
        plan, {0.01: 0.11, 0.03: None, 0.1: None, 0.017: 0.1, 0.023: 0.1, 0.026: 0.1}
    )
    text = "\n".join(bench.new_rows_lines(plan, {}, _new(plan, batch_rows=rows, dense_own=own)))
    assert "| SGD NTK-BAFFLE K=100, batch-level | 3 | 0.7100 ± 0.0100 |" in text
    assert "batch-level: NTK-BAFFLE − dense BAFFLE: +11.00 ± 1.00 points" in text
    assert (
        "no lr of the grid trains on seed 0 (best validation 0.1100 at lr 0.01, below 0.2)" in text
    )
