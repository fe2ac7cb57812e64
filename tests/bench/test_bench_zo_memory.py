"""`fedge bench zo` and `fedge bench memory`: JSON shape, oracles, sanity (no timing targets)."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from fedge.bench.memory import _rss_child, memory_markdown, run_memory, step_peak_bytes
from fedge.bench.zo import reference_gradient, run_zo, zo_markdown
from fedge.cli.main import app

runner = CliRunner()

ZO_KEYS = {
    "model", "scheme", "k", "batch", "zo_step_s", "bp_step_s", "reference_loop_step_s",
    "matmul_peak_gflops", "zo_lean_step_s", "zo_over_bp_per_k", "speedup_vs_reference",
    "forward_gflops", "fast_path",
}  # fmt: skip
MEMORY_KEYS = {
    "model", "batch", "inference_peak_bytes", "bp_peak_bytes", "zo_lean_peak_bytes",
    "zo_fast_peak_bytes", "bp_over_lean", "lean_over_inference", "zo_lean_peak_bytes_by_k",
}  # fmt: skip


def _quadratic_model() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model, (torch.randn(16, 3, generator=g), torch.randn(16, 2, generator=g))


def test_reference_gradient_matches_autograd_and_restores_weights():
    # Prepare: a quadratic loss, where the central difference is exactly 2δᵀ∇L, so the estimate
    # is (1/K) Σ (zᵀ∇L) z: unbiased, relative error ~ sqrt(n / K) = sqrt(8 / 4000) ≈ 0.045.
    model, batch = _quadratic_model()
    before = [p.detach().clone() for p in model.parameters()]
    F.mse_loss(model(batch[0]), batch[1]).backward()
    truth = torch.cat([p.grad.flatten() for p in model.parameters()])
    # Execute
    est = reference_gradient(model, F.mse_loss, batch, k=4000, sigma=1e-3, scheme="central",
                             generator=torch.Generator().manual_seed(1))  # fmt: skip
    # Assert
    got = torch.cat([est[n].flatten() for n, _ in model.named_parameters()])
    assert F.cosine_similarity(got, truth, dim=0) > 0.99
    assert (got.norm() / truth.norm() - 1).abs() < 0.1
    for p, b in zip(model.parameters(), before):  # restored up to the in-place drift, 3 ops a k
        torch.testing.assert_close(p.detach(), b, atol=1e-4, rtol=0)


def test_step_accountant_counts_new_storages_not_weight_views():
    # F.linear runs addmm on W.t(), a view of the resident weight: only the (5, 3) output is new.
    model, x = nn.Linear(4, 3), torch.randn(5, 4)
    got = step_peak_bytes("inference", model, (x, torch.zeros(5, dtype=torch.int64)))
    assert got["step_bytes"] == 5 * 3 * 4
    assert got["resident_bytes"] == (4 * 3 + 3) * 4 + x.nbytes + 5 * 8
    assert got["peak_bytes"] == got["resident_bytes"] + got["step_bytes"]


def test_run_zo_json_shape_and_markdown():
    report = run_zo(["lenet"], k=2, batch=2, repeats=1, schemes=("central", "forward"),
                    retain_memory=False, probe_k=None)  # fmt: skip
    json.dumps(report)
    rows = report["results"]
    assert [r["scheme"] for r in rows] == ["central", "forward"]
    for r in rows:
        assert ZO_KEYS <= r.keys()
        assert r["fast_path"] == "batched"
        assert min(r["zo_step_s"], r["zo_lean_step_s"], r["bp_step_s"], r["reference_loop_step_s"]) > 0
        assert r["forwards_per_step"] == (4 if r["scheme"] == "central" else 3)
        assert r["forward_gflops"] > 0 and r["matmul_peak_gflops"] > 0
    assert report["threads"] == 1 and report["malloc_retained"] is False
    assert "Command: `fedge bench zo`" in zo_markdown(report, "fedge bench zo")


def test_run_zo_rejects_unknown_model():
    with pytest.raises(ValueError, match="resnet99"):
        run_zo(["resnet99"], k=1, batch=1, repeats=1, retain_memory=False, probe_k=None)


@pytest.mark.parametrize("name", ["lenet", "wrn-10-2"])
def test_run_memory_sanity(name):
    report = run_memory([name], batches=[4], lean_ks=(3, 1), fast_k=3, rss_repeats=0)
    json.dumps(report)
    (r,) = report["results"]
    assert MEMORY_KEYS <= r.keys()
    assert r["fast_path"].startswith("batched" if name == "lenet" else "lean-fallback")
    assert r["resident_bytes"] < r["inference_peak_bytes"] <= r["zo_lean_peak_bytes"]
    assert r["zo_lean_peak_bytes"] <= r["bp_peak_bytes"]
    assert r["zo_lean_peak_bytes"] <= r["zo_fast_peak_bytes"]  # equal where fast runs lean
    # The sparse step holds its masks (1 byte per prunable weight) and nothing else extra.
    assert r["zo_sparse_mask_bytes"] > 0
    assert r["zo_lean_peak_bytes"] + r["zo_sparse_mask_bytes"] <= r["zo_sparse_peak_bytes"]
    assert r["zo_sparse_peak_bytes"] <= r["zo_lean_peak_bytes"] + 2 * r["zo_sparse_mask_bytes"]
    # Lean memory does not depend on K beyond the K float64 losses it returns.
    assert r["zo_lean_k_spread_bytes"] <= 64 * (3 - 1)
    params_bytes = 4 * r["params"]
    assert r["bp_peak_bytes"] >= r["inference_peak_bytes"] + params_bytes  # + gradients
    assert "rss_bp_peak_bytes" not in r
    assert "Command: `x`" in memory_markdown(report, "x")


def test_rss_child_reports_growth():
    got = _rss_child("lenet", 4, "zo_lean", 2, 1)
    if got["rss_growth_bytes"] is None:
        pytest.skip("the kernel does not allow resetting the RSS high-water mark")
    assert got["rss_growth_bytes"] >= 0 and got["rss_before_bytes"] > 0


def test_cli_bench_commands_write_json_and_docs(tmp_path):
    docs = tmp_path / "benchmarks.md"
    zo_json, mem_json = tmp_path / "zo.json", tmp_path / "mem.json"
    res = runner.invoke(app, ["bench", "zo", "--models", "lenet", "--k", "1", "--batch", "2",
                              "--repeats", "1", "--schemes", "forward", "--no-retain-memory",
                              "--probe-k", "0", "--json", str(zo_json), "--docs", str(docs)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(zo_json.read_text())["results"][0]["scheme"] == "forward"
    res = runner.invoke(app, ["bench", "memory", "--models", "lenet", "--batches", "2",
                              "--lean-ks", "2,1", "--fast-k", "1", "--rss-repeats", "0",
                              "--json", str(mem_json), "--docs", str(docs)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(mem_json.read_text())["results"][0]["batch"] == 2
    text = docs.read_text()
    assert "<!-- bench:zo-step -->" in text and "<!-- bench:client-memory -->" in text


@pytest.mark.parametrize(
    "args,needle",
    [
        (["zo", "--models", "resnet99", "--no-retain-memory"], "resnet99"),
        (["zo", "--schemes", "backward", "--no-retain-memory"], "backward"),
        (["memory", "--batches", "64,x"], "--batches"),
        (["memory", "--models", "vgg"], "vgg"),
    ],
)
def test_cli_bench_bad_input_exits_2(args, needle):
    res = runner.invoke(app, ["bench", *args])
    assert res.exit_code == 2
    assert needle in res.output
