"""Measured sections of ``docs/benchmarks.md`` and the records they are rendered from.

A measured section (timings, memory, one-off runs) is written by the command that measures it.
With ``--docs FILE`` the command first writes the section's record,
``benchmarks/results/measured/<section>.json`` in the checkout ``FILE`` belongs to (or under
``--records DIR``): the section's name and title, the command line the docs show, the machine
the measurement ran on (with its load average at the start and the UTC date), the wall minutes
it took and the raw report. The section is then rendered from that record alone, so it can be
rendered again without measuring (``--table-only``), byte-identical while the record is
unchanged, and checked against the committed record (tests/test_docs_figures.py).
Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from fedge.bench.docs import update_section
from fedge.core.errors import ConfigError

__all__ = [
    "MEASURED_DIR",
    "Section",
    "Start",
    "document",
    "machine_facts",
    "measure",
    "opening_line",
    "read_record",
    "record_path",
    "render",
    "start",
    "write_record",
]

#: Where a checkout keeps the records of its measured sections (relative to its root).
MEASURED_DIR = "benchmarks/results/measured"
#: The keys every record holds.
KEYS = ("section", "title", "command", "machine", "minutes", "report")

R = TypeVar("R")


@dataclass(frozen=True)
class Section:
    """A measured section: its ``name`` (the ``<!-- bench:NAME -->`` marker), its ``title`` and
    ``markdown(report, command)``, the section's body from a report and the command shown."""

    name: str
    title: str
    markdown: Callable[[Any, str], str]


@dataclass(frozen=True)
class Start:
    """The moment a measurement started: the machine's facts then, and the wall clock."""

    machine: dict[str, Any]
    perf: float


def machine_facts() -> dict[str, Any]:
    """This machine as a record keeps it: architecture, CPU model (where ``/proc/cpuinfo`` names
    it, else None), CPUs, torch threads, torch and Python versions, the one-minute load average
    (None where the OS has none) and the UTC date to the minute."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return {
        "machine": platform.machine(),
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": load,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def opening_line(record: dict[str, Any], where: str) -> str:
    """The line opening a section rendered from ``record`` (kept at ``where``): the machine the
    measurement ran on, its load then, when and for how long, and where the record is. The torch
    threads are not in it: a benchmark sets its own (those at the start, torch's default, are in
    the record only), so each section's text or command states them.

    >>> facts = {"machine": "x86_64", "cpu_model": "Xeon", "cpus": 2, "torch_threads": 1,
    ...          "torch": "2.5.1", "python": "3.12.3", "load_average": 0.5,
    ...          "date": "2026-12-05 15:00 UTC"}
    >>> opening_line({"machine": facts, "minutes": 1.234}, "benchmarks/results/measured/x.json")
    'Machine: x86_64 (Xeon), 2 CPUs, torch 2.5.1, Python 3.12.3; load average 0.5 at the start; measured 2026-12-05 15:00 UTC in 1.23 wall minutes. Record: `benchmarks/results/measured/x.json`.'
    """
    m = record["machine"]
    cpu = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
    load = m.get("load_average")
    return (
        f"Machine: {m['machine']}{cpu}, {m['cpus']} CPUs, "
        f"torch {m['torch']}, Python {m['python']}; "
        + ("" if load is None else f"load average {load:g} at the start; ")
        + f"measured {m['date']} in {record['minutes']:.3g} wall minutes. Record: `{where}`."
    )


def record_path(name: str, docs: str | Path, records: str | Path | None = None) -> Path:
    """The record of section ``name``: ``<records>/<name>.json``, by default in the measured
    folder of the checkout ``docs`` belongs to (``<docs dir>/../benchmarks/results/measured``).

    >>> record_path("engine", "/repo/docs/benchmarks.md").as_posix()
    '/repo/benchmarks/results/measured/engine.json'
    >>> record_path("engine", "/repo/docs/benchmarks.md", "/tmp/r").as_posix()
    '/tmp/r/engine.json'
    """
    folder = Path(records) if records is not None else Path(docs).parent.parent / MEASURED_DIR
    return folder / f"{name}.json"


def _shown(path: Path, docs: str | Path) -> str:
    """``path`` as a section names it: relative to the docs' checkout when under it."""
    root = Path(docs).resolve().parent.parent
    full = path.resolve()
    return (full.relative_to(root) if full.is_relative_to(root) else full).as_posix()


def write_record(path: str | Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` atomically: a reader sees the old file or the whole new one
    (a temporary file beside it, renamed over it). A report that is not JSON raises first."""
    p = Path(path)
    text = json.dumps(record, indent=1, ensure_ascii=False) + "\n"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def read_record(path: str | Path, name: str) -> dict[str, Any]:
    """The record of section ``name`` at ``path``; a ConfigError (one line, naming the path and
    the fix) when it is missing, not JSON, not a record, or another section's."""
    p = Path(path)
    remeasure = "run the command without --table-only to measure it"
    if not p.is_file():
        raise ConfigError(
            f"{p}: no record of the measured section {name!r}; {remeasure}, or point --records "
            "at the folder that holds it"
        )
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"{p}: not JSON ({e}); restore it (git checkout -- {p}) or {remeasure}"
        ) from None
    missing = [k for k in KEYS if k not in record] if isinstance(record, dict) else list(KEYS)
    if missing:
        raise ConfigError(
            f"{p}: not a measured-section record (lacks {', '.join(missing)}); restore it "
            f"(git checkout -- {p}) or {remeasure}"
        )
    if record["section"] != name:
        raise ConfigError(
            f"{p} is the record of section {record['section']!r}, not {name!r}; point --records "
            f"at the folder holding {name}.json, or {remeasure}"
        )
    return dict(record)


def render(section: Section, docs: str | Path, records: str | Path | None = None) -> Path:
    """Rewrite ``section`` of the Markdown file ``docs`` from its record (:func:`record_path`):
    the record's title, :func:`opening_line`, then ``section.markdown(report, command)``.
    Returns the record's path; a bad record raises (:func:`read_record`) before docs is touched."""
    path = record_path(section.name, docs, records)
    record = read_record(path, section.name)
    body = section.markdown(record["report"], record["command"])
    line = opening_line(record, _shown(path, docs))
    update_section(docs, section.name, record["title"], body, machine=line)
    return path


def start() -> Start:
    """Note this machine and the clock as a measurement starts (for :func:`document`)."""
    return Start(machine_facts(), time.perf_counter())


def document(
    section: Section,
    report: Any,
    *,
    command: str,
    docs: str | Path | None,
    started: Start,
    records: str | Path | None = None,
) -> Path | None:
    """After a measurement that began at ``started`` finished with ``report``: with ``docs``,
    write the section's record (:func:`write_record`, ``command`` being the command line the
    docs show) and render the section from it (:func:`render`); returns the record's path, or
    None without ``docs`` (nothing written)."""
    if docs is None:
        return None
    record = {
        "section": section.name,
        "title": section.title,
        "command": command,
        "machine": started.machine,
        "minutes": round((time.perf_counter() - started.perf) / 60, 4),
        "report": report,
    }
    path = record_path(section.name, docs, records)
    write_record(path, record)
    render(section, docs, records)
    return path


def measure(
    section: Section,
    run: Callable[[], R],
    *,
    command: str,
    docs: str | Path | None,
    records: str | Path | None = None,
) -> R:
    """``run()`` (the measurement) timed from :func:`start`, then :func:`document` of its
    report; returns the report. An exception inside ``run`` writes neither record nor docs."""
    started = start()
    report = run()
    document(section, report, command=command, docs=docs, started=started, records=records)
    return report
