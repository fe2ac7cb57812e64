"""Measuring a client step for real: FLOPs from torch's flop-counter formulas, wall time, and peak
memory by tensor accounting and by peak RSS, or on a GPU by the CUDA allocator's peak statistics.
Design notes: docs/decisions.md#core.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

from fedge.core.device import device_peak, reset_device_peak

__all__ = [
    "FlopCounter",
    "Meter",
    "effective_flops_ratio",
    "StepStats",
    "TensorAccountant",
    "rss_peak_reset",
    "rss_peak_since_reset",
]


@dataclass
class StepStats:
    """What one party's step cost, plus (for a client step) what the side parties it called
    cost on their own accounts (:attr:`parties`) and the bytes on each link (:attr:`links`)."""

    flops: int = 0
    wall_s: float = 0.0
    tensor_peak_bytes: int | None = None
    rss_peak_bytes: int | None = None
    side_bytes_down: int = 0
    side_bytes_up: int = 0
    links: dict[str, int] = field(default_factory=dict)  # "client->edge" -> bytes
    parties: dict[str, StepStats] = field(default_factory=dict)  # party kind -> its cost
    #: on a CUDA device: the allocator's peak during the step above what it held when the step
    #: began, plus the resident model (:meth:`Meter.measure`); None on the CPU
    device_peak_bytes: int | None = None

    def copy(self) -> StepStats:
        return StepStats(
            self.flops,
            self.wall_s,
            self.tensor_peak_bytes,
            self.rss_peak_bytes,
            device_peak_bytes=self.device_peak_bytes,
        )

    def since(self, before: StepStats) -> StepStats:
        """The cost added since ``before`` (peaks are kept as they are: they are maxima)."""
        return StepStats(
            self.flops - before.flops,
            self.wall_s - before.wall_s,
            self.tensor_peak_bytes,
            self.rss_peak_bytes,
            device_peak_bytes=self.device_peak_bytes,
        )

    def add_link(self, link: str, nbytes: int) -> None:
        self.links[link] = self.links.get(link, 0) + nbytes
        if link.startswith("client->"):
            self.side_bytes_up += nbytes
        elif link.endswith("->client"):
            self.side_bytes_down += nbytes

    def merge(self, other: StepStats) -> None:
        """Add ``other``'s cost: FLOPs, time and bytes add up, peaks take the maximum."""
        self.flops += other.flops
        self.wall_s += other.wall_s
        self.side_bytes_down += other.side_bytes_down
        self.side_bytes_up += other.side_bytes_up
        if other.tensor_peak_bytes is not None:
            self.tensor_peak_bytes = max(self.tensor_peak_bytes or 0, other.tensor_peak_bytes)
        if other.rss_peak_bytes is not None:
            self.rss_peak_bytes = max(self.rss_peak_bytes or 0, other.rss_peak_bytes)
        if other.device_peak_bytes is not None:
            self.device_peak_bytes = max(self.device_peak_bytes or 0, other.device_peak_bytes)
        for k, v in other.links.items():
            self.links[k] = self.links.get(k, 0) + v
        for party, cost in other.parties.items():
            self.add_party(party, cost)

    def add_party(self, name: str, cost: StepStats) -> None:
        if name in self.parties:
            self.parties[name].merge(cost)
        else:
            self.parties[name] = cost


def _shape(x: Any) -> Any:
    return x.shape if isinstance(x, torch.Tensor) else x


class FlopCounter(TorchDispatchMode):
    """Count FLOPs of the ops run inside the mode with torch's own per-op formulas.

    Thread-safe: code that fans work out to threads (the zeroth-order fast mode) re-enters
    the caller's modes in each thread, and every thread adds to this one count.
    """

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self._lock = threading.Lock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            n = int(
                formula(
                    *tree_map(_shape, args),
                    **tree_map(_shape, kwargs),
                    out_val=tree_map(_shape, out),
                )
            )
            with self._lock:
                self.flops += n
        return out


class TensorAccountant(TorchDispatchMode):
    """Track live bytes of storages created by ops inside the mode; keep the peak.

    Storages are keyed by data pointer and reference-counted over the tensors that share
    them, so views do not count twice and a storage is released when its last tensor dies.
    Storages of ``resident`` tensors (the model's weights, the input batch) are not step
    memory: ops that return views of them (``W.t()`` inside ``F.linear``) or update them in
    place (an optimizer step) are ignored, so resident bytes are counted once, apart.

    Forward-mode AD (``torch.func.jvp``) makes zero tangents as storage-less zero tensors: they
    hold no memory and are not counted.

    Thread-safe (one re-entrant lock: a storage can be released by the garbage collector
    while its own thread is tracking another): threads that re-enter the caller's modes
    add to the same live total, so the peak is the peak over all threads together.
    """

    def __init__(self, resident: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._live: dict[int, list[int]] = {}  # data_ptr -> [nbytes, tensors alive]
        self._resident = {t.untyped_storage().data_ptr() for t in resident}
        self.current = 0
        self.peak = 0
        self._lock = threading.RLock()

    def _release(self, key: int) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                self.current -= entry[0]
                del self._live[key]

    def add_resident(self, tensors: Iterable[torch.Tensor]) -> None:
        """Declare more resident storages (e.g. a model loaded during the step)."""
        self._resident.update(t.untyped_storage().data_ptr() for t in tensors)

    def _track(self, t: torch.Tensor) -> None:
        if t._is_zerotensor():  # forward AD's zero tangent: no storage, no memory
            return
        st = t.untyped_storage()
        key, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or key in self._resident:
            return
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                self._live[key] = [nbytes, 1]
                self.current += nbytes
                self.peak = max(self.peak, self.current)
            else:
                entry[1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t)
        return out


_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_peak_reset() -> int | None:
    """Reset the RSS high-water mark; return the current RSS in bytes (None if unsupported)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return None
    return _status_kb("VmRSS")


def rss_peak_since_reset(start_rss: int | None) -> int | None:
    """Growth of the RSS high-water mark over ``start_rss`` since :func:`rss_peak_reset`."""
    if start_rss is None:
        return None
    hwm = _status_kb("VmHWM")
    return None if hwm is None else max(0, hwm - start_rss)


def module_bytes(module: torch.nn.Module | None) -> int:
    """Bytes held by a module's parameters and buffers."""
    if module is None:
        return 0
    return sum(
        t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers())
    )


