"""Variant tables: runs are resumed or read rather than rerun, and the table shows what was logged."""

from __future__ import annotations

import json

import pytest

from fedge.bench.tables import variants_markdown
from fedge.bench.variants import run_variants
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

    from fedge.bench.tables import seeded_markdown
    from fedge.bench.variants import run_seeded_variants

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


def test_a_none_neutral_key_is_filled_only_where_the_wanted_config_has_it() -> None:
    """``method.k_final`` (neutral None) is BAFFLE's: a FedAvg record lacking it must not gain it,
    or it would differ from FedAvg's wanted config, which has no such key; BAFFLE's record does."""
    from fedge.bench.variants import with_neutral_additions

    fedavg = {"method": {"name": "fedavg"}}
    assert with_neutral_additions(fedavg, {"method": {"name": "fedavg"}}) == fedavg
    baffle = {"method": {"name": "baffle"}}
    want = {"method": {"name": "baffle", "k_final": None, "prefix_once": False}}
    assert with_neutral_additions(baffle, want) == want
    other = {"method": {"name": "baffle", "k_final": 200, "prefix_once": False}}
    assert with_neutral_additions(baffle, other) != other  # a K schedule is another run


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


def test_a_record_from_before_draws_existed_is_a_torch_draws_run(tmp_path):
    """A record committed before the run-level ``draws`` key (its config lacks it) was made with
    torch's generators: it matches ``draws: torch`` and not ``draws: portable`` (the default)."""
    torch_draws = {"a": ["draws=torch"]}
    run_variants(
        "quickstart",
        torch_draws,
        out_root=tmp_path / "runs",
        common=COMMON,
        records=tmp_path / "rec",
    )
    path = tmp_path / "rec" / "a.json"
    stored = json.loads(path.read_text())
    assert stored["config"].pop("draws") == "torch"
    path.write_text(json.dumps(stored))
    (row,) = run_variants(
        "quickstart",
        torch_draws,
        out_root=tmp_path / "none",
        common=COMMON,
        records=tmp_path / "rec",
    )["results"]
    assert row["run_dir"] is None and not (tmp_path / "none").exists()
    with pytest.raises(ConfigError, match="different config"):
        run_variants(
            "quickstart",
            {"a": []},
            out_root=tmp_path / "none",
            common=COMMON,
            records=tmp_path / "rec",
        )


def test_a_record_from_before_local_test_splits_still_matches(tmp_path):
    """A record committed before ``partition.local_test`` and ``local_eval_every`` existed (its
    config lacks both) is the same run as one without local test splits, and a different one
    with them."""
    run_variants(
        "quickstart", {"a": []}, out_root=tmp_path / "runs", common=COMMON, records=tmp_path / "rec"
    )
    path = tmp_path / "rec" / "a.json"
    stored = json.loads(path.read_text())
    assert stored["config"]["partition"].pop("local_test") is None
    assert stored["config"].pop("local_eval_every") is None
    path.write_text(json.dumps(stored))
    (row,) = run_variants(
        "quickstart", {"a": []}, out_root=tmp_path / "none", common=COMMON, records=tmp_path / "rec"
    )["results"]
    assert row["run_dir"] is None and not (tmp_path / "none").exists()
    with pytest.raises(ConfigError, match="different config"):
        run_variants(
            "quickstart",
            {"a": ["partition.local_test=0.2"]},
            out_root=tmp_path / "none",
            common=COMMON,
            records=tmp_path / "rec",
        )


def test_a_zeroth_order_client_whose_forwards_blow_up_is_a_diverged_row(tmp_path):
    """Epoch-mode BAFFLE at an lr that makes the client's own model overflow within its local
    steps: its loss differences go non-finite on the client, which is training that diverged, so
    a screen records the variant as diverged (its lr loses) instead of failing."""
    baffle = [
        "method.name=baffle",
        "method.mode=epoch",
        "method.k=4",
        "method.batch_size=16",
        "method.clip=null",
        "method.client_optimizer.name=sgd",
        "model.name=mlp",
        "model.hidden=[8]",
    ]
    variants = {"blows up": [*baffle, "method.client_optimizer.lr=1e30"]}
    got = run_variants(
        "quickstart", variants, out_root=tmp_path, common=COMMON, record_divergence=True
    )
    row = got["results"][0]
    assert row["diverged_round"] == 1 and row["final_val_accuracy"] is None
    assert "non-finite" in row["diverged"]
