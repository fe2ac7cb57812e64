"""Keep ``docs/benchmarks.md`` up to date: each benchmark owns one marked section."""

from __future__ import annotations

import platform
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

__all__ = [
    "command_section",
    "machine_line",
    "markdown_table",
    "publish",
    "records_line",
    "update_section",
]

HEADER = """# fedge benchmarks

Every figure here was written by the command shown with it, on the machine named in its
section. Timings on shared machines are noisy: compare ratios measured in the same run.
Sections are rewritten in place by `fedge bench ... --docs docs/benchmarks.md`.
"""


def machine_line() -> str:
    return (
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch thread(s) of "
        f"{__import__('os').cpu_count()} CPUs, torch {torch.__version__}, Python {platform.python_version()}; "
        f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
    )


def records_line(records: str | Path, *, root: str | Path | None = None) -> str:
    """The line heading a section rendered from the run records in ``records`` (shown relative
    to ``root`` when under it) rather than measured by the command that wrote it: the
    renderer's machine and clock say nothing about those runs, so the line says where their
    machines and minutes are given instead. A re-render of unchanged records is then
    byte-identical.

    >>> "under `benchmarks/results/t2/`;" in records_line("/repo/benchmarks/results/t2", root="/repo")
    True
    >>> "`/tmp/t2/records/`" in records_line("/tmp/t2/records", root="/repo")
    True
    """
    where = Path(records)
    if root is not None and where.is_relative_to(root):
        where = where.relative_to(root)
    return (
        f"Rendered from the committed run records under `{where.as_posix()}/`; the machines the runs "
        "ran on and their minutes are listed with the tables below."
    )


def update_section(
    path: str | Path, name: str, title: str, body: str, *, machine: str | None = None
) -> None:
    """Replace (or append) the section ``name`` of the Markdown file at ``path``. It opens with
    ``machine`` when given (e.g. :func:`records_line`), else with this machine and the time."""
    p = Path(path)
    text = p.read_text() if p.exists() else HEADER
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n## {title}\n\n{machine or machine_line()}\n\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = (
        pattern.sub(lambda _: block, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + block + "\n"
    )
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def publish(
    text: str, docs: str | Path | None, name: str, title: str, *, machine: str | None = None
) -> None:
    """Print ``text`` and, when ``docs`` names a file, make it that file's section ``name``
    (headed ``title``, opened by ``machine`` as in :func:`update_section`): the last step of a
    script whose docs section is its printed table."""
    print(text)
    if docs:
        update_section(docs, name, title, text, machine=machine)


def markdown_table(
    head: Sequence[str], rows: Iterable[Sequence[str]], *, left: int | None = None
) -> list[str]:
    """The lines of a Markdown table: ``head``, the rule and one line per row of cells. Every
    column is left-aligned, or with ``left`` only the first ``left`` (the labels) and the rest
    (the figures) right-aligned.

    >>> markdown_table(["K", "bytes"], [["100", "412"]])
    ['| K | bytes |', '|---|---|', '| 100 | 412 |']
    >>> markdown_table(["K", "bytes"], [], left=1)
    ['| K | bytes |', '|---|---:|']
    """
    n = len(head) if left is None else left
    rule = "|" + "---|" * n + "---:|" * (len(head) - n)
    return ["| " + " | ".join(head) + " |", rule, *("| " + " | ".join(r) + " |" for r in rows)]


def command_section(intro: Sequence[str], command: str, body: Sequence[str]) -> str:
    """A section body laid out as every ``fedge bench`` section is: the ``intro`` lines, the
    command that wrote it, then ``body`` (its table and what follows), blank lines between."""
    return "\n".join([*intro, "", f"Command: `{command}`", "", *body])
