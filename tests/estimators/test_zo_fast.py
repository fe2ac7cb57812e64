"""Fast (batched) mode gives the lean mode's loss differences for the same seed."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.estimators import loss_differences, register_channelwise, zeroth_order
from fedge.estimators.batched import BatchedEvaluator
from fedge.estimators.perturbation import select


class StridedMaxPool(nn.Module):
    """2x2 max pooling written as a max over strided slices (as fedge's LeNet does)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = torch.maximum(h[..., 0::2, 0::2], h[..., 1::2, 0::2])
        return torch.maximum(a, torch.maximum(h[..., 0::2, 1::2], h[..., 1::2, 1::2]))


register_channelwise(StridedMaxPool)


def lenet_like() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.GroupNorm(2, 4),
        nn.Hardswish(),
        StridedMaxPool(),
        nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.GroupNorm(3, 6, affine=False)),
        nn.Hardswish(),
        StridedMaxPool(),
        nn.Flatten(),
        nn.Linear(6 * 2 * 2, 8),
        nn.Hardswish(),
        nn.Linear(8, 3),
    )


def mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(100, 8),
        nn.LayerNorm(8),
        nn.SELU(),
        nn.Dropout(0.3),
        nn.Linear(8, 6),
        nn.BatchNorm1d(6),
        nn.ReLU(),
        nn.Linear(6, 3, bias=False),
    )


