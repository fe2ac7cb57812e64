"""``fedge bench``'s measured sections: ``--docs`` keeps the section's record and renders the section
from it; ``--table-only`` re-renders it from the record alone, and a bad record exits 2 in one line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedge.bench.measured import Section, opening_line
from fedge.cli.main import app

runner = CliRunner()


def _section(name: str) -> Section:
    from fedge.bench import engine, memory, population, presets, zo

    return {
        "engine": engine.ENGINE_SECTION,
        "population": population.POPULATION_SECTION,
        "zo-step": zo.ZO_SECTION,
        "client-memory": memory.MEMORY_SECTION,
        "presets": presets.PRESETS_SECTION,
    }[name]


# the small settings of the commands' other tests (tests/bench/test_bench_zo_memory.py, ...)
SMALL = {
    "engine": ["engine", "--clients", "2", "--rounds", "1"],
    "population": ["engine", "--populations", "10", "--rounds", "1"],
    "zo-step": [
        *("zo", "--models", "lenet", "--k", "1", "--batch", "2", "--repeats", "1"),
        *("--schemes", "forward", "--no-retain-memory", "--probe-k", "0"),
    ],
    "client-memory": [
        *("memory", "--models", "lenet", "--batches", "2", "--lean-ks", "2,1"),
        *("--fast-k", "1", "--rss-repeats", "0"),
    ],
    "presets": [
        *("presets", "quickstart", "--set", "rounds=1", "--set", "clients.per_round=2"),
        *("--set", "threads=1"),
    ],
}


def _block(docs: Path, name: str) -> str:
    m = re.search(rf"<!-- bench:{name} -->\n(.*?)\n<!-- /bench:{name} -->", docs.read_text(), re.S)
    assert m, f"{docs} has no section {name}"
    return m.group(1)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_docs_keeps_the_record_and_table_only_renders_the_section_from_it(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "docs" / "benchmarks.md"
    report_json = tmp_path / "report.json"
    args = ["bench", *SMALL[name], "--json", str(report_json), "--docs", str(docs)]
    if name == "presets":
        args += ["--out", str(tmp_path / "runs")]
    monkeypatch.setattr(sys, "argv", ["fedge", *args])  # the command line the docs show
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    path = tmp_path / "benchmarks/results/measured" / f"{name}.json"
    record = json.loads(path.read_text())
    section = _section(name)
    assert (record["section"], record["title"]) == (name, section.title)
    assert record["command"] == "fedge " + " ".join(args)
    assert record["report"] == json.loads(report_json.read_text())
    line = opening_line(record, f"benchmarks/results/measured/{name}.json")
    body = section.markdown(record["report"], record["command"])
    assert _block(docs, name) == f"## {section.title}\n\n{line}\n\n{body.rstrip()}"

    first = docs.read_text()
    docs.write_text(first.replace(body.rstrip(), "stale"))
    res = runner.invoke(app, [*args, "--table-only"])
    assert res.exit_code == 0, res.output
    assert docs.read_text() == first  # byte-identical from the unchanged record
    assert json.loads(path.read_text()) == record  # re-rendering measures and writes nothing


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["engine", "--table-only"], "--table-only re-renders a docs section"),
        (["zo", "--table-only", "--docs", "{docs}"], "no record of the measured section 'zo-step'"),
        (
            ["engine", "--populations", "10", "--table-only", "--docs", "{docs}"],
            "is the record of section 'engine', not 'population'",
        ),
        (["memory", "--table-only", "--docs", "{docs}"], "not JSON"),
    ],
)
def test_table_only_with_a_bad_record_exits_2_in_one_line(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    docs = tmp_path / "docs" / "benchmarks.md"
    measured = tmp_path / "benchmarks/results/measured"
    measured.mkdir(parents=True)
    engine = {"section": "engine", "title": "E", "command": "c", "machine": {}, "minutes": 1}
    (measured / "population.json").write_text(json.dumps({**engine, "report": {}}))
    (measured / "client-memory.json").write_text("{")
    res = runner.invoke(app, ["bench", *(a.format(docs=docs) for a in args)])
    assert res.exit_code == 2, res.output
    assert needle in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not docs.exists()
