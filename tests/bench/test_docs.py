"""docs/benchmarks.md sections: written in place, and a script's printed table published as one."""

from __future__ import annotations

from fedge.bench.docs import publish, records_line, update_section


def test_update_section_replaces_its_own_section_only(tmp_path):
    docs = tmp_path / "benchmarks.md"
    update_section(docs, "a", "A", "first")
    update_section(docs, "b", "B", "other")
    update_section(docs, "a", "A", "second")
    text = docs.read_text()
    assert text.startswith("# fedge benchmarks") and text.count("<!-- bench:a -->") == 1
    assert "second" in text and "first" not in text and "<!-- bench:b -->\n## B\n" in text
    assert text.index("<!-- bench:a -->") < text.index(
        "<!-- bench:b -->"
    )  # replaced where it stood


def test_publish_prints_and_writes_the_section_only_when_asked(tmp_path, capsys):
    docs = tmp_path / "benchmarks.md"
    publish("| a |\n|---|", None, "t", "T")
    assert capsys.readouterr().out == "| a |\n|---|\n" and not docs.exists()
    publish("| a |\n|---|", str(docs), "t", "T")
    assert capsys.readouterr().out == "| a |\n|---|\n"
    block = docs.read_text().split("<!-- bench:t -->\n", 1)[1]
    assert block.startswith("## T\n\nMachine: ") and block.endswith(
        "\n\n| a |\n|---|\n<!-- /bench:t -->\n"
    )


def test_a_section_rendered_from_records_names_them_not_the_renderer(tmp_path):
    docs = tmp_path / "benchmarks.md"
    line = records_line(tmp_path / "results" / "x", root=tmp_path)
    assert "`results/x/`" in line and "Machine:" not in line and "measured" not in line
    publish("| a |\n|---|", str(docs), "t", "T", machine=line)
    first = docs.read_text()
    assert f"## T\n\n{line}\n\n| a |" in first
    publish("| a |\n|---|", str(docs), "t", "T", machine=line)
    assert docs.read_text() == first  # unchanged records render byte-identical: no clock in it


def test_markdown_table_and_the_section_layout():
    from fedge.bench.docs import command_section, markdown_table

    lines = markdown_table(["K", "up B"], [["100", "412"], ["200", "812"]])
    assert lines == ["| K | up B |", "|---|---|", "| 100 | 412 |", "| 200 | 812 |"]
    assert markdown_table(["a"], []) == ["| a |", "|---|"]
    assert markdown_table(["row", "name", "acc %", "MiB"], [["a", "b", "1.00", "2.0"]], left=2)[
        1:
    ] == [
        "|---|---|---:|---:|",
        "| a | b | 1.00 | 2.0 |",
    ]
    text = command_section(["Intro one,", "intro two."], "fedge bench comm", lines)
    assert (
        text
        == "Intro one,\nintro two.\n\nCommand: `fedge bench comm`\n\n| K | up B |\n|---|---|\n| 100 | 412 |\n| 200 | 812 |"
    )
