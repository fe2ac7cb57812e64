"""PPFL's configuration (seed 001): the stage schedule (Algorithm 1-2), the client's local training,
the enclaves' sizes, the server enclave's cohort rule, whether the last stage stays in the enclaves,
and transfer from a pretrained model (Sec. 4.1; its experiment, Sec. 6.6), with
:func:`init_arrays`, the model's initial arrays under ``init_from``. Details:
``docs/methods/ppfl.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator

from fedge.core import rundir_schema
from fedge.core.errors import ConfigError
from fedge.methods.base import MethodConfigBase, MethodEnv

__all__ = ["PpflConfig", "PpflTeeConfig", "init_arrays"]


class PpflTeeConfig(MethodConfigBase):
    client_mb: float = Field(
        16.0, gt=0, description="client enclave size when its profile gives no enclave_mb"
    )
    server_mb: float = Field(256.0, gt=0, description="server enclave size")


class PpflConfig(MethodConfigBase):
    name: Literal["ppfl"] = "ppfl"
    block_layers: int = Field(
        1, ge=1, description="conv blocks trained together per stage (Table 5)"
    )
    rounds_per_stage: int | None = Field(None, ge=1, description="fixed schedule: rounds per stage")
    patience: int | None = Field(
        None, ge=1, description="end a stage after this many rounds without a better test accuracy"
    )
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="end a stage when test accuracy reaches this"
    )
    stage_patience: int | None = Field(
        None,
        ge=1,
        description="end a stage once its validation accuracy (dataset.validation) has not risen "
        "above the stage's best by more than stage_min_delta for this many evaluated rounds: "
        "it has plateaued",
    )
    stage_min_delta: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="a rise of validation accuracy over the stage's best must exceed this to count "
        "as an improvement for stage_patience",
    )
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(16, ge=1)
    min_batch_size: int | None = Field(
        None, ge=1, description="smallest batch a client may shrink to (null: no shrinking)"
    )
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    tee: PpflTeeConfig = PpflTeeConfig()
    on_bad_upload: Literal["drop", "abort"] = "drop"
    min_cohort: int = Field(
        2,
        ge=1,
        description="fewest uploads the server enclave averages: a round with fewer that "
        "open is skipped (under clients.min_replies) or stops the run, so the REE never gets one "
        "client's update as a stage's layers; 1 allows exactly that",
    )
    keep_last_in_tee: bool = Field(
        True,
        description="when training ends, keep the last stage (the classifier) inside the "
        "enclaves: the REE and model.safetensors get only the layers before it (Sec. 3, "
        "PPFL's defence against membership inference)",
    )
    init_from: str | None = Field(
        None, description="pretrained model.safetensors, or a run directory holding one"
    )
    freeze_from_init: int = Field(0, ge=0, description="stages taken as trained from init_from")

    @model_validator(mode="after")
    def _check(self) -> PpflConfig:
        if (
            self.rounds_per_stage is None
            and self.patience is None
            and self.target_accuracy is None
            and self.stage_patience is None
        ):
            raise ValueError(
                "ppfl needs a stage schedule: set method.rounds_per_stage, method.patience, "
                "method.stage_patience or method.target_accuracy"
            )
        if self.stage_min_delta and self.stage_patience is None:
            raise ValueError(
                f"method.stage_min_delta={self.stage_min_delta} acts only with method.stage_patience; "
                "set stage_patience (rounds without a validation gain) or drop stage_min_delta"
            )
        if self.min_batch_size is not None and self.min_batch_size > self.batch_size:
            raise ValueError(
                f"method.min_batch_size={self.min_batch_size} exceeds batch_size={self.batch_size}"
            )
        if self.freeze_from_init and self.init_from is None:
            raise ValueError(
                "method.freeze_from_init needs method.init_from (the pretrained model)"
            )
        return self


def init_arrays(cfg: PpflConfig, env: MethodEnv) -> dict[str, torch.Tensor]:
    model = env.model_fn()
    arrays = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if cfg.init_from is None:
        return arrays
    path = Path(cfg.init_from)
    if path.is_dir():
        path = path / rundir_schema.MODEL
    if not path.is_file():
        raise ConfigError(
            f"method.init_from={cfg.init_from!r}: no such file (expected a model.safetensors or a run directory holding one)"
        )
    from safetensors.torch import load_file

    loaded = load_file(str(path))
    unknown = sorted(set(loaded) - set(arrays))
    if unknown:
        raise ConfigError(
            f"method.init_from={cfg.init_from!r} holds tensors {unknown[:5]} this model lacks; pretrain the same model"
        )
    for k, v in loaded.items():
        if v.shape != arrays[k].shape:
            raise ConfigError(
                f"method.init_from: {k} has shape {tuple(v.shape)}, the model expects {tuple(arrays[k].shape)}"
            )
        arrays[k] = v.to(arrays[k].dtype)
    return arrays
