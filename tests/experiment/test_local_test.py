"""``partition.local_test``: clients train on what they keep, the engine evaluates the global
model on what they hold out, at ``local_eval_every``; the statistics land in the metrics line
and the summary."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.build import build_run
from fedge.experiment.run import run_experiment
from fedge.runtime.evaluate import evaluate
from fedge.runtime.fairness import FAIRNESS_KEYS, fairness_stats


def _local(tiny, **more):
    return tiny(**{"partition.local_test": 0.25, "clients.num": 4, **more})


def test_local_test_splits_are_disjoint_from_what_clients_train_on(tiny):
    built = build_run(load_config(_local(tiny)))
    plain = build_run(load_config(tiny(**{"clients.num": 4})))
    assert built.local_tests is not None and plain.local_tests is None
    for data, held, before in zip(built.clients, built.local_tests, plain.clients, strict=True):
        assert held is not None
        train, shard = set(data.indices.tolist()), set(before.indices.tolist())
        assert train < shard  # the client trains on part of its shard of the same partition
        rows = sorted(shard - train)  # the part it no longer holds is exactly its local test split
        assert len(rows) == len(held[1]) > 0
        assert torch.equal(data.x[rows], held[0]) and torch.equal(data.y[rows], held[1])
    summary = built.partition_summary
    assert summary["local_test"]["clients"] == [len(h[1]) for h in built.local_tests]
    assert sum(c["num_samples"] for c in summary["clients"]) + summary["local_test"][
        "num_samples"
    ] == sum(c.num_samples for c in plain.clients)


def test_split_is_deterministic_given_the_seed(tiny):
    a = build_run(load_config(_local(tiny)))
    b = build_run(load_config(_local(tiny)))
    c = build_run(load_config(_local(tiny, seed=1)))
    idx = [[d.indices for d in r.clients] for r in (a, b, c)]
    assert all(torch.equal(x, y) for x, y in zip(idx[0], idx[1], strict=True))
    assert any(not torch.equal(x, y) for x, y in zip(idx[0], idx[2], strict=True))


def test_run_logs_the_statistics_at_the_cadence_and_the_summary_keeps_the_last(tmp_path, tiny):
    cfg = _local(tiny, rounds=3, local_eval_every=2)
    out = run_experiment(load_config(cfg), out=tmp_path / "run", render=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert ["client_accuracy" in x for x in lines] == [False, True, True]  # round 2, and the last
    last = lines[-1]
    assert len(last["client_accuracy"]) == 4
    assert {k: last[k] for k in FAIRNESS_KEYS} == fairness_stats(last["client_accuracy"])
    # the per-client figure is the final model's accuracy on that client's split
    built = build_run(load_config(cfg))
    model = built.model_fn()
    from safetensors.torch import load_file

    model.load_state_dict(load_file(out / "model.safetensors"))
    held = built.local_tests[0]
    assert held is not None
    expected = evaluate(model, *held, num_classes=built.dataset.num_classes)["test_accuracy"]
    assert last["client_accuracy"][0] == pytest.approx(expected)
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[f"final_{k}"] for k in FAIRNESS_KEYS} == {k: last[k] for k in FAIRNESS_KEYS}


def test_without_local_test_nothing_changes_and_the_cadence_key_is_refused(tmp_path, tiny):
    out = run_experiment(load_config(tiny(rounds=1)), out=tmp_path / "run", render=False)
    line = json.loads((out / "metrics.jsonl").read_text())
    assert not set(FAIRNESS_KEYS) & set(line) and "client_accuracy" not in line
    with pytest.raises(ConfigError, match="local_eval_every=2 .* partition.local_test is null"):
        load_config(tiny(local_eval_every=2))
    with pytest.raises(ConfigError, match="partition.local_test"):
        load_config(tiny(**{"partition.local_test": 1.5}))


def test_generated_population_refuses_local_test(tiny):
    cfg = tiny(**{"dataset": {"name": "synthetic-fed"}, "partition.local_test": 0.2})
    with pytest.raises(ConfigError, match="synthetic-fed generates its clients on demand"):
        build_run(load_config(cfg))


def test_local_test_with_portable_draws_builds(tiny):
    built = build_run(load_config(_local(tiny, draws="portable")))
    assert built.local_tests is not None
    assert all(np.asarray(h[1]).size for h in built.local_tests if h is not None)
