"""benchmarks/cross_device.py at a tiny size (2 rounds, 3 devices a round, K = 2): with --docs
the report is kept as the section's record and the section is rendered from it alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_helpers import benchmark_script, check_measured_script, check_measured_script_errors

bench = benchmark_script("cross_device")
TINY = ["rounds=2", "clients.per_round=3"]


def test_docs_keeps_the_record_the_section_is_rendered_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variants = {
        label: [*ov, *TINY, *(["method.k=2", "method.batch_size=10"] if ov else [])]
        for label, ov in bench.VARIANTS.items()
    }
    monkeypatch.setattr(bench, "VARIANTS", variants)
    argv = ["--out", str(tmp_path / "runs")]
    record = check_measured_script(bench, argv, section=bench.SECTION, tmp_path=tmp_path)
    report = record["report"]
    assert [r["label"] for r in report["results"]] == list(variants)
    assert all(len(r["accuracy_by_round"]) == 2 for r in report["results"])
    assert report["peak_rss_mb"] > 0
    assert f"Peak RSS of the whole script:\n{report['peak_rss_mb']:.0f} MB." in bench.markdown(
        report, "c"
    )


def test_table_only_without_a_record_is_one_line_with_the_fix(tmp_path: Path, capsys) -> None:
    check_measured_script_errors(bench, [], tmp_path=tmp_path, capsys=capsys)
