"""The run-level ``draws`` key: a portable run draws exactly what the pure layers' portable
functions draw (oracle), resumes and runs on workers to the same numbers, and is the default;
``draws: torch`` is the run as before, and what a run directory or record without the key reads
as."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.rng import derive_seed
from fedge.core.rundir_schema import APPLIED_CONFIG, CONFIG
from fedge.data.partition import partition
from fedge.experiment.build import build_run
from fedge.experiment.resume import resume_experiment
from fedge.experiment.run import run_experiment
from fedge.methods.fedpt import FedPTClient, reconstruct_
from fedge.methods.ntk_baffle import data_free_masks
from fedge.methods.secure import SecureAggregation, _graph
from fedge.models import build_model
from fedge.privacy.secagg.graph import MaskGraph
from tests_helpers import metrics_without_wall, run_cut_after


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_default_is_portable_and_a_bad_value_names_the_choices(tiny):
    assert load_config(tiny()).draws == "portable"
    with pytest.raises(Exception, match="portable"):
        load_config(tiny(draws="philox"))


def test_fedavg_portable_init_and_iid_partition_are_the_pure_layers_portable_draws(tmp_path, tiny):
    cfg = load_config(tiny(draws="portable"))
    built = build_run(cfg)
    shape, classes = tuple(built.dataset.input_shape), built.dataset.num_classes
    seed = derive_seed(cfg.seed, "model-init")
    want = build_model("mlp", input_shape=shape, num_classes=classes, seed=seed, draws="portable")
    assert _equal(_state(built.model_fn()), _state(want))
    torch_init = build_model("mlp", input_shape=shape, num_classes=classes, seed=seed)
    assert not _equal(_state(want), _state(torch_init))  # the key changed the draws
    labels = built.dataset.y_train.numpy()
    parts = partition("iid", labels, 4, seed=cfg.seed, draws="portable")
    assert [p.tolist() for p in built.parts] == [p.tolist() for p in parts]
    assert [p.tolist() for p in parts] != [
        p.tolist() for p in partition("iid", labels, 4, seed=cfg.seed)
    ]
    out = run_experiment(
        load_config(tiny(rounds=2, draws="portable")), out=tmp_path / "r", render=False
    )
    assert (out / "summary.json").exists()


def test_fedpt_portable_rebuilds_frozen_tensors_from_portable_init(tmp_path, tiny):
    cfg = load_config(
        tiny(draws="portable", **{"method.name": "fedpt", "method.freeze": "largest"})
    )
    built = build_run(cfg)  # its build checks the model equals the portable rebuild of z
    z = derive_seed(cfg.seed, "model-init")
    model = built.model_fn()
    shape, classes = tuple(built.dataset.input_shape), built.dataset.num_classes
    oracle = build_model("mlp", input_shape=shape, num_classes=classes, seed=z, draws="portable")
    rebuilt = reconstruct_(built.model_fn(), {}, z, draws="portable")
    assert _equal(_state(rebuilt), _state(oracle)) and _equal(_state(model), _state(oracle))
    assert _wrapped(built.method.program, FedPTClient).draws == "portable"
    run_experiment(load_config({**cfg.to_dict(), "rounds": 2}), out=tmp_path / "r", render=False)


def _baffle(tiny, **kw):
    method = {"name": "baffle", "mode": "batch", "k": 4, "batch_size": 16}
    return tiny(model={"name": "logreg"}, method=method, **kw)


def _wrapped(side, kind):
    """The layer of type ``kind`` in a composed strategy or program."""
    s = side
    while not isinstance(s, kind):
        s = s.inner
    return s


def test_baffle_batch_with_secure_aggregation_draws_portable_directions_and_graph(tmp_path, tiny):
    cfg = load_config(_baffle(tiny, draws="portable"))
    built = build_run(cfg)
    mcfg = built.method_config
    assert mcfg.secure_aggregation
    secure = _wrapped(built.method.strategy, SecureAggregation)
    bare = built.method.bare
    assert bare.spec == mcfg.zo_spec(draws="portable") and bare.spec.draws == "portable"
    assert secure.draws == "portable"
    # the ring the run's server and clients build, on a population where it is not complete
    opts, ids = secure.opts.model_copy(update={"secagg_neighbors": 2}), list(range(12))
    got = _graph(opts, ids, seed=cfg.seed, rnd=1, draws=secure.draws)
    assert got == MaskGraph.build(ids, 2, seed=cfg.seed, round=1, draws="portable")
    assert got != MaskGraph.build(ids, 2, seed=cfg.seed, round=1)
    full = run_experiment(
        load_config(_baffle(tiny, rounds=2, draws="portable")), out=tmp_path / "p", render=False
    )
    plain = run_experiment(
        load_config(_baffle(tiny, rounds=2, draws="torch")), out=tmp_path / "t", render=False
    )
    assert metrics_without_wall(full) != metrics_without_wall(plain)


def test_ntk_baffle_data_free_portable_masks_are_the_pure_layers(tiny):
    method = {
        "name": "ntk-baffle",
        "mode": "batch",
        "k": 4,
        "batch_size": 16,
        "max_steps": 2,
        "density": 0.2,
        "prune_rounds": 2,
        "prune_inputs": 8,
    }
    cfg = load_config(tiny(model={"name": "mlp", "hidden": [32]}, method=method, draws="portable"))
    built = build_run(cfg)
    mcfg = built.method_config
    shape = tuple(built.dataset.input_shape)
    masks = {n: m for n, m in built.method.bare.server.masks.items()}
    w0 = build_model(
        "mlp",
        input_shape=shape,
        num_classes=built.dataset.num_classes,
        seed=derive_seed(cfg.seed, "model-init"),
        draws="portable",
        hidden=[32],
    )
    want = data_free_masks(mcfg, w0, seed=cfg.seed, input_shape=shape, draws="portable")
    assert masks.keys() == want.keys() and all(torch.equal(masks[n], want[n]) for n in want)
    torch_masks = data_free_masks(mcfg, w0, seed=cfg.seed, input_shape=shape)
    assert any(not torch.equal(want[n], torch_masks[n]) for n in want)
    assert built.method.bare.spec.draws == "portable"
    built.simulation().run_round(1)


def test_a_resumed_portable_run_equals_an_uninterrupted_one(tmp_path, tiny, monkeypatch):
    cfg = _baffle(tiny, rounds=4, draws="portable")
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)


def test_portable_workers_equal_in_process(tmp_path, tiny):
    seq = run_experiment(
        load_config(_baffle(tiny, rounds=2, draws="portable")), out=tmp_path / "seq", render=False
    )
    pool = run_experiment(
        load_config(_baffle(tiny, rounds=2, draws="portable", **{"clients.workers": 2})),
        out=tmp_path / "pool",
        render=False,
    )
    assert metrics_without_wall(seq) == metrics_without_wall(pool)


def test_dirichlet_under_portable_draws_warns_that_it_is_drawn_with_numpy(tiny):
    cfg = load_config(tiny(draws="portable", partition={"name": "dirichlet", "alpha": 0.5}))
    with pytest.warns(UserWarning, match="numpy's generator, not portably"):
        build_run(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        build_run(load_config(tiny(draws="torch", partition={"name": "dirichlet", "alpha": 0.5})))
        build_run(load_config(tiny(draws="portable", partition={"name": "shards"})))


def test_an_old_run_directory_without_the_key_resumes_as_torch(tmp_path, tiny, monkeypatch):
    """A run directory written before ``draws`` existed (neither config.yaml nor the applied
    config names it) resumes, with torch's draws: the same numbers as a run with ``draws: torch``."""
    import yaml

    cfg = tiny(rounds=4, draws="torch")
    full = run_experiment(load_config(cfg), out=tmp_path / "full", render=False)
    portable = run_experiment(load_config(tiny(rounds=4)), out=tmp_path / "p", render=False)
    assert metrics_without_wall(portable) != metrics_without_wall(full)  # the key matters
    run_cut_after(cfg, tmp_path / "cut", 2, monkeypatch)
    written = tmp_path / "cut" / CONFIG
    data = yaml.safe_load(written.read_text())
    assert data.pop("draws") == "torch"
    written.write_text(yaml.safe_dump(data, sort_keys=False))
    applied = tmp_path / "cut" / APPLIED_CONFIG
    data = json.loads(applied.read_text())
    assert data.pop("draws") == "torch"
    applied.write_text(json.dumps(data))
    resume_experiment(tmp_path / "cut", render=False)
    assert metrics_without_wall(tmp_path / "cut") == metrics_without_wall(full)


def test_an_old_run_directory_without_the_key_reads_as_torch(tmp_path, tiny):
    """``fedge report``/``compare``'s run log, ``fedge show`` and ``RunDir`` give a run directory
    written before ``draws`` existed ``draws: torch``; one that names its draws keeps them."""
    import yaml

    from fedge.experiment.rundir import RunDir
    from fedge.report.runlog import load_run

    out = run_experiment(load_config(tiny(rounds=1)), out=tmp_path / "r", render=False)
    assert load_run(out).config["draws"] == "portable" == RunDir(out).read_config()["draws"]
    for name, read, write in (
        (CONFIG, yaml.safe_load, lambda d: yaml.safe_dump(d, sort_keys=False)),
        (APPLIED_CONFIG, json.loads, json.dumps),
    ):
        data = read((out / name).read_text())
        del data["draws"]
        (out / name).write_text(write(data))
    assert load_run(out).config["draws"] == "torch"
    assert RunDir(out).read_config()["draws"] == "torch"
    assert RunDir(out).applied_config()["draws"] == "torch"  # type: ignore[index]
    assert load_config(RunDir(out).read_config()).draws == "torch"
