"""The public API end to end: a user's own data, trained from Python and resumed by the plain CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import fedge

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _cli(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    """``fedge ...`` in a fresh process (nothing registered from Python survives)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (SRC, pythonpath) if p),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "fedge.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _tabular(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    x = rng.normal(size=(n, 5)) + 3.0 * np.eye(3, 5)[y]  # separable: class k shifts feature k
    return x.astype(np.float32), y


def _cfg(dataset: dict, rounds: int = 2) -> dict:
    return {
        "rounds": rounds,
        "clients": {"num": 3, "per_round": 3},
        "dataset": dataset,
        "model": {"name": "mlp", "hidden": [16]},
        "method": {
            "name": "fedavg",
            "local_epochs": 3,
            "batch_size": 8,
            "client_optimizer": {"lr": 0.1},
        },
    }


def _curve(run: fedge.RunResult) -> list[tuple[float, float]]:
    return [(m["test_accuracy"], m["test_loss"]) for m in run.metrics]


def test_public_names_are_sorted_and_resolve() -> None:
    assert fedge.__all__ == sorted(fedge.__all__)
    for name in fedge.__all__:
        assert getattr(fedge, name) is not None
    with pytest.raises(AttributeError):
        fedge.no_such_thing  # noqa: B018


def test_import_fedge_is_cheap() -> None:
    code = "import sys, fedge; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "False"


def test_npz_run_then_plain_cli_resume_equals_uninterrupted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    x, y = _tabular(90, 0)
    xt, yt = _tabular(30, 1)
    np.savez("data.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)
    run = fedge.run(_cfg({"name": "npz", "path": "data.npz"}), out="r", overrides={"seed": 3})
    assert len(run.metrics) == 2 and run.summary["dataset"] == "npz"
    assert run.config["dataset"]["path"] == str(tmp_path / "data.npz")  # recorded absolute
    assert run.model(torch_tensor(xt[:4])).shape == (4, 3)

    # the plain CLI, in a fresh process and another directory, trains the run further
    monkeypatch.chdir(tmp_path.parent)
    res = _cli("run", "--resume", str(tmp_path / "r"), "--set", "rounds=4", "-q")
    assert res.returncode == 0, res.stderr
    resumed = fedge.load_run(tmp_path / "r")
    full = fedge.run(
        _cfg({"name": "npz", "path": str(tmp_path / "data.npz")}, rounds=4),
        out=tmp_path / "full",
        overrides=["seed=3"],
    )
    assert _curve(resumed) == _curve(full)
    assert full.metrics[-1]["test_accuracy"] > 0.8  # tabular features train with mlp


def test_csv_yaml_run_with_the_cli(tmp_path: Path) -> None:
    x, y = _tabular(60, 0)
    for name, (xs, ys) in {"train.csv": (x, y), "test.csv": _tabular(21, 1)}.items():
        rows = ["f0,f1,f2,f3,f4,species"] + [
            ",".join(f"{v:.5f}" for v in r) + f",s{c}" for r, c in zip(xs, ys)
        ]
        (tmp_path / name).write_text("\n".join(rows) + "\n")
    cfg = _cfg(
        {
            "name": "csv",
            "path": str(tmp_path / "train.csv"),
            "test_path": str(tmp_path / "test.csv"),
            "label": "species",
        }
    )
    cfg["model"] = {"name": "logreg"}
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(cfg))
    res = _cli("run", str(tmp_path / "my.yaml"), "--out", str(tmp_path / "r"), "-q")
    assert res.returncode == 0, res.stderr
    part = json.loads((tmp_path / "r" / "partition.json").read_text())
    assert part["num_samples"] == 60 and part["num_classes"] == 3


