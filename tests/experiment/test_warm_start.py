"""Warm start from public data (``warm_start.*``): the public split is disjoint from every
client's data; the start equals the same pretraining done by hand with torch; every method
starts from it; the server's FLOPs are not client FLOPs; a resumed run equals an uninterrupted
one; bad sizes fail naming the fix."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import fedge.experiment.warm_start as ws
from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.core.rng import derive_seed, numpy_rng
from fedge.data.dataset import stratified_subset
from fedge.experiment.build import build_run, resolved_config
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from tests_helpers import metrics_without_wall, run_cut_after

PUBLIC = {"public": 100, "epochs": 2, "lr": 0.05, "batch_size": 16}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _baffle(tiny, **kw):
    method = {"name": "baffle", "k": 4, "batch_size": 16}
    return tiny(model={"name": "mlp"}, method=method, **kw)


def test_the_public_split_is_disjoint_from_every_clients_data(tiny):
    cfg = load_config(
        tiny(warm_start=PUBLIC, **{"dataset.validation": 50, "partition.local_test": 0.2})
    )
    built = build_run(cfg)
    w = built.warm_start
    assert w is not None and len(w.public) == 100 and w.record["public"] == 100
    kept, public = w.kept, set(w.public.tolist())
    n = len(kept) + len(public)  # the training set after the validation hold-out: 600 - 50
    assert n == 550 and len(built.dataset.y_train) == 450 == w.record["clients_samples"]
    seen: set[int] = set()
    for idx in built.parts:  # indices into the clients' training set, kept[...] into the whole
        mine = set(kept[np.asarray(idx)].tolist())
        assert not mine & public
        seen |= mine
    for t in built.partition_summary["local_test"]["clients"]:
        assert t > 0
    # training shards and local tests together are every kept sample: nothing public leaked
    assert sum(len(p) for p in built.parts) + built.partition_summary["local_test"][
        "num_samples"
    ] == len(kept)
    assert seen | public <= set(range(n)) and not seen & public
    # by content too: no public sample is any client's sample (synthetic rows are distinct)
    full = build_run(load_config(tiny(**{"dataset.validation": 50}))).dataset.x_train
    pub_rows = {tuple(r.tolist()) for r in full[torch.from_numpy(w.public)].flatten(1)}
    for c in built.clients:
        x, _ = c.tensors()
        assert not pub_rows & {tuple(r.tolist()) for r in x.flatten(1)}


def _oracle(tiny) -> tuple[dict[str, torch.Tensor], int]:
    """The warm start done by hand: the seed's initial model (a run without warm start), the
    stratified public draw, torch's SGD over torch.randperm orders; FLOPs by torch's counter."""
    plain = build_run(load_config(tiny()))
    model = plain.model_fn()
    y_all = plain.dataset.y_train
    public = torch.from_numpy(
        stratified_subset(y_all.numpy(), 100, numpy_rng(0, "warm-start", "public"))
    )
    x, y = plain.dataset.x_train[public], y_all[public]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(derive_seed(0, "warm-start", "order"))
    with FlopCounterMode(display=False) as counter:
        for _ in range(2):
            order = torch.randperm(100, generator=g)
            for i in range(0, 100, 16):
                b = order[i : i + 16]
                opt.zero_grad()
                F.cross_entropy(model(x[b]), y[b]).backward()
                opt.step()
    return _state(model), counter.get_total_flops()


def test_the_warm_start_equals_pretraining_by_hand(tiny):
    want, flops = _oracle(tiny)
    ws._LAST.clear()
    built = build_run(load_config(tiny(warm_start=PUBLIC)))
    assert _equal(_state(built.model_fn()), want)
    assert _equal(_state(built.method.strategy.eval_model()), want)  # round 0's global model
    assert built.warm_start is not None
    rec = built.warm_start.record
    assert rec["server_flops"] == flops and rec["steps"] == 2 * 7
    assert not _equal(_state(build_run(load_config(tiny())).model_fn()), want)


def test_bp_fedavg_and_baffle_start_from_the_identical_model(tiny):
    ws._LAST.clear()
    fedavg = build_run(load_config(tiny(warm_start=PUBLIC)))
    ws._LAST.clear()  # built again, not taken from the last one
    baffle = build_run(load_config(_baffle(tiny, warm_start=PUBLIC)))
    a, b = _state(fedavg.method.strategy.eval_model()), _state(baffle.method.strategy.eval_model())
    assert _equal(a, b)
    assert fedavg.parts and all(
        np.array_equal(p, q) for p, q in zip(fedavg.parts, baffle.parts, strict=True)
    )


def test_server_flops_are_not_client_flops(tmp_path, tiny):
    one = run_experiment(
        load_config(tiny(rounds=1, warm_start=PUBLIC)), out=tmp_path / "a", render=False
    )
    three = run_experiment(
        load_config(tiny(rounds=1, warm_start={**PUBLIC, "epochs": 6})),
        out=tmp_path / "b",
        render=False,
    )
    s1, s3 = (json.loads((d / "summary.json").read_text()) for d in (one, three))
    assert s3["warm_start"]["server_flops"] == 3 * s1["warm_start"]["server_flops"] > 0
    assert s1["total_client_flops"] == s3["total_client_flops"] > 0  # same clients' steps
    assert s1["warm_start"]["public"] == 100 and s1["warm_start"]["model_bytes"] > 0


def test_a_resumed_warm_started_run_equals_an_uninterrupted_one(tmp_path, tiny, monkeypatch):
    cfg = _baffle(tiny, rounds=3, warm_start=PUBLIC)
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    run_cut_after(cfg, tmp_path / "cut", 1, monkeypatch)
    ws._LAST.clear()  # a fresh process: the start is pretrained again
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)


def test_a_run_without_warm_start_writes_no_key(tiny):
    assert "warm_start" not in resolved_config(load_config(tiny()))
    with_it = resolved_config(load_config(tiny(warm_start={"public": 10})))
    assert with_it["warm_start"] == {
        "public": 10,
        "source": "split",
        "epochs": 1,
        "lr": 0.01,
        "batch_size": 32,
        "optimizer": "sgd",
        "momentum": 0.9,
    }


@pytest.mark.parametrize(
    ("public", "match"),
    [
        (600, r"warm_start.public=600 takes every one of the 600 training samples.*lower"),
        (598, r"warm_start.public=598 leaves 2 of the 600 .*clients.num=4.*at most 596"),
    ],
)
def test_a_public_split_too_large_is_refused_naming_the_fix(tiny, public, match):
    with pytest.raises(ConfigError, match=match):
        build_run(load_config(tiny(warm_start={"public": public})))


def test_bad_warm_start_keys_are_refused(tiny):
    with pytest.raises(ConfigError, match="warm_start"):
        load_config(tiny(warm_start={"public": 10, "epoch": 2}))
    with pytest.raises(ConfigError, match="warm_start.public"):
        load_config(tiny(warm_start={"public": 0}))
    with pytest.raises(ConfigError, match="synthetic-fed generates its clients"):
        build_run(
            load_config(
                tiny(dataset={"name": "synthetic-fed"}, partition={}, warm_start={"public": 10})
            )
        )


UNUSED = {**PUBLIC, "source": "unused"}


def test_an_unused_public_set_leaves_the_clients_data_and_validation_as_they_were(tiny):
    """``source: unused`` draws the public set from what ``dataset.limit_train`` leaves out: the
    partition, the clients' samples and the validation set are those of the run without it,
    and the public samples are standardized as the clients' are."""
    base = {"dataset.limit_train": 400, "dataset.validation": 40}
    plain = build_run(load_config(tiny(**base)))
    ws._LAST.clear()
    warm = build_run(load_config(tiny(warm_start=UNUSED, **base)))
    assert all(np.array_equal(p, q) for p, q in zip(plain.parts, warm.parts, strict=True))
    assert torch.equal(plain.dataset.x_train, warm.dataset.x_train)
    assert plain.validation is not None and warm.validation is not None
    assert torch.equal(plain.validation[0], warm.validation[0])
    w = warm.warm_start
    assert w is not None and len(w.public) == 100 and len(w.kept) == 400
    assert not set(w.public.tolist()) & set(w.kept.tolist())  # indices into the 600 samples
    assert w.record["source"] == "unused" and w.record["clients_samples"] == 360
    # the whole split, restandardized with the run's statistics, gives back the run's samples
    from fedge.data.registry import load_dataset

    full = load_dataset("synthetic", seed=0)
    limited = load_dataset("synthetic", limit_train=400, seed=0)
    again = ws.restandardize(full.x_train[torch.from_numpy(w.kept)], full, limited)
    torch.testing.assert_close(again, limited.x_train, rtol=0, atol=1e-5)
    # no public sample is one the run holds (by content)
    pub = {tuple(r.tolist()) for r in full.x_train[torch.from_numpy(w.public)].flatten(1)}
    assert not pub & {tuple(r.tolist()) for r in full.x_train[torch.from_numpy(w.kept)].flatten(1)}
    assert not _equal(_state(warm.model_fn()), _state(plain.model_fn()))


