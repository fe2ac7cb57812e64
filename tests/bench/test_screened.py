"""A screened table: the screen picks on validation and grows past a winning edge, workers share
the runs, and the table is read back from its records (nothing runs, what was recorded is read)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from fedge.bench.screened import (
    read_plan_screen,
    recorded_screen,
    recorded_seeded,
    run_plan,
    when_picked,
)
from fedge.bench.tables import per_seed_cell
from fedge.bench.variants import run_seeded_variants, run_variants
from fedge.core.errors import ConfigError

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


def test_run_screened_picks_on_validation_and_shards_split_the_runs(tmp_path):
    import threading

    from fedge.bench.screened import pick_by_validation, run_screened
    from fedge.bench.variants import recorded

    lrs = (0.01, 0.3)
    screen = {f"lr={lr}": [f"method.client_optimizer.lr={lr}"] for lr in lrs}
    common = [*COMMON, "dataset.validation=20"]
    picked: list[float] = []

    def main(rep):
        lr = pick_by_validation(rep["results"], {lr: f"lr={lr}" for lr in lrs})
        if lr is not None:
            picked.append(lr)
        return (
            None
            if lr is None
            else {
                "a": [f"method.client_optimizer.lr={lr}"],
                "b": [f"method.client_optimizer.lr={lr}", "method.local_epochs=1"],
            }
        )

    def worker(shard, shards, records):
        run_screened(
            "quickstart",
            screen,
            main,
            screen_common=[*common, "rounds=1"],
            protocol=common,
            seeds=(0, 1),
            records=records,
            out=tmp_path / f"runs-{shard}-{shards}",
            shard=shard,
            shards=shards,
            probe_common=[*common, "rounds=1"],
            poll_s=0.2,
            steal=False,
        )  # as on two machines

    worker(0, 1, tmp_path / "one")
    vals = recorded(
        "quickstart", screen, common=[*common, "rounds=1"], records=tmp_path / "one" / "screen"
    )["results"]
    best = max(vals, key=lambda r: (r["final_val_accuracy"], -float(r["label"][3:])))
    assert picked[-1] == float(
        best["label"][3:]
    )  # the validation accuracy decides, never the test accuracy
    files = sorted(
        p.relative_to(tmp_path / "one").as_posix() for p in (tmp_path / "one").rglob("*.json")
    )
    assert files == [
        "probe/a.json",
        "probe/b.json",
        "screen/lr=0.01.json",
        "screen/lr=0.3.json",
        "seed-0/a.json",
        "seed-0/b.json",
        "seed-1/a.json",
        "seed-1/b.json",
    ]
    threads = [threading.Thread(target=worker, args=(i, 2, tmp_path / "two")) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    two = sorted(
        p.relative_to(tmp_path / "two").as_posix() for p in (tmp_path / "two").rglob("*.json")
    )
    assert two == files  # two workers wrote every record once between them
    # each run came from exactly one worker: no worker left a run directory for a record the other wrote
    made = [
        sorted(
            p.parent.relative_to(tmp_path / f"runs-{i}-2").as_posix()
            for p in (tmp_path / f"runs-{i}-2").rglob("summary.json")
        )
        for i in range(2)
    ]
    assert not set(made[0]) & set(made[1]) and len(made[0]) + len(made[1]) == len(files)
    for rel in files:
        one, other = (
            json.loads((tmp_path / d / rel).read_text())["result"] for d in ("one", "two")
        )
        assert one["final_test_accuracy"] == other["final_test_accuracy"]  # same runs, same numbers
    with pytest.raises(ConfigError, match="shard 2 of 2"):
        worker(2, 2, tmp_path / "bad")


def test_a_lone_worker_steals_the_runs_of_a_worker_that_never_came(tmp_path):
    from fedge.bench.screened import run_screened

    screen = {
        "lr=0.1": ["method.client_optimizer.lr=0.1"],
        "lr=0.3": ["method.client_optimizer.lr=0.3"],
    }
    variants = {"a": ["method.client_optimizer.lr=0.1"], "b": ["method.client_optimizer.lr=0.3"]}

    def run(**kw):
        run_screened(
            "quickstart",
            screen,
            lambda rep: variants if len(rep["results"]) == 2 else None,
            screen_common=[*COMMON, "rounds=1"],
            protocol=[*COMMON, "rounds=1"],
            seeds=(0,),
            records=tmp_path / "rec",
            out=tmp_path / "runs",
            shard=1,
            shards=2,
            poll_s=0.05,
            **kw,
        )

    run()  # worker 1 of 2, alone: its share, then worker 0's (without stealing it would wait forever)
    files = sorted(
        p.relative_to(tmp_path / "rec").as_posix() for p in (tmp_path / "rec").rglob("*.json")
    )
    assert files == ["screen/lr=0.1.json", "screen/lr=0.3.json", "seed-0/a.json", "seed-0/b.json"]


def test_grid_step_walks_the_1_3_10_ladder():
    from fedge.bench.screened import grid_step

    assert [grid_step(x, up=True) for x in (0.001, 0.003, 0.01, 0.03, 0.3, 1.0)] == [
        0.003,
        0.01,
        0.03,
        0.1,
        1.0,
        3.0,
    ]
    assert [grid_step(x, up=False) for x in (0.001, 0.003, 0.01, 0.1)] == [
        0.0003,
        0.001,
        0.003,
        0.03,
    ]
    assert grid_step(0.05, up=True) == 0.158  # off the ladder: sqrt(10)


def test_widened_grid_grows_past_a_winning_edge_until_bracketed():
    from fedge.bench.screened import widened_grid

    def rows(vals):
        return [{"label": f"lr={lr}", "final_val_accuracy": v} for lr, v in vals.items()]

    def label(lr):
        return f"lr={lr}"

    base = (0.003, 0.01, 0.03)
    assert widened_grid(base, label, rows({0.003: 0.2})) == base  # not all screened yet: no verdict
    assert (
        widened_grid(base, label, rows({0.003: 0.2, 0.01: 0.5, 0.03: 0.4})) == base
    )  # interior: bracketed
    top = {0.003: 0.2, 0.01: 0.3, 0.03: 0.4}
    assert widened_grid(base, label, rows(top)) == (0.003, 0.01, 0.03, 0.1)  # 0.1 to screen next
    assert widened_grid(base, label, rows({**top, 0.1: 0.35})) == (
        0.003,
        0.01,
        0.03,
        0.1,
    )  # 0.03 now interior
    assert widened_grid(base, label, rows({**top, 0.1: 0.5})) == (0.003, 0.01, 0.03, 0.1, 0.3)
    assert widened_grid(base, label, rows({**top, 0.1: 0.5, 0.3: 0.6})) == (
        0.003,
        0.01,
        0.03,
        0.1,
        0.3,
    )  # at most 2 steps
    assert widened_grid(base, label, rows({0.003: 0.5, 0.01: 0.3, 0.03: 0.3})) == (
        0.001,
        0.003,
        0.01,
        0.03,
    )
    # the test accuracy never matters
    assert (
        widened_grid(
            base,
            label,
            [{**r, "final_test_accuracy": 1.0 - r["final_val_accuracy"]} for r in rows(top)],
        )[-1]
        == 0.1
    )


def test_a_growing_screen_is_screened_until_it_stops_growing(tmp_path):
    from fedge.bench.screened import recorded_grown, run_screened

    def screen(results):  # a second lr once the first is recorded (as a widened grid would add one)
        labels = {r["label"] for r in results}
        lrs = (0.1, 0.3) if "lr=0.1" in labels else (0.1,)
        return {f"lr={lr}": [f"method.client_optimizer.lr={lr}"] for lr in lrs}

    seen = []

    def main(rep):
        seen.append(sorted(r["label"] for r in rep["results"]))
        return {"a": ["method.client_optimizer.lr=0.1"]}

    common = [*COMMON, "rounds=1"]
    run_screened(
        "quickstart",
        screen,
        main,
        screen_common=common,
        protocol=common,
        seeds=(0,),
        records=tmp_path / "rec",
        out=tmp_path / "runs",
        poll_s=0.05,
    )
    assert seen == [["lr=0.1", "lr=0.3"]]  # main saw the grown screen, whole
    rep = recorded_grown("quickstart", screen, common=common, records=tmp_path / "rec" / "screen")
    assert (
        sorted(r["label"] for r in rep["results"]) == ["lr=0.1", "lr=0.3"] and rep["missing"] == []
    )


def test_work_share_takes_its_own_first_then_the_idle_others_and_skips_busy_runs():
    from fedge.bench.screened import _work_share
    from fedge.experiment.claim import RunDirBusyError

    ran: list[int] = []

    def run_one(i):
        if i == 2:  # another process is driving this run now
            raise RunDirBusyError("busy")
        ran.append(i)

    _work_share(list(range(6)), 1, 3, run_one, steal=True)
    assert ran == [1, 4, 0, 3, 5]  # own (1, 4), then the others' in order, 2 left to its driver
    ran.clear()
    _work_share(list(range(6)), 1, 3, run_one, steal=False)
    assert ran == [1, 4]
    ran.clear()
    _work_share(list(range(6)), 1, 3, run_one, steal=True, own=False)
    assert ran == [0, 3, 5]


def test_run_screened_only_runs_the_named_variants_and_seeds(tmp_path):
    from fedge.bench.screened import run_screened

    screen = {"lr=0.1": ["method.client_optimizer.lr=0.1"]}
    variants = {
        "a": ["method.client_optimizer.lr=0.1"],
        "b": ["method.client_optimizer.lr=0.1", "method.local_epochs=1"],
    }

    def run(only, records):
        run_screened(
            "quickstart",
            screen,
            lambda rep: variants if rep["results"] else None,
            screen_common=[*COMMON, "rounds=1"],
            protocol=[*COMMON, "rounds=1"],
            seeds=(0, 1),
            records=records,
            out=tmp_path / "runs",
            only=only,
            poll_s=0.1,
        )

    run([("b", 1), ("a", None)], tmp_path / "rec")
    files = sorted(
        p.relative_to(tmp_path / "rec").as_posix() for p in (tmp_path / "rec").rglob("*.json")
    )
    assert files == ["screen/lr=0.1.json", "seed-0/a.json", "seed-1/a.json", "seed-1/b.json"]
    with pytest.raises(
        ConfigError,
        match=r"--only \['c'\]: not a variant of this table; expected one of \['a', 'b'\]",
    ):
        run([("c", None)], tmp_path / "rec")


def test_a_screen_run_that_diverges_is_recorded_as_the_worst_of_its_grid(tmp_path):
    from fedge.bench.screened import pick_by_validation, run_screened
    from fedge.bench.tables import screen_cell
    from fedge.bench.variants import recorded
    from fedge.core.errors import DivergenceError

    screen = {
        "lr=0.1": ["method.client_optimizer.lr=0.1"],
        "lr=100000.0": ["method.client_optimizer.lr=0.1", "method.server_optimizer.lr=1e5"],
    }
    common = [*COMMON, "rounds=2", "dataset.validation=20"]
    with pytest.raises(
        DivergenceError
    ) as caught:  # outside a screen a divergence is still an error
        run_variants(
            "quickstart", {"x": screen["lr=100000.0"]}, out_root=tmp_path / "plain", common=common
        )
    assert caught.value.round == 1
    picked = []

    def main(rep):
        picked.append(pick_by_validation(rep["results"], {0.1: "lr=0.1", 1e5: "lr=100000.0"}))
        return {"a": ["method.client_optimizer.lr=0.1"]}

    run_screened(
        "quickstart",
        screen,
        main,
        screen_common=common,
        protocol=[*COMMON, "rounds=1"],
        seeds=(0,),
        records=tmp_path / "rec",
        out=tmp_path / "runs",
        poll_s=0.05,
    )
    assert picked == [0.1]  # the larger lr diverged: it lost, and the worker went on
    rows = {
        r["label"]: r
        for r in recorded("quickstart", screen, common=common, records=tmp_path / "rec" / "screen")[
            "results"
        ]
    }
    bad = rows["lr=100000.0"]  # read back from its record: the screen is not rerun
    assert bad["diverged_round"] == 1 and bad["final_val_accuracy"] is None
    assert bad["diverged"].startswith("training diverged in round 1")
    assert screen_cell(bad) == "diverged (round 1)" and screen_cell(None) == "not run"
    assert screen_cell(rows["lr=0.1"]) == f"{rows['lr=0.1']['final_val_accuracy']:.4f}"


def test_pick_by_validation_ranks_a_diverged_run_below_every_finished_one():
    from fedge.bench.screened import pick_by_validation, widened_grid

    def label(lr):
        return f"lr={lr}"

    rows = [
        {"label": "lr=0.01", "final_val_accuracy": 0.1},
        {"label": "lr=0.03", "final_val_accuracy": 0.05},
        {"label": "lr=0.1", "diverged_round": 3, "final_val_accuracy": None},
    ]
    assert pick_by_validation(rows, {lr: label(lr) for lr in (0.01, 0.03, 0.1)}) == 0.01
    # the winner is the smallest lr, an edge: the grid grows downwards, not past the diverged top
    assert widened_grid((0.01, 0.03, 0.1), label, rows) == (0.003, 0.01, 0.03, 0.1)
    every = [
        {"label": label(lr), "diverged_round": 1, "final_val_accuracy": None} for lr in (0.01, 0.03)
    ]
    assert (
        pick_by_validation(every, {lr: label(lr) for lr in (0.01, 0.03)}) == 0.01
    )  # all diverged: the smallest


def test_a_main_run_that_diverges_is_a_listed_result_not_averaged_in(tmp_path):
    from fedge.bench.screened import recorded_probes, recorded_seeded, run_screened
    from fedge.bench.tables import not_run_cell

    variants = {
        "a": ["method.client_optimizer.lr=0.1"],
        "boom": ["method.client_optimizer.lr=0.1", "method.server_optimizer.lr=1e5"],
    }
    common = [*COMMON, "rounds=1"]
    probe = [*common, "measure.flops=true"]
    run_screened(
        "quickstart",
        {},
        lambda _rep: variants,
        screen_common=common,
        protocol=common,
        seeds=(0, 1),
        records=tmp_path / "rec",
        out=tmp_path / "runs",
        poll_s=0.05,
        probe_common=probe,
    )  # the worker went on
    # the probe of "boom" diverged too: recorded as such (not rerun), and left out of the table's probes
    assert (
        json.loads((tmp_path / "rec" / "probe" / "boom.json").read_text())["result"][
            "diverged_round"
        ]
        == 1
    )
    probes = recorded_probes(
        "quickstart", variants, common=probe, records=tmp_path / "rec" / "probe"
    )
    assert list(probes) == ["a"] and probes["a"]["client_flops_per_client_round"] > 0
    report = recorded_seeded(
        "quickstart", variants, seeds=(0, 1), common=common, records=tmp_path / "rec"
    )
    assert [r["label"] for r in report["results"]] == ["a"] and report["missing"] == []
    assert report["diverged"] == {"boom": [{"seed": 0, "round": 1}, {"seed": 1, "round": 1}]}
    assert not_run_cell(report, "boom") == "seed 0 diverged (round 1), seed 1 diverged (round 1)"
    assert not_run_cell(report, "a") == "not run yet"
    # one seed of "a" diverged (its record rewritten as a diverged one): the other is the row, the table says which
    path = tmp_path / "rec" / "seed-1" / "a.json"
    rec = json.loads(path.read_text())
    seed0 = json.loads((tmp_path / "rec" / "seed-0" / "a.json").read_text())["result"][
        "final_test_accuracy"
    ]
    rec["result"] = {
        "label": "a",
        "overrides": variants["a"],
        "diverged_round": 7,
        "diverged": "training diverged in round 7",
        "final_val_accuracy": None,
        "final_test_accuracy": None,
    }
    path.write_text(json.dumps(rec))
    row = recorded_seeded(
        "quickstart", variants, seeds=(0, 1), common=common, records=tmp_path / "rec"
    )["results"][0]
    assert (
        row["seeds"] == 1
        and row["final_test_accuracy"] == seed0
        and row["final_test_accuracy_std"] == 0.0
    )
    assert row["diverged"] == [{"seed": 1, "round": 7}]
    assert per_seed_cell(row) == f"{seed0:.4f}, seed 1 diverged (round 7)"


def test_a_windowed_validation_score_judges_where_a_swinging_run_sits():
    from fedge.bench.screened import pick_by_validation, validation_score, widened_grid
    from fedge.bench.tables import screen_cell

    steady = {
        "label": "lr=0.01",
        "final_val_accuracy": 0.20,
        "val_accuracy_by_round": [None, 0.19, None, 0.21, None, 0.20],
    }
    swing = {
        "label": "lr=0.03",
        "final_val_accuracy": 0.25,
        "val_accuracy_by_round": [None, 0.05, None, 0.10, None, 0.25],
    }
    assert (
        validation_score(steady) == 0.20 and validation_score(swing, 1) == 0.25
    )  # the final evaluation
    assert validation_score(steady, 3) == pytest.approx(0.20) and validation_score(
        swing, 3
    ) == pytest.approx(0.4 / 3)
    assert validation_score(swing, 2) == pytest.approx(
        0.175
    )  # the last 2 evaluations; rounds not evaluated skipped
    assert validation_score({"label": "x", "diverged_round": 4}, 3) is None
    labels = {0.01: "lr=0.01", 0.03: "lr=0.03"}
    assert (
        pick_by_validation([steady, swing], labels) == 0.03
    )  # its last evaluation happened to be high
    assert pick_by_validation([steady, swing], labels, window=3) == 0.01
    assert screen_cell(swing, 3) == "0.1333"
    # the window decides the widening too: 0.01 wins at the lower edge, so 0.003 is screened next
    assert widened_grid((0.01, 0.03), lambda lr: f"lr={lr}", [steady, swing], window=3) == (
        0.003,
        0.01,
        0.03,
    )


def test_main_tasks_are_seed_major_and_respect_only():
    from fedge.bench.screened import main_tasks

    assert main_tasks(["a", "b", "c"], (0, 1)) == [
        ("a", 0),
        ("b", 0),
        ("c", 0),
        ("a", 1),
        ("b", 1),
        ("c", 1),
    ]
    # a table stopped after its first len(variants) runs has one seed of every row
    assert {label for label, _ in main_tasks(["a", "b", "c"], (0, 1, 2))[:3]} == {"a", "b", "c"}
    assert main_tasks(["a", "b"], (0, 1, 2), only=[("b", None), ("a", 2)]) == [
        ("b", 0),
        ("b", 1),
        ("a", 2),
        ("b", 2),
    ]
