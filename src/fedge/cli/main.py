"""The ``fedge`` command line: the app and its commands, one module per concern.

    fedge run PRESET_OR_YAML [--set key=value ...] [--out DIR]   train, write a run directory  (cli/run.py)
    fedge run --resume RUN_DIR [--set rounds=N]                  continue or extend a run       (cli/run.py)
    fedge datasets | fedge models                                what is available here         (cli/show.py)
    fedge report RUN_DIR | fedge compare RUN_DIR RUN_DIR ...     read finished runs             (cli/show.py)
    fedge partition RUN_DIR --client I                           one client's shard             (cli/show.py)
    fedge bench engine|zo|memory|comm|presets                    benchmarks                     (cli/bench.py)
    fedge export RUN_DIR [--format torchscript|onnx]             the trained model for the edge (cli/export.py)
    fedge privacy epsilon ...                                    DP accounting without training (cli/privacy.py)
    fedge fedpt-search CONFIG ...                                FedPT's partition search       (cli/fedpt.py)
    fedge attack RUN_DIR --attack dlg|mia                        privacy attacks as measurements (cli/attack.py)

Bad input (unknown key, wrong type, out-of-range or non-finite value, unknown name, missing
data, an unwritable --out) prints one ``error:`` line naming the value and the fix and exits
with status 2, leaving no run directory (cli/common.py holds the shared pieces).
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import typer  # noqa: E402

from fedge.cli import attack, bench, export, fedpt, privacy, run, show  # noqa: E402
from fedge.cli.common import EXIT_BAD_INPUT  # noqa: E402

__all__ = ["EXIT_BAD_INPUT", "app", "main"]

app = typer.Typer(
    name="fedge",
    help="Federated learning on resource-constrained edge devices, measured honestly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        import platform

        import torch

        from fedge.core.version import __version__

        typer.echo(
            f"fedge {__version__} (torch {torch.__version__}, Python {platform.python_version()})"
        )
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="print fedge's version (and torch's and Python's) and exit",
    ),
) -> None:
    """Federated learning on resource-constrained edge devices, measured honestly."""


app.command("run", context_settings={"allow_extra_args": True})(run.run)
app.command("datasets")(show.datasets)
app.command("models")(show.models)
app.command("report")(show.report)
app.command("compare")(show.compare)
app.command("partition")(show.partition)
app.command("export")(export.export)
app.add_typer(bench.bench_app, name="bench")
app.add_typer(privacy.app, name="privacy")
fedpt.register(app)  # fedge fedpt-search
attack.register(app)  # fedge attack


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
