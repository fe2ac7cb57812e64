"""EMA evaluation: the raw global model evaluated beside the average (``ema_also_raw``) gives,
figure for figure, the same run with EMA off (the average never feeds training)."""

import json

import pytest

from fedge.core.config import load_config
from fedge.experiment.run import run_experiment
from fedge.methods import get_method


def _run(tiny, tmp_path, name, **method):
    cfg = load_config(
        tiny(
            model={"name": "logreg"},
            rounds=4,
            dataset={"name": "digits", "validation": 100},
            method={
                "name": "baffle",
                "mode": "epoch",
                "k": 8,
                "batch_size": 32,
                "sigma": 1e-3,
                **method,
            },
        )
    )
    run = run_experiment(cfg, out=tmp_path / name, render=False)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return lines, json.loads((run / "summary.json").read_text())


def test_the_raw_model_beside_the_ema_is_the_run_without_ema(tiny, tmp_path):
    both, both_summary = _run(tiny, tmp_path, "both", ema=0.9, ema_warmup=False, ema_also_raw=True)
    plain, plain_summary = _run(tiny, tmp_path, "plain", ema=None)
    for a, b in zip(both, plain, strict=True):
        for key in ("test_accuracy", "test_loss", "val_accuracy", "val_loss"):
            assert a[f"raw_{key}"] == b[key], (a["round"], key)  # the same W, bit for bit
    # the main figures are the average's, not W's: the loss differs every round
    assert all(a["test_loss"] != b["test_loss"] for a, b in zip(both, plain, strict=True))
    for key in (
        "final_test_accuracy",
        "best_test_accuracy",
        "best_val_accuracy",
        "test_accuracy_at_best_val",
        "best_val_round",
    ):
        assert both_summary[f"raw_{key}"] == plain_summary[key], key
    assert both_summary["final_test_accuracy"] == both[-1]["test_accuracy"]  # the EMA's, as before
    assert "raw_final_test_accuracy" not in plain_summary


def test_without_the_flag_nothing_raw_is_logged(tiny, tmp_path):
    lines, summary = _run(tiny, tmp_path, "ema", ema=0.9)
    assert not any(k.startswith("raw_") for line in lines for k in line)
    assert not any(k.startswith("raw_") for k in summary)


def test_raw_beside_no_ema_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"ema_also_raw.*ema is None.*method\.ema"):
        get_method("baffle").section(ema=None, ema_also_raw=True)
