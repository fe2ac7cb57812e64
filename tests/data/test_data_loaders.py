"""Dataset loaders on tiny fake files, the bundled and generated datasets, real Fashion-MNIST."""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedge.core.errors import ConfigError, DataNotFoundError, UnknownNameError
from fedge.data import (
    DATASETS,
    available_datasets,
    builtin,
    dataset_names,
    formats,
    load_dataset,
)

_IDX_NAMES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real data directory is searched: $FEDGE_DATA unset, cache and system dirs in tmp."""
    monkeypatch.delenv("FEDGE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(formats, "SYSTEM_DATA_DIR", tmp_path / "system")
    return tmp_path


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def fake_images(n: int, seed: int, size: int = 28) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size), dtype=np.uint8)


def write_mnist_like(
    directory: Path,
    names: tuple[str, ...] = _IDX_NAMES,
    *,
    n_train: int = 40,
    n_test: int = 20,
    num_classes: int = 10,
    offset: int = 0,
    gz: bool = False,
) -> tuple[np.ndarray, ...]:
    directory.mkdir(parents=True, exist_ok=True)
    arrays = (
        fake_images(n_train, 1),
        np.arange(n_train) % num_classes + offset,
        fake_images(n_test, 2),
        np.arange(n_test) % num_classes + offset,
    )
    for name, array in zip(names, arrays):
        write_idx(directory / (name + (".gz" if gz else "")), array, gz)
    return arrays


def test_mnist_from_root(tmp_path: Path) -> None:
    x_tr, y_tr, _, y_te = write_mnist_like(tmp_path / "m", gz=True)
    ds = load_dataset("mnist", root=tmp_path / "m")
    assert ds.x_train.shape == (40, 1, 28, 28) and ds.x_test.shape == (20, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    np.testing.assert_array_equal(ds.y_train, y_tr)
    np.testing.assert_array_equal(ds.y_test, y_te)
    # normalized with the train split's statistics, which are kept for de-normalizing
    assert ds.mean[0] == pytest.approx(x_tr.mean() / 255, rel=1e-5)
    assert ds.std[0] == pytest.approx(x_tr.std() / 255, rel=1e-4)
    assert abs(float(ds.x_train.mean())) < 1e-5
    assert float(ds.x_train.std()) == pytest.approx(1, rel=1e-3)
    restored = ds.x_train[0, 0] * ds.std[0] + ds.mean[0]
    torch.testing.assert_close(restored, torch.from_numpy(x_tr[0] / 255).float(), atol=1e-5, rtol=0)
    assert ds.source == str(tmp_path / "m") and ds.classes == tuple("0123456789")


def test_mnist_from_fedge_data_and_torchvision_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_mnist_like(tmp_path / "store" / "mnist" / "MNIST" / "raw")
    monkeypatch.setenv("FEDGE_DATA", str(tmp_path / "store"))
    assert load_dataset("mnist").num_train == 40
    status = {s.name: s for s in available_datasets()}
    assert status["mnist"].available
    assert status["mnist"].location == str(tmp_path / "store" / "mnist" / "MNIST" / "raw")


def test_missing_data_lists_every_path_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("fashion-mnist", root=tmp_path / "nowhere")
    message = str(info.value)
    for expected in (
        str(tmp_path / "nowhere"),
        str(tmp_path / "cache" / "fedge" / "fashion-mnist"),
        str(tmp_path / "system" / "fashion-mnist"),
        "$FEDGE_DATA  (not set)",
        "train-images-idx3-ubyte[.gz]",
        "apt-get install dataset-fashion-mnist",
    ):
        assert expected in message
    assert isinstance(info.value, FileNotFoundError)  # callers unaware of fedge can catch it


def test_emnist_transposed_images_and_letters_labels(tmp_path: Path) -> None:
    names = tuple(f"emnist-letters-{n.replace('t10k', 'test')}" for n in _IDX_NAMES)
    directory = tmp_path / "e"
    x_tr, y_tr, _, _ = write_mnist_like(directory, names, num_classes=26, offset=1)
    # EMNIST's files hold each image transposed: store the transposes
    write_idx(directory / names[0], x_tr.transpose(0, 2, 1))
    ds = load_dataset("emnist", root=directory, split="letters")
    assert ds.num_classes == 26 and ds.classes[0] == "A"
    np.testing.assert_array_equal(ds.y_train, y_tr - 1)  # letters labels 1..26 -> 0..25
    restored = (ds.x_train[:, 0] * ds.std[0] + ds.mean[0]) * 255
    np.testing.assert_allclose(restored.numpy(), x_tr, atol=1e-3)


def test_emnist_default_split_and_bad_split(tmp_path: Path) -> None:
    names = tuple(f"emnist-balanced-{n.replace('t10k', 'test')}" for n in _IDX_NAMES)
    write_mnist_like(tmp_path / "e", names, n_train=47, n_test=47, num_classes=47)
    assert DATASETS["emnist"].options == {"split": "balanced"}
    ds = load_dataset("emnist", root=tmp_path / "e")
    assert ds.num_classes == 47 and len(ds.classes) == 47
    with pytest.raises(ConfigError, match="split must be one of balanced, byclass"):
        load_dataset("emnist", root=tmp_path / "e", split="bogus")


def test_labels_out_of_range_are_rejected(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "m", num_classes=12)  # labels 10, 11 are not MNIST labels
    with pytest.raises(ConfigError, match=r"labels must lie in \[0, 10\)"):
        load_dataset("mnist", root=tmp_path / "m")


@pytest.mark.parametrize("split", ["train", "test"])
def test_images_not_28x28_are_refused_naming_the_file(tmp_path: Path, split: str) -> None:
    """A resized or foreign IDX file parses; every MNIST-family image is 28x28, so anything else
    is the wrong file (and a test split of another size would fail only in the first forward)."""
    write_mnist_like(tmp_path / "m")
    name = _IDX_NAMES[0] if split == "train" else _IDX_NAMES[2]
    write_idx(tmp_path / "m" / name, fake_images(40 if split == "train" else 20, 3, size=32))
    with pytest.raises(
        ConfigError,
        match=rf"{name}: expected 28x28 images .* got 32x32; .*"
        "dataset.name=npz",
    ):
        load_dataset("mnist", root=tmp_path / "m")


@pytest.mark.parametrize("split", ["train", "test"])
def test_an_empty_split_is_refused_naming_it(tmp_path: Path, split: str) -> None:
    """IDX files holding 0 images parse; a run on them would report test accuracy 0.0 (an
    empty test split) or a partition error about "[1, 0]" clients (an empty train split)."""
    write_mnist_like(tmp_path / "m", **{f"n_{split}": 0})
    with pytest.raises(
        ConfigError,
        match=rf"^dataset 'mnist' \(.*m\): the {split} split holds no samples; .*check "
        "or replace the files$",
    ):
        load_dataset("mnist", root=tmp_path / "m")


def write_cifar(directory: Path, files: dict[str, int], label_key: bytes, classes: int) -> None:
    directory.mkdir(parents=True)
    for i, (name, n) in enumerate(files.items()):
        data = np.random.default_rng(i).integers(0, 256, (n, 3072), dtype=np.uint8)
        data[:, :1024] = 200  # red plane constant: checks the channel layout
        batch = {b"data": data, label_key: [int(k) % classes for k in range(n)]}
        (directory / name).write_bytes(pickle.dumps(batch, protocol=2))


def test_cifar10(tmp_path: Path) -> None:
    files = {f"data_batch_{i}": 4 for i in range(1, 6)} | {"test_batch": 6}
    write_cifar(tmp_path / "c" / "cifar-10-batches-py", files, b"labels", 10)
    ds = load_dataset("cifar10", root=tmp_path / "c", resize=16)
    assert ds.x_train.shape == (20, 3, 16, 16) and ds.x_test.shape == (6, 3, 16, 16)
    assert ds.classes[0] == "airplane" and ds.num_classes == 10
    assert ds.mean[0] == pytest.approx(200 / 255) and ds.std[0] == 1.0  # constant channel


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    write_cifar(tmp_path / "c", {"train": 10, "test": 5}, b"fine_labels", 100)  # no subfolder
    ds = load_dataset("cifar100", root=tmp_path / "c")
    assert ds.num_classes == 100 and len(set(ds.classes)) == 100
    assert ds.input_shape == (3, 32, 32) and ds.y_train.tolist() == list(range(10))


def test_digits_fixed_split_and_resize() -> None:
    ds = load_dataset("digits")
    assert ds.x_train.shape == (1437, 1, 8, 8) and ds.x_test.shape == (360, 1, 8, 8)
    assert ds.num_classes == 10 and ds.source == "scikit-learn"
    assert torch.bincount(ds.y_test).tolist() == [36, 37, 35, 37, 36, 36, 36, 36, 35, 36]
    # the test set is pinned forever: a change in the split would change every digits result
    _, _, x_te, y_te = builtin._digits()
    digest = hashlib.sha256(x_te.tobytes() + y_te.tobytes()).hexdigest()[:16]
    assert digest == DIGITS_TEST_DIGEST
    assert load_dataset("digits", seed=5).y_test.tolist() == ds.y_test.tolist()  # seed-free
    big = load_dataset("digits", resize=28)
    assert big.x_train.shape == (1437, 1, 28, 28) and big.input_shape == (1, 28, 28)
    assert float(big.x_train.std()) == pytest.approx(1, abs=1e-3)


DIGITS_TEST_DIGEST = "c68d82276b1cc6c3"


def test_synthetic_is_deterministic_and_learnable() -> None:
    a, b = load_dataset("synthetic", seed=3), load_dataset("synthetic", seed=3)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_train, load_dataset("synthetic", seed=4).x_train)
    assert a.x_train.shape == (600, 1, 8, 8) and torch.bincount(a.y_train).tolist() == [60] * 10
    # oracle: nearest class mean of the train split classifies the test split almost perfectly
    centroids = torch.stack([a.x_train[a.y_train == k].mean(0) for k in range(10)]).flatten(1)
    predicted = torch.cdist(a.x_test.flatten(1), centroids).argmin(1)
    assert (predicted == a.y_test).float().mean() > 0.95


def test_synthetic_options_and_domains() -> None:
    ds = load_dataset(
        "synthetic",
        num_train=90,
        num_test=30,
        shape=[3, 4, 5],
        num_classes=3,
        num_domains=4,
        limit_train=45,
    )
    assert ds.x_train.shape == (45, 3, 4, 5) and ds.train_domains is not None
    assert ds.train_domains.shape == (45,) and set(ds.train_domains) <= {0, 1, 2, 3}
    with pytest.raises(ConfigError, match=r"has no option colour; valid options: .*num_train"):
        load_dataset("synthetic", colour=1)
    with pytest.raises(ConfigError, match="shape must be three positive integers"):
        load_dataset("synthetic", shape=(8, 8))
    with pytest.raises(ConfigError, match="num_classes must be an integer >= 2"):
        load_dataset("synthetic", num_classes=1)


def test_a_dataset_that_cannot_fit_in_memory_is_refused_before_allocating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """digits at resize=64: 1797 x 1x64x64 float32 = 29.4 MB; on a machine "with 20 MB" that is
    refused with the sizes and the fixes, and limits that make it fit are accepted."""
    from fedge.data import registry

    monkeypatch.setattr(registry, "memory_limit", lambda: 20 * 2**20)
    with pytest.raises(
        ConfigError,
        match=r"^dataset 'digits' with resize=64: 1437 train and 360 test samples of "
        r"1x64x64 take 29.4 MB as float32, more than the 21.0 MB of memory this process may use; use a smaller "
        r"dataset.resize, or fewer samples \(dataset.limit_train, dataset.limit_test\)$",
    ):
        load_dataset("digits", resize=64)
    assert load_dataset("digits", resize=64, limit_train=800).x_train.shape == (800, 1, 64, 64)
    monkeypatch.setattr(registry, "memory_limit", lambda: None)  # the OS does not say: no check
    assert load_dataset("digits", resize=64).num_train == 1437


def test_the_memory_limit_is_a_containers_where_that_is_smaller(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedge.data import registry

    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    monkeypatch.setattr(registry, "_CGROUP_LIMITS", (v2, v1))
    machine = registry.memory_limit()
    assert machine is not None and machine > 2**20
    v2.write_text("max\n")  # no limit
    v1.write_text("9223372036854771712\n")  # v1's "no limit"
    assert registry.memory_limit() == machine
    v2.write_text(f"{2**20}\n")
    assert registry.memory_limit() == 2**20


def test_limit_is_stratified_seeded_and_ordered() -> None:
    full = load_dataset("synthetic")
    a = load_dataset("synthetic", limit_train=100, limit_test=50, seed=0)
    assert a.num_train == 100 and a.num_test == 50
    assert torch.bincount(a.y_train).tolist() == [10] * 10
    assert torch.bincount(a.y_test, minlength=10).tolist() == [5] * 10
    b = load_dataset("synthetic", limit_train=100, seed=0)
    c = load_dataset("synthetic", limit_train=100, seed=1)
    assert torch.equal(a.y_train, b.y_train) and not torch.equal(a.x_train, c.x_train)
    assert load_dataset("synthetic", limit_train=10**6).num_train == full.num_train
    with pytest.raises(ConfigError, match="limit_train must be an integer >= 1"):
        load_dataset("synthetic", limit_train=0)


def test_registry_names_status_and_describe() -> None:
    assert dataset_names() == [
        "cifar10",
        "cifar100",
        "csv",
        "digits",
        "emnist",
        "fashion-mnist",
        "mnist",
        "module",
        "npz",
        "synthetic",
    ]
    with pytest.raises(
        UnknownNameError,
        match="unknown dataset 'mnits' \\(did you mean 'mnist'\\?\\); expected one of: cifar10",
    ):
        load_dataset("mnits")
    status = {s.name: s for s in available_datasets()}
    assert status["digits"].available and status["synthetic"].available
    assert not status["mnist"].available and status["mnist"].location is None
    assert "FEDGE_DATA" in status["cifar10"].how_to_get
    json.dumps([s.to_dict() for s in status.values()])
    summary = load_dataset("digits").describe()
    json.dumps(summary)
    assert summary["num_train"] == 1437 and summary["input_shape"] == [1, 8, 8]


#: Where fedge's search finds the real Fashion-MNIST (before ``isolated`` hides every directory).
FASHION = DATASETS["fashion-mnist"].locate(root=None)


@pytest.mark.needs_data("fashion-mnist")
def test_real_fashion_mnist() -> None:
    ds = load_dataset("fashion-mnist", root=FASHION)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert torch.bincount(ds.y_train).tolist() == [6000] * 10
    assert int(ds.y_test.min()) == 0 and int(ds.y_test.max()) == 9
    assert ds.classes[0] == "T-shirt/top" and ds.source == FASHION
    assert ds.mean[0] == pytest.approx(0.2860, abs=1e-4)  # the published statistics
    assert ds.std[0] == pytest.approx(0.3530, abs=1e-4)
