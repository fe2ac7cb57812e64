"""A user's own data: npz, csv and module:function datasets, and their error messages."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedge.core.errors import ConfigError, DataNotFoundError
from fedge.data import load_dataset
from fedge.data.registry import resolve_dataset_options


def _arrays(n: int = 40, m: int = 12, shape: tuple[int, ...] = (6, 6), classes: int = 3):
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.integers(0, 256, (n, *shape), dtype=np.uint8),
        "y_train": np.arange(n) % classes,
        "x_test": rng.integers(0, 256, (m, *shape), dtype=np.uint8),
        "y_test": np.arange(m) % classes,
    }


def test_npz_images_get_a_channel_axis_and_the_shared_pipeline(tmp_path: Path) -> None:
    a = _arrays()
    np.savez(tmp_path / "d.npz", **a)
    ds = load_dataset("npz", path=str(tmp_path / "d.npz"))
    assert ds.input_shape == (1, 6, 6) and ds.num_classes == 3 and ds.num_train == 40
    # oracle: (x / 255 - mean) / std with the train statistics, computed by hand
    x = a["x_train"].astype(np.float64) / 255
    mean, std = x.mean(), x.std()
    assert ds.mean[0] == pytest.approx(mean) and ds.std[0] == pytest.approx(std)
    expect = (a["x_test"].astype(np.float64) / 255 - mean) / std
    assert np.allclose(ds.x_test[:, 0].numpy(), expect, atol=1e-5)
    assert torch.equal(ds.y_test, torch.as_tensor(a["y_test"]))


def test_npz_tabular_is_normalized_per_feature(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal([0, 10, -5], [1, 3, 0.5], size=(50, 3)).astype(np.float32)
    np.savez(
        tmp_path / "t.npz",
        x_train=x,
        y_train=np.arange(50) % 2,
        x_test=x[:10],
        y_test=np.arange(10) % 2,
    )
    ds = load_dataset("npz", path=tmp_path / "t.npz")
    assert ds.input_shape == (3,) and ds.x_train.shape == (50, 3)
    assert np.allclose(ds.x_train.mean(0).numpy(), 0, atol=1e-5)
    assert np.allclose(ds.x_train.std(0, unbiased=False).numpy(), 1, atol=1e-4)
    with pytest.raises(ConfigError, match="resize=8 applies to images"):
        load_dataset("npz", path=tmp_path / "t.npz", resize=8)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"y_test": None}, "missing array\\(s\\) y_test"),
        ({"y_train": np.arange(39) % 3}, "x_train has 40 samples but y_train has shape \\(39,\\)"),
        ({"y_train": np.linspace(0, 2, 40)}, "y_train must hold integer class labels"),
        ({"y_test": -np.ones(12, dtype=int)}, "y_test must hold integer class labels >= 0"),
        ({"x_test": np.zeros((12, 5, 5), np.uint8)}, "same sample shape"),
        ({"x_train": np.zeros(40)}, "x_train has shape \\(40,\\)"),
    ],
)
def test_npz_errors_name_the_problem(tmp_path: Path, change: dict, match: str) -> None:
    a = {k: v for k, v in {**_arrays(), **change}.items() if v is not None}
    np.savez(tmp_path / "bad.npz", **a)
    with pytest.raises(ConfigError, match=match):
        load_dataset("npz", path=str(tmp_path / "bad.npz"))


def test_missing_file_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="path='nope.npz' is not a file"):
        load_dataset("npz", path="nope.npz")
    with pytest.raises(ConfigError, match="option path must be a file path, got None"):
        load_dataset("npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(ConfigError, match="not a readable .npz"):
        load_dataset("npz", path=str(tmp_path / "junk.npz"))


def test_an_empty_npz_names_the_file_and_what_a_valid_one_holds(tmp_path: Path) -> None:
    empty = tmp_path / "e.npz"
    empty.write_bytes(b"")  # `: > e.npz`
    with pytest.raises(ConfigError) as exc:
        load_dataset("npz", path=str(empty))
    msg = str(exc.value)
    assert f"{str(empty)!r} is not a readable .npz file" in msg and "the file is empty" in msg
    assert "x_train, y_train, x_test, y_test" in msg and "np.savez(" in msg


def _write_csv(path: Path, rows: list[list[object]], header: str = "a,b,label") -> None:
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")


def test_csv_class_names_and_features(tmp_path: Path) -> None:
    _write_csv(tmp_path / "tr.csv", [[1, 2, "dog"], [3, 4, "cat"], [5, 6, "dog"], [7, 8, "cat"]])
    _write_csv(tmp_path / "te.csv", [[1, 1, "cat"], [2, 2, "dog"]])
    ds = load_dataset("csv", path=str(tmp_path / "tr.csv"), test_path=str(tmp_path / "te.csv"))
    assert ds.classes == ("cat", "dog") and ds.input_shape == (2,)
    assert ds.y_train.tolist() == [1, 0, 1, 0] and ds.y_test.tolist() == [0, 1]
    # feature a: mean 4, std sqrt(5); test value 1 -> (1 - 4) / sqrt(5)
    assert ds.x_test[0, 0].item() == pytest.approx(-3 / 5**0.5, rel=1e-5)


def test_csv_errors(tmp_path: Path) -> None:
    tr, te = tmp_path / "tr.csv", tmp_path / "te.csv"
    _write_csv(tr, [[1, 2, 0], [3, 4, 1]])
    _write_csv(te, [[1, 2, 0.5]])
    with pytest.raises(ConfigError, match="label '0.5'; numeric labels must be whole numbers"):
        load_dataset("csv", path=str(tr), test_path=str(te))
    with pytest.raises(ConfigError, match="has no column 'y'.*set dataset.label"):
        load_dataset("csv", path=str(tr), test_path=str(tr), label="y")
    _write_csv(te, [[1, "x", 0]])
    with pytest.raises(ConfigError, match="non-numeric feature"):
        load_dataset("csv", path=str(tr), test_path=str(te))
    with pytest.raises(DataNotFoundError, match="test_path"):
        load_dataset("csv", path=str(tr), test_path=str(tmp_path / "none.csv"))


def test_module_target_and_recorded_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_data_mod.py").write_text(
        "import numpy as np\n"
        "def make(n=20, seed=0):\n"
        "    r = np.random.default_rng(seed)\n"
        "    return r.normal(size=(n, 4)), np.arange(n) % 2, r.normal(size=(6, 4)), np.arange(6) % 2\n"
        "not_callable = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ds = load_dataset("module", target="my_data_mod:make", kwargs={"n": 30}, seed=5)
    assert ds.num_train == 30 and ds.input_shape == (4,)
    other = load_dataset("module", target="my_data_mod:make", kwargs={"n": 30}, seed=6)
    assert not torch.equal(ds.x_train, other.x_train)  # the run seed reaches the function
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        load_dataset("module", target="no_such_mod:f")
    with pytest.raises(ConfigError, match="is not callable"):
        load_dataset("module", target="my_data_mod:not_callable")
    with pytest.raises(ConfigError, match="'package.module:function'"):
        load_dataset("module", target="my_data_mod.make")
    sys.modules.pop("my_data_mod", None)


def test_resolved_options_make_paths_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = resolve_dataset_options("csv", {"path": "tr.csv", "test_path": "te.csv"})
    assert out == {
        "path": str(tmp_path / "tr.csv"),
        "test_path": str(tmp_path / "te.csv"),
        "label": "label",
    }
    with pytest.raises(ConfigError, match="dataset 'npz' has no option pth; valid options: path"):
        resolve_dataset_options("npz", {"pth": "x"})
