"""benchmarks/zo_precision.py: with --docs its results are kept as the section's record and the
section is rendered from it; --table-only renders it again from the record alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_helpers import benchmark_script, check_measured_script, check_measured_script_errors

bench = benchmark_script("zo_precision")


def test_docs_keeps_the_record_the_section_is_rendered_from(
    tmp_path: Path, fake_fashion_mnist: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "SEEDS", range(2))  # two seeds: a mean and a std
    record = check_measured_script(bench, [], section=bench.SECTION, tmp_path=tmp_path)
    assert record["command"] == bench.COMMAND
    report = record["report"]
    assert set(report) == {"float32 loss", "float64 loss"}
    # the oracle: float64 loss differences are closer to the all-float64 ones than float32's
    assert all(len(r["err"]) == 2 == len(r["cos"]) for r in report.values())
    assert max(report["float64 loss"]["err"]) < min(report["float32 loss"]["err"])


def test_table_only_without_a_record_is_one_line_with_the_fix(tmp_path: Path, capsys) -> None:
    check_measured_script_errors(bench, [], tmp_path=tmp_path, capsys=capsys)
