"""Measured sections: the record a measurement keeps, and the section rendered from it alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedge.bench import measured
from fedge.bench.measured import (
    Section,
    document,
    machine_facts,
    measure,
    opening_line,
    read_record,
    record_path,
    render,
    start,
    write_record,
)
from fedge.core.errors import ConfigError


def _markdown(report: dict, command: str) -> str:
    return f"Command: `{command}`\n\n| x |\n|---|\n| {report['x']:.3f} |"


SECTION = Section("t", "T, measured", _markdown)
COMMAND = "fedge bench t --docs docs/benchmarks.md"


def _block(docs: Path, name: str) -> str:
    m = re.search(rf"<!-- bench:{name} -->\n(.*?)\n<!-- /bench:{name} -->", docs.read_text(), re.S)
    assert m, f"{docs} has no section {name}"
    return m.group(1)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """A docs file in a checkout laid out as the repo's (tmp_path/docs/benchmarks.md)."""
    return tmp_path / "docs" / "benchmarks.md"


def test_a_record_round_trips(tmp_path: Path) -> None:
    record = {
        "section": "t",
        "title": "T",
        "command": COMMAND,
        "machine": machine_facts(),
        "minutes": 0.5,
        "report": {"x": 0.25, "rows": [{"label": "ε", "values": [1, 2.5, None]}]},
    }
    path = tmp_path / "r" / "t.json"
    write_record(path, record)
    assert read_record(path, "t") == record
    assert [p.name for p in path.parent.iterdir()] == ["t.json"]  # no temporary file left


def test_machine_facts_name_the_machine_torch_python_load_and_date() -> None:
    import platform

    import torch

    facts = machine_facts()
    assert facts["machine"] == platform.machine() and facts["python"] == platform.python_version()
    assert facts["torch"] == torch.__version__ and facts["torch_threads"] == torch.get_num_threads()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", facts["date"])
    assert facts["load_average"] is None or facts["load_average"] >= 0


def test_the_section_is_the_records_markdown_under_its_machine_line(docs: Path) -> None:
    report = measure(SECTION, lambda: {"x": 0.5}, command=COMMAND, docs=docs)
    path = docs.parents[1] / "benchmarks/results/measured/t.json"
    assert path == record_path("t", docs)
    record = json.loads(path.read_text())
    assert record["section"] == "t" and record["title"] == "T, measured"
    assert record["command"] == COMMAND and record["report"] == report == {"x": 0.5}
    assert record["minutes"] >= 0 and set(record["machine"]) == set(machine_facts())
    line = opening_line(record, "benchmarks/results/measured/t.json")
    assert line.endswith(" Record: `benchmarks/results/measured/t.json`.")
    assert f"torch {record['machine']['torch']}" in line and record["machine"]["date"] in line
    assert _block(docs, "t") == f"## T, measured\n\n{line}\n\n{_markdown(report, COMMAND)}"
    first = docs.read_text()
    assert render(SECTION, docs) == path
    assert docs.read_text() == first  # an unchanged record re-renders byte-identical


def test_the_section_is_rendered_from_the_record_not_the_report_in_memory(docs: Path) -> None:
    """A report with tuples renders as its JSON record does, so measuring and re-rendering agree."""
    report = measure(SECTION, lambda: {"x": 0.5, "pair": (1, 2)}, command=COMMAND, docs=docs)
    first = docs.read_text()
    record = json.loads(record_path("t", docs).read_text())
    assert record["report"]["pair"] == [1, 2] and report["pair"] == (1, 2)
    record["report"]["x"] = 0.75  # an edited record: the section follows it
    write_record(record_path("t", docs), record)
    render(SECTION, docs)
    assert "| 0.750 |" in docs.read_text() and "| 0.500 |" in first


def test_records_elsewhere_are_named_relative_to_the_checkout_or_in_full(tmp_path: Path) -> None:
    docs = tmp_path / "repo" / "docs" / "benchmarks.md"
    inside, outside = tmp_path / "repo" / "mine", tmp_path / "elsewhere"
    measure(SECTION, lambda: {"x": 1.0}, command=COMMAND, docs=docs, records=inside)
    assert (inside / "t.json").is_file() and "Record: `mine/t.json`." in docs.read_text()
    measure(SECTION, lambda: {"x": 1.0}, command=COMMAND, docs=docs, records=outside)
    assert (outside / "t.json").is_file()
    assert not (tmp_path / "repo" / "benchmarks").exists()
    assert f"Record: `{(outside / 't.json').resolve().as_posix()}`." in docs.read_text()


def test_no_docs_writes_nothing(docs: Path) -> None:
    started = start()
    assert document(SECTION, {"x": 1.0}, command=COMMAND, docs=None, started=started) is None
    assert measure(SECTION, lambda: {"x": 1.0}, command=COMMAND, docs=None) == {"x": 1.0}
    assert not docs.parents[1].joinpath("benchmarks").exists() and not docs.exists()


def test_an_interrupted_measurement_writes_neither_record_nor_docs(docs: Path) -> None:
    def interrupted() -> dict:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure(SECTION, interrupted, command=COMMAND, docs=docs)
    assert not docs.exists() and not record_path("t", docs).exists()
    measure(SECTION, lambda: {"x": 0.5}, command=COMMAND, docs=docs)
    before = (docs.read_text(), record_path("t", docs).read_text())

    def failing() -> dict:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        measure(SECTION, failing, command=COMMAND, docs=docs)
    assert (docs.read_text(), record_path("t", docs).read_text()) == before


def test_a_report_that_is_not_json_leaves_the_old_record_and_docs(docs: Path) -> None:
    measure(SECTION, lambda: {"x": 0.5}, command=COMMAND, docs=docs)
    before = (docs.read_text(), record_path("t", docs).read_text())
    with pytest.raises(TypeError):
        measure(SECTION, lambda: {"x": 0.5, "path": Path("/x")}, command=COMMAND, docs=docs)
    assert (docs.read_text(), record_path("t", docs).read_text()) == before
    assert [p.name for p in record_path("t", docs).parent.iterdir()] == ["t.json"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no record of the measured section 't'; run the command without --table-only"),
        ("{not json", "not JSON (Expecting property name"),
        ('{"section": "t"}', "not a measured-section record (lacks title, command, machine"),
        ("[1, 2]", "not a measured-section record"),
        ("OTHER", "is the record of section 'u', not 't'; point --records at the folder"),
    ],
)
def test_a_bad_record_is_one_line_naming_the_path_and_the_fix(
    docs: Path, content: str | None, needle: str
) -> None:
    path = record_path("t", docs)
    if content == "OTHER":
        measure(Section("u", "U", _markdown), lambda: {"x": 1.0}, command="c", docs=docs)
        record_path("u", docs).rename(path)
    elif content is not None:
        path.parent.mkdir(parents=True)
        path.write_text(content)
    before = docs.read_text() if docs.exists() else None
    with pytest.raises(ConfigError) as e:
        render(SECTION, docs)
    message = str(e.value)
    assert needle in message and str(path) in message and "\n" not in message
    assert (docs.read_text() if docs.exists() else None) == before  # docs untouched


def test_the_records_folder_is_the_checkouts_measured_folder() -> None:
    assert measured.MEASURED_DIR == "benchmarks/results/measured"
    assert record_path("zo-step", Path("/r/docs/benchmarks.md")) == Path(
        "/r/benchmarks/results/measured/zo-step.json"
    )
