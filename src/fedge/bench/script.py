"""Command lines shared by the benchmark scripts: reproduction scripts (shards, records, smoke
protocol) and measurement scripts (``--json``, ``--from-json``). Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedge.bench.measured import Section, Start, document, render
from fedge.bench.progress import MAX_RUN_BYTES, RunStatus
from fedge.core.errors import ConfigError

__all__ = [
    "load_measurement",
    "measurement_parser",
    "measurement_settings",
    "parse_only",
    "parse_reproduction_args",
    "parse_settings",
    "parse_shard",
    "progress_action",
    "record_flags",
    "report_and_document",
    "reproduction_parser",
    "runs_parser",
    "save_measurement",
    "script_command",
    "table_only",
    "usage_errors",
    "warn_unpinned_shard",
]


def runs_parser(description: str | None, *, out: str) -> argparse.ArgumentParser:
    """``--out`` (default ``out``) and ``--docs``: the flags of every script that runs variants
    into run directories and tabulates them (the FedPT tables; :func:`reproduction_parser`)."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=out, help="where the runs' directories (checkpoints) go")
    ap.add_argument(
        "--docs",
        default=None,
        help="rewrite this script's section of this file (docs/benchmarks.md)",
    )
    return ap


def script_command(script: str | Path, argv: Sequence[str] | None) -> str:
    """The command line shown in a docs section: ``python benchmarks/<script's file name>`` and
    ``argv`` (``sys.argv[1:]`` when None, as ``argparse`` reads it).

    >>> script_command("/x/benchmarks/fedpt_table1.py", ["--seeds", "3"])
    'python benchmarks/fedpt_table1.py --seeds 3'
    """
    given = sys.argv[1:] if argv is None else argv
    return ("python benchmarks/" + Path(script).name + " " + " ".join(given)).strip()


def report_and_document(
    report: Any,
    table: str,
    docs: str | None,
    *,
    section: Section,
    started: Start,
    script: str | Path,
    argv: Sequence[str] | None,
    records: str | Path | None = None,
) -> int:
    """The end of a script that runs variants and tabulates them (:func:`runs_parser`): print the
    ``report`` (JSON) and its ``table``; with ``docs``, keep the report as the record of the
    measured ``section`` (begun at ``started``, under ``records`` when given) and render that
    file's section from it, showing the command line (:func:`script_command`;
    :func:`fedge.bench.measured.document`). Returns 0, the exit status."""
    print(json.dumps(report, indent=2))
    print(table)
    command = script_command(script, argv)
    document(section, report, command=command, docs=docs, started=started, records=records)
    return 0


