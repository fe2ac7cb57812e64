"""synthetic-fed: clients generated on demand from (seed, client), FedProx's Synthetic(α, β)."""

import subprocess
import sys

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.data.federated import LazyClients, SyntheticFederated
from fedge.experiment.build import build_run


def test_a_client_is_the_same_whenever_and_wherever_it_is_made():
    fed = SyntheticFederated(10**6, seed=3)
    x, y = fed.client(123_456)
    x2, y2 = SyntheticFederated(10**6, seed=3).client(123_456)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    code = (
        "from fedge.data.federated import SyntheticFederated as S; import hashlib;"
        "x, y = S(10**6, seed=3).client(123_456); print(hashlib.sha256(x.numpy().tobytes()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    import hashlib

    assert out == hashlib.sha256(x.numpy().tobytes()).hexdigest()
    assert x.shape == (fed.size(123_456), 60) and y.dtype == torch.int64 and int(y.max()) < 10


def test_generative_model_matches_fedprox():
    """Labels are the argmax of the device's own linear model; α = β = 0 makes devices share
    their means (u = B = 0), so feature means agree across devices up to the N(0,1) draws."""
    fed = SyntheticFederated(100, seed=0, alpha=0.0, beta=0.0, max_samples=5000)
    w, b, v = fed._device(7)
    x, y = fed._samples(7, 4000, "check")
    assert torch.equal(y, (x @ w.t() + b).argmax(1))
    # x ~ N(v, Σ) with Σ_jj = j^-1.2: the sample variance of feature j follows j^-1.2
    var = x.var(0)
    want = torch.arange(1, 61, dtype=torch.float32).pow(-1.2)
    assert torch.allclose(var, want, rtol=0.15)
    assert torch.allclose(x.mean(0), v, atol=4 * (want.sqrt() / 4000**0.5).max().item())


def test_sizes_follow_the_power_law_with_a_cap():
    fed = SyntheticFederated(10**6, seed=1, max_samples=1000)
    sizes = [fed.size(c) for c in range(2000)]
    assert min(sizes) >= 50 and max(sizes) == 1000
    assert 60 < sorted(sizes)[1000] < 200  # median exp(4) + 50 ≈ 105


def test_test_set_is_ten_thousand_seeded_samples():
    x, y = SyntheticFederated(10**6, seed=2).test_set()
    assert x.shape == (10_000, 60) and y.shape == (10_000,)
    x2, _ = SyntheticFederated(10**6, seed=2).test_set()
    assert torch.equal(x, x2)


def test_lazy_clients_hold_only_recent_clients():
    clients = LazyClients(SyntheticFederated(10**6, seed=0), cache=4)
    for c in range(10):
        assert clients[c].num_samples == clients.source.size(c)
    assert len(clients._recent) == 4 and len(clients) == 10**6


def test_bad_parameters_are_named():
    with pytest.raises(ConfigError, match="dataset.alpha"):
        SyntheticFederated(10, seed=0, alpha=float("nan"))
    with pytest.raises(ConfigError, match="outside the population"):
        SyntheticFederated(10, seed=0).client(10)


def test_a_million_client_run_builds_nothing_per_client(tiny):
    cfg = load_config(
        tiny(
            model={"name": "logreg"},
            dataset={"name": "synthetic-fed"},
            rounds=2,
            **{"clients.num": 10**6, "clients.per_round": 20},
        )
    )
    built = build_run(cfg)
    assert isinstance(built.clients, LazyClients) and built.partition_summary["lazy"] is True
    sim = built.simulation()
    lines = [sim.run_round(r) for r in (1, 2)]
    assert lines[1]["clients"] == 20 and lines[1]["test_accuracy"] is not None
    assert len(built.clients._recent) <= built.clients.cache
    with pytest.raises(ConfigError, match="synthetic-fed only"):
        load_config(tiny(dataset={"name": "digits", "alpha": 0.5}))


def test_partition_command_shows_one_clients_shard(tiny, tmp_path):
    import json

    from typer.testing import CliRunner

    from fedge.cli.main import app
    from fedge.experiment.run import run_experiment

    cfg = load_config(
        tiny(
            model={"name": "logreg"},
            dataset={"name": "synthetic-fed"},
            rounds=1,
            **{"clients.num": 10**6, "clients.per_round": 5},
        )
    )
    run = run_experiment(cfg, out=tmp_path / "run", render=False)
    res = CliRunner().invoke(app, ["partition", str(run), "--client", "999999"])
    assert res.exit_code == 0, res.output
    shard = json.loads(res.output)
    want = SyntheticFederated(10**6, seed=0).client(999_999)[1]
    assert (
        shard["samples"] == want.numel()
        and shard["label_counts"] == torch.bincount(want, minlength=10).tolist()
    )
    bad = CliRunner().invoke(app, ["partition", str(run), "--client", str(10**6)])
    assert bad.exit_code == 2 and "outside the population" in bad.output