class Meter:
    """Measures one party's step. The engine wraps ``program.run`` in :meth:`measure`;
    links add their side-party traffic to :attr:`stats` and run the side party under
    :meth:`paused`, so its work is not charged to the caller.

    ``device``: where the step's tensors live. On a CUDA device, with ``memory``, the step's
    peak is also read from the CUDA allocator (:attr:`StepStats.device_peak_bytes`:
    ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats`` at the
    step's start, less what was allocated then, plus the resident model), which the tensor
    accounting cannot see whole (cuDNN and cuBLAS workspaces)."""

    def __init__(
        self, *, flops: bool = True, memory: bool = False, device: torch.device | None = None
    ) -> None:
        self.count_flops = flops
        self.memory = memory
        self.device = device
        self.stats = StepStats()
        self._resident: torch.nn.Module | None = None
        self._accountant: TensorAccountant | None = None
        self._paused_s = 0.0

    @property
    def resident(self) -> torch.nn.Module | None:
        """The model the step keeps resident: counted once (its parameters and buffers), and
        views or in-place updates of its storage are not counted as step memory."""
        return self._resident

    @resident.setter
    def resident(self, model: torch.nn.Module | None) -> None:
        self._resident = model
        if model is not None and self._accountant is not None:
            self._accountant.add_resident([*model.parameters(), *model.buffers()])

    @contextmanager
    def paused(self) -> Any:
        """Stop counting for the duration (FLOPs, tensor memory and wall time): the work
        inside belongs to another party, which measures it under its own meter. (The RSS
        high-water mark is process-wide and cannot be paused: with ``--measure-memory`` a
        co-located side party's RSS growth shows in the client's ``client_rss_growth_bytes``.)"""
        t0 = time.perf_counter()
        try:
            with _disable_current_modes():
                yield
        finally:
            self._paused_s += time.perf_counter() - t0

    @contextmanager
    def measure(self) -> Any:
        flop_mode = FlopCounter() if self.count_flops else None
        accountant = TensorAccountant() if self.memory else None
        self._accountant = accountant
        if accountant is not None and self._resident is not None:
            accountant.add_resident([*self._resident.parameters(), *self._resident.buffers()])
        start_rss = rss_peak_reset() if self.memory else None
        start_device = reset_device_peak(self.device) if self.memory else None
        t0 = time.perf_counter()
        try:
            if flop_mode is not None:
                flop_mode.__enter__()
            if accountant is not None:
                accountant.__enter__()
            yield self.stats
        finally:
            if accountant is not None:
                accountant.__exit__(None, None, None)
            self._accountant = None
            if flop_mode is not None:
                flop_mode.__exit__(None, None, None)
            self.stats.wall_s += time.perf_counter() - t0 - self._paused_s
            self._paused_s = 0.0
            if flop_mode is not None:
                self.stats.flops += flop_mode.flops
            if accountant is not None:
                self.stats.tensor_peak_bytes = accountant.peak + module_bytes(self.resident)
                self.stats.rss_peak_bytes = rss_peak_since_reset(start_rss)
                peak = device_peak(self.device, start_device)
                if peak is not None:
                    self.stats.device_peak_bytes = peak + module_bytes(self.resident)


def effective_flops_ratio(
    model: torch.nn.Module, masks: dict[str, torch.Tensor], sample: torch.Tensor
) -> float:
    """Fraction of a forward's FLOPs that multiply non-zero weights, for a pruned model.

    Dense kernels execute every multiply-add, so the executed FLOPs of a pruned model are
    those of the dense one. The *effective* count scales each weight's layer by that
    weight's density: per-module FLOPs come from torch's FlopCounterMode (module
    attribution) on one forward of ``sample``, and a mask named ``"a.b.weight"`` scales the
    FLOPs attributed to module ``"a.b"``. Multiply executed FLOPs by this ratio to get the
    effective non-zero FLOPs (exact for forward passes, which is all zeroth-order clients run).
    """
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(sample)
    counts = counter.get_flop_counts()
    total = sum(counts.get("Global", {}).values())
    if total == 0:
        return 1.0
    prefix = type(model).__name__ + "."
    skipped = 0.0
    for name, mask in masks.items():
        module = name.rsplit(".", 1)[0]
        flops = sum(counts.get(prefix + module, {}).values())
        skipped += flops * (1.0 - float(mask.float().mean()))
    return (total - skipped) / total