def test_an_unused_public_set_needs_samples_left_out(tiny):
    with pytest.raises(ConfigError, match=r"dataset.limit_train=None keeps all 600.*at most 500"):
        build_run(load_config(tiny(warm_start=UNUSED)))
    with pytest.raises(ConfigError, match=r"leaves only 50 of the 600.*at most 50.*at most 500"):
        build_run(load_config(tiny(warm_start=UNUSED, **{"dataset.limit_train": 550})))


def test_the_start_is_kept_for_the_same_config_data_and_model_only(tiny):
    ws._LAST.clear()
    cfg = load_config(tiny(warm_start=PUBLIC))
    first = build_run(cfg).warm_start
    assert build_run(cfg).warm_start is first  # the same run built again: not pretrained again
    x, y = torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64)
    model = torch.nn.Linear(3, 2)
    key = ws._fingerprint(cfg, x, y, model)
    x2 = x.clone()
    x2[0, 0] = 1e-7
    assert ws._fingerprint(cfg, x2, y, model) != key  # other public samples
    with torch.no_grad():
        model.weight[0, 0] += 1
    assert ws._fingerprint(cfg, x, y, model) != key  # another initial model
    assert ws._fingerprint(load_config(tiny(warm_start={**PUBLIC, "lr": 0.1})), x, y, model) != (
        ws._fingerprint(cfg, x, y, model)
    )


