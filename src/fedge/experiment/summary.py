"""A finished run's summary: what ``summary.json`` holds besides its status and machines (the
final and best accuracies, the totals of bytes and FLOPs, the method, model, dataset and seed,
the model's size, the server's warm start), with the figures each side-evaluated model and the method itself add.
"""

from __future__ import annotations

from typing import Any

from fedge.core.messages import Message
from fedge.experiment.build import BuiltRun
from fedge.methods import get_method
from fedge.methods.base import model_arrays
from fedge.runtime.engine import Simulation
from fedge.runtime.fairness import FAIRNESS_KEYS

__all__ = ["run_summary", "side_summary"]


def run_summary(built: BuiltRun, sim: Simulation, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``summary.json`` says of the finished simulation ``sim`` of ``built``, whose rounds
    wrote ``lines``: the accuracies, the totals, what the run was, and the figures the method
    and the side-evaluated models add."""
    cfg, rec = built.config, sim.record
    model = sim.strategy.eval_model()
    out: dict[str, Any] = {
        "final_test_accuracy": rec.last_test_accuracy,
        "best_test_accuracy": rec.best_test_accuracy,
        **(
            {
                "best_val_accuracy": rec.extra["best_val_accuracy"],
                "test_accuracy_at_best_val": rec.extra["test_at_best_val"],
                "best_val_round": rec.extra["best_val_round"],
            }
            if "best_val_accuracy" in rec.extra
            else {}
        ),
        **({"stopped": rec.extra["stopped"]} if "stopped" in rec.extra else {}),
        **(
            {"skipped_rounds": rec.extra["skipped_rounds"]} if "skipped_rounds" in rec.extra else {}
        ),
        # client id -> the first round that aggregated it: whose samples the model trained on
        **(
            {"first_aggregated": rec.extra["first_aggregated"]}
            if "first_aggregated" in rec.extra
            else {}
        ),
        **(
            {"epsilon": lines[-1]["epsilon"], "delta": cfg.privacy.model_dump().get("delta", 1e-6)}
            if lines and "epsilon" in lines[-1]
            else {}
        ),
        # the time model (clients.profiles' gflops and links): simulated seconds of every round
        **(
            {"sim_time_total_s": rec.extra["sim_time_total_s"]}
            if "sim_time_total_s" in rec.extra
            else {}
        ),
        # profiles whose memory_mb a client step's measured peak exceeded (MiB)
        **({"memory_over": rec.extra["memory_over"]} if "memory_over" in rec.extra else {}),
        "total_bytes_down": rec.cum_bytes_down,
        "total_bytes_up": rec.cum_bytes_up,
        "total_client_flops": rec.cum_client_flops if cfg.measure.flops else None,
        # the server's pretraining (warm_start): its public size and cost, never client FLOPs
        **({"warm_start": built.warm_start.record} if built.warm_start is not None else {}),
        "rounds": rec.round,
        "method": cfg.method.name,
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "dataset_source": built.dataset.source,
        "seed": cfg.seed,
        "wall_s": sum(x.get("wall_s", 0.0) for x in lines),
        "model_params": sum(p.numel() for p in model.parameters()),
        "model_bytes": len(Message(model_arrays(model)).to_bytes()),
    }
    for name in sim.strategy.side_eval_models():  # e.g. "raw": the EMA wrapper's raw global model
        out.update(side_summary(name, rec.extra, lines))
    fair = [x for x in lines if x.get(FAIRNESS_KEYS[0]) is not None]
    if fair:  # the last per-client evaluation (partition.local_test): final_client_acc_mean, ...
        out.update({f"final_{k}": fair[-1][k] for k in FAIRNESS_KEYS})
    if "test_top5" in (lines[-1] if lines else {}):
        out["final_test_top5"] = lines[-1]["test_top5"]
    for key in get_method(cfg.method.name).summary_keys:  # what the method reports each round
        if lines and key in lines[-1]:
            out[key] = lines[-1][key]
    if cfg.measure.memory:
        for key in ("client_peak_bytes", "client_tensor_peak_bytes", "client_rss_growth_bytes"):
            vals = [x[key] for x in lines if x.get(key) is not None]
            out[key] = max(vals) if vals else None
    return out


def side_summary(name: str, extra: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, Any]:
    """A side-evaluated model's summary figures (``<name>_final_test_accuracy``, ...), named as
    the main model's with the prefix."""
    accs = [x[f"{name}_test_accuracy"] for x in lines if x.get(f"{name}_test_accuracy") is not None]
    out: dict[str, Any] = {
        f"{name}_final_test_accuracy": lines[-1].get(f"{name}_test_accuracy") if lines else None,
        f"{name}_best_test_accuracy": max(accs) if accs else None,
    }
    if f"{name}_best_val_accuracy" in extra:
        out.update(
            {
                f"{name}_best_val_accuracy": extra[f"{name}_best_val_accuracy"],
                f"{name}_test_accuracy_at_best_val": extra[f"{name}_test_at_best_val"],
                f"{name}_best_val_round": extra[f"{name}_best_val_round"],
            }
        )
    return out
