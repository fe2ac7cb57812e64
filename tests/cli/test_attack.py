"""``fedge attack`` on a real (tiny) run directory: files written, bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from fedge.cli.main import app

runner = CliRunner()


def _run(tmp_path: Path, *sets: str) -> Path:
    out = tmp_path / "run"
    args = ["run", "quickstart", "--out", str(out), "--set", "rounds=1", "--set", "dataset.name=digits",
            "--set", "model.name=lenet-dlg", "--set", "clients.num=2", "--set", "clients.per_round=2", *sets]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_dlg_writes_json_and_image_grid(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedsgd", "--set", "method.batch_size=1")
    result = runner.invoke(app, ["attack", str(run), "--attack", "dlg", "--iterations", "60", "--samples", "2"])
    ig = runner.invoke(app, ["attack", str(run), "--attack", "ig", "--iterations", "30", "--samples", "1"])
    assert ig.exit_code == 0, ig.output
    assert json.loads((run / "attacks" / "ig.json").read_text())["attacks"]["ig"]["median_mse"] >= 0
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "dlg.json").read_text())
    assert data["clients_attacked"] == 2 and data["method"] == "fedsgd"
    assert data["attacks"]["dlg"]["median_mse"] < data["baseline_mean_image_mse"]
    assert (run / data["images"]["dlg"]).stat().st_size > 0


def test_mia_on_the_final_model(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedavg")
    result = runner.invoke(app, ["attack", str(run), "--attack", "mia", "--samples", "50"])
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "mia.json").read_text())
    assert data["members"] == 50 and data["non_members"] == 50 and 0 <= data["auc"] <= 1


def test_bad_attack_name_and_missing_run_exit_2(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["attack", str(tmp_path), "--attack", "zzz"])
    assert bad.exit_code == 2 and "zzz" in bad.output
    missing = runner.invoke(app, ["attack", str(tmp_path / "nope"), "--attack", "dlg"])
    assert missing.exit_code == 2 and "not a fedge run directory" in missing.output


def test_mia_shadow_writes_loss_shadow_and_lira(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedavg", "--set", "dataset.limit_train=60")
    result = runner.invoke(app, ["attack", str(run), "--attack", "mia-shadow", "--samples", "30", "--shadows", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "mia-shadow.json").read_text())
    assert data["shadows"] == 2 and data["shadow_train_size"] == 60
    for key in ("loss", "shadow", "lira"):
        assert data[key]["members"] == 30 and 0 <= data[key]["precision"] <= 1
    assert "lira: membership AUC" in result.output


def test_pia_cuts_local_sets_to_the_batch_and_scores_every_upload(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedsgd", "--set", "method.batch_size=8")
    result = runner.invoke(app, ["attack", str(run), "--attack", "pia", "--samples", "6", "--property-class", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads((run / "attacks" / "pia.json").read_text())
    assert data["uploads"] == 6 and data["rounds_observed"] == 3 and data["property_class"] == 3
    assert data["classifiers"] == 3 and not data["masked"]  # one per round: each broadcasts another model


def test_pia_without_negatives_says_how_to_get_them(tmp_path: Path) -> None:
    run = _run(tmp_path, "--set", "method.name=fedsgd", "--set", "method.batch_size=64")  # 64 digits: every class
    result = runner.invoke(app, ["attack", str(run), "--attack", "pia", "--samples", "2"])
    assert result.exit_code == 2 and "method.batch_size" in result.output
    assert not (run / "attacks" / "pia.json").exists()