def test_function_registered_from_python_resumes_with_the_cli(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "user_data_mod.py").write_text(
        "import numpy as np\n"
        "def make(seed=0, n=60):\n"
        "    r = np.random.default_rng(7)\n"
        "    y = np.arange(n) % 3\n"
        "    x = r.normal(size=(n, 5)) + 3.0 * np.eye(3, 5)[y]\n"
        "    return x, y, x[:15], y[:15]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_data_mod

    from fedge.data import registry

    fedge.register_dataset("user-tab", user_data_mod.make, replace=True)
    try:
        run = fedge.run(_cfg({"name": "user-tab", "n": 45}), out=tmp_path / "r")
    finally:  # leave the registry as the other tests expect it
        registry._REGISTRY.unregister("user-tab")
        registry._FUNCTIONS.discard("user-tab")
    assert run.config["dataset"]["target"] == "user_data_mod:make"
    res = _cli(
        "run", "--resume", str(tmp_path / "r"), "--set", "rounds=3", "-q", pythonpath=str(tmp_path)
    )
    assert res.returncode == 0, res.stderr
    assert len(fedge.load_run(tmp_path / "r").metrics) == 3
    part = json.loads((tmp_path / "r" / "partition.json").read_text())
    assert part["num_samples"] == 45  # the recorded option n=45 reached the function again


def test_bad_user_data_writes_no_run_dir(tmp_path: Path) -> None:
    np.savez(
        tmp_path / "d.npz",
        x_train=np.zeros((4, 2)),
        y_train=np.zeros(3),
        x_test=np.zeros((2, 2)),
        y_test=np.zeros(2),
    )
    with pytest.raises(fedge.ConfigError, match="x_train has 4 samples but y_train has shape"):
        fedge.run(_cfg({"name": "npz", "path": str(tmp_path / "d.npz")}), out=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    res = _cli(
        "run",
        "quickstart",
        "--set",
        "dataset.name=npz",
        "--set",
        "dataset.path=missing.npz",
        "--out",
        str(tmp_path / "r2"),
    )
    assert res.returncode == 2 and "missing.npz" in res.stderr and not (tmp_path / "r2").exists()


@pytest.fixture
def registered():
    """Register datasets for one test; the registry is left as the other tests expect it."""
    from fedge.data import registry

    names: list[str] = []

    def register(name, fn, **kw):
        spec = fedge.register_dataset(name, fn, replace=True, **kw)
        names.append(name)
        return spec

    yield register
    for name in names:
        if name in registry._REGISTRY:
            registry._REGISTRY.unregister(name)
        registry._FUNCTIONS.discard(name)


def test_a_resume_refused_because_the_data_changed_leaves_the_run_as_it_was(
    tmp_path: Path, registered
) -> None:
    """The dataset registered under the run's name now has 4 classes, not 3: the checkpoint no
    longer fits the model, which resume finds before it writes anything."""
    registered("api-tab", lambda seed: (*_tabular(60, 0), *_tabular(15, 1)))
    run = fedge.run(_cfg({"name": "api-tab"}, rounds=1), out=tmp_path / "r")
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}

    def four_classes(seed):
        x, y = _tabular(60, 0)
        return x, np.arange(60) % 4, x[:15], np.arange(15) % 4

    registered("api-tab", four_classes)
    with pytest.raises(
        fedge.ResumeError,
        match=r"its checkpoint does not fit the model built from its config now .*"
        r"\(nothing was changed\)",
    ):
        fedge.resume(run.path, rounds=2)
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before


def test_registered_function_options_must_be_plain_values(registered) -> None:
    def numpy_default(seed=0, w=np.float32(1.5)):
        return (*_tabular(60, 0), *_tabular(15, 1))

    with pytest.raises(
        fedge.ConfigError,
        match=r"the default of parameter 'w' is .*1.5.* \(float32\); a dataset option must be a plain",
    ):
        registered("api-np", numpy_default)
    with pytest.raises(fedge.ConfigError, match="cannot read the parameters of"):
        registered("api-dict", dict)


def test_label_ids_that_are_not_class_indices_are_refused_and_unseen_test_labels_warned(
    tmp_path: Path, registered
) -> None:
    def ids(seed):
        x, y = _tabular(60, 0)
        return x, y * 1_000_000, x[:15], y[:15] * 1_000_000

    registered("api-ids", ids)
    with pytest.raises(
        fedge.ConfigError,
        match=r"labels are class indices 0..C-1, but these run up to 2000000 with only "
        r"3 distinct values \(0, 1000000, 2000000\).*map them to 0..2",
    ):
        fedge.run(_cfg({"name": "api-ids"}, rounds=1), out=tmp_path / "r")
    assert not (tmp_path / "r").exists()

    def unseen(seed):
        x, y = _tabular(60, 0)
        return x, y, x[:15], np.full(15, 4)

    registered("api-unseen", unseen)
    with pytest.warns(UserWarning, match=r"test labels \[4\] never occur in the training labels"):
        fedge.run(_cfg({"name": "api-unseen"}, rounds=1), out=tmp_path / "u")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: fedge.run(None, out=d / "r"), r"config=None \(NoneType\): expected a path"),
        (lambda d: fedge.run(5, out=d / "r"), r"config=5 \(int\): expected a path"),
        (lambda d: fedge.run("quickstart", out=123), r"out=123 \(int\): expected a path"),
        (lambda d: fedge.load_run(None), r"run_dir=None \(NoneType\): expected a path"),
        (lambda d: fedge.resume(5), r"run_dir=5 \(int\): expected a path"),
        (lambda d: fedge.load_config(None), r"config None \(NoneType\)"),
        (
            lambda d: fedge.run("quickstart", out=d / "r", overrides="rounds=1"),
            r"overrides='rounds=1' is one string; give a list of 'KEY=VALUE' strings \(\['rounds=1'\]\) or a mapping",
        ),
        (
            lambda d: fedge.run("quickstart", out=d / "r", overrides=[("rounds", 1)]),
            r"overrides=\[\('rounds', 1\)\]: expected a list of 'KEY=VALUE' strings or a mapping",
        ),
        (
            lambda d: fedge.run("quickstart", out=d / "r", progress=lambda line: None),
            r"progress=<function .*> cannot be called as f\(metrics_line, total_rounds\)",
        ),
        (
            lambda d: fedge.run("quickstart", out=d / "r", overrides={"rounds": object()}),
            r"overrides: rounds=<object object at .*> \(object\) is not a config value",
        ),
    ],
)
def test_wrong_argument_types_are_config_errors_naming_the_argument(
    tmp_path: Path, call, message
) -> None:
    with pytest.raises(fedge.ConfigError, match=message):
        call(tmp_path)
    assert not (tmp_path / "r").exists()


