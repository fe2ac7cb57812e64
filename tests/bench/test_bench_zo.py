"""`fedge bench zo`: JSON shape, the floor and bound arithmetic, the layer breakdown, busy
warnings (no timing targets: timings are benchmarks, not tests)."""

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.bench import zo
from fedge.bench.zo import forward_breakdown, run_zo, zo_markdown
from fedge.estimators import (
    ZerothOrderSpec,
    estimate_gradient,
    loss_differences,
    zeroth_order_gradient,
)

ZO_KEYS = {
    "model",
    "scheme",
    "k",
    "batch",
    "zo_step_s",
    "bp_step_s",
    "reference_loop_step_s",
    "zo_lean_step_s",
    "zo_over_bp_per_k",
    "speedup_vs_reference",
    "forward_gflops",
    "fast_path",
    "forward_s",
    "forward_achieved_gflops",
    "zo_achieved_gflops",
    "peak_1thread_gflops",
    "forward_efficiency",
    "zo_floor_s",
    "zo_floor_ratio",
    "zo_lean_floor_ratio",
    "meets_floor_ratio",
    "zo_bound_s",
    "zo_over_bound",
    "forward_channels_last_s",
    "forward_breakdown",
    "forward_loop_s",
    "zo_loop_ratio",
    "zo_lean_loop_ratio",
    "zo_epoch_step_s",
    "epoch_over_split",
}


@pytest.fixture(scope="module")
def report() -> dict:
    threads = torch.get_num_threads()
    with warnings.catch_warnings():  # busy-machine warnings: tested below
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return run_zo(
                ["lenet", "lenet5"],
                k=2,
                batch=2,
                repeats=1,
                schemes=("central", "forward"),
                retain_memory=False,
                probe_k=None,
            )
        finally:
            torch.set_num_threads(threads)


def test_run_zo_json_shape_and_markdown(report: dict) -> None:
    json.dumps(report)
    rows = report["results"]
    assert [(r["model"], r["scheme"]) for r in rows] == [
        ("lenet", "central"),
        ("lenet", "forward"),
        ("lenet5", "central"),
        ("lenet5", "forward"),
    ]
    for r in rows:
        assert ZO_KEYS <= r.keys()
        assert r["fast_path"] == "batched"
        assert (
            min(r["zo_step_s"], r["zo_lean_step_s"], r["bp_step_s"], r["reference_loop_step_s"]) > 0
        )
        assert r["forwards_per_step"] == (4 if r["scheme"] == "central" else 3)
    assert report["threads"] == 1 and report["malloc_retained"] is False
    assert report["draws"] == "torch"
    assert report["cores"] >= 1 and report["peak_1thread"]["start"]["peak"] > 0
    text = zo_markdown(report, "fedge bench zo")
    assert "Command: `fedge bench zo`" in text and "epoch-level s (vs fast)" in text
    assert text.count("\n| lenet |") == 2 + 1  # two scheme rows + one breakdown row
    assert "| lenet5 | central | 2 | 2 | batched |" in text


def test_zo_steps_draw_the_named_directions() -> None:
    # Oracle: the estimators called with a spec naming the same draws.
    model, data = zo.bench_model("lenet", 2)
    params = dict(model.named_parameters())
    got = {}
    for draws in ("torch", "portable"):
        spec = ZerothOrderSpec(k=3, sigma=zo.SIGMA, scheme="central", mode="fast", draws=draws)
        diffs = loss_differences(model, F.cross_entropy, data, spec, seed=7)
        want = estimate_gradient(params, diffs, spec, seed=7)
        step = zo._zo_step(model, data, k=3, scheme="central", mode="fast", seed=7, draws=draws)
        assert all(torch.equal(step[n], want[n]) for n in want)
        epoch = zo._epoch_step(model, data, k=3, scheme="central", seed=7, draws=draws)
        want = zeroth_order_gradient(model, F.cross_entropy, data, spec, seed=7)
        assert all(torch.equal(epoch[n], want[n]) for n in want)
        got[draws] = step
    assert not torch.equal(
        got["torch"]["features.conv1.conv.weight"],
        got["portable"]["features.conv1.conv.weight"],
    )


def test_floor_and_bound_arithmetic(report: dict) -> None:
    for r in report["results"]:
        forwards = r["forwards_per_step"]
        assert math.isclose(r["zo_floor_s"], forwards * r["forward_s"])
        assert math.isclose(r["zo_floor_ratio"], r["zo_step_s"] / r["zo_floor_s"])
        assert r["meets_floor_ratio"] == (r["zo_floor_ratio"] <= zo.FLOOR_RATIO_TARGET)
        assert math.isclose(r["zo_loop_ratio"], r["zo_step_s"] / r["forward_loop_s"])
        assert math.isclose(r["epoch_over_split"], r["zo_epoch_step_s"] / r["zo_step_s"])
        # bound = forwards × FLOPs / (1-thread peak × threads), here 1 thread
        bound = forwards * r["forward_gflops"] / r["peak_1thread_gflops"]
        assert math.isclose(r["zo_bound_s"], bound)
        assert math.isclose(
            r["forward_efficiency"], r["forward_achieved_gflops"] / r["peak_1thread_gflops"]
        )
    lenet = report["results"][0]
    # BAFFLE's LeNet on 2 samples of 1×28×28: conv1 1→16 (5×5, pad 2) on 28², conv2 16→64 on 14²,
    # FC 64→10: 2·(16·25·784 + 64·400·196 + 640)·2 FLOPs (the hand-computed oracle).
    assert lenet["forward_gflops"] * 1e9 == 2 * 2 * (16 * 25 * 784 + 64 * 16 * 25 * 196 + 640)


def test_forward_breakdown_names_each_leaf_kind() -> None:
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Sequential(nn.Conv2d(4, 4, 3), nn.ReLU()), nn.Flatten()
    )
    got = forward_breakdown(model, torch.randn(2, 1, 8, 8), repeats=1)
    assert set(got) == {"Conv2d", "ReLU", "Flatten"}
    assert all(v > 0 for v in got.values())
    assert list(got.values()) == sorted(got.values(), reverse=True)


def test_run_zo_warns_when_the_machine_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = {"load_1min": 5.0, "cores": 2, "matmul_512_s": 1e-3, "spread": 1.0, "repeats": 5}
    monkeypatch.setattr(zo, "load_probe", lambda: busy)
    monkeypatch.setattr(
        zo, "one_thread_peak", lambda: {"matmul": 100.0, "conv": 90.0, "peak": 100.0}
    )
    threads = torch.get_num_threads()
    try:
        with pytest.warns(RuntimeWarning, match="load average 5.00"):
            rep = run_zo(
                ["lenet5"],
                k=1,
                batch=2,
                repeats=1,
                schemes=("forward",),
                retain_memory=False,
                probe_k=None,
            )
    finally:
        torch.set_num_threads(threads)
    assert len(rep["warnings"]) == 2  # at the start and at the end
    assert "Machine busy" in zo_markdown(rep, "x")


def test_run_zo_rejects_unknown_model() -> None:
    with pytest.raises(ValueError, match="resnet99"):
        run_zo(["resnet99"], k=1, batch=1, repeats=1, retain_memory=False, probe_k=None)
