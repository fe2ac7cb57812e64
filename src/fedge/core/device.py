"""Where a simulation's tensors live: the ``device`` config key (``cpu``, ``cuda``, ``cuda:N`` or
``auto``), checked by :func:`check_device` and turned into a :class:`torch.device` by
:func:`resolve_device`, and :func:`device_peak` / :func:`reset_device_peak`, the CUDA allocator's
peak-memory statistics a client step on a GPU is measured by. Design notes: docs/guide/gpu.md.

Example:
    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("auto").type in ("cpu", "cuda")
    True
"""

from __future__ import annotations

import re

import torch

from fedge.core.errors import ConfigError

__all__ = [
    "DEVICE_FORMS",
    "check_device",
    "device_peak",
    "full_float32",
    "reset_device_peak",
    "resolve_device",
]

#: the values the ``device`` key takes, as its errors name them
DEVICE_FORMS = "cpu, cuda, cuda:N (N a GPU index) or auto (cuda where torch sees one, else cpu)"

_CUDA = re.compile(r"cuda(?::(\d+))?")


def _cuda_count() -> int:
    """GPUs torch sees (0 without a CUDA build or driver)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_device(value: object) -> str:
    """``value`` if it names a device this process can run on, else a :class:`ConfigError` that
    names it, what is expected and the fix. ``auto`` always passes (it resolves where the run
    starts); ``cuda`` and ``cuda:N`` need torch to see a CUDA device (the N-th)."""
    if not isinstance(value, str) or not (value in ("cpu", "auto") or _CUDA.fullmatch(value)):
        raise ConfigError(
            f"device={value!r} is not a device fedge runs on; expected {DEVICE_FORMS}"
        )
    match = _CUDA.fullmatch(value)
    if match is None:
        return value
    count = _cuda_count()
    if count == 0:
        raise ConfigError(
            f"device={value!r}, but no CUDA device is visible to torch here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); run on a "
            "machine with an NVIDIA GPU and a CUDA build of torch, or set device=cpu (or "
            "device=auto, which takes the GPU where there is one)"
        )
    index = match.group(1)
    if index is not None and int(index) >= count:
        raise ConfigError(
            f"device={value!r}, but torch sees {count} CUDA device(s) (cuda:0 to "
            f"cuda:{count - 1}); pick one of those, or set device=cuda"
        )
    return value


def resolve_device(value: str | torch.device = "cpu") -> torch.device:
    """The :class:`torch.device` a run's ``device`` value names: ``auto`` is ``cuda`` where
    ``torch.cuda.is_available()``, else ``cpu``; ``cuda`` is the current CUDA device with its
    index (``cuda:0``), as tensors moved there report it; a :class:`torch.device` is returned
    as it is."""
    if isinstance(value, torch.device):
        return value
    checked = check_device(value)
    if checked == "auto":
        checked = "cuda" if torch.cuda.is_available() else "cpu"
    if checked == "cuda":  # with its index, as a tensor moved there reports it
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(checked)


def full_float32(device: torch.device) -> None:
    """On a CUDA ``device``: switch TensorFloat-32 off for matrix products and cuDNN
    convolutions, so float32 is float32 there as on the CPU. TF32 keeps 10 bits of mantissa
    (relative error ~1e-3), and a zeroth-order loss difference ΔL = L(W + σz) − L(W) with
    σ = 1e-4 is far below that: on TF32 the estimate is noise (torch's default is TF32 on for
    cuDNN convolutions). A process-wide setting of torch's; nothing is changed off CUDA."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def reset_device_peak(device: torch.device | None) -> int | None:
    """On a CUDA ``device``: reset the allocator's peak statistics and return the bytes allocated
    now (what a step's peak is measured above); elsewhere None."""
    if device is None or device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def device_peak(device: torch.device | None, start: int | None) -> int | None:
    """The peak bytes the CUDA allocator held on ``device`` since :func:`reset_device_peak`
    returned ``start``, above ``start`` (the tensors that lived before the step: the server's
    model, the data set); None off CUDA."""
    if device is None or device.type != "cuda" or start is None:
        return None
    torch.cuda.synchronize(device)
    return max(0, int(torch.cuda.max_memory_allocated(device)) - start)