def test_mapping_overrides_take_paths_numpy_numbers_and_nested_sections(tmp_path: Path) -> None:
    """A nested mapping sets the keys it names and keeps the section's others (batch_size 8 here)."""
    from fedge.core.config import load_config

    cfg = load_config(
        _cfg({"name": "digits"}),
        overrides={
            "rounds": np.int64(4),
            "dataset": {"root": tmp_path},
            "method": {"local_epochs": 2},
        },
    )
    assert cfg.rounds == 4 and cfg.dataset.root == str(tmp_path)
    assert (
        cfg.to_dict()["method"]["local_epochs"] == 2 and cfg.to_dict()["method"]["batch_size"] == 8
    )


def test_resume_and_export_name_their_bad_arguments(tmp_path: Path) -> None:
    run = fedge.run(_cfg({"name": "digits"}, rounds=1), out=tmp_path / "r")
    with pytest.raises(
        fedge.ConfigError, match=r"rounds='2' \(str\): expected a whole number of rounds"
    ):
        fedge.resume(run.path, rounds="2")  # type: ignore[arg-type]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(fedge.ConfigError, match=r"a part of its folder .*afile' is a file"):
        run.export(out=tmp_path / "afile" / "m.pt")
    with pytest.raises(fedge.ConfigError, match=r"export out=5 \(int\): expected a file path"):
        run.export(out=5)  # type: ignore[arg-type]


def test_a_run_of_a_dataset_registered_from_python_says_to_register_it_again(
    tmp_path: Path, registered
) -> None:
    from fedge.data import registry

    registered("api-gone", lambda seed: (*_tabular(60, 0), *_tabular(15, 1)))
    run = fedge.run(_cfg({"name": "api-gone"}, rounds=1), out=tmp_path / "r")
    registry._REGISTRY.unregister("api-gone")  # as in a fresh process
    with pytest.raises(
        fedge.ConfigError,
        match=r"unknown dataset 'api-gone'.*register it again in this process first",
    ):
        fedge.resume(run.path, rounds=2)
    with pytest.raises(fedge.ConfigError, match=r"register it again in this process first"):
        run.export()


def torch_tensor(a: np.ndarray):  # noqa: ANN201
    import torch

    return torch.as_tensor(a)


def test_a_model_whose_data_moved_says_why_the_data_is_needed(tmp_path: Path) -> None:
    x, y = _tabular(60, 0)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x[:15], y_test=y[:15])
    run = fedge.run(
        _cfg({"name": "npz", "path": str(tmp_path / "d.npz")}, rounds=1), out=tmp_path / "r"
    )
    (tmp_path / "d.npz").rename(tmp_path / "moved.npz")
    with pytest.raises(
        fedge.DataNotFoundError,
        match=r"the model of run '.*' is rebuilt from the run's config, which "
        r"reads its dataset \(input shape, normalization statistics\): .*d.npz",
    ):
        fedge.load_run(run.path).model  # noqa: B018
