"""benchmarks/noniid_uplink.py at a tiny size: the rows follow the registries at run time,
each unit is recorded once and reread, ``--max-minutes`` starts nothing past its budget, and
``--docs`` renders the table and figure from the records."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "noniid_uplink.py"
TINY = [
    "--rows",
    "fedavg,fedprox",
    "--alphas",
    "0.5",
    "--seeds",
    "0,1",
    "--rounds",
    "1",
    "--set",
    "dataset.limit_train=300",
    "--set",
    "dataset.validation=60",
    "--set",
    "dataset.limit_test=100",
    "--set",
    "clients.num=4",
    "--set",
    "clients.per_round=2",
]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("noniid_uplink", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["noniid_uplink"] = mod
    spec.loader.exec_module(mod)
    return mod


bench = _load()


def _rec(row: str, seed: int, acc: float, curve: list[list[float]], worst: float) -> dict:
    return {
        "row": row,
        "alpha": 0.1,
        "seed": seed,
        "setting": ["method.client_optimizer.lr=0.05"],
        "final_test_accuracy": acc,
        "total_bytes_up": curve[-1][0],
        "curve": curve,
        "client_acc_worst10": worst,
        "wall_s": 60.0,
    }


def test_summary_of_hand_made_records() -> None:
    recs = [
        _rec("fedavg", 0, 0.6, [[100, 0.5], [200, 0.72], [300, 0.6]], 0.1),
        _rec("fedavg", 1, 0.8, [[100, 0.71], [200, 0.8]], 0.3),
        _rec("fedavg", 2, 0.7, [[100, 0.4], [200, 0.69]], 0.2),
    ]
    assert bench.bytes_to(recs[0]["curve"], 0.7) == 200  # the first round at or above it
    assert bench.bytes_to(recs[2]["curve"], 0.7) is None
    (e,) = bench.summarize(recs, ["fedavg"])
    assert e["accuracy"] == pytest.approx(0.7) and e["accuracy_std"] == pytest.approx(0.1)
    # the target at α = 0.1 is 50%: reached at 100, 100 and 200 bytes
    assert e["bytes_to_target"] == pytest.approx(400 / 3) and e["reached"] == 3
    assert e["bytes_up"] == pytest.approx((300 + 200 + 200) / 3)
    assert e["worst10"] == pytest.approx((0.2, 0.1))
    table = bench.table([e], {"fedavg": "FedAvg"})
    assert "| 0.1 | FedAvg | method.client_optimizer.lr=0.05 | 70.00 ± 10.00 (n=3) |" in table
    assert "| 20.00 ± 10.00 |" in table


def test_diverged_seeds_are_counted_apart_and_a_row_that_always_diverges_says_so() -> None:
    gone = {"row": "fedavg-randk", "alpha": 0.1, "setting": [], "final_test_accuracy": None}
    recs = [
        _rec("fedavg", 0, 0.6, [[100, 0.6]], 0.1),
        _rec("fedavg", 1, 0.8, [[100, 0.8]], 0.3),
        {**gone, "row": "fedavg", "seed": 2, "diverged_round": 9},
        *({**gone, "seed": s, "diverged_round": 7 + s} for s in range(3)),
    ]
    kept, randk = bench.summarize(recs, ["fedavg", "fedavg-randk"])
    assert kept["seeds"] == 2 and kept["diverged"] == [9] and kept["accuracy"] == pytest.approx(0.7)
    assert "accuracy" not in randk and randk["diverged"] == [7, 8, 9]
    table = bench.table([kept, randk], {"fedavg": "FedAvg", "fedavg-randk": "FedAvg + randk"})
    assert "| 70.00 ± 14.14 (n=2; 1 more diverged) |" in table
    assert "| diverged (3 of 3 seeds; rounds 7, 8, 9) | — | — | — |" in table


def test_a_diverging_unit_is_recorded_as_diverged_and_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedge.core.errors import DivergenceError

    calls = []

    def diverge(cfg: object, out: Path) -> None:
        calls.append(out)
        raise DivergenceError("non-finite", round=7)

    monkeypatch.setattr(bench, "run_experiment", diverge)
    row = bench.all_rows()["fedavg"]
    rec_path = tmp_path / "rec.json"
    args = (row, [], rec_path, tmp_path / "run", {"row": "fedavg"}, bench.Budget(None))
    rec = bench.run_unit(*args)
    assert rec["diverged_round"] == 7 and rec["final_val_accuracy"] is None
    assert bench.run_unit(*args) == rec and len(calls) == 1  # read from its record


def _grid_row(values: tuple[float, ...]) -> object:
    return bench.Row("r", "R", "p", grid=bench._lr_grid(bench.LR, values), widen=bench.LR)


def _scores(table: dict[float, float | None]) -> object:
    """A tuning unit that reads validation accuracies from ``table`` by learning rate (None:
    the unit diverged; a rate missing from the table: the unit has not run)."""

    def unit(row: object, setting: tuple[str, ...]) -> dict | None:
        lr = bench._value(setting, bench.LR)
        hit = [v for k, v in table.items() if abs(k - lr) < 1e-2 * k]  # rates print to 3 digits
        return {"final_val_accuracy": hit[0]} if hit else None

    return unit


@pytest.mark.parametrize(
    ("grid", "scores", "pick", "tried", "edge"),
    [
        # picked inside its grid: nothing widened
        ((0.01, 0.02, 0.05), {0.01: 0.5, 0.02: 0.7, 0.05: 0.6}, 0.02, 3, False),
        # top edge: one step up (x 2.5) wins, the next loses: the step that won, inside now
        ((0.02, 0.05), {0.02: 0.5, 0.05: 0.6, 0.125: 0.65, 0.3125: 0.64}, 0.125, 4, False),
        # top edge and every step wins: two steps, still at the edge
        ((0.02, 0.05), {0.02: 0.5, 0.05: 0.6, 0.125: 0.65, 0.3125: 0.7}, 0.3125, 4, True),
        # bottom edge: stepped down by the same ratio; a diverged step ranks below all
        ((0.02, 0.05), {0.02: 0.6, 0.05: 0.5, 0.008: None}, 0.02, 3, False),
        # a tie is no improvement: the step must validate better
        ((0.02, 0.05), {0.02: 0.5, 0.05: 0.6, 0.125: 0.6}, 0.05, 3, False),
    ],
)
def test_a_pick_at_the_grid_edge_is_widened_by_the_grid_ratio_while_it_improves(
    grid: tuple[float, ...], scores: dict, pick: float, tried: int, edge: bool
) -> None:
    got = bench.tuned_setting(_grid_row(grid), _scores(scores))
    assert got is not None
    setting, how = got
    assert bench._value(setting, bench.LR) == pytest.approx(pick, rel=1e-2)
    assert len(how["tried"]) == tried and how["at_edge"] is edge


def test_tuning_waits_for_a_missing_unit_in_the_grid_or_a_widening_step() -> None:
    assert bench.tuned_setting(_grid_row((0.02, 0.05)), _scores({0.02: 0.5})) is None
    assert bench.tuned_setting(_grid_row((0.02, 0.05)), _scores({0.02: 0.5, 0.05: 0.6})) is None


def _diverging(calls: list[Path]):
    """A stand-in for run_experiment that notes its run directory and diverges in round 3."""

    def run(cfg: object, out: Path) -> None:
        calls.append(out)
        out.mkdir(parents=True)
        raise __import__("fedge.core.errors").core.errors.DivergenceError("x", round=3)

    return run


def test_a_seed_record_at_a_setting_tuning_no_longer_picks_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(bench, "run_experiment", _diverging(calls))
    row, rec_path, out = bench.all_rows()["fedavg"], tmp_path / "rec.json", tmp_path / "run"
    rec_path.write_text(
        json.dumps({"row": "fedavg", "setting": ["a=1"], "final_val_accuracy": 0.9})
    )
    (out / "stale").mkdir(parents=True)
    meta = {"row": "fedavg", "setting": ["a=2"]}
    rec = bench.run_unit(row, [], rec_path, out, meta, bench.Budget(None))
    assert len(calls) == 1 and rec["setting"] == ["a=2"] and rec["diverged_round"] == 3
    assert not (out / "stale").exists()  # the old run's directory went with its record
    assert bench.run_unit(row, [], rec_path, out, meta, bench.Budget(None)) == rec  # now kept


def test_the_table_keeps_only_the_seeds_run_at_the_tuned_pick_and_marks_an_edge() -> None:
    lr = bench.LR
    tune = [
        {"row": "fedavg", "alpha": 0.1, "setting": [f"{lr}={v}"], "final_val_accuracy": a}
        for v, a in ((0.02, 0.5), (0.05, 0.6), (0.125, 0.65), (0.312, 0.7))
    ]
    rows = bench.all_rows()
    chosen = bench.picks(tune, {"fedavg": rows["fedavg"]})
    assert chosen[("fedavg", 0.1)][0] == (f"{lr}=0.312",)
    old = _rec("fedavg", 0, 0.6, [[100, 0.6]], 0.1)  # its setting: lr 0.05
    new = [
        {**_rec("fedavg", s, 0.8, [[100, 0.8]], 0.3), "setting": [f"{lr}=0.312"]} for s in (1, 2)
    ]
    (e,) = bench.summarize([old, *new], ["fedavg"], chosen)
    assert e["seeds"] == 2 and e["accuracy"] == pytest.approx(0.8) and e["at_edge"]
    assert f"| {lr}=0.312 † |" in bench.table([e], {"fedavg": "FedAvg"})


def test_compressor_rows_follow_the_registry_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fedge.core.compress", None)  # not there: no rows
    assert bench.compressor_rows() == []
    fake = types.SimpleNamespace(CODECS=("topk", "qsgd"))
    monkeypatch.setitem(sys.modules, "fedge.core.compress", fake)
    rows = bench.compressor_rows()
    assert [r.name for r in rows] == ["fedavg-topk", "fedavg-qsgd"]
    assert rows[1].fixed == ("method.compress.name=qsgd",) and rows[1].tuned_from == "fedavg"


def test_the_benchmark_runs_records_rereads_and_renders_at_a_tiny_size(
    tmp_path: Path, fake_fashion_mnist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, runs = tmp_path / "records", tmp_path / "runs"
    argv = [*TINY, "--out", str(runs), "--records", str(records)]
    assert bench.main([*argv, "--max-minutes", "0"]) == 3  # the budget starts nothing
    assert not records.exists()
    assert "0 of 4 units recorded" in capsys.readouterr().out
    assert bench.main(argv) == 0
    tune = sorted(p.relative_to(records).as_posix() for p in (records / "tune").rglob("*.json"))
    # FedAvg's two rates, FedProx's two rates x two mu, and up to two widening steps each
    assert 2 + 4 <= len(tune) <= 2 + 4 + 2 * bench.WIDEN
    seeds = sorted(p.relative_to(records).as_posix() for p in (records / "runs").rglob("*.json"))
    assert seeds == [
        f"runs/alpha-0.5/{row}/seed-{s}.json" for row in ("fedavg", "fedprox") for s in (0, 1)
    ]
    rec = json.loads((records / seeds[0]).read_text())
    assert rec["client_acc_worst10"] is not None and rec["total_bytes_up"] > 0
    tuning = [json.loads((records / t).read_text()) for t in tune]
    best = max(r["final_val_accuracy"] for r in tuning if r["row"] == "fedavg")
    pick = bench.picks(tuning, bench.all_rows())[("fedavg", 0.5)][0]
    assert rec["setting"] == list(pick)  # the seeds run the setting validation chose
    assert best == next(r["final_val_accuracy"] for r in tuning if r["setting"] == rec["setting"])
    first = capsys.readouterr().out
    shutil.rmtree(runs)  # the records alone: nothing trains again
    assert bench.main(argv) == 0
    assert capsys.readouterr().out == first
    assert not runs.exists()

    docs, fig = tmp_path / "docs" / "benchmarks.md", tmp_path / "docs" / "figures" / "nu.png"
    docs.parent.mkdir()
    docs.write_text("# Benchmarks\n")
    assert bench.main(["--records", str(records), "--docs", str(docs), "--figure", str(fig)]) == 0
    text = docs.read_text()
    assert "<!-- bench:noniid-uplink -->" in text and "<!-- /bench:noniid-uplink -->" in text
    assert "| 0.5 | FedAvg |" in text and "| 0.5 | FedProx |" in text and "(n=2)" in text
    assert "![Final accuracy against total uplink bytes](figures/nu.png)" in text
    assert fig.stat().st_size > 0


def test_unknown_rows_are_refused_naming_the_available_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--rows", "fedavg,nosuch"])
    assert "unknown row(s) nosuch; rows available now: fedavg, fedprox" in capsys.readouterr().err


def test_every_row_and_setting_registered_now_is_a_valid_config() -> None:
    """Each row's preset, fixed overrides and every grid setting validate (method keys
    included) at both α, so no unit of the full table fails on a typo hours in."""
    from fedge.core.config import load_config
    from fedge.experiment.build import method_config

    rows = bench.all_rows()
    assert {"fedavg", "fedprox", "scaffold", "fednova", "baffle"} <= set(rows)
    for row in rows.values():
        steps = [bench._with(s, row.widen, bench._value(s, row.widen) * f) for s in row.grid[:1] for f in (0.09, 11.1)] if row.widen else []  # fmt: skip
        for setting in (*row.grid, *steps) or ((),):
            for alpha in bench.ALPHAS:
                base = bench.common(alpha, bench.ROUNDS, row.round_factor)
                cfg = load_config(row.preset, overrides=[*base, *row.fixed, *setting])
                assert cfg.method.name == method_config(cfg).name
                assert cfg.partition.local_test == 0.2
                assert cfg.rounds == cfg.local_eval_every == bench.ROUNDS * row.round_factor
                assert cfg.eval_every == 5 * row.round_factor


def test_feedsign_runs_a_one_step_round_for_each_local_step_of_fedkseed() -> None:
    """FeedSign's rounds are one zeroth-order step each: its row runs FedKSeed's local steps a
    round as rounds, so its clients take FedKSeed's clients' steps, evaluated at the same
    points of the budget; every other row runs the protocol's rounds."""
    from fedge.core.config import load_config

    rows = bench.all_rows()
    steps = load_config("fedkseed-fmnist-lenet").method.local_steps
    assert steps > 1 and rows["feedsign"].round_factor == steps
    assert {r.round_factor for n, r in rows.items() if n != "feedsign"} == {1}
    base = bench.common(0.1, 30, steps)
    assert f"rounds={30 * steps}" in base and f"eval_every={5 * steps}" in base


