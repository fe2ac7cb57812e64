"""benchmarks/device_check.py's CPU-side parts: the needs_cuda tests' output when pytest times out
(bytes from ``TimeoutExpired``, decoded), and the server model it compares across devices."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
import torch

from fedge.core.config import load_config
from fedge.experiment.build import build_run
from tests_helpers import benchmark_script

bench = benchmark_script("device_check")


def test_timed_out_tests_report_their_output_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TimeoutExpired`` keeps the captured output as bytes even with ``text=True``: the report
    shows it decoded, line by line, not as ``b'...'``."""

    def timing_out(cmd, **kwargs):
        raise subprocess.TimeoutExpired(
            cmd, kwargs["timeout"], output=b"collected 3 items\n..", stderr=None
        )

    monkeypatch.setattr(bench.subprocess, "run", timing_out)
    tests = bench.run_cuda_tests()
    assert tests["rc"] == 124 and not tests["ok"]
    assert tests["output"] == f"collected 3 items\n..\ntimed out after {bench.TEST_TIMEOUT_S} s"
    assert tests["summary"] == f"timed out after {bench.TEST_TIMEOUT_S} s"
    assert "b'" not in tests["output"]


def test_text_of_captured_output() -> None:
    assert bench._text(None) == ""
    assert bench._text("a\nb") == "a\nb"
    assert bench._text("é\n".encode()) == "é\n"
    assert bench._text(b"\xff") == "\ufffd"  # undecodable bytes replaced, not an error


def test_server_model_is_the_bare_strategys_and_a_strategy_without_one_names_the_fix() -> None:
    cfg = {**bench.BASE, "rounds": 1, "method": bench.CASES["fedavg"], "device": "cpu"}
    cfg["dataset"] = {**cfg["dataset"], "num_train": 200, "num_test": 50}
    built = build_run(load_config(cfg))
    model = bench._server_model(built)
    assert isinstance(model, torch.nn.Module) and model is built.method.bare.model
    bare = dataclasses.replace(built.method, bare=None)
    with pytest.raises(TypeError, match=r"'fedavg': its strategy \(NoneType\) has no \.model"):
        bench._server_model(dataclasses.replace(built, method=bare))
