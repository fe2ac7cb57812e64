"""Variant tables: runs are resumed or read rather than rerun, and the table shows what was logged."""

from __future__ import annotations

import json

import pytest

from fedge.bench.variants import run_variants, variants_markdown
from fedge.core.errors import ConfigError
from fedge.experiment.provenance import machine

COMMON = ["rounds=2", "eval_every=1", "clients.num=4", "clients.per_round=2", "threads=1"]


def test_run_variants_runs_then_reads_complete_runs(tmp_path):
    variants = {"a": ["method.local_epochs=1"], "b": ["method.local_epochs=2"]}
    first = run_variants("quickstart", variants, out_root=tmp_path, common=COMMON)
    assert [r["label"] for r in first["results"]] == ["a", "b"] and first["missing"] == []
    metrics = tmp_path / "a" / "metrics.jsonl"
    stamp = metrics.stat().st_mtime_ns
    again = run_variants("quickstart", variants, out_root=tmp_path, common=COMMON)
    assert metrics.stat().st_mtime_ns == stamp  # read, not rerun
    assert again["results"] == first["results"]
    r = first["results"][0]
    assert len(r["accuracy_by_round"]) == 2 and 0 <= r["final_test_accuracy"] <= 1
    assert r["bytes_up_per_client_round"] > 0 and r["client_flops_per_round"] > 0
    assert r["client_flops_effective_per_round"] is None and r["client_tensor_peak_bytes"] is None
    table = variants_markdown(first, "cmd", "intro")
    assert "effective GFLOP" not in table and "client peak MiB" not in table
    assert table.count("\n| a |") == 1 and "Command: `cmd`" in table


def test_run_variants_without_running_lists_the_missing(tmp_path):
    report = run_variants("quickstart", {"x": []}, out_root=tmp_path, common=COMMON, run=False)
    assert report["results"] == [] and report["missing"] == ["x"]
    assert "Not run yet (the command resumes them): x" in variants_markdown(report, "cmd", "intro")


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


def test_more_rounds_extend_a_finished_variant_and_a_changed_one_is_refused(tmp_path):
    import pytest

    run_variants("quickstart", {"a": []}, out_root=tmp_path, common=COMMON)
    longer = [x if not x.startswith("rounds=") else "rounds=3" for x in COMMON]
    (r,) = run_variants("quickstart", {"a": []}, out_root=tmp_path, common=longer)["results"]
    assert len(r["accuracy_by_round"]) == 3
    with pytest.raises(ConfigError, match="different config"):
        run_variants(
            "quickstart", {"a": ["method.local_epochs=5"]}, out_root=tmp_path, common=longer
        )
    with pytest.raises(ConfigError, match="different config"):  # never shortened
        run_variants("quickstart", {"a": []}, out_root=tmp_path, common=COMMON)


def test_seeded_variants_aggregate_mean_and_std_over_seeds(tmp_path):
    import statistics

    from fedge.bench.variants import run_seeded_variants, seeded_markdown

    common = [*COMMON, "dataset.validation=0.1"]
    report = run_seeded_variants(
        "quickstart",
        {"a": [], "b": ["method.local_epochs=2"]},
        seeds=[0, 1, 2],
        out_root=tmp_path,
        common=common,
    )
    row = report["results"][0]
    finals = [r["final_test_accuracy"] for r in row["runs"]]
    assert row["seeds"] == 3 and len({r["run_dir"] for r in row["runs"]}) == 3
    assert row["final_test_accuracy"] == statistics.mean(finals)
    assert row["final_test_accuracy_std"] == statistics.stdev(finals)
    assert row["test_accuracy_at_best_val"] == statistics.mean(
        r["test_accuracy_at_best_val"] for r in row["runs"]
    )
    text = seeded_markdown(report, "cmd", "intro")
    assert text.count(" ± ") >= 6 and "test acc at best val" in text


