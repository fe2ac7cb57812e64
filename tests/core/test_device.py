"""The ``device`` key (fedge.core.device): which values pass, what ``auto`` and ``cuda`` resolve
to, and the message that refuses ``cuda`` where torch sees no CUDA device. torch's CUDA queries
are replaced where a test needs a machine with (or without) a GPU, so these run anywhere."""

from __future__ import annotations

import pytest
import torch

from fedge.core import device as D
from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ConfigError


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_the_default_is_cpu_and_cpu_resolves_to_the_cpu():
    assert RunConfig().device == "cpu"
    assert D.resolve_device("cpu") == torch.device("cpu")
    assert D.resolve_device(torch.device("meta")) == torch.device("meta")  # given: kept


def test_auto_resolves_to_the_cpu_without_a_gpu(no_gpu):
    assert D.resolve_device("auto") == torch.device("cpu")
    assert load_config("quickstart", overrides=["device=auto"]).device == "auto"


def test_auto_resolves_to_this_machine_here():
    """On this machine: cuda where torch sees a GPU, else the CPU (the CPU in fedge's CI)."""
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert D.resolve_device("auto").type == want


def test_auto_and_cuda_resolve_to_the_current_gpu_with_its_index(two_gpus):
    assert D.resolve_device("auto") == torch.device("cuda", 1)
    assert D.resolve_device("cuda") == torch.device("cuda", 1)
    assert D.resolve_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.parametrize("value", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_refused_naming_the_value_and_the_fix(no_gpu, value):
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", overrides=[f"device={value}"])
    msg = str(err.value)
    assert f"device='{value}'" in msg
    assert "no CUDA device is visible" in msg
    assert "device=cpu" in msg and "device=auto" in msg


def test_a_gpu_index_past_the_visible_ones_is_refused(two_gpus):
    assert D.check_device("cuda:1") == "cuda:1"
    with pytest.raises(
        ConfigError, match=r"device='cuda:2'.*2 CUDA device\(s\) \(cuda:0 to cuda:1\)"
    ):
        D.check_device("cuda:2")


@pytest.mark.parametrize("value", ["gpu", "CPU", "cuda:", "cuda:x", "mps", "", 0, None])
def test_other_values_are_refused_with_the_forms_expected(value):
    with pytest.raises(ConfigError) as err:
        D.check_device(value)
    assert repr(value) in str(err.value) and D.DEVICE_FORMS in str(err.value)


def test_the_cuda_peak_is_not_read_off_cuda():
    for device in (None, torch.device("cpu")):
        assert D.reset_device_peak(device) is None
        assert D.device_peak(device, 0) is None


def test_the_cuda_peak_is_the_allocators_peak_above_the_start(monkeypatch):
    """reset_peak_memory_stats at the start, max_memory_allocated at the end, less what was
    allocated when the step began (a fake allocator: the oracle is its arithmetic)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 1000)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 5096)
    gpu = torch.device("cuda", 0)
    start = D.reset_device_peak(gpu)
    assert start == 1000 and calls == ["sync", "reset"]
    assert D.device_peak(gpu, start) == 4096


def test_full_float32_switches_tf32_off_on_cuda_only():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = True
        D.full_float32(torch.device("cpu"))
        assert matmul.allow_tf32 and cudnn.allow_tf32
        D.full_float32(torch.device("cuda", 0))
        assert not matmul.allow_tf32 and not cudnn.allow_tf32
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved
