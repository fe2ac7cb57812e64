"""Preset figures: bytes per client per round are the mean over all rounds of the logged totals."""

from __future__ import annotations

import json

from fedge.bench.presets import presets_markdown, run_presets


def test_bytes_are_averaged_over_every_round(tmp_path):
    report = run_presets(
        ["quickstart"],
        overrides=["rounds=3", "clients.per_round=2", "threads=1"],
        out_root=tmp_path,
    )
    (r,) = report["results"]
    lines = [
        json.loads(x) for x in (tmp_path / "quickstart" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(lines) == 3 == r["rounds"]
    for key in ("bytes_down", "bytes_up"):  # oracle: plain sums over the logged rounds
        assert r[f"{key}_per_client_round"] == sum(x[key] / x["clients"] for x in lines) / 3
    table = presets_markdown(report, "cmd")
    ratio = r["bytes_down_per_client_round"] / r["model_bytes"]
    assert (
        f"| {r['bytes_down_per_client_round']:.0f} ({ratio:.4f}) |" in table
        and "mean of rounds" in table
    )
    assert 0.99 < ratio < 1.01  # each client downloads one model a round
