"""Commands that read: ``fedge datasets``, ``fedge models``, ``fedge methods``, ``fedge report``,
``fedge compare``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fedge.cli.common import fail, one_line_warnings, out, parse_list, set_options
from fedge.core.errors import FedgeError
from fedge.core.rundir_schema import CONFIG

__all__ = ["compare", "datasets", "methods", "models", "partition", "report"]


def datasets() -> None:
    """List the datasets fedge knows and whether their files are available here."""
    from fedge.data import available_datasets
    from fedge.experiment.build import FEDERATED

    table = Table("dataset", "available", "location", "description")
    rows = [
        (
            st.name,
            "yes" if st.available else "no",
            str(st.location or st.how_to_get),
            st.description,
        )
        for st in available_datasets()
    ]
    rows.append(
        (
            FEDERATED,
            "yes",
            "generated per client from the run seed",
            "Synthetic(alpha, beta) of FedProx: a population of any size, each client's data made when it is "
            "sampled (dataset.alpha, dataset.beta, dataset.max_samples)",
        )
    )
    for row in sorted(rows):
        table.add_row(*row)
    out().print(table)


def models(
    input_shape: Annotated[str, typer.Option(help="C,H,W of the input")] = "1,28,28",
    num_classes: Annotated[int, typer.Option(help="number of classes", min=1)] = 10,
    blocks: Annotated[
        str | None,
        typer.Option("--blocks", help="list this model's parameter blocks (for method.freeze)"),
    ] = None,
) -> None:
    """List the model zoo with parameter counts for an input shape."""
    from fedge.models import list_models

    shape = parse_list("--input-shape", input_shape, int, example="1,28,28", positive=True)
    if len(shape) != 3:
        fail(f"--input-shape {input_shape!r}: expected C,H,W such as 1,28,28")
    if blocks is not None:
        from fedge.cli.fedpt import print_blocks

        print_blocks(blocks, shape, num_classes)
        return
    table = Table("model", "parameters", "defaults", "description")
    for row in list_models(input_shape=shape, num_classes=num_classes):
        params = row.get("params")
        table.add_row(
            row["name"],
            f"{params:,}" if isinstance(params, int) else str(params),
            ", ".join(f"{k}={v}" for k, v in (row.get("defaults") or {}).items()),
            row["description"],
        )
    out().print(table)


def methods() -> None:
    """List the methods (``method.name``) with the mechanisms that compose onto each."""
    from fedge.methods import get_method, method_names
    from fedge.methods.compose import MECHANISMS

    table = Table("method", "composes with", "description")
    for name in method_names():
        caps = get_method(name).capabilities
        keys = [
            "privacy.*" if m.name == "dp" else f"method.{m.name}"
            for m in MECHANISMS
            if getattr(caps, m.needs)
        ]
        if caps.accelerators:
            keys.append("device: cuda")
        table.add_row(name, ", ".join(keys) or "-", get_method(name).description)
    out().print(table)


def report(run_dir: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Render report.md and report.html (with plots) for a run directory."""
    from fedge.report import render_report

    try:
        with one_line_warnings():
            md, html = render_report(run_dir)
    except FedgeError as exc:
        fail(exc)
    out().print(f"wrote {md}\nwrote {html}", markup=False)


def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="two or more run directories")],
    out_dir: Annotated[Path | None, typer.Option("--out", help="where to write the plots")] = None,
    target: Annotated[
        float | None, typer.Option(help="also report bytes to reach this test accuracy (0-1)")
    ] = None,
) -> None:
    """Side-by-side table and overlaid plots of several runs."""
    from fedge.report import compare_runs

    dest = out_dir or Path(f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        with one_line_warnings():
            cmp = compare_runs(run_dirs, dest, target_accuracy=target)
    except FedgeError as exc:
        fail(exc)
    console = out()
    console.print(cmp.table_rich())
    console.print(f"plots in {dest}", markup=False)


def partition(
    source: Annotated[
        str, typer.Argument(help="a run directory, a preset name or a YAML config file")
    ],
    client: Annotated[int, typer.Option("--client", help="the client whose shard to show")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="with a preset or YAML file: override a config key (--set partition.alpha=0.1)",
        ),
    ] = None,
) -> None:
    """One client's shard (sample count, label histogram) of a run, a preset or a config file.

    A preset or config file is partitioned as a run would, before anything runs (generated populations too)."""
    import json

    from fedge.core.config import load_config
    from fedge.core.presets import looks_like_path
    from fedge.experiment.build import client_shard

    try:
        if Path(source).is_dir():
            if set_:
                fail(
                    f"--set goes with a preset or YAML file; {source!r} is a run directory, whose config.yaml "
                    "fixes its population"
                )
            if not (Path(source) / CONFIG).is_file():
                fail(
                    f"{source!r} is not a fedge run directory (no config.yaml); give a run directory, a preset or a YAML file"
                )
            from fedge.experiment.rundir import RunDir

            cfg = load_config(RunDir(source).read_config())
        else:
            if looks_like_path(source) and not Path(source).exists():
                fail(
                    f"{source!r} does not exist; give a run directory, a YAML file or a preset name"
                )
            cfg = load_config(source, overrides=set_options(set_))
        out().print_json(json.dumps(client_shard(cfg, client)))
    except FedgeError as exc:
        fail(exc)
