"""A validation split carved from the training data: disjoint from what clients train on,
stratified and seeded, evaluated every round; the summary reports test accuracy at the round
of best validation accuracy (what a table tuned on validation must report)."""

import json

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.build import build_run
from fedge.experiment.run import run_experiment


def test_validation_is_held_out_from_every_client(tiny):
    plain = build_run(load_config(tiny(dataset={"name": "digits"})))
    built = build_run(load_config(tiny(dataset={"name": "digits", "validation": 0.2})))
    xv, yv = built.validation
    n = len(plain.dataset.y_train)
    assert len(yv) == round(0.2 * n) and len(built.dataset.y_train) == n - len(yv)
    # disjoint: no validation image is among the training images
    train = {tuple(r.tolist()) for r in built.dataset.x_train.flatten(1)}
    assert not any(tuple(r.tolist()) in train for r in xv.flatten(1))
    # stratified: class shares within one sample of the training set's
    share = torch.bincount(plain.dataset.y_train, minlength=10) * len(yv) / n
    assert (torch.bincount(yv, minlength=10) - share).abs().max() <= 1
    again = build_run(load_config(tiny(dataset={"name": "digits", "validation": 0.2})))
    assert torch.equal(again.validation[1], yv)


def test_summary_reports_test_accuracy_at_best_validation(tiny, tmp_path):
    cfg = load_config(tiny(dataset={"name": "digits", "validation": 100}, rounds=3))
    run = run_experiment(cfg, out=tmp_path / "r", render=False)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    best = max(range(3), key=lambda i: (lines[i]["val_accuracy"], -i))
    assert summary["best_val_round"] == best + 1
    assert summary["test_accuracy_at_best_val"] == lines[best]["test_accuracy"]


@pytest.mark.parametrize("bad", [0.0, 1.0, 0, True])
def test_bad_validation_sizes_are_refused(tiny, bad):
    with pytest.raises(ConfigError, match="dataset.validation"):
        load_config(tiny(dataset={"name": "digits", "validation": bad}))
