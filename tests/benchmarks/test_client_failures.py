"""benchmarks/client_failures.py at a tiny size (one seed, 2 rounds, 200 samples): with --docs its
table's figures are kept as the section's record and the section is rendered from it alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests_helpers import benchmark_script, check_measured_script, check_measured_script_errors

bench = benchmark_script("client_failures")
TINY = ["rounds=2", "eval_every=2", "dataset.limit_train=200", "dataset.limit_test=50"]


def test_docs_keeps_the_record_the_section_is_rendered_from(
    tmp_path: Path, fake_fashion_mnist: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "COMMON", [*bench.COMMON, *TINY])
    argv = ["--seeds", "1", "--out", str(tmp_path / "runs")]
    record = check_measured_script(
        bench, argv, section=bench.SECTION, tmp_path=tmp_path, measuring="run_seeded_variants"
    )
    rows = record["report"]["rows"]
    assert list(rows) == list(bench.ROWS) and all(r["seeds"] == 1 for r in rows.values())
    assert rows[bench.CONTROL]["failed"] == 0  # no dropout in the control row
    assert record["command"].startswith("python benchmarks/client_failures.py --seeds 1 --out ")


def test_table_only_without_a_record_is_one_line_with_the_fix(tmp_path: Path, capsys) -> None:
    check_measured_script_errors(bench, [], tmp_path=tmp_path, capsys=capsys)
