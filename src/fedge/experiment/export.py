"""The trained model of a run directory: load it, and export it for on-device inference
(TorchScript, ``torch.export`` or ONNX, with its preprocessing in ``fedge.json``).
Design notes: docs/decisions.md#experiment-and-reports.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from fedge.core.config import load_config
from fedge.core.errors import ConfigError, DataNotFoundError, ResumeError
from fedge.core.rundir_schema import MODEL
from fedge.core.validation import path_argument
from fedge.experiment import storage
from fedge.experiment.build import BuiltRun, rebuild_run
from fedge.experiment.rundir import RunDir

__all__ = [
    "ExportResult",
    "TrainedModel",
    "WithheldModelError",
    "export_model",
    "load_trained_model",
]

Format = Literal["torchscript", "pt2", "onnx"]
FORMATS: dict[str, str] = {"torchscript": "model.pt", "pt2": "model.pt2", "onnx": "model.onnx"}
"""Each export format and the file name it is written to by default (in the run directory)."""


@dataclass
class TrainedModel:
    """A run's final model (eval mode) and what inference needs to know about its inputs."""

    model: torch.nn.Module
    masks: dict[str, torch.Tensor]  # name -> bool keep-mask; {} for a dense model
    input_shape: tuple[int, ...]
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    withheld: tuple[
        str, ...
    ] = ()  # tensors kept in PPFL's enclaves (``withheld_ok``): at their initial values here

    def metadata(self) -> dict[str, Any]:
        return {
            "input_shape": list(self.input_shape),
            "num_classes": len(self.classes),
            "classes": list(self.classes),
            "mean": list(self.mean),
            "std": list(self.std),
            "normalize": "x_norm = (x / scale - mean) / std, per channel (images) or feature",
            "density": _density(self.model, self.masks),
        }


def _density(model: torch.nn.Module, masks: dict[str, torch.Tensor]) -> float | None:
    if not masks:
        return None
    kept = sum(int(m.sum()) for m in masks.values())
    return kept / sum(m.numel() for m in masks.values())


def _find_masks(obj: Any, depth: int = 0, seen: set[int] | None = None) -> dict[str, torch.Tensor]:
    """The ``masks`` dict (name -> bool tensor) held by a built strategy or its wrappers."""
    seen = set() if seen is None else seen
    if depth > 5 or id(obj) in seen or not type(obj).__module__.startswith("fedge."):
        return {}
    seen.add(id(obj))
    masks = getattr(obj, "masks", None)
    if (
        isinstance(masks, dict)
        and masks
        and all(isinstance(m, torch.Tensor) and m.dtype == torch.bool for m in masks.values())
    ):
        return masks
    for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
        found = _find_masks(value, depth + 1, seen)
        if found:
            return found
    return {}


class WithheldModelError(ResumeError):
    """The run's last stage stayed inside PPFL's enclaves (``method.keep_last_in_tee``): no
    complete model exists outside them. ``kept`` names the tensors."""

    def __init__(self, message: str, *, kept: list[str]) -> None:
        super().__init__(message)
        self.kept = kept


def _kept_in_tee(
    built: BuiltRun, model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> list[str]:
    """The tensors a PPFL run kept in its enclaves: in the model, absent from the file, and all
    of the last stage (a run that ended before its last stage released everything)."""
    if not getattr(built.method_config, "keep_last_in_tee", False):
        return []
    names = set(model.state_dict())
    absent = sorted(names - set(state))
    stages = getattr(built.method.strategy, "stages", None)  # PPFL's stage plan
    if not stages:
        return []
    if not absent or set(state) - names or not all(stages[-1].holds(k) for k in absent):
        return []
    return absent


def _names(keys: list[str]) -> str:
    """``classifier.0.weight, classifier.0.bias`` -> ``classifier.0``."""
    return ", ".join(sorted({k.rsplit(".", 1)[0] for k in keys}))


def load_trained_model(run_dir: str | Path, *, withheld_ok: bool = False) -> TrainedModel:
    """The final model of a complete run (``model.safetensors``), masks applied, in eval mode.

    The architecture is rebuilt from the run's ``config.yaml`` (which also reloads the data,
    for its shape and normalization statistics, and the method, for a pruned model's masks).

    Args:
        withheld_ok: for a PPFL run that kept its last stage in the enclaves, load the layers it
            released and leave the kept ones at their initial values, named in
            :attr:`TrainedModel.withheld` (what an attacker holding the released layers starts
            from); without it such a run is a :class:`WithheldModelError`.

    Raises:
        ResumeError: not a run directory, or the run has not finished (no model yet).
        WithheldModelError: the run kept its last stage in the enclaves (see ``withheld_ok``).
    """
    rundir = RunDir(run_dir)
    raw = rundir.read_config()
    weights = rundir.path / MODEL
    if not rundir.is_complete():
        raise ResumeError(
            f"run {str(rundir.path)!r} has no final model yet (it is not complete); finish it "
            f"with: fedge run --resume {rundir.path}"
        )
    if not weights.is_file():
        raise ResumeError(
            f"run {str(rundir.path)!r} is complete but its model.safetensors is missing (deleted or moved); "
            "put it back, or train the run anew into another --out"
        )
    try:
        # the model is rebuilt and exported on the CPU, whatever device trained it (a run made on
        # a GPU exports on a machine without one)
        built: BuiltRun = rebuild_run(load_config({**raw, "device": "cpu"}))
    except DataNotFoundError as exc:
        raise DataNotFoundError(
            f"the model of run {str(rundir.path)!r} is rebuilt from the run's config, which reads "
            f"its dataset (input shape, normalization statistics): {exc}"
        ) from None
    model = built.model_fn()
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise ResumeError(
            f"{str(weights)!r} cannot be read as safetensors ({exc}): the file is corrupt or truncated; "
            "put back an intact copy, or train the run anew into another --out"
        ) from None
    missing = sorted(set(model.state_dict()) ^ set(state))
    kept = _kept_in_tee(built, model, state)
    if kept and not withheld_ok:
        raise WithheldModelError(
            f"run {str(rundir.path)!r} kept its last stage ({_names(kept)}) inside the enclaves "
            "(method.keep_last_in_tee, PPFL's defence against membership inference): model.safetensors holds only "
            "the layers before it, so there is no complete model to load or export; train with --set "
            "method.keep_last_in_tee=false to release it",
            kept=kept,
        )
    if missing and not kept:
        raise ResumeError(
            f"{str(weights)!r} does not match the run's model "
            f"{raw.get('model', {}).get('name')!r} (keys {missing[:3]} differ)"
        )
    model.load_state_dict(state, strict=not kept)
    sim = built.simulation()
    checkpoint = rundir.load_checkpoint()
    if checkpoint is not None:
        sim.load_state_dict(checkpoint)
    masks = {k: v.clone() for k, v in _find_masks(sim.strategy).items()}
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, mask in masks.items():
            params[name].mul_(mask.to(params[name].dtype))  # pruned weights exactly 0
    model.eval()
    ds = built.dataset
    return TrainedModel(
        model,
        masks,
        tuple(ds.input_shape),
        tuple(ds.classes),
        tuple(ds.mean),
        tuple(ds.std),
        tuple(kept),
    )


def _export_onnx(
    model: torch.nn.Module, example: torch.Tensor, path: Path, meta: dict[str, Any]
) -> None:
    """ONNX with a dynamic batch axis (input ``x``, output ``logits``) and ``fedge.json`` in
    the model's metadata_props."""
    import contextlib
    import io

    import onnx

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=["x"],
            output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}},
            external_data=False,
        )
    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = "fedge.json", json.dumps(meta)
    onnx.save(proto, str(path))


