"""bench.machine and core.allocator: peaks against their FLOP formulas, the load probe, and the
busy warnings on hand-made probes (no timing targets)."""

import pytest
import torch

from fedge.bench import machine
from fedge.core.allocator import retain_freed_memory


def test_peaks_are_positive_and_restore_the_thread_count() -> None:
    threads = torch.get_num_threads()
    got = machine.one_thread_peak(repeats=1)
    assert torch.get_num_threads() == threads
    assert got["peak"] == max(got["matmul"], got["conv"]) > 0
    assert machine.matmul_peak_gflops(64, repeats=1) > 0


def test_conv_peak_counts_the_conv_flops_torch_counts() -> None:
    # The hard-coded FLOP count of the probe's conv equals torch's own formula (the oracle).
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(64, 64, 16, 16), torch.randn(64, 64, 3, 3)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.conv2d(x, w, padding=1)
    assert counter.get_total_flops() == 2 * 64 * 64 * 16 * 16 * 64 * 9


def test_load_probe_fields() -> None:
    got = machine.load_probe(repeats=3)
    assert got["cores"] == machine.usable_cores() >= 1
    assert got["spread"] >= 1.0 and got["matmul_512_s"] > 0 and got["repeats"] == 3


def _probe(load: float, spread: float = 1.0) -> dict:
    return {"load_1min": load, "cores": 2, "matmul_512_s": 1e-3, "spread": spread, "repeats": 5}


@pytest.mark.parametrize(
    ("before", "after", "threads", "peaks", "needles"),
    [
        (_probe(0.2), _probe(0.9), 1, (200, 190), []),  # quiet: one idle core for one thread
        (_probe(0.9), _probe(0.2), 2, (200, 200), ["load average 0.90"]),  # 2 threads need 2
        (_probe(3.5), _probe(0.1), 1, (200, 200), ["at the start: 1-minute load average 3.50"]),
        (_probe(0.1, 1.5), _probe(0.1), 1, (200, 200), ["varied 1.50x"]),
        (_probe(0.1), _probe(0.1), 1, (200, 100), ["moved 2.00x"]),
    ],
)
def test_busy_warnings(before, after, threads, peaks, needles) -> None:
    got = machine.busy_warnings(
        before, after, threads=threads, peak_before=peaks[0], peak_after=peaks[1]
    )
    assert len(got) == len(needles)
    for msg, needle in zip(got, needles):
        assert needle in msg


def test_busy_warnings_without_load_average() -> None:
    none = {**_probe(0.0), "load_1min": None}
    assert machine.busy_warnings(none, none, threads=1, peak_before=1.0, peak_after=1.0) == []


def test_retain_freed_memory_is_accepted_by_glibc() -> None:
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert retain_freed_memory() is True