def record_flags(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--records DIR`` and ``--table-only`` to the parser of a script that measures a
    docs section (:mod:`fedge.bench.measured`; ``--docs`` it has already)."""
    ap.add_argument(
        "--records",
        default=None,
        metavar="DIR",
        help="with --docs: keep the section's record (SECTION.json) in DIR instead of the docs "
        "file's checkout's benchmarks/results/measured/",
    )
    ap.add_argument(
        "--table-only",
        action="store_true",
        help="measure nothing: re-render the --docs section from its committed record "
        "(benchmarks/results/measured/SECTION.json, or under --records)",
    )
    return ap


def table_only(ap: argparse.ArgumentParser, section: Section, args: argparse.Namespace) -> int:
    """``--table-only``: re-render ``section`` of ``args.docs`` from its record and return 0; no
    ``--docs``, or a missing or bad record, exits 2 with one line naming the path and the fix."""
    if not args.docs:
        ap.exit(2, f"{ap.prog}: error: --table-only re-renders a docs section: give --docs FILE\n")
    try:
        path = render(section, args.docs, args.records)
    except ConfigError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    print(f"updated {args.docs} from {path}")
    return 0


def reproduction_parser(
    description: str | None, *, out: str, smoke: bool = True
) -> argparse.ArgumentParser:
    """The flags every reproduction script shares: ``--out``, ``--docs``, ``--shard I/N``,
    ``--no-steal``, ``--only LABEL[@SEED]``, ``--table-only``, ``--save-progress`` (with
    ``--progress-max-mb``), ``--restore-progress``, ``--progress-status`` and (with ``smoke``)
    ``--smoke``."""
    ap = runs_parser(description, out=out)
    ap.add_argument(
        "--shard",
        default="0/1",
        help="I/N: run every N-th run starting at I (parallel workers), then "
        "the other workers' runs that nobody is running now",
    )
    ap.add_argument(
        "--no-steal",
        action="store_true",
        help="run only this shard's runs, never another worker's (for shards on different machines, "
        "which cannot see each other's runs)",
    )
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="LABEL[@SEED]",
        help="run only this variant (every seed, or the one after @); repeatable. Sends chosen "
        "runs to a given machine or core; the screen still runs first",
    )
    ap.add_argument(
        "--table-only", action="store_true", help="tabulate the recorded runs, run nothing"
    )
    ap.add_argument(
        "--save-progress",
        action="store_true",
        help="pack the unfinished runs under --out into the records folder (commit it), run nothing",
    )
    ap.add_argument(
        "--restore-progress",
        action="store_true",
        help="unpack the records folder's unfinished runs under --out (before starting workers), run nothing",
    )
    ap.add_argument(
        "--progress-status",
        action="store_true",
        help="print where each unfinished run under --out and in the records folder's archive "
        "stands (rounds done of its rounds, whether a process drives it now, its pace), run nothing",
    )
    ap.add_argument(
        "--progress-max-mb",
        type=float,
        default=MAX_RUN_BYTES / 1e6,
        metavar="MB",
        help="with --save-progress: leave out (and name) an unfinished run whose files exceed MB "
        "megabytes, since git keeps a copy at every save; 0 packs every run (default %(default)g)",
    )
    if smoke:
        ap.add_argument(
            "--smoke",
            action="store_true",
            help="a tiny protocol (seconds), recorded under --out, never the docs",
        )
    return ap


def parse_shard(text: str) -> tuple[int, int] | None:
    """``"I/N"`` with ``0 <= I < N`` as ``(I, N)``; None for anything else.

    >>> parse_shard("1/2"), parse_shard("2/2"), parse_shard("two")
    ((1, 2), None, None)
    """
    parts = text.split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        return None
    shard, shards = int(parts[0]), int(parts[1])
    return (shard, shards) if 0 <= shard < shards else None


def parse_reproduction_args(
    ap: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, int, int]:
    """Parse ``argv``; a bad ``--shard`` or ``--smoke`` with ``--docs`` exits 2 with the fix."""
    args = ap.parse_args(argv)
    parsed = parse_shard(args.shard)
    if parsed is None:
        ap.error(f"--shard {args.shard!r}: expected I/N with 0 <= I < N, e.g. 0/2")
    if getattr(args, "smoke", False) and args.docs:
        ap.error("--smoke writes no docs: drop --docs")
    actions = [
        f
        for f in ("table_only", "save_progress", "restore_progress", "progress_status")
        if getattr(args, f, False)
    ]
    if len(actions) > 1:
        ap.error(
            f"{' and '.join('--' + a.replace('_', '-') for a in actions)} exclude each other: give one"
        )
    if getattr(args, "progress_max_mb", 0) < 0:
        ap.error(
            f"--progress-max-mb {args.progress_max_mb:g}: expected a size in MB >= 0 (0 packs every run)"
        )
    if hasattr(args, "only"):  # as (label, seed or None) pairs
        parsed_only = [parse_only(item) for item in args.only]
        for item, pair in zip(args.only, parsed_only, strict=True):
            if pair is None:
                ap.error(
                    f"--only {item!r}: expected a variant's label, or LABEL@SEED with a whole-number seed"
                )
        args.only = parsed_only
    if parsed[1] > 1 and not args.table_only:
        warn_unpinned_shard(parsed[0])
    return args, parsed[0], parsed[1]


@contextmanager
def usage_errors(ap: argparse.ArgumentParser) -> Iterator[None]:
    """A :class:`ConfigError` raised inside (an ``--only`` label the table lacks, a record made by
    another config) ends the script as a usage error: its one line, exit status 2, no traceback."""
    try:
        yield
    except ConfigError as e:
        ap.error(str(e))


def parse_only(text: str) -> tuple[str, int | None] | None:
    """``--only`` as ``(label, seed)``: ``LABEL`` (every seed) or ``LABEL@SEED``; None when the
    seed is not a whole number or the label is empty.

    >>> parse_only("BAFFLE K=200"), parse_only("BAFFLE K=200@2"), parse_only("K=200@two")
    (('BAFFLE K=200', None), ('BAFFLE K=200', 2), None)
    """
    label, at, seed = text.rpartition("@") if "@" in text else (text, "", "")
    if not label.strip() or (at and not seed.strip().isdigit()):
        return None
    return label, int(seed) if at else None


def progress_action(args: argparse.Namespace, records: str | Path) -> bool:
    """Carry out ``--save-progress`` / ``--restore-progress`` / ``--progress-status``
    (:mod:`fedge.bench.progress`) with the archive in ``records``, print what moved (or where
    the runs stand), and return True; False when none was given."""
    from fedge.bench.progress import ARCHIVE, progress_status, restore_progress, save_progress

    archive = Path(records) / ARCHIVE
    if getattr(args, "progress_status", False):
        for line in status_lines(progress_status(args.out, archive)):
            print(line)
        return True
    if getattr(args, "save_progress", False):
        limit = args.progress_max_mb
        packed = save_progress(
            args.out,
            archive,
            records=records,
            max_run_bytes=int(limit * 1e6) if limit > 0 else None,
        )
        held = packed.held
        print(
            f"{archive}: "
            + (
                ", ".join(f"{p.run} (round {p.rounds})" for p in held)
                if held
                else "nothing to carry (archive removed)"
            )
        )
        if packed.recorded:
            print(
                "dropped, recorded as finished (on another machine): "
                + ", ".join(f"{p.run} (round {p.rounds})" for p in packed.recorded)
            )
        for p in packed.left_out:
            print(
                f"not carried: {p.run} (round {p.rounds}, {p.nbytes / 1e6:.1f} MB > --progress-max-mb {limit:g}): "
                f"git would keep another copy at every save; it restarts from round 1 on another machine "
                f"(finish it on this one, or save again with --progress-max-mb {p.nbytes / 1e6 + 1:.0f})"
            )
        return True
    if getattr(args, "restore_progress", False):
        restored = restore_progress(archive, args.out)
        print(
            f"restored under {args.out}: "
            + (", ".join(f"{p.run} (round {p.rounds})" for p in restored) or "nothing newer")
        )
        return True
    return False


def status_lines(status: Sequence[RunStatus]) -> list[str]:
    """``--progress-status``'s lines: one a run, ``RUN: round 12 of 20 here (running now); the
    archive holds round 10``, the runs that ``--restore-progress`` would move forward marked.

    >>> from fedge.bench.progress import RunStatus
    >>> status_lines([RunStatus("seed-1/a", 12, True, 10, 20), RunStatus("seed-2/a", None, False, 3, 20)])
    ['seed-1/a: round 12 of 20 here (running now); the archive holds round 10', 'seed-2/a: not here; the archive holds round 3 of 20 (--restore-progress brings it here)']
    >>> status_lines([RunStatus("seed-1/b", 5, False, None, 20, 540.0)])
    ['seed-1/b: round 5 of 20 here (stopped; its last round took 9.0 min, about 2.2 h left at that pace)']
    """
    if not status:
        return ["no unfinished runs here or in the archive"]
    out = []
    for s in status:
        of = "" if s.total is None else f" of {s.total}"
        if s.here is None:
            where = f"not here; the archive holds round {s.archived}{of}"
        else:
            pace = ""
            if s.round_s is not None:
                pace = f"; its last round took {s.round_s / 60:.1f} min"
                if s.total is not None and s.total > s.here:
                    pace += (
                        f", about {(s.total - s.here) * s.round_s / 3600:.1f} h left at that pace"
                    )
            where = f"round {s.here}{of} here ({'running now' if s.running else 'stopped'}{pace})"
            if s.archived is not None:
                where += f"; the archive holds round {s.archived}"
        if s.archived is not None and (s.here is None or s.archived > s.here) and not s.running:
            where += " (--restore-progress brings it here)"
        out.append(f"{s.run}: {where}")
    return out


def warn_unpinned_shard(shard: int) -> None:
    """Warn when a shard of a parallel reproduction may run on more than one core.

    BAFFLE's fast estimator splits the K perturbations over every core the process may use
    (``perturbation_threads``), so unpinned workers started side by side each use all the cores and
    slow one another down several-fold (measured: 2 minutes a round pinned, 130-300 s unpinned).
    Results are the same either way; only the time is lost.
    """
    cores = len(os.sched_getaffinity(0))
    if cores > 1:
        warnings.warn(
            f"--shard {shard}/N runs on {cores} cores: parallel workers then contend for the same "
            f"cores; pin each to one, e.g. OMP_NUM_THREADS=1 taskset -c {shard} python ... --shard {shard}/N",
            RuntimeWarning,
            stacklevel=2,
        )


def measurement_parser(
    description: str | None, *, section: str, example: str
) -> argparse.ArgumentParser:
    """``--docs``, ``--json``, ``--from-json`` and ``--set key=value ...`` (``example``: one such
    override, shown in the help) for a script that writes the ``section`` of docs/benchmarks.md."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", help=f"update the {section} section of this Markdown file")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument(
        "--from-json", help="render a --json file of an earlier run instead of measuring"
    )
    ap.add_argument(
        "--set", nargs="*", default=[], help=f"settings overrides, key=value (e.g. {example})"
    )
    return ap