@dataclass(frozen=True)
class ExportResult:
    path: Path
    format: str
    metadata: dict[str, Any]


def export_model(
    run_dir: str | Path, *, format: Format = "torchscript", out: str | Path | None = None
) -> ExportResult:
    """Write a complete run's model for on-device inference.

    Args:
        format: ``"torchscript"`` (``torch.jit.load``-able, metadata in ``fedge.json``),
            ``"pt2"`` (a ``torch.export`` program, ``torch.export.load``-able, batch axis
            dynamic, metadata in the extra file ``fedge.json``) or ``"onnx"`` (needs the
            ``onnx`` package).
        out: the file to write; default ``RUN_DIR/`` ``model.pt``, ``model.pt2`` or ``model.onnx``.

    Returns:
        where it was written, the format, and the input metadata.
    """
    if format not in FORMATS:
        raise ConfigError(
            f"export format {format!r} is not supported; expected one of {', '.join(FORMATS)}"
        )
    # the run folder first: a mistyped path is reported before a missing optional package
    trained = load_trained_model(run_dir)
    if format == "onnx":
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError:
            raise ConfigError(
                "ONNX export needs the onnx and onnxscript packages, which are not installed "
                "here; install them with `pip install 'fedge[onnx]'` (or `pip install onnx "
                "onnxscript`), or use --format torchscript"
            ) from None
    name = FORMATS[format]
    dest = (
        path_argument("export out", out, what="a file path")
        if out is not None
        else Path(run_dir) / name
    )
    if dest.is_dir():
        raise ConfigError(
            f"export --out {str(dest)!r} is a directory; name the file to write, e.g. --out {dest / name}"
        )
    fix = f"choose a writable --out, e.g. --out ./{name}"
    with storage.failing_as(dest.parent, "create the folder", fix):
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(
                f"export --out {str(dest)!r}: a part of its folder {str(dest.parent)!r} is a file; choose another --out"
            ) from None
    meta = trained.metadata()
    example = torch.zeros((1, *trained.input_shape))
    tmp = dest.with_name(dest.name + ".tmp")
    # a read-only or full target is one StorageError naming it; the probe finds it before the
    # exporters, which report a file they cannot open as a RuntimeError without the path
    with storage.failing_as(dest, "write", fix, tmp=tmp):
        storage.write_file(tmp, b"")
        try:
            _write_model(trained, format, example, tmp, meta)
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)  # a failed write leaves nothing half-written
    return ExportResult(dest, format, meta)


def _write_model(
    trained: TrainedModel, format: Format, example: torch.Tensor, tmp: Path, meta: dict[str, Any]
) -> None:
    if format == "torchscript":
        # tracing records one forward; the models are static graphs (no data-dependent
        # control flow: their shape checks are constants for a fixed input shape), and the
        # test checks the trace against the model on a batch of another size
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
            traced = torch.jit.trace(trained.model, example)
            torch.jit.save(traced, str(tmp), _extra_files={"fedge.json": json.dumps(meta)})
    elif format == "pt2":
        _export_program(trained.model, torch.zeros((2, *trained.input_shape)), tmp, meta)
    else:
        _export_onnx(trained.model, torch.zeros((2, *trained.input_shape)), tmp, meta)


def _export_program(
    model: torch.nn.Module, example: torch.Tensor, path: Path, meta: dict[str, Any]
) -> None:
    """``torch.export`` the model with a dynamic batch axis (traced on a batch of two, so the
    axis is not specialised to 1) and save it with ``fedge.json`` as an extra file. Checked on
    torch 2.13 for every registered model at batch sizes 1 and 5; older torch builds, whose
    ``torch.export`` treated batch sizes 0 and 1 specially, are not tested here."""
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path), extra_files={"fedge.json": json.dumps(meta)})
