"""benchmarks/baffle_delta_loss.py: the variants it runs and its tables, on tiny hand-made records
(hand-computed means, paired differences and t intervals; nothing is trained)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from fedge.bench.stats import t_interval
from fedge.core.config import load_config
from fedge.experiment.build import resolved_config
from tests_helpers import benchmark_script

bench = benchmark_script("baffle_delta_loss")

# per seed: (local_set accuracy at every round, batch accuracy at rounds RATIO, 2 RATIO, ...)
LOCAL = {s: [0.1 + 0.01 * r + 0.001 * s for r in range(1, bench.ROUNDS + 1)] for s in bench.SEEDS}
EVALS = {
    s: [0.1 + 0.009 * t - 0.002 * s * (t == bench.ROUNDS) for t in range(1, bench.ROUNDS + 1)]
    for s in bench.SEEDS
}


def _batch_curve(seed: int) -> list[float | None]:
    """80 rounds, evaluated every RATIO-th (None between, as the engine logs them)."""
    out: list[float | None] = [None] * (bench.ROUNDS * bench.RATIO)
    for t, acc in enumerate(EVALS[seed], start=1):
        out[bench.RATIO * t - 1] = acc
    return out


def _run(seed: int, variant: str) -> dict:
    curve = LOCAL[seed] if variant == "local_set" else _batch_curve(seed)
    return {
        "seed": seed,
        "accuracy_by_round": curve,
        "final_test_accuracy": curve[-1],
        "test_accuracy_at_best_val": 0.3 + (0.01 * seed if variant == "local_set" else 0.0),
    }


def _report() -> dict:
    results = []
    for v in bench.VARIANTS:
        runs = [_run(s, v) for s in bench.SEEDS]
        vals = [r["test_accuracy_at_best_val"] for r in runs]
        results.append(
            {
                "label": v,
                "seeds": len(runs),
                "runs": runs,
                "bytes_up_per_client_round": 1430.0,
                "bytes_down_per_client_round": 107848.0,
                "test_accuracy_at_best_val": statistics.mean(vals),
                "test_accuracy_at_best_val_std": statistics.stdev(vals),
            }
        )
    return {"results": results, "missing": []}


def test_the_variants_differ_only_in_delta_loss_on_and_spend_equal_forwards() -> None:
    main = bench.main_variants({"batch": 0.003, "local_set": 0.01})
    batch, local = (
        resolved_config(load_config(bench.BASE, overrides=[*bench.PROTOCOL, *main[v]]))
        for v in ("batch", "local_set")
    )
    assert (
        batch["method"]["delta_loss_on"] == "batch"
        and local["method"]["delta_loss_on"] == "local_set"
    )
    assert (
        batch["method"]["server_optimizer"]["name"]
        == local["method"]["server_optimizer"]["name"]
        == "adam"
    )
    assert (
        batch["method"]["server_optimizer"]["lr"],
        local["method"]["server_optimizer"]["lr"],
    ) == (0.003, 0.01)
    assert batch["method"]["secure_aggregation"] is True  # batch mode's default, kept
    # the same forwards over each whole run: rounds × (K + 1) × samples evaluated per round
    assert (
        batch["rounds"] * bench.FORWARDS["batch"] == local["rounds"] * bench.FORWARDS["local_set"]
    )
    per_client = (local["dataset"]["limit_train"] - local["dataset"]["validation"]) // local[
        "clients"
    ]["num"]
    assert bench.FORWARDS["local_set"] == (local["method"]["k"] + 1) * per_client == 101 * 64
    assert (
        bench.FORWARDS["batch"]
        == (batch["method"]["k"] + 1) * batch["method"]["batch_size"]
        == 101 * 16
    )
    for cfg in (batch, local):
        cfg["method"]["delta_loss_on"] = cfg["method"]["server_optimizer"]["lr"] = None
        cfg["rounds"] = cfg["eval_every"] = None
    assert batch == local


def test_accuracy_at_reads_the_round_and_refuses_an_unevaluated_one() -> None:
    run = _run(1, "batch")
    assert bench.accuracy_at(run, bench.RATIO) == EVALS[1][0]
    with pytest.raises(ValueError, match="round 1 of seed 1 was not evaluated"):
        bench.accuracy_at(run, 1)


def test_paired_difference_and_interval_by_hand() -> None:
    rows = {r["label"]: r for r in _report()["results"]}
    d = bench.paired_at(rows, {"local_set": 20, "batch": 20})  # batch round 20 = its 5th evaluation
    want = [LOCAL[s][19] - EVALS[s][4] for s in bench.SEEDS]
    assert d is not None and d["diffs"] == pytest.approx(want)
    half = 4.303 * statistics.stdev(want) / math.sqrt(3)  # t(0.975, 2 df)
    assert (d["lo"], d["hi"]) == pytest.approx(
        (statistics.mean(want) - half, statistics.mean(want) + half)
    )


@pytest.mark.parametrize(
    ("diffs", "says"),
    [
        ([0.05, 0.06, 0.07], "95% t interval +3.52 to +8.48 points → local_set ahead"),
        ([-0.05, -0.06, -0.07], "→ batch ahead"),
        ([0.05, -0.04, 0.01], "→ not resolved (the interval holds 0)"),
        ([0.03, 0.05, 0.07], "→ local_set ahead, only just (its near end is 0.031 points from 0)"),
    ],
)
def test_verdict_is_resolved_only_when_the_interval_excludes_zero(
    diffs: list[float], says: str
) -> None:
    lo, hi = t_interval(diffs)
    text = bench.verdict(
        {
            "diffs": diffs,
            "mean": statistics.mean(diffs),
            "std": statistics.stdev(diffs),
            "lo": lo,
            "hi": hi,
        }
    )
    assert text.endswith(says) and ("ahead" in text) == ("ahead" in says)
    assert bench.verdict(None).startswith("fewer than two")


def test_result_tables_by_hand() -> None:
    lines = bench.result_lines(
        _report(), {"probe batch": {"client_flops_per_client_round": 17.2e9}}
    )
    rows = {
        line.split("|")[1].strip(): line
        for line in lines
        if line.startswith("| batch") or line.startswith("| local_set")
    }
    local_acc = [LOCAL[s][19] for s in bench.SEEDS]
    assert (
        f"| {statistics.mean(local_acc):.4f} ± {statistics.stdev(local_acc):.4f} |"
        in rows["local_set"]
    )
    assert (
        "| 1,616 | 17.2 | 1,430 | 107,848 |" in rows["batch"]
    )  # (K + 1) × 16; no probe for local_set: "-"
    assert "| 6,464 | - | 1,430 | 107,848 |" in rows["local_set"]
    head = next(
        i for i, line in enumerate(lines) if line.startswith("| cumulative forwards/client |")
    )
    matched = [line for line in lines[head + 2 :] if line.startswith("| ")]
    assert [m.split("|")[2].strip() for m in matched] == ["5", "10", "15", "20"]
    last = matched[-1].split("|")
    assert last[1].strip() == f"{20 * 6464:,}" and last[4].strip() == "80"
    diffs = [
        LOCAL[s][19] - EVALS[s][19] for s in bench.SEEDS
    ]  # local_set round 20 vs batch round 80
    assert (
        last[6]
        .strip()
        .startswith(f"{100 * statistics.mean(diffs):+.2f} ± {100 * statistics.stdev(diffs):.2f}")
    )
    assert any(
        line.startswith("- Test accuracy at the round of best validation")
        and "+1.00 ± 1.00" in line
        for line in lines
    )
    # local_set ahead of batch at every matched point on every seed (0.01/round against 0.009 per 4 rounds)
    assert "At every matched point every seed has local_set ahead." in lines


def test_screen_picks_each_variants_best_validation_lr() -> None:
    vals = {
        ("batch", 0.003): 0.4,
        ("batch", 0.01): 0.5,
        ("batch", 0.03): 0.5,
        ("batch", 0.1): 0.45,
        ("local_set", 0.003): 0.6,
        ("local_set", 0.01): 0.5,
        ("local_set", 0.03): 0.2,
    }
    screen = {
        "results": [
            {"label": f"screen {v} lr={lr}", "final_val_accuracy": a} for (v, lr), a in vals.items()
        ]
    }
    assert bench.picks(screen) == {"batch": 0.01, "local_set": 0.003}  # tie at 0.5: the smaller lr
    text = "\n".join(bench.screen_lines(screen))
    assert (
        "| 0.003 | 0.4000 | 0.6000 |" in text and "| 0.1 | 0.4500 | - |" in text
    )  # 0.1: batch's grid only
    assert "At the edge of the grid: local_set." in text
    assert bench.picks({"results": screen["results"][:-1]}) is None


def _write_record(root: Path, label: str, overrides: list[str], row: dict) -> None:
    """A record as ``run_variants`` writes it: the full resolved config and the row."""
    config = resolved_config(load_config(bench.BASE, overrides=overrides))
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{label}.json").write_text(
        json.dumps({"config": config, "result": {"label": label, **row}})
    )


def test_table_reads_the_records_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "RECORDS", tmp_path)
    text = bench.table("cmd")
    assert (
        "| 0.003 | not run | not run |" in text
        and "| 0.1 | not run | - |" in text
        and "The screen is not finished" in text
    )
    for i, (label, overrides) in enumerate(bench.screen_variants().items()):
        _write_record(
            tmp_path / "screen",
            label,
            [*bench.screen_common(), *overrides],
            {"final_val_accuracy": 0.1 * i},
        )
    text = bench.table("cmd")
    assert (
        "Picked: batch lr 0.1, local_set lr 0.03. At the edge of the grid: batch, local_set."
        in text
    )
    assert "Main runs not recorded yet" in text
    base = {
        "bytes_up_per_client_round": 1430.0,
        "bytes_down_per_client_round": 107848.0,
        "client_flops_per_round": 0.0,
        "wall_s": 1.0,
        "final_test_accuracy": 0.5,
        "best_test_accuracy": 0.5,
    }
    for seed in bench.SEEDS:
        for label, overrides in bench.main_variants({"batch": 0.1, "local_set": 0.03}).items():
            curve = _run(seed, label)["accuracy_by_round"]
            _write_record(
                tmp_path / f"seed-{seed}",
                label,
                [*bench.PROTOCOL, f"seed={seed}", *overrides],
                {**base, "accuracy_by_round": curve},
            )
    text = bench.table("cmd")
    assert (
        "**Equal rounds**" in text and "**Matched forwards**" in text and "Command: `cmd`" in text
    )
    assert "| batch | 3 |" in text and "| local_set | 3 |" in text