def test_records_outlive_the_run_directory_and_guard_their_config(tmp_path):
    import shutil

    first = run_variants(
        "quickstart", {"a": []}, out_root=tmp_path / "runs", common=COMMON, records=tmp_path / "rec"
    )
    record = json.loads((tmp_path / "rec" / "a.json").read_text())
    assert record["config"]["rounds"] == first["results"][0]["accuracy_by_round"].__len__()
    (segment,) = record["result"]["machines"]  # one machine ran rounds 1-2: the record says which
    assert segment["rounds"] == [1, 2] and segment["machine"]["cpu"] == machine()["cpu"]
    shutil.rmtree(tmp_path / "runs")  # the machine that ran it is gone; the committed record is not
    again = run_variants(
        "quickstart", {"a": []}, out_root=tmp_path / "runs", common=COMMON, records=tmp_path / "rec"
    )
    assert not (tmp_path / "runs").exists()  # read from the record, nothing rerun
    (row,) = again["results"]
    assert (
        row["final_test_accuracy"] == first["results"][0]["final_test_accuracy"]
        and row["run_dir"] is None
    )
    with pytest.raises(ConfigError, match="different config"):
        run_variants(
            "quickstart",
            {"a": ["method.local_epochs=3"]},
            out_root=tmp_path / "runs",
            common=COMMON,
            records=tmp_path / "rec",
        )


def test_costs_are_per_client_averaged_over_all_rounds_with_pruning_phases_apart(tmp_path):
    """Oracle: hand sums over the runs' metrics.jsonl, and NTK-Rand's rounds (no pruning phases,
    same sparse model size) for the training bytes of NTK-Ori's round 1."""
    common = [
        "rounds=3",
        "eval_every=1",
        "clients.num=4",
        "clients.per_round=2",
        "threads=1",
        "model.name=mlp",
        "method.name=ntk-baffle",
        "method.k=8",
        "method.max_steps=2",
        "method.density=0.2",
        "method.prune_rounds=3",
        "method.prune_inputs=8",
        "method.prune_k=4",
    ]
    report = run_variants(
        "quickstart",
        {"ori": ["method.prune_data=client"], "rand": []},
        out_root=tmp_path,
        common=common,
    )
    ori, rand = report["results"]
    lines = [json.loads(x) for x in (tmp_path / "ori" / "metrics.jsonl").read_text().splitlines()]
    assert [x.get("phases", 1) for x in lines] == [4, 1, 1]  # 3 pruning phases ride in round 1
    assert ori["pretraining_phases"] == 3 and rand["pretraining_phases"] == 0
    for key in ("bytes_up", "bytes_down"):
        later = [x[key] / x["clients"] for x in lines[1:]]
        training = sum(later) / 2
        assert ori[f"pretraining_{key}_per_client"] == pytest.approx(
            lines[0][key] / lines[0]["clients"] - training
        )
        assert ori[f"{key}_per_client_round"] == pytest.approx(
            training
        )  # round 1 counted as a training round
        assert ori[f"{key}_per_client_round"] == pytest.approx(rand[f"{key}_per_client_round"])
        assert rand[f"pretraining_{key}_per_client"] == 0.0
    # each pruning phase uploads 4 float32 per client, plus the message's framing
    assert 3 * 4 * 4 <= ori["pretraining_bytes_up_per_client"] < 3 * (4 * 4 + 200)
    assert ori["client_flops_per_client_round"] == pytest.approx(
        sum(x["client_flops"] / x["clients"] for x in lines) / 3
    )
    assert ori["client_flops_per_round"] == pytest.approx(
        sum(x["client_flops"] for x in lines) / 3
    )  # summed over clients
    text = variants_markdown(report, "cmd", "")
    assert "pruning phases B/client (up / down)" in text and "mean of all rounds" in text
    row = next(x for x in text.splitlines() if x.startswith("| ori |"))
    assert (
        f"| {ori['pretraining_bytes_up_per_client']:.0f} / {ori['pretraining_bytes_down_per_client']:.0f} |"
        in row
    )
    assert next(x for x in text.splitlines() if x.startswith("| rand |")).count("| - |") >= 1


def test_bytes_of_a_run_without_pruning_are_the_mean_over_rounds(tmp_path):
    (r,) = run_variants(
        "quickstart", {"a": ["clients.per_round=3"]}, out_root=tmp_path, common=COMMON
    )["results"]
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert r["bytes_up_per_client_round"] == pytest.approx(
        sum(x["bytes_up"] / 3 for x in lines) / len(lines)
    )
    assert r["client_flops_per_client_round"] == pytest.approx(r["client_flops_per_round"] / 3)


