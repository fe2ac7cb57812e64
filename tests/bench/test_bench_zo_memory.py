"""`fedge bench memory` (and both bench CLI commands): JSON shape, oracles, sanity (no timing
targets). `fedge bench zo` itself: test_bench_zo.py."""

import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from fedge.bench.memory import _rss_child, memory_markdown, run_memory, step_peak_bytes
from fedge.cli.main import app

runner = CliRunner()

MEMORY_KEYS = {
    "model",
    "batch",
    "inference_peak_bytes",
    "bp_peak_bytes",
    "zo_lean_peak_bytes",
    "zo_fast_peak_bytes",
    "bp_over_lean",
    "lean_over_inference",
    "zo_lean_peak_bytes_by_k",
}


def test_step_accountant_counts_new_storages_not_weight_views():
    # F.linear runs addmm on W.t(), a view of the resident weight: only the (5, 3) output is new.
    model, x = nn.Linear(4, 3), torch.randn(5, 4)
    got = step_peak_bytes("inference", model, (x, torch.zeros(5, dtype=torch.int64)))
    assert got["step_bytes"] == 5 * 3 * 4
    assert got["resident_bytes"] == (4 * 3 + 3) * 4 + x.nbytes + 5 * 8
    assert got["peak_bytes"] == got["resident_bytes"] + got["step_bytes"]


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
    docs = tmp_path / "docs" / "benchmarks.md"
    zo_json, mem_json = tmp_path / "zo.json", tmp_path / "mem.json"
    res = runner.invoke(
        app,
        [
            "bench",
            "zo",
            "--models",
            "lenet",
            "--k",
            "1",
            "--batch",
            "2",
            "--repeats",
            "1",
            "--schemes",
            "forward",
            "--no-retain-memory",
            "--probe-k",
            "0",
            "--json",
            str(zo_json),
            "--docs",
            str(docs),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(zo_json.read_text())["results"][0]["scheme"] == "forward"
    res = runner.invoke(
        app,
        [
            "bench",
            "memory",
            "--models",
            "lenet",
            "--batches",
            "2",
            "--lean-ks",
            "2,1",
            "--fast-k",
            "1",
            "--rss-repeats",
            "0",
            "--json",
            str(mem_json),
            "--docs",
            str(docs),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(mem_json.read_text())["results"][0]["batch"] == 2
    text = docs.read_text()
    assert "<!-- bench:zo-step -->" in text and "<!-- bench:client-memory -->" in text
    for name, figures in (("zo-step", zo_json), ("client-memory", mem_json)):  # their records
        record = json.loads((tmp_path / f"benchmarks/results/measured/{name}.json").read_text())
        assert record["report"] == json.loads(figures.read_text())


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
