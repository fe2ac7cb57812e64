"""benchmarks/mia_overfit.py at a tiny size: each method's row is recorded, the section is
rendered from the records, and a rerun reads them instead of measuring again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests_helpers import benchmark_script

bench = benchmark_script("mia_overfit")
TINY = ["rounds=2", "clients=2", "per_client=4", "local_epochs=1", "k=2", "shadows=1", "test=40"]


def test_rows_are_recorded_and_the_section_renders_from_them_alone(
    tmp_path: Path, fake_fashion_mnist: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, docs = tmp_path / "records", tmp_path / "benchmarks.md"
    argv = ["--records", str(records), "--set", *TINY]
    assert bench.main([*argv, "--docs", str(docs)]) == 0
    first = docs.read_text()
    assert f"Rendered from the committed run records under `{records.as_posix()}/`" in first
    names = sorted(p.name for p in records.glob("*.json"))
    assert names == [
        "baffle-epoch-k-2-forward-only.json",
        "fedavg-backprop.json",
        "fedpt-largest-layer-frozen-backprop.json",
    ]
    rec = json.loads((records / names[0]).read_text())
    assert rec["settings"]["rounds"] == 2 and rec["machine"]["cpu"]
    # nothing is measured again: the records alone render the same section
    monkeypatch.setattr(bench, "measure", lambda *a: pytest.fail("measured a recorded row"))
    again = tmp_path / "again.md"
    assert bench.main([*argv, "--table-only", "--docs", str(again)]) == 0
    assert again.read_text() == first
    # other settings than a record's: refused by name, not silently mixed
    with pytest.raises(Exception, match="made with other settings"):
        bench.main(["--records", str(records), "--table-only", "--set", *TINY[1:]])


def test_table_only_without_records_says_what_awaits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--records", str(tmp_path), "--table-only"]) == 1
    assert "awaiting records of ['fedavg (backprop)'" in capsys.readouterr().out