def parse_settings(defaults: dict[str, Any], pairs: Sequence[str]) -> dict[str, Any]:
    """``defaults`` with the ``key=value`` overrides of ``--set``, each value read as the type of
    its default (text, float or int); a ConfigError names an unknown key or a value that is not
    a number, with the fix.

    >>> parse_settings({"model": "lenet", "rounds": 4, "lr": 0.1}, ["rounds=8", "lr=0.05", "model=vgg"])
    {'model': 'vgg', 'rounds': 8, 'lr': 0.05}
    """
    s = dict(defaults)
    for kv in pairs:
        k, _, v = kv.partition("=")
        if k not in s:
            raise ConfigError(f"unknown setting {k!r}; expected one of {sorted(s)} (as key=value)")
        if isinstance(defaults[k], str):
            s[k] = v
            continue
        try:
            s[k] = float(v) if isinstance(defaults[k], float) else int(v)
        except ValueError:
            raise ConfigError(
                f"setting {k}={v!r} is not a number; expected e.g. {k}={defaults[k]}"
            ) from None
    return s


def measurement_settings(
    ap: argparse.ArgumentParser, pairs: Sequence[str], defaults: dict[str, Any]
) -> dict[str, Any]:
    """:func:`parse_settings` of a measurement script's ``--set``: a bad key or value exits 2
    through ``ap.error`` with the message that names it and the fix."""
    try:
        return parse_settings(defaults, pairs)
    except ConfigError as e:
        ap.error(str(e))


def save_measurement(path: str | Path, record: dict[str, Any]) -> None:
    """Write a measurement's raw results (``--json``): settings, seconds and results, which
    :func:`load_measurement` reads back for ``--from-json``."""
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=str)


def load_measurement(path: str | Path) -> dict[str, Any]:
    """The raw results a :func:`save_measurement` wrote (``--from-json``)."""
    with open(path) as f:
        saved: dict[str, Any] = json.load(f)
    return saved
