"""benchmarks/flower_deploy_baffle.py: with --docs the engine's and the deployment's per-round lines
are kept as the section's record and the section is rendered from it alone. The loopback
deployment itself (SuperLink and SuperNodes as processes, seconds of polling a round) is
tests/experiment's; here its lines are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_helpers import benchmark_script, check_measured_script, check_measured_script_errors

bench = benchmark_script("flower_deploy_baffle")


def _lines(rounds: int, *, flower: bool, up: int = 1600) -> list[dict]:
    extra = {"flower_bytes_down": 90_000, "flower_bytes_up": 2_000} if flower else {}
    return [
        {"round": r, "test_accuracy": 0.1 * r, "bytes_down": 80_000, "bytes_up": up, "wall_s": 2.0}
        | extra
        for r in range(1, rounds + 1)
    ]


def _measure(rounds: int, *, up: int = 1600) -> dict:
    return {
        "nodes": bench.NODES,
        "rounds": rounds,
        "engine": _lines(rounds, flower=False),
        "deployed": _lines(rounds, flower=True, up=up),
    }


def test_docs_keeps_the_record_the_section_is_rendered_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "measure", _measure)
    record = check_measured_script(
        bench, ["--rounds", "3"], section=bench.SECTION, tmp_path=tmp_path
    )
    assert record["report"] == _measure(3)
    text = bench.markdown(record["report"], record["command"])
    assert (
        "| Flower deployment | 3 | 0.3000 | 80,000 / 1,600 | 90,000 / 2,000 | 1.1250, 1.250 |"
        in text
    )
    assert "byte counts equal the engine's in every round" in text


def test_a_deployment_that_differs_is_recorded_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "measure", lambda rounds: _measure(rounds, up=1700))
    docs = tmp_path / "docs" / "benchmarks.md"
    assert bench.main(["--docs", str(docs)]) == 1
    assert (tmp_path / "benchmarks/results/measured/flower-deploy-baffle.json").is_file()
    assert "byte counts DIFFER from the engine's" in docs.read_text()


def test_table_only_without_a_record_is_one_line_with_the_fix(tmp_path: Path, capsys) -> None:
    check_measured_script_errors(bench, [], tmp_path=tmp_path, capsys=capsys)
