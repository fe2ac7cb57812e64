"""fedge export: the TorchScript file computes what the run's model computes, masks applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from fedge.cli.main import app
from fedge.core.config import load_config
from fedge.core.errors import ConfigError, ResumeError
from fedge.experiment.export import export_model, load_trained_model
from fedge.experiment.run import run_experiment
from fedge.pruning import prunable_parameters


def _batch(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn((17, *shape), generator=torch.Generator().manual_seed(0))


def test_torchscript_export_matches_the_model(tmp_path: Path, tiny) -> None:
    cfg = load_config(tiny(rounds=2, model={"name": "lenet", "channels": [4, 8]}))
    run = run_experiment(cfg, out=tmp_path / "r", render=False)
    res = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "m.pt")])
    assert res.exit_code == 0, res.output
    extra = {"fedge.json": ""}
    scripted = torch.jit.load(str(tmp_path / "m.pt"), _extra_files=extra)
    meta = json.loads(extra["fedge.json"])
    assert (
        meta["input_shape"] == [1, 8, 8] and meta["num_classes"] == 10 and meta["density"] is None
    )
    # oracle: the run's final weights (model.safetensors) in a freshly built model
    trained = load_trained_model(run)
    state = load_file(str(run / "model.safetensors"))
    assert all(torch.equal(v, state[k]) for k, v in trained.model.state_dict().items())
    x = _batch((1, 8, 8))
    with torch.no_grad():
        assert torch.allclose(scripted(x), trained.model(x), atol=1e-6)
    assert list(meta["mean"]) == pytest.approx(list(trained.mean))


def test_pt2_export_matches_the_model_at_any_batch_size(tmp_path: Path, tiny) -> None:
    cfg = load_config(tiny(rounds=2, model={"name": "lenet", "channels": [4, 8]}))
    run = run_experiment(cfg, out=tmp_path / "r", render=False)
    res = CliRunner().invoke(app, ["export", str(run), "--format", "pt2"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "model.pt2 (pt2;" in res.output
    extra = {"fedge.json": ""}
    program = torch.export.load(str(run / "model.pt2"), extra_files=extra)
    meta = json.loads(extra["fedge.json"])
    trained = load_trained_model(run)
    assert meta == trained.metadata() and meta["input_shape"] == [1, 8, 8]
    module = program.module()
    x = _batch((1, 8, 8))  # 17: the program was traced on 2, its batch axis is dynamic
    with torch.no_grad():
        assert torch.allclose(module(x), trained.model(x), atol=1e-6)
        assert torch.allclose(module(x[:1]), trained.model(x[:1]), atol=1e-6)


def _exported_weights(path: Path, format: str) -> tuple[dict[str, torch.Tensor], Any]:
    """(parameter name -> tensor, a callable module) of an exported file."""
    if format == "torchscript":
        scripted = torch.jit.load(str(path))
        return dict(scripted.named_parameters()), scripted
    program = torch.export.load(str(path))
    return dict(program.state_dict), program.module()


@pytest.mark.parametrize("format", ["torchscript", "pt2"])
def test_pruned_model_exports_with_exact_zeros(tmp_path: Path, tiny, format: str) -> None:
    method = {
        "name": "ntk-baffle",
        "k": 8,
        "batch_size": 16,
        "max_steps": 2,
        "density": 0.2,
        "prune_rounds": 3,
        "prune_inputs": 8,
        "mode": "epoch",
    }
    cfg = load_config(
        tiny(
            rounds=2,
            model={"name": "mlp", "hidden": [32]},
            method=method,
            **{"clients.num": 4, "clients.per_round": 4},
        )
    )
    run = run_experiment(cfg, out=tmp_path / "r", render=False)
    result = export_model(run, format=format)  # type: ignore[arg-type]
    assert result.path == run / {"torchscript": "model.pt", "pt2": "model.pt2"}[format]
    assert result.metadata["density"] == pytest.approx(0.2, abs=1e-3)
    trained = load_trained_model(run)
    names = prunable_parameters(trained.model)
    assert set(trained.masks) == set(names)
    weights, scripted = _exported_weights(result.path, format)
    for name, mask in trained.masks.items():
        assert torch.all(weights[name][~mask] == 0)  # pruned: exactly zero in the file
    kept = sum(int((weights[n] != 0).sum()) for n in names)
    assert kept == sum(int(m.sum()) for m in trained.masks.values())
    x = _batch((1, 8, 8))
    with torch.no_grad():
        assert torch.allclose(scripted(x), trained.model(x), atol=1e-6)


def test_export_errors(tmp_path: Path, tiny) -> None:
    cfg = load_config(tiny(rounds=1))
    run = run_experiment(cfg, out=tmp_path / "r", render=False)
    with pytest.raises(
        ConfigError, match="'tflite' is not supported; expected one of torchscript, pt2, onnx"
    ):
        export_model(run, format="tflite")  # type: ignore[arg-type]
    (run / "summary.json").unlink()
    with pytest.raises(ResumeError, match="not complete"):
        export_model(run)
    res = CliRunner().invoke(app, ["export", str(tmp_path / "nothing")])
    assert (
        res.exit_code == 2
        and "nothing' does not exist; give the directory of a fedge run" in res.output
    )


def test_export_refuses_a_corrupt_model_or_a_directory_as_out_and_leaves_no_temp_file(
    tmp_path: Path, tiny
) -> None:
    run = run_experiment(load_config(tiny(rounds=1)), out=tmp_path / "r", render=False)
    (tmp_path / "dir").mkdir()
    res = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "dir")])
    assert res.exit_code == 2 and "is a directory; name the file to write, e.g. --out" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "r"] and not any(
        (tmp_path / "dir").iterdir()
    )
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    res = CliRunner().invoke(app, ["export", str(run)])
    assert (
        res.exit_code == 2
        and "cannot be read as safetensors" in res.output
        and "corrupt or truncated" in res.output
    )
    weights.unlink()
    with pytest.raises(ResumeError, match="complete but its model.safetensors is missing"):
        export_model(run)
    assert not list(run.glob("*.tmp")) and not (run / "model.pt").exists()


def test_onnx_export_matches_the_model(tmp_path: Path, tiny) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from onnx.reference import ReferenceEvaluator

    run = run_experiment(
        load_config(tiny(rounds=1, model={"name": "lenet", "channels": [4, 8]})),
        out=tmp_path / "r",
        render=False,
    )
    result = export_model(run, format="onnx")
    proto = onnx.load(str(result.path))
    meta = json.loads({p.key: p.value for p in proto.metadata_props}["fedge.json"])
    assert meta["input_shape"] == [1, 8, 8]
    x = _batch((1, 8, 8))
    (got,) = ReferenceEvaluator(proto).run(None, {"x": x.numpy()})
    with torch.no_grad():
        want = load_trained_model(run).model(x)
    assert torch.allclose(torch.from_numpy(got), want, atol=1e-5)


def test_onnx_missing_says_how_to_install(tmp_path: Path, tiny, monkeypatch) -> None:
    import sys

    run = run_experiment(load_config(tiny(rounds=1)), out=tmp_path / "r", render=False)
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install 'fedge\\[onnx\\]'"):
        export_model(run, format="onnx")
    # a folder that is not a run is named first, whatever is installed
    with pytest.raises(ResumeError, match="does not exist; give the directory of a fedge run"):
        export_model(tmp_path / "nothing", format="onnx")


def test_a_run_trained_on_a_gpu_exports_on_a_machine_without_one(tmp_path: Path, tiny) -> None:
    """The run's config.yaml names device: cuda (as a GPU run's does); export rebuilds the model
    on the CPU, so it works where torch sees no GPU, giving the run's weights."""
    import yaml

    run = run_experiment(load_config(tiny(rounds=1)), out=tmp_path / "r", render=False)
    config = run / "config.yaml"
    raw = yaml.safe_load(config.read_text())
    assert raw["device"] == "cpu"
    config.write_text(yaml.safe_dump({**raw, "device": "cuda"}, sort_keys=False))
    res = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "m.pt")])
    assert res.exit_code == 0, res.output
    scripted = torch.jit.load(str(tmp_path / "m.pt"))
    trained = load_trained_model(run)
    x = _batch((1, 8, 8))
    with torch.no_grad():
        assert torch.allclose(scripted(x), trained.model(x), atol=1e-6)
