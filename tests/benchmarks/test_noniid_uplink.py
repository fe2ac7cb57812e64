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
    assert e["bytes_to_target"] == pytest.approx(150) and e["reached"] == 2  # (200 + 100) / 2
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
    assert len(tune) == 2 + 4  # FedAvg's two rates, FedProx's two rates x two mu
    seeds = sorted(p.relative_to(records).as_posix() for p in (records / "runs").rglob("*.json"))
    assert seeds == [
        f"runs/alpha-0.5/{row}/seed-{s}.json" for row in ("fedavg", "fedprox") for s in (0, 1)
    ]
    rec = json.loads((records / seeds[0]).read_text())
    assert rec["client_acc_worst10"] is not None and rec["total_bytes_up"] > 0
    best = max(
        (json.loads((records / t).read_text()) for t in tune if "/fedavg/" in t),
        key=lambda r: r["final_val_accuracy"],
    )
    assert rec["setting"] == best["setting"]  # the seeds run the setting validation chose
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
        for setting in row.grid or ((),):
            for alpha in bench.ALPHAS:
                cfg = load_config(
                    row.preset,
                    overrides=[*bench.common(alpha, bench.ROUNDS), *row.fixed, *setting],
                )
                assert cfg.method.name == method_config(cfg).name
                assert cfg.partition.local_test == 0.2 and cfg.local_eval_every == bench.ROUNDS