def test_a_record_for_another_number_of_rounds_is_run_again(monkeypatch, tmp_path) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(bench, "run_experiment", _diverging(calls))
    row, rec_path, out = bench.all_rows()["feedsign"], tmp_path / "rec.json", tmp_path / "run"
    meta = {"row": "feedsign", "setting": ["a=1"]}
    rec_path.write_text(json.dumps({**meta, "rounds": 30, "final_val_accuracy": 0.1}))
    assert (
        bench.run_unit(row, ["rounds=30"], rec_path, out, meta, bench.Budget(None))["rounds"] == 30
    )
    assert calls == []  # the same rounds: read
    rec = bench.run_unit(row, ["rounds=30", "rounds=1500"], rec_path, out, meta, bench.Budget(None))
    assert len(calls) == 1 and rec["diverged_round"] == 3  # the last rounds= is the run's


def test_rows_against_their_reference_pair_seeds_and_resolve_only_intervals_excluding_zero() -> (
    None
):
    base = {**_rec("fedavg", 0, 0.6, [[200, 0.6]], 0.1), "alpha": 0.5}
    accs = {
        "fedavg": (0.60, 0.70, 0.50),
        "fedprox": (0.62, 0.73, 0.525),  # +2, +3, +2.5 points: resolved
        "fedavg-sgd": (0.50, 0.60, 0.40),
        "scaffold": (0.60, 0.50, 0.40),  # against FedAvg without momentum: +10, -10, 0
    }
    recs = [
        {**base, "row": row, "seed": s, "final_test_accuracy": a, "total_bytes_up": 100 * (i + 2)}
        for i, (row, vals) in enumerate(accs.items())
        for s, a in enumerate(vals)
    ]
    entries = bench.summarize(recs, list(accs))
    labels = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedavg-sgd": "SGD", "scaffold": "SC"}
    table = bench.against_reference(entries, labels, {"scaffold": "fedavg-sgd"})
    # mean +2.5, std 0.5: 2.5 ± 4.303 · 0.5 / sqrt(3) = [+1.26, +3.74]; bytes 300 / 200
    assert "| 0.5 | FedProx | FedAvg | +2.50 [+1.26, +3.74] (n=3) | above FedAvg | 1.5 |" in table
    assert "| 0.5 | SC | SGD | +0.00 [-24.84, +24.84] (n=3) | not resolved" in table
    assert table.rstrip().endswith("| 1.25 |")  # SCAFFOLD's 500 bytes over the reference's 400
    assert "| 0.5 | SGD | FedAvg | -10.00 [-10.00, -10.00] (n=3) | below FedAvg | 2 |" in table


def test_the_closing_summary_counts_diverged_seeds_apart(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done = {
        "fedavg-randk@0.1": [
            {"final_test_accuracy": 0.5},
            {"final_test_accuracy": None, "diverged_round": 7},
        ],
        "fedavg-sign@0.1": [{"final_test_accuracy": None, "diverged_round": 3}],
    }
    monkeypatch.setattr(bench, "measure", lambda args: done)
    assert bench.main(["--rows", "fedavg"]) == 3  # 3 of the 6 units it asks for
    out = capsys.readouterr().out
    assert "fedavg-randk@0.1: 2 seed(s), final accuracy 0.5000, 1 diverged" in out
    assert "fedavg-sign@0.1: 1 seed(s), no finished seed, 1 diverged" in out
