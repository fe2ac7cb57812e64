"""The ``fedge`` command line.

    fedge run PRESET_OR_YAML [--set key=value ...] [--out DIR]   train, write a run directory
    fedge run --resume RUN_DIR                                   continue an interrupted run
    fedge run --resume RUN_DIR --set rounds=300                  train a finished run further
    fedge datasets | fedge models                                what is available here
    fedge report RUN_DIR | fedge compare RUN_DIR RUN_DIR ...     read finished runs

Bad input (unknown key, wrong type, out-of-range value, unknown name, missing data) prints
one message naming the value and the fix and exits with status 2, writing nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from fedge.core.errors import FedgeError, MessageError  # noqa: E402

app = typer.Typer(
    name="fedge",
    help="Federated learning on resource-constrained edge devices, measured honestly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

EXIT_BAD_INPUT = 2


def _fail(exc: BaseException, code: int = EXIT_BAD_INPUT) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)


def _default_out(source: str) -> Path:
    stem = Path(source).stem if source.endswith((".yaml", ".yml")) else source
    base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


class _Bar:
    """A rich progress bar showing round, accuracy and bytes so far."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = (
            Progress(
                TextColumn("[bold]round"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[acc]}"),
                TextColumn("{task.fields[bytes]}"),
                TimeElapsedColumn(),
                console=err,
                transient=False,
            )
            if enabled
            else None
        )
        self.task: Any = None

    def __enter__(self) -> _Bar:
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def __call__(self, line: dict[str, Any], total: int) -> None:
        if self.progress is None:
            return
        from fedge.report import format_bytes

        if self.task is None:
            self.task = self.progress.add_task("run", total=total, completed=line["round"] - 1, acc="", bytes="")
        acc = line.get("test_accuracy")
        moved = line["cum_bytes_down"] + line["cum_bytes_up"]
        self.progress.update(
            self.task,
            completed=line["round"],
            acc=f"acc {acc:.4f}" if acc is not None else "",
            bytes=f"{format_bytes(moved)} moved",
        )


