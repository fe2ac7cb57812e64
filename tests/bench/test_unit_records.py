"""fedge.bench.unit_records: units are read from their run and figures records alone (configs
checked), a label with a seed unrecorded is missing, a run record without its figures is an
error, and the CPU estimate counts the runs not yet recorded (records written by hand; nothing
is trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedge.bench.unit_records import cpu_estimate, run_units
from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.build import resolved_config

PRESET = "fedpt-fmnist-cnn"
COMMON = ["threads=1", "rounds=1"]
VARIANTS = {"full": ["method.freeze=[]"], "frozen": ["method.freeze=[classifier.fc1]"]}


def _record(records: Path, label: str, seed: int, *, acc: float, figures: bool = True) -> None:
    cfg = load_config(PRESET, overrides=[*COMMON, f"seed={seed}", *VARIANTS[label]])
    run = records / "runs" / f"seed-{seed}" / f"{label}.json"
    run.parent.mkdir(parents=True, exist_ok=True)
    row = {"label": label, "final_test_accuracy": acc, "wall_s": 60.0}
    run.write_text(json.dumps({"config": resolved_config(cfg), "result": row}))
    if figures:
        fig = records / "figures" / f"seed-{seed}" / f"{label}.json"
        fig.parent.mkdir(parents=True, exist_ok=True)
        fig.write_text(json.dumps({"accuracy": acc, "trainable_fraction": 0.5}))


def _read(records: Path, seeds: list[int]) -> dict:
    def never(run_dir: str, row: dict) -> dict:
        raise AssertionError("nothing runs, so no figures are made")

    return run_units(
        PRESET,
        VARIANTS,
        seeds=seeds,
        out_root=records / "runs-unused",
        common=COMMON,
        records=records,
        figures=never,
        run=False,
    )


def test_units_are_read_from_their_records_alone(tmp_path: Path) -> None:
    for seed, (a, b) in enumerate([(0.7, 0.6), (0.8, 0.5)]):
        _record(tmp_path, "full", seed, acc=a)
        _record(tmp_path, "frozen", seed, acc=b)
    got = _read(tmp_path, [0, 1])
    assert got["missing"] == []
    assert [(u["seed"], u["accuracy"], u["row"]["wall_s"]) for u in got["rows"]["full"]] == [
        (0, 0.7, 60.0),
        (1, 0.8, 60.0),
    ]
    assert [u["accuracy"] for u in got["rows"]["frozen"]] == [0.6, 0.5]
    assert "run_dir" not in got["rows"]["full"][0]["row"]


def test_a_label_with_a_seed_unrecorded_is_missing_not_a_row(tmp_path: Path) -> None:
    _record(tmp_path, "full", 0, acc=0.7)
    _record(tmp_path, "frozen", 0, acc=0.6)
    _record(tmp_path, "full", 1, acc=0.8)
    got = _read(tmp_path, [0, 1])
    assert got["missing"] == ["frozen@1"]
    assert list(got["rows"]) == ["full"]
    assert cpu_estimate(got["missing"], 4, 2.5) == (
        "1 of 4 runs not yet recorded: about 2.5 CPU-minutes (2.5 per run, one thread each)"
    )


def test_a_run_record_without_its_figures_and_run_directory_is_an_error(tmp_path: Path) -> None:
    _record(tmp_path, "full", 0, acc=0.7, figures=False)
    with pytest.raises(FileNotFoundError, match="no figures record"):
        _read(tmp_path, [0])


def test_a_record_of_another_config_is_an_error(tmp_path: Path) -> None:
    _record(tmp_path, "full", 0, acc=0.7)
    run = tmp_path / "runs" / "seed-0" / "full.json"
    stored = json.loads(run.read_text())
    stored["config"]["rounds"] = 7
    run.write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match="different config"):
        _read(tmp_path, [0])
