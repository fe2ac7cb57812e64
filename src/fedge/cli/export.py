"""``fedge export RUN_DIR [--format torchscript|pt2|onnx] [--out FILE]``: the trained model for the edge.

Only parses and calls :func:`fedge.experiment.export.export_model`; bad input prints one
message and exits with status 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fedge.cli.common import fail
from fedge.core.errors import FedgeError

__all__ = ["export"]


def export(
    run_dir: Annotated[Path, typer.Argument(help="a complete run directory")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="torchscript (model.pt), pt2 (torch.export, model.pt2) or onnx (model.onnx)",
        ),
    ] = "torchscript",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="file to write (default RUN_DIR/model.pt, .pt2 or .onnx by --format)"
        ),
    ] = None,
) -> None:
    """Write a run's trained model (pruned weights exactly zero) for on-device inference."""
    from fedge.experiment.export import export_model

    try:
        result = export_model(run_dir, format=format, out=out)  # type: ignore[arg-type]
    except FedgeError as exc:
        fail(exc)
    meta = result.metadata
    Console().print(
        f"wrote {result.path} ({result.format}; input {tuple(meta['input_shape'])}, "
        f"{meta['num_classes']} classes"
        + (f", density {meta['density']:.4f}" if meta["density"] else "")
        + "; normalization in fedge.json)",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