def bn_convnet() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2),
        nn.MaxPool2d(2),
        nn.Tanh(),
        nn.AvgPool2d(1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(1, 1, 3, padding=1), nn.Linear(100, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head((x + torch.tanh(self.conv(x))).flatten(1))


def _build(make, train: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = make().double()
    model.train(train)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 1, 10, 10, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (5,), generator=g)


def _both(model, batch, monkeypatch=None, **kw):
    lean = loss_differences(model, F.cross_entropy, batch, mode="lean", **kw)
    if monkeypatch is not None:  # the batched path must run, not fall back to the lean loop

        def no_lean(*args, **kwargs):
            raise AssertionError("fast mode fell back to the lean loop")

        monkeypatch.setattr(zeroth_order, "LeanEvaluator", no_lean)
    fast = loss_differences(model, F.cross_entropy, batch, mode="fast", **kw)
    if monkeypatch is not None:
        monkeypatch.undo()
    return lean, fast


def _assert_same(lean: torch.Tensor, fast: torch.Tensor) -> None:
    assert lean.dtype == fast.dtype == torch.float32 and lean.shape == fast.shape
    torch.testing.assert_close(fast, lean, rtol=1e-5, atol=1e-5 * float(lean.abs().max()))


MODELS = {
    "lenet_like": (lenet_like, False),
    "mlp": (mlp, False),
    "bn_train": (bn_convnet, True),
    "bn_eval": (bn_convnet, False),
}


@pytest.mark.parametrize("draws", ["torch", "portable"])
@pytest.mark.parametrize("scheme", ["central", "forward"])
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_fast_equals_lean(
    arch: str, scheme: str, draws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, train = MODELS[arch]
    model = _build(make, train)
    x, y = _batch()
    assert BatchedEvaluator.build(model, select(model), 0, x, F.cross_entropy, y) is not None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kw = dict(k=7, sigma=1e-3, seed=3, scheme=scheme, chunk=3, draws=draws)
    lean, fast = _both(model, (x, y), monkeypatch, **kw)
    _assert_same(lean, fast)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("draws", ["torch", "portable"])
@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_fast_equals_lean_with_masks_and_a_frozen_prefix(
    scheme: str, draws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _build(lenet_like)
    g = torch.Generator().manual_seed(2)
    masks = {
        "4.0.weight": torch.rand(6, 4, 3, 3, generator=g) > 0.5,
        "8.weight": torch.rand(8, 24, generator=g) > 0.3,
    }
    for params in (None, ["4.0.weight", "4.0.bias", "8.weight", "10.bias"]):
        lean, fast = _both(
            model,
            _batch(),
            monkeypatch,
            k=5,
            sigma=1e-3,
            seed=8,
            scheme=scheme,
            chunk=2,
            params=params,
            masks=masks,
            draws=draws,
        )
        _assert_same(lean, fast)


def test_chunking_does_not_change_the_result() -> None:
    model = _build(lenet_like)
    kw = dict(k=6, sigma=1e-3, seed=1, scheme="central", mode="fast")
    ref = loss_differences(model, F.cross_entropy, _batch(), chunk=6, **kw)
    for chunk in (1, 4, 50):
        _assert_same(ref, loss_differences(model, F.cross_entropy, _batch(), chunk=chunk, **kw))


def upsampling() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 1, 3), nn.Upsample(scale_factor=2), nn.Flatten(), nn.Linear(256, 3)
    )


@pytest.mark.parametrize("make", [Residual, upsampling])
def test_unbatchable_models_fall_back_to_the_lean_loop(make) -> None:
    model = _build(make)
    x, y = _batch()
    assert BatchedEvaluator.build(model, select(model), 0, x, F.cross_entropy, y) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lean, fast = _both(model, (x, y), k=4, sigma=1e-3, seed=0, scheme="central")
    assert torch.equal(lean, fast)


def test_float32_fast_close_to_lean() -> None:
    torch.manual_seed(0)
    model = lenet_like()
    x, y = _batch()
    lean, fast = _both(model, (x.float(), y), k=6, sigma=1e-2, seed=0, scheme="forward")
    torch.testing.assert_close(fast, lean, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("mode", ["lean", "fast"])
def test_low_precision_forward_runs_under_autocast(mode: str) -> None:
    torch.manual_seed(0)
    model = lenet_like()
    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = loss_differences(
            model,
            F.cross_entropy,
            (x.float(), y),
            k=4,
            sigma=0.05,
            seed=0,
            scheme="central",
            mode=mode,
            dtype=torch.bfloat16,
        )
    assert d.dtype == torch.float32 and d.shape == (4,) and bool(torch.isfinite(d).all())


def test_register_channelwise_takes_module_types_only() -> None:
    with pytest.raises(TypeError, match="nn.Module subclasses"):
        register_channelwise(StridedMaxPool())  # type: ignore[arg-type]


@pytest.fixture
def no_batching(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forward counts as too much work to batch: fast mode splits the lean loop over
    threads (the tests' models are far too small to reach the real threshold)."""
    monkeypatch.setattr(zeroth_order, "_MAX_BATCHED_WORK", 0.0)


def _big_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch for the threaded path (with :func:`no_batching`)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(12, 1, 10, 10, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (x.shape[0],), generator=g)


@pytest.mark.usefixtures("no_batching")
@pytest.mark.parametrize("draws", ["torch", "portable"])
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("scheme", ["central", "forward"])
@pytest.mark.parametrize("make", [lenet_like, Residual, lambda: bn_convnet().train()])
def test_threaded_spans_equal_lean(make, scheme: str, workers: int, draws: str) -> None:
    model = _build(make, train=make().training)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    threads = torch.get_num_threads()
    kw = dict(k=7, sigma=1e-3, seed=5, scheme=scheme, draws=draws)
    lean = loss_differences(model, F.cross_entropy, _big_batch(), mode="lean", **kw)
    fast = loss_differences(
        model, F.cross_entropy, _big_batch(), mode="fast", workers=workers, **kw
    )
    _assert_same(lean, fast)
    assert torch.get_num_threads() == threads
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.usefixtures("no_batching")
def test_threaded_spans_honour_masks_and_a_parameter_subset() -> None:
    model = _build(lenet_like)
    g = torch.Generator().manual_seed(2)
    masks = {"4.0.weight": torch.rand(6, 4, 3, 3, generator=g) > 0.5}
    kw = dict(
        k=5, sigma=1e-3, seed=8, scheme="central", masks=masks, params=["4.0.weight", "10.bias"]
    )
    lean = loss_differences(model, F.cross_entropy, _big_batch(), mode="lean", **kw)
    fast = loss_differences(model, F.cross_entropy, _big_batch(), mode="fast", workers=2, **kw)
    _assert_same(lean, fast)


@pytest.mark.usefixtures("no_batching")
def test_threaded_spans_run_on_worker_threads_and_propagate_errors() -> None:
    import threading

    model = _build(Residual)
    seen: set[str] = set()

    def recording_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.add(threading.current_thread().name)
        return F.cross_entropy(logits, y)

    loss_differences(
        model,
        recording_loss,
        _big_batch(),
        k=4,
        sigma=1e-3,
        seed=0,
        scheme="central",
        mode="fast",
        workers=2,
    )
    assert len(seen) == 2 and all(n.startswith("fedge-zo") for n in seen)

    def failing_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"):
        loss_differences(
            model,
            failing_loss,
            _big_batch(),
            k=4,
            sigma=1e-3,
            seed=0,
            scheme="central",
            mode="fast",
            workers=2,
        )
    assert torch.get_num_threads() == threads


def test_workers_must_be_positive() -> None:
    from fedge.core.errors import ConfigError

    with pytest.raises(ConfigError, match="workers"):
        loss_differences(
            _build(Residual),
            F.cross_entropy,
            _big_batch(),
            k=2,
            sigma=1e-3,
            seed=0,
            scheme="central",
            mode="fast",
            workers=0,
        )


def test_work_not_batch_size_decides_batching(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flatten + Linear(100, 10): 2·100·10 = 2000 FLOPs a sample (torch's flop counter)
    model = nn.Sequential(nn.Flatten(), nn.Linear(100, 10))
    monkeypatch.setattr(zeroth_order, "_MAX_BATCHED_WORK", 5 * 2000.0)
    monkeypatch.setattr(zeroth_order, "_FLOPS_PER_SAMPLE", {})
    x = torch.randn(6, 1, 10, 10)
    assert zeroth_order.batched_pays(model, x[:5]) and not zeroth_order.batched_pays(model, x)
    assert list(zeroth_order._FLOPS_PER_SAMPLE.values()) == [2000.0]  # probed once, for both calls


def test_real_models_batch_where_it_pays() -> None:
    """LeNet-5 (0.56 MFLOP a sample) batches its NTK Table 3 batches of 32; BAFFLE's LeNet
    (10.7 MFLOP) batches up to 8 samples, its Table 1 batches of 20 run the lean loop."""
    from fedge.models.registry import build_model

    lenet5 = build_model("lenet5", input_shape=(1, 28, 28), num_classes=10, activation="hardswish")
    lenet = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, activation="hardswish")
    x = torch.randn(64, 1, 28, 28)
    assert zeroth_order.batched_pays(lenet5, x[:32]) and zeroth_order.batched_pays(lenet5, x)
    assert zeroth_order.batched_pays(lenet, x[:8]) and not zeroth_order.batched_pays(lenet, x[:9])


def test_the_work_probe_is_not_metered_and_leaves_rng_and_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedge.core.meter import FlopCounter

    monkeypatch.setattr(zeroth_order, "_FLOPS_PER_SAMPLE", {})
    model = _build(bn_convnet, train=True)
    model.add_module("drop", nn.Dropout(0.5))  # a train-mode forward draws from the global RNG
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = _batch()[0]
    torch.manual_seed(3)
    with FlopCounter() as counter:
        assert zeroth_order.batched_pays(model, x)
    assert counter.flops == 0  # the probe is not client work
    assert torch.equal(torch.rand(3), (torch.manual_seed(3), torch.rand(3))[1])  # nor a draw
    assert all(
        torch.equal(before[k], v) for k, v in model.state_dict().items()
    )  # nor a BatchNorm update