@pytest.mark.parametrize(
    ("key", "neutral", "other"), [("lr_decay", 1.0, "0.9"), ("state", "fresh", "persistent")]
)
def test_a_record_from_before_a_neutral_key_existed_still_matches(tmp_path, key, neutral, other):
    """A record committed before ``client_optimizer.lr_decay`` (or ``.state``) existed (its config
    lacks the key) is the same run as one with the neutral value (no decay; a fresh optimizer each
    round), and a different one with any other value."""
    run_variants(
        "quickstart", {"a": []}, out_root=tmp_path / "runs", common=COMMON, records=tmp_path / "rec"
    )
    path = tmp_path / "rec" / "a.json"
    stored = json.loads(path.read_text())
    assert stored["config"]["method"]["client_optimizer"].pop(key) == neutral
    path.write_text(json.dumps(stored))
    (row,) = run_variants(
        "quickstart", {"a": []}, out_root=tmp_path / "none", common=COMMON, records=tmp_path / "rec"
    )["results"]
    assert row["run_dir"] is None and not (tmp_path / "none").exists()
    with pytest.raises(ConfigError, match="different config"):
        run_variants(
            "quickstart",
            {"a": [f"method.client_optimizer.{key}={other}"]},
            out_root=tmp_path / "none",
            common=COMMON,
            records=tmp_path / "rec",
        )


def test_run_screened_picks_on_validation_and_shards_split_the_runs(tmp_path):
    import threading

    from fedge.bench.variants import pick_by_validation, recorded, run_screened

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
    from fedge.bench.variants import run_screened

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
    from fedge.bench.variants import grid_step

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
    from fedge.bench.variants import widened_grid

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
    from fedge.bench.variants import recorded_grown, run_screened

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
    from fedge.bench.variants import _work_share
    from fedge.experiment.rundir import RunDirBusyError

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
    from fedge.bench.variants import run_screened

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
    from fedge.bench.variants import pick_by_validation, recorded, run_screened, screen_cell
    from fedge.experiment.run import DivergenceError

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
    from fedge.bench.variants import pick_by_validation, widened_grid

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
    from fedge.bench.screened import per_seed_cell, recorded_probes, recorded_seeded
    from fedge.bench.variants import not_run_cell, run_screened

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
    from fedge.bench.variants import pick_by_validation, screen_cell, validation_score, widened_grid

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
    from fedge.bench.variants import main_tasks

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


def test_a_side_evaluated_model_is_a_row_equal_to_its_own_runs(tmp_path):
    """The raw model logged beside an EMA (``method.ema_also_raw``) makes the "w/o EMA" row from
    the EMA row's runs: the oracle is the same variant run with ``ema=null``, seed by seed."""
    import statistics

    from fedge.bench.variants import run_seeded_variants, side_row

    common = [
        *COMMON,
        "rounds=3",
        "dataset.validation=0.1",
        "method.name=baffle",
        "method.mode=epoch",
        "method.k=8",
        "method.max_steps=3",
        "method.sigma=0.001",
    ]
    report = run_seeded_variants(
        "quickstart",
        {"ema": ["method.ema_also_raw=true"], "w/o": ["method.ema=null"]},
        seeds=[0, 1],
        out_root=tmp_path / "runs",
        common=common,
        records=tmp_path / "rec",
    )
    ema, plain = report["results"]
    raw = side_row(ema, "raw", "w/o (raw)", ["method.ema_also_raw=true"])
    assert raw is not None and raw["label"] == "w/o (raw)" and raw["seeds"] == 2
    for key in (
        "final_test_accuracy",
        "final_test_accuracy_std",
        "best_test_accuracy",
        "test_accuracy_at_best_val",
    ):
        assert raw[key] == plain[key], key
    assert [r["accuracy_by_round"] for r in raw["runs"]] == [
        r["accuracy_by_round"] for r in plain["runs"]
    ]
    assert raw["final_test_accuracy"] == statistics.mean(
        r["side"]["raw"]["final_test_accuracy"] for r in ema["runs"]
    )
    assert (
        raw["bytes_up_per_client_round"] == ema["bytes_up_per_client_round"]
    )  # the same runs, the same costs
    assert (
        side_row(plain, "raw", "x", []) is None
    )  # runs made without the side evaluation have none
    # a record made before the key existed matches ema_also_raw's neutral value (off), not on
    path = tmp_path / "rec" / "seed-0" / "w-o.json"
    stored = json.loads(path.read_text())
    assert stored["config"]["method"].pop("ema_also_raw") is False
    path.write_text(json.dumps(stored))
    again = run_seeded_variants(
        "quickstart",
        {"w/o": ["method.ema=null"]},
        seeds=[0],
        out_root=tmp_path / "none",
        common=common,
        records=tmp_path / "rec",
    )
    assert again["results"][0]["runs"][0]["run_dir"] is None and not (tmp_path / "none").exists()
