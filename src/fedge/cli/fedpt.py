"""FedPT commands: ``fedge fedpt-search`` (the paper's partition search) and the block table
behind ``fedge models --blocks MODEL``.

    fedge fedpt-search CONFIG --budget-rounds R --tolerance 0.02 [--out DIR] [--max-trials N]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fedge.cli.common import fail, set_options
from fedge.core.errors import FedgeError

__all__ = ["fedpt_search", "print_blocks", "register"]

err = Console(stderr=True)
out = Console()


def print_blocks(model: str, input_shape: tuple[int, int, int], num_classes: int) -> None:
    """The parameter blocks of ``model`` (``fedge models --blocks MODEL``): what ``method.freeze`` can name."""
    from fedge.models import build_model
    from fedge.models.blocks import model_blocks

    try:
        net = build_model(model, input_shape=input_shape, num_classes=num_classes, seed=0)
    except FedgeError as exc:
        fail(exc)
    blocks = model_blocks(net)
    total = sum(b.params for b in blocks)
    table = Table(
        "block",
        "kind",
        "parameters",
        "share",
        "freezable",
        title=f"{model} on {input_shape}: {total:,} parameters",
    )
    for b in blocks:
        table.add_row(
            b.name, b.kind, f"{b.params:,}", f"{100 * b.params / total:.2f}%", f"{b.freezable:,}"
        )
    out.print(table)
    out.print(
        "freeze with --set method.freeze=[BLOCK,...] or method.freeze=largest (normalization layers stay trainable)",
        markup=False,
    )


def fedpt_search(
    config: Annotated[
        str, typer.Argument(help="preset name or YAML file with method fedavg or fedpt")
    ],
    budget_rounds: Annotated[int, typer.Option("--budget-rounds", help="rounds per trial")] = 5,
    tolerance: Annotated[
        float, typer.Option(help="accuracy drop (0-1) a frozen block may cost")
    ] = 0.02,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="override a config key: --set dataset.limit_train=2000"),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="directory for the trials and search.json")
    ] = None,
    max_trials: Annotated[
        int | None,
        typer.Option("--max-trials", help="stop after this many trials besides the baseline"),
    ] = None,
) -> None:
    """FedPT's search for a partially trainable network (principles 1-4).

    Freeze the largest block, add blocks while accuracy holds, switch to a smaller one when it drops."""
    import time

    from fedge.core.config import load_config
    from fedge.experiment.fedpt_search import Trial
    from fedge.experiment.fedpt_search import fedpt_search as search

    def show(t: Trial) -> None:
        verdict = "baseline" if t.accepted is None else ("accepted" if t.accepted else "rejected")
        frozen = ", ".join(t.freeze) or "(nothing)"
        err.print(
            f"{verdict:9s} frozen {frozen}: trainable {100 * t.trainable_fraction:.2f}%, "
            f"accuracy {t.accuracy:.4f}, bytes/client/round {t.bytes_down:,.0f} down {t.bytes_up:,.0f} up"
        )

    target = out_dir or Path("runs") / f"fedpt-search-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        cfg = load_config(config, overrides=set_options(set_))
        result = search(
            cfg,
            budget_rounds=budget_rounds,
            tolerance=tolerance,
            out=target,
            max_trials=max_trials,
            progress=show,
        )
    except FedgeError as exc:
        fail(exc)
    table = Table("trial", "frozen", "trainable %", "accuracy", "bytes down", "bytes up", "verdict")
    for i, t in enumerate([result["baseline"], *result["trials"]]):
        verdict = (
            "baseline" if t["accepted"] is None else ("accepted" if t["accepted"] else "rejected")
        )
        table.add_row(
            str(i),
            ", ".join(t["freeze"]) or "-",
            f"{100 * t['trainable_fraction']:.2f}",
            f"{t['accuracy']:.4f}",
            f"{t['bytes_down']:,.0f}",
            f"{t['bytes_up']:,.0f}",
            verdict,
        )
    out.print(table)
    chosen = result["chosen"]
    out.print(
        f"chosen: --set method.freeze=[{','.join(chosen['freeze'])}]  (trainable {100 * chosen['trainable_fraction']:.2f}%, "
        f"accuracy {chosen['accuracy']:.4f}, baseline {result['baseline']['accuracy']:.4f})",
        markup=False,
    )
    out.print(f"wrote {target / 'search.json'}", markup=False)


def register(app: typer.Typer) -> None:
    """Add the FedPT commands to the ``fedge`` app."""
    app.command("fedpt-search")(fedpt_search)
