"""``fedge bench ...``: measure, print JSON, optionally rewrite a section of docs/benchmarks.md.

A measured section is rendered from its record (:mod:`fedge.bench.measured`): ``--docs FILE``
writes ``benchmarks/results/measured/SECTION.json`` beside ``FILE``'s checkout (``--records DIR``
elsewhere) and renders the section from it; the same command with ``--table-only`` re-renders
the section from the record without measuring."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from fedge.cli.common import fail, out, parse_list, set_options
from fedge.core.errors import FedgeError

__all__ = ["bench_app"]

bench_app = typer.Typer(
    help="Benchmarks: measure, print JSON, optionally update docs/benchmarks.md (a measured "
    "section from the record --docs keeps; --table-only re-renders it without measuring).",
    no_args_is_help=True,
)


def _command_line() -> str:
    args = sys.argv[1:]
    return "fedge " + " ".join(args) if args else "fedge"


def _emit(
    report: dict[str, Any],
    json_path: Path | None,
    docs: Path | None = None,
    section: tuple[str, str, Any] | None = None,
) -> None:
    """Print or write the JSON figures; with ``docs``, rewrite ``section`` = (name, title,
    markdown(report, command)) of that Markdown file with the exact command line."""
    from fedge.bench.docs import update_section

    _print_report(report, json_path)
    if docs is not None and section is not None:
        name, title, markdown = section
        update_section(docs, name, title, markdown(report, _command_line()))
        out().print(f"updated {docs}", markup=False)


def _print_report(report: dict[str, Any], json_path: Path | None) -> None:
    text = json.dumps(report, indent=2)
    console = out()
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n")
        console.print(f"wrote {json_path}", markup=False)
    else:
        console.print_json(text)


#: The options every measuring subcommand shares: where its record goes, and re-rendering.
RecordsOption = Annotated[
    Path | None,
    typer.Option(
        "--records",
        help="with --docs: keep the section's record (SECTION.json) in this folder instead of "
        "the docs file's checkout's benchmarks/results/measured/",
    ),
]
TableOnlyOption = Annotated[
    bool,
    typer.Option(
        "--table-only",
        help="measure nothing: re-render the --docs section from its committed record "
        "(benchmarks/results/measured/SECTION.json, or under --records)",
    ),
]


def _measured(
    section: Any,
    run: Callable[[], dict[str, Any]],
    *,
    json_path: Path | None,
    docs: Path | None,
    records: Path | None,
    table_only: bool,
) -> None:
    """Measure with ``run`` and print the report (:func:`_print_report`); with ``docs``, keep its
    record and render ``section`` from it (:func:`fedge.bench.measured.measure`). With
    ``table_only``, only re-render the section from its record; a missing or bad record exits 2
    with its one-line error."""
    from fedge.bench import measured

    if table_only:
        if docs is None:
            fail("--table-only re-renders a docs section from its record: give --docs FILE")
        try:
            path = measured.render(section, docs, records)
        except FedgeError as exc:
            fail(exc)
        out().print(f"updated {docs} from {path}", markup=False)
        return
    report = measured.measure(section, run, command=_command_line(), docs=docs, records=records)
    _print_report(report, json_path)
    if docs is not None:
        path = measured.record_path(section.name, docs, records)
        out().print(f"wrote {path}; updated {docs}", markup=False)


@bench_app.command("engine")
def bench_engine(
    clients: Annotated[str, typer.Option(help="comma-separated clients per round")] = "10,100,1000",
    rounds: Annotated[int, typer.Option(help="timed rounds per setting")] = 5,
    populations: Annotated[
        str,
        typer.Option(
            help="comma-separated population sizes (1000 clients a round): e.g. 1000,1000000"
        ),
    ] = "",
    json_path: Annotated[
        Path | None, typer.Option("--json", help="write the figures to this JSON file")
    ] = None,
    docs: Annotated[
        Path | None,
        typer.Option(
            "--docs",
            help="update this Markdown file's engine section (with --populations: its "
            "population section), rendered from the record this run writes",
        ),
    ] = None,
    records: RecordsOption = None,
    table_only: TableOnlyOption = False,
) -> None:
    """Engine overhead per client per round with trivial clients (and against the population size).

    With --docs the figures are kept as the section's record, which --table-only re-renders."""
    from fedge.bench.engine import ENGINE_SECTION, run_engine_overhead
    from fedge.bench.population import POPULATION_SECTION, run_population_scale

    if populations:
        sizes = parse_list("--populations", populations, int, example="1000,1000000", positive=True)
        section, run = POPULATION_SECTION, lambda: run_population_scale(sizes, rounds=rounds)
    else:
        counts = parse_list("--clients", clients, int, example="10,100,1000", positive=True)
        section, run = ENGINE_SECTION, lambda: run_engine_overhead(counts, rounds=rounds)
    _measured(section, run, json_path=json_path, docs=docs, records=records, table_only=table_only)