_SEEDS_DOWNLINK = [
    {"name": "fedkseed", "k": 8, "local_steps": 2, "batch_size": 16},
    {"name": "decomfl", "p": 2, "local_steps": 2, "batch_size": 16},
    {"name": "feedsign", "batch_size": 16},
]


@pytest.mark.parametrize("method", _SEEDS_DOWNLINK, ids=lambda m: m["name"])
def test_a_seeds_downlink_client_downloads_the_warm_start_once(tmp_path, tiny, method):
    """A method whose clients never receive the model (seeds and scalars down) cannot let a
    client build a pretrained start itself: its first participation downloads the model (a
    real serialized message, within 64 bytes of framing of summary ``model_bytes``), later
    ones are the scalars as without warm start, and without warm start nothing changes."""
    base = tiny(
        rounds=3,
        clients={"num": 2, "per_round": 2},
        model={"name": "mlp"},
        method={**method, "secure_aggregation": False, "ema": None},
    )

    def down(cfg: dict, out: str) -> tuple[list[int], dict]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = run_experiment(load_config(cfg), out=tmp_path / out, render=False)
        lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((d / "summary.json").read_text())
        return [m["bytes_down"] for m in lines if "bytes_down" in m], summary

    cold, _ = down(base, "cold")
    warm, summary = down({**base, "warm_start": PUBLIC}, "warm")
    model_bytes = summary["warm_start"]["model_bytes"]
    assert cold[0] < model_bytes  # without warm start: no model travels (the seeded start)
    # round 1: both clients' first participation, the model each (+ framing), not the scalars
    assert 2 * model_bytes <= warm[0] <= 2 * (model_bytes + 64) + cold[0]
    assert warm[1:] == cold[1:]  # later rounds: the missed rounds' scalars, as without it


def test_baffle_seeds_downlink_already_sends_a_new_client_the_model(tmp_path, tiny):
    """BAFFLE's seeds downlink never assumes a client can build the start: a client's first
    message is the model, warm start or not (so its bytes need no change)."""
    cfg = tiny(
        rounds=2,
        clients={"num": 2, "per_round": 2},
        model={"name": "mlp"},
        method={"name": "baffle", "mode": "batch", "k": 4, "batch_size": 16, "downlink": "seeds"},
        warm_start=PUBLIC,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = run_experiment(load_config(cfg), out=tmp_path / "b", render=False)
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    model_bytes = json.loads((d / "summary.json").read_text())["warm_start"]["model_bytes"]
    down = [m["bytes_down"] for m in lines if "bytes_down" in m]
    assert down[0] >= 2 * model_bytes > down[1]