@app.command()
def run(
    config: Annotated[str | None, typer.Argument(help="preset name (see configs/) or path to a YAML file")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a config key: --set rounds=20")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="run directory to write (default runs/<preset>-<time>)")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="continue the interrupted run in this directory")] = None,
    measure_memory: Annotated[bool, typer.Option("--measure-memory", help="measure client peak memory")] = False,
    workers: Annotated[int | None, typer.Option("--workers", help="client worker processes")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Train a federation and write its run directory."""
    from fedge.core.config import load_config
    from fedge.experiment.run import resume_experiment, run_experiment

    overrides = list(set_ or [])
    if measure_memory:
        overrides.append("measure.memory=true")
    if workers is not None:
        overrides.append(f"clients.workers={workers}")
    target: Path | None = None
    try:
        if resume is not None:
            extend = [o for o in overrides if o.split("=", 1)[0].strip() == "rounds"]
            if config is not None or len(extend) != len(overrides) or len(extend) > 1:
                _fail(ValueError(
                    "--resume takes only the run directory (its config.yaml fixes everything else) "
                    "and optionally --set rounds=N to train a run further"
                ))  # fmt: skip
            rounds = None
            if extend:
                value = extend[0].split("=", 1)[1].strip() if "=" in extend[0] else ""
                if not value.isdigit():
                    _fail(ValueError(f"--set {extend[0]}: rounds must be a whole number of rounds"))
                rounds = int(value)
            target = resume
            with _Bar(not quiet) as bar:
                path = resume_experiment(resume, rounds=rounds, progress=bar)
        else:
            if config is None:
                _fail(ValueError("give a preset or YAML file (e.g. fedge run quickstart), or --resume RUN_DIR"))
            cfg = load_config(config, overrides=overrides)
            target = out_dir or _default_out(config)
            with _Bar(not quiet) as bar:
                path = run_experiment(cfg, out=target, progress=bar)
    except MessageError as exc:
        _fail(exc, code=1)
    except FedgeError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        err.print(f"interrupted; continue with: fedge run --resume {target}")
        raise typer.Exit(130) from None
    import json

    summary = json.loads((path / "summary.json").read_text())
    acc = summary.get("final_test_accuracy")
    out.print(f"final test accuracy: {acc:.4f}" if acc is not None else "final test accuracy: n/a")
    out.print(f"run directory: {path}")


@app.command()
def datasets() -> None:
    """List the datasets fedge knows and whether their files are available here."""
    from fedge.data import available_datasets

    table = Table("dataset", "available", "location", "description")
    for st in available_datasets():
        table.add_row(st.name, "yes" if st.available else "no", str(st.location or st.how_to_get), st.description)
    out.print(table)


@app.command()
def models(
    input_shape: Annotated[str, typer.Option(help="C,H,W of the input")] = "1,28,28",
    num_classes: Annotated[int, typer.Option(help="number of classes")] = 10,
    blocks: Annotated[str | None, typer.Option("--blocks", help="list this model's parameter blocks (for method.freeze)")] = None,
) -> None:
    """List the model zoo with parameter counts for an input shape."""
    from fedge.models import list_models

    try:
        shape = tuple(int(v) for v in input_shape.split(","))
        if len(shape) != 3:
            raise ValueError
    except ValueError:
        _fail(ValueError(f"--input-shape {input_shape!r}: expected C,H,W such as 1,28,28"))
    if blocks is not None:
        from fedge.cli.fedpt import print_blocks

        return print_blocks(blocks, shape, num_classes)
    table = Table("model", "parameters", "defaults", "description")
    for row in list_models(input_shape=shape, num_classes=num_classes):
        params = row.get("params")
        table.add_row(row["name"], f"{params:,}" if isinstance(params, int) else str(params),
                      ", ".join(f"{k}={v}" for k, v in (row.get("defaults") or {}).items()), row["description"])
    out.print(table)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Render report.md and report.html (with plots) for a run directory."""
    from fedge.report import render_report

    try:
        md, html = render_report(run_dir)
    except FedgeError as exc:
        _fail(exc)
    out.print(f"wrote {md}\nwrote {html}")


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="two or more run directories")],
    out_dir: Annotated[Path | None, typer.Option("--out", help="where to write the plots")] = None,
    target: Annotated[float | None, typer.Option(help="also report bytes to reach this test accuracy (0-1)")] = None,
) -> None:
    """Side-by-side table and overlaid plots of several runs."""
    from fedge.report import compare_runs

    dest = out_dir or Path(f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        cmp = compare_runs(run_dirs, dest, target_accuracy=target)
    except FedgeError as exc:
        _fail(exc)
    out.print(cmp.table_rich())
    out.print(f"plots in {dest}")


bench_app = typer.Typer(help="Benchmarks: measure, print JSON, optionally update docs/benchmarks.md.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


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
    import json

    from fedge.bench.docs import update_section

    text = json.dumps(report, indent=2)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n")
        out.print(f"wrote {json_path}")
    else:
        out.print_json(text)
    if docs is not None and section is not None:
        name, title, markdown = section
        update_section(docs, name, title, markdown(report, _command_line()))
        out.print(f"updated {docs}")


@app.command()
def partition(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    client: Annotated[int, typer.Option("--client", help="the client whose shard to show")],
) -> None:
    """One client's shard of a run (sample count, label histogram), also for generated populations."""
    import json

    from fedge.core.config import load_config
    from fedge.experiment.build import client_shard

    try:
        cfg = load_config(str(run_dir / "config.yaml"))
        out.print_json(json.dumps(client_shard(cfg, client)))
    except FedgeError as exc:
        _fail(exc)


@bench_app.command("engine")
def bench_engine(
    clients: Annotated[str, typer.Option(help="comma-separated clients per round")] = "10,100,1000",
    rounds: Annotated[int, typer.Option(help="timed rounds per setting")] = 5,
    populations: Annotated[
        str, typer.Option(help="comma-separated population sizes (1000 clients a round): e.g. 1000,1000000")
    ] = "",
    json_path: Annotated[Path | None, typer.Option("--json", help="write the figures to this JSON file")] = None,
    docs: Annotated[Path | None, typer.Option("--docs", help="update this Markdown file's engine section")] = None,
) -> None:
    """Engine overhead per client per round with trivial clients (and against the population size)."""
    from fedge.bench.engine import engine_markdown, run_engine_overhead

    if populations:
        from fedge.bench.population import population_markdown, run_population_scale

        try:
            sizes = tuple(int(float(p)) for p in populations.split(","))
            if not sizes or min(sizes) < 1:
                raise ValueError
        except ValueError:
            _fail(ValueError(f"--populations {populations!r}: expected positive integers such as 1000,1000000"))
        scale = run_population_scale(sizes, rounds=rounds)
        _emit(scale, json_path, docs, ("population", "Engine cost against the population size", population_markdown))
        return

    try:
        counts = tuple(int(c) for c in clients.split(","))
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        _fail(ValueError(f"--clients {clients!r}: expected positive integers such as 10,100,1000"))
    report = run_engine_overhead(counts, rounds=rounds)
    _emit(report, json_path, docs, ("engine", "Engine overhead", engine_markdown))


@bench_app.command("zo")
def bench_zo(
    models: Annotated[str, typer.Option(help="comma-separated models: lenet, wrn-10-2")] = "lenet,wrn-10-2",
    k: Annotated[int, typer.Option("--k", min=1, help="loss differences per estimate (K)")] = 100,
    batch: Annotated[int, typer.Option(min=1, help="samples per step")] = 64,
    repeats: Annotated[int, typer.Option(min=1, help="interleaved timed repetitions (minimum reported)")] = 3,
    threads: Annotated[int, typer.Option(min=1, help="torch threads")] = 1,
    schemes: Annotated[str, typer.Option(help="comma-separated: central, forward")] = "central,forward",
    retain_memory: Annotated[
        bool, typer.Option("--retain-memory/--no-retain-memory", help="glibc mallopt: keep freed memory")
    ] = True,
    probe_k: Annotated[int, typer.Option(min=0, help="K of the allocator comparison in fresh processes; 0 skips")] = 8,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the figures to this JSON file")] = None,
    docs: Annotated[Path | None, typer.Option("--docs", help="update this Markdown file's zo section")] = None,
) -> None:
    """Zeroth-order step time (fast, lean) against a backprop step and BAFFLE's reference loop."""
    from fedge.bench.zo import run_zo, zo_markdown

    try:
        report = run_zo([m.strip() for m in models.split(",")], k=k, batch=batch, repeats=repeats,
                        threads=threads, schemes=[s.strip() for s in schemes.split(",")],
                        retain_memory=retain_memory, probe_k=probe_k or None)  # fmt: skip
    except ValueError as exc:
        _fail(exc)
    _emit(report, json_path, docs, ("zo-step", "Zeroth-order step time", zo_markdown))


@bench_app.command("memory")
def bench_memory(
    models: Annotated[str, typer.Option(help="comma-separated models: lenet, wrn-10-2")] = "lenet,wrn-10-2",
    batches: Annotated[str, typer.Option(help="comma-separated batch sizes")] = "64,256",
    lean_ks: Annotated[str, typer.Option(help="K values of the lean step (the first is the headline)")] = "8,2",
    fast_k: Annotated[int, typer.Option(min=1, help="K of the fast step")] = 8,
    rss_repeats: Annotated[int, typer.Option(min=0, help="fresh processes per RSS figure; 0 skips RSS")] = 3,
    threads: Annotated[int, typer.Option(min=1, help="torch threads")] = 1,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the figures to this JSON file")] = None,
    docs: Annotated[Path | None, typer.Option("--docs", help="update this Markdown file's memory section")] = None,
) -> None:
    """Peak client-step memory: inference, backprop, lean and fast zeroth-order."""
    from fedge.bench.memory import memory_markdown, run_memory

    try:
        sizes = tuple(int(b) for b in batches.split(","))
        ks = tuple(int(v) for v in lean_ks.split(","))
    except ValueError:
        _fail(ValueError(f"--batches {batches!r} / --lean-ks {lean_ks!r}: expected integers such as 64,256 and 8,2"))
    try:
        report = run_memory([m.strip() for m in models.split(",")], batches=sizes, lean_ks=ks,
                            fast_k=fast_k, rss_repeats=rss_repeats, threads=threads)  # fmt: skip
    except ValueError as exc:
        _fail(exc)
    _emit(report, json_path, docs, ("client-memory", "Client step memory", memory_markdown))


@bench_app.command("comm")
def bench_comm(
    ks: Annotated[str, typer.Option("--k", help="comma-separated K values")] = "100,200,500",
    json_path: Annotated[Path | None, typer.Option("--json", help="write the figures to this JSON file")] = None,
    docs: Annotated[Path | None, typer.Option("--docs", help="update this Markdown file's section")] = None,
) -> None:
    """BAFFLE message sizes from real rounds: uplink 4K + framing, seed bytes, secure aggregation."""
    from fedge.bench.comm import comm_markdown, run_comm

    try:
        values = tuple(int(v) for v in ks.split(","))
    except ValueError:
        _fail(ValueError(f"--k {ks!r}: expected integers such as 100,200,500"))
    report = run_comm(values)
    _emit(report, json_path, docs, ("baffle-comm", "BAFFLE communication", comm_markdown))


@bench_app.command("presets")
def bench_presets(
    names: Annotated[list[str], typer.Argument(help="presets to run")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a config key in every run")] = None,
    out_root: Annotated[Path | None, typer.Option("--out", help="directory for the run directories")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the figures to this JSON file")] = None,
    docs: Annotated[Path | None, typer.Option("--docs", help="update this Markdown file's presets section")] = None,
) -> None:
    """Run presets end to end; tabulate accuracy and per-client bytes against the model size."""
    from fedge.bench.presets import presets_markdown, run_presets

    try:
        report = run_presets(list(names), overrides=list(set_ or []), out_root=out_root)
    except FedgeError as exc:
        _fail(exc)
    _emit(report, json_path, docs, ("presets", "Baseline presets", presets_markdown))


app.add_typer(__import__("fedge.cli.privacy", fromlist=["app"]).app, name="privacy")  # fedge privacy ...

from fedge.cli.fedpt import register as _register_fedpt  # noqa: E402

_register_fedpt(app)  # fedge fedpt-search

app.command("export")(__import__("fedge.cli.export", fromlist=["export"]).export)  # fedge export


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