@bench_app.command("zo")
def bench_zo(
    models: Annotated[
        str, typer.Option(help="comma-separated models: lenet, lenet5, wrn-10-2, ...")
    ] = "lenet,lenet5,wrn-10-2",
    k: Annotated[int, typer.Option("--k", min=1, help="loss differences per estimate (K)")] = 100,
    batch: Annotated[int, typer.Option(min=1, help="samples per step")] = 64,
    repeats: Annotated[
        int, typer.Option(min=1, help="interleaved timed repetitions (minimum reported)")
    ] = 3,
    threads: Annotated[int, typer.Option(min=1, help="torch threads")] = 1,
    schemes: Annotated[
        str, typer.Option(help="comma-separated: central, forward")
    ] = "central,forward",
    retain_memory: Annotated[
        bool,
        typer.Option("--retain-memory/--no-retain-memory", help="glibc mallopt: keep freed memory"),
    ] = True,
    probe_k: Annotated[
        int, typer.Option(min=0, help="K of the allocator comparison in fresh processes; 0 skips")
    ] = 8,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="write the figures to this JSON file")
    ] = None,
    docs: Annotated[
        Path | None,
        typer.Option(
            "--docs",
            help="update this Markdown file's zo-step section, rendered from the record this "
            "run writes",
        ),
    ] = None,
    records: RecordsOption = None,
    table_only: TableOnlyOption = False,
) -> None:
    """Zeroth-order step time (fast, lean) against a backprop step and BAFFLE's reference loop.

    With --docs the figures are kept as the section's record, which --table-only re-renders."""
    from fedge.bench.zo import ZO_SECTION, run_zo

    names: tuple[str, ...] = parse_list("--models", models, example="lenet,wrn-10-2")
    scheme_list: tuple[str, ...] = parse_list("--schemes", schemes, example="central,forward")

    def run() -> dict[str, Any]:
        try:
            return run_zo(
                list(names),
                k=k,
                batch=batch,
                repeats=repeats,
                threads=threads,
                schemes=list(scheme_list),
                retain_memory=retain_memory,
                probe_k=probe_k or None,
            )
        except ValueError as exc:
            fail(exc)

    _measured(
        ZO_SECTION, run, json_path=json_path, docs=docs, records=records, table_only=table_only
    )


@bench_app.command("memory")
def bench_memory(
    models: Annotated[
        str, typer.Option(help="comma-separated models: lenet, lenet5, wrn-10-2, ...")
    ] = "lenet,lenet5,wrn-10-2",
    batches: Annotated[str, typer.Option(help="comma-separated batch sizes")] = "64,256",
    lean_ks: Annotated[
        str, typer.Option(help="K values of the lean step (the first is the headline)")
    ] = "8,2",
    fast_k: Annotated[int, typer.Option(min=1, help="K of the fast step")] = 8,
    rss_repeats: Annotated[
        int, typer.Option(min=0, help="fresh processes per RSS figure; 0 skips RSS")
    ] = 3,
    threads: Annotated[int, typer.Option(min=1, help="torch threads")] = 1,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="write the figures to this JSON file")
    ] = None,
    docs: Annotated[
        Path | None,
        typer.Option(
            "--docs",
            help="update this Markdown file's client-memory section, rendered from the record "
            "this run writes",
        ),
    ] = None,
    records: RecordsOption = None,
    table_only: TableOnlyOption = False,
) -> None:
    """Peak client-step memory: inference, backprop, lean and fast zeroth-order.

    With --docs the figures are kept as the section's record, which --table-only re-renders."""
    from fedge.bench.memory import MEMORY_SECTION, run_memory

    names: tuple[str, ...] = parse_list("--models", models, example="lenet,wrn-10-2")
    sizes = parse_list("--batches", batches, int, example="64,256", positive=True)
    ks = parse_list("--lean-ks", lean_ks, int, example="8,2", positive=True)

    def run() -> dict[str, Any]:
        try:
            return run_memory(
                list(names),
                batches=sizes,
                lean_ks=ks,
                fast_k=fast_k,
                rss_repeats=rss_repeats,
                threads=threads,
            )
        except ValueError as exc:
            fail(exc)

    _measured(
        MEMORY_SECTION, run, json_path=json_path, docs=docs, records=records, table_only=table_only
    )


@bench_app.command("comm")
def bench_comm(
    ks: Annotated[str, typer.Option("--k", help="comma-separated K values")] = "100,200,500",
    json_path: Annotated[
        Path | None, typer.Option("--json", help="write the figures to this JSON file")
    ] = None,
    docs: Annotated[
        Path | None, typer.Option("--docs", help="update this Markdown file's section")
    ] = None,
) -> None:
    """BAFFLE message sizes from real rounds: uplink 4K + framing, seed bytes, secure aggregation."""
    from fedge.bench.comm import comm_markdown, run_comm

    values = parse_list("--k", ks, int, example="100,200,500", positive=True)
    report = run_comm(values)
    _emit(report, json_path, docs, ("baffle-comm", "BAFFLE communication", comm_markdown))


@bench_app.command("presets")
def bench_presets(
    names: Annotated[list[str], typer.Argument(help="presets to run")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a config key in every run")
    ] = None,
    out_root: Annotated[
        Path | None, typer.Option("--out", help="directory for the run directories")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="write the figures to this JSON file")
    ] = None,
    docs: Annotated[
        Path | None,
        typer.Option(
            "--docs",
            help="update this Markdown file's presets section, rendered from the record this "
            "run writes",
        ),
    ] = None,
    records: RecordsOption = None,
    table_only: TableOnlyOption = False,
) -> None:
    """Run presets end to end; tabulate accuracy and per-client bytes against the model size.

    With --docs the figures are kept as the section's record, which --table-only re-renders."""
    from fedge.bench.presets import PRESETS_SECTION, run_presets

    overrides = set_options(set_)

    def run() -> dict[str, Any]:
        try:
            return run_presets(list(names), overrides=overrides, out_root=out_root)
        except FedgeError as exc:
            fail(exc)

    _measured(
        PRESETS_SECTION, run, json_path=json_path, docs=docs, records=records, table_only=table_only
    )
