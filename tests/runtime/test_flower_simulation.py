"""Flower's simulation engine (Ray backend) running fedge: the same per-round accuracies and
payload bytes as the built-in engine, the same run directory, and no Ray process left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="flwr is not installed (pip install 'fedge[flower]')")

from fedge.core.config import load_config  # noqa: E402
from fedge.core.errors import ConfigError  # noqa: E402
from fedge.experiment.run import run_experiment  # noqa: E402
from fedge.runtime.flower.simulation import backend_config  # noqa: E402
from tests.conftest import tiny_config  # noqa: E402

SAME = (
    "test_accuracy",
    "test_loss",
    "bytes_down",
    "bytes_up",
    "client_flops",
    "cum_bytes_down",
    "cum_bytes_up",
)


def _lines(path):
    return [json.loads(x) for x in (Path(path) / "metrics.jsonl").read_text().splitlines()]


def _descendants() -> list[int]:
    """Live processes descended from this one (Ray's GCS, raylet, workers and actors would be)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(d.name)] = int(fields[1])
    me, out = os.getpid(), []
    for pid in parent:
        p = pid
        while p in parent and p != me:
            p = parent[p]
        if p == me and pid != me:
            out.append(pid)
    return out


def test_backend_config_one_cpu_per_actor_no_gpu_no_dashboard():
    cfg = backend_config(num_nodes=3, cpus=8)
    assert cfg["client_resources"] == {"num_cpus": 1, "num_gpus": 0.0}
    assert cfg["init_args"]["num_cpus"] == 3  # never more actors than nodes
    assert cfg["init_args"]["include_dashboard"] is False
    assert backend_config(num_nodes=100, cpus=2)["init_args"]["num_cpus"] == 2


def test_unknown_backend_is_a_config_error_and_claims_no_directory(tmp_path):
    with pytest.raises(ConfigError, match="backend 'dask' is not known"):
        run_experiment(
            load_config(tiny_config(rounds=1)),
            out=tmp_path / "r",
            runtime="flower-sim",
            backend="dask",
        )
    with pytest.raises(ConfigError, match="goes with runtime 'flower-sim'"):
        run_experiment(load_config(tiny_config(rounds=1)), out=tmp_path / "r", backend="ray")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_quickstart_on_rays_simulation_engine_equals_the_engine_and_resumes(tmp_path):
    """``fedge run quickstart --runtime flower-sim --backend ray`` (2 rounds, 3 clients), then
    ``--resume --set rounds=3`` (on the in-process grid: Ray starts once, ~30 s): per-round
    accuracies and payload bytes equal a 3-round run on the built-in engine."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'fedge[flower-sim]')")
    from typer.testing import CliRunner

    from fedge.cli.main import app

    sets = ["--set", "clients.num=3", "--set", "clients.per_round=3"]
    engine = _lines(
        run_experiment(
            load_config(
                "quickstart", overrides=["rounds=3", "clients.num=3", "clients.per_round=3"]
            ),
            out=tmp_path / "engine",
            render=False,
        )
    )
    out = tmp_path / "ray"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "quickstart",
            "--runtime",
            "flower-sim",
            "--backend",
            "ray",
            "--set",
            "rounds=2",
            *sets,
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert _descendants() == []  # Ray's processes are gone
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runtime"] == "flower-sim" and summary["flower_backend"] == "ray"
    assert (out / "report.md").exists() and (out / "model.safetensors").exists()
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--resume",
            str(out),
            "--set",
            "rounds=3",
            "--runtime",
            "flower-sim",
            "--backend",
            "local",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert _descendants() == []
    ray = _lines(out)
    assert [x["round"] for x in ray] == [1, 2, 3]
    for e, f in zip(engine, ray, strict=True):
        for key in SAME:
            assert f[key] == pytest.approx(e[key], rel=1e-9, abs=0), (e["round"], key)
        assert f["bytes_down"] < f["flower_bytes_down"] and f["bytes_up"] < f["flower_bytes_up"]
    assert engine[-1]["test_accuracy"] > 0.9
