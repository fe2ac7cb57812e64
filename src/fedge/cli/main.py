"""The ``fedge`` command line: the app and its commands, one module per concern; bad input prints
one ``error:`` line naming the value and the fix and exits with status 2.
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
app.command("methods")(show.methods)
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
