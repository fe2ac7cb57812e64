"""The run directory's schema: the names of the files a run writes, the keys of its
``metrics.jsonl`` lines and ``summary.json`` that readers depend on, and their strict-JSON
encoding (:func:`dumps`, :func:`loads`). Design notes: docs/decisions.md#core.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = [
    "APPLIED_CONFIG",
    "BEST_TEST_ACCURACY",
    "BYTES_DOWN",
    "BYTES_UP",
    "CHECKPOINT",
    "CLAIM",
    "CLIENTS",
    "CLIENT_FLOPS",
    "CLIENT_FLOPS_EFFECTIVE",
    "CLIENT_PEAK_BYTES",
    "CLIENT_TENSOR_PEAK_BYTES",
    "CLIENT_RSS_GROWTH_BYTES",
    "CLIENT_ACCURACY",
    "CLIENT_ACC_BEST10",
    "CLIENT_ACC_MEAN",
    "CLIENT_ACC_VAR",
    "CLIENT_ACC_WORST10",
    "COMPLETE",
    "CONFIG",
    "CONFIG_CHANGES",
    "CUM_BYTES_DOWN",
    "CUM_BYTES_UP",
    "CUM_CLIENT_FLOPS",
    "CUM_CLIENT_FLOPS_EFFECTIVE",
    "FAIRNESS_KEYS",
    "FINAL_TEST_ACCURACY",
    "METRICS",
    "MODEL",
    "MODEL_BYTES",
    "MODEL_PARAMS",
    "NON_FINITE",
    "PARTITION",
    "PAYLOAD_BYTES_DOWN",
    "PAYLOAD_BYTES_UP",
    "PHASES",
    "PLOTS",
    "REPORT_HTML",
    "REPORT_MD",
    "ROUND",
    "ROUNDS",
    "ROUND_KEYS",
    "SECAGG_BYTES_DOWN",
    "SECAGG_BYTES_UP",
    "SESSIONS",
    "SIM_CLIENTS",
    "SIM_TIME_S",
    "SIM_TIME_TOTAL_S",
    "STATUS",
    "STOPPED",
    "SUMMARY",
    "SUMMARY_KEYS",
    "TEST_ACCURACY",
    "TEST_ACCURACY_AT_BEST_VAL",
    "TEST_LOSS",
    "TOTAL_BYTES_DOWN",
    "TOTAL_BYTES_UP",
    "TOTAL_CLIENT_FLOPS",
    "VAL_ACCURACY",
    "WALL_S",
    "dumps",
    "loads",
]

# ---- files, in the order a run writes them
CLAIM = ".fedge-claim"  # created exclusively before anything else: one run owns the directory
APPLIED_CONFIG = ".fedge-config.json"  # the resolved config as last run (what --resume checks)
CONFIG = "config.yaml"  # the resolved config, every default filled in
CONFIG_CHANGES = "config_changes.jsonl"  # edits accepted by --resume --allow-config-change
PARTITION = "partition.json"  # samples and label histogram per client
METRICS = "metrics.jsonl"  # one JSON object per completed round
SESSIONS = "sessions.jsonl"  # one line each time rounds are driven: first round and machine
CHECKPOINT = "checkpoint.pt"  # state after the last completed round, for --resume
MODEL = "model.safetensors"  # the final model (the one evaluated)
SUMMARY = "summary.json"  # written last
PLOTS = "plots"  # a folder: the report's figures
REPORT_MD = "report.md"
REPORT_HTML = "report.html"

# ---- keys of every metrics.jsonl line
ROUND = "round"  # 1-based
CLIENTS = "clients"  # clients sampled this round
TEST_ACCURACY = "test_accuracy"  # null on rounds not evaluated
TEST_LOSS = "test_loss"
BYTES_DOWN = "bytes_down"  # this round's bytes, summed over its clients
BYTES_UP = "bytes_up"
CLIENT_FLOPS = "client_flops"
CUM_BYTES_DOWN = "cum_bytes_down"  # bytes of rounds 1..round
CUM_BYTES_UP = "cum_bytes_up"
CUM_CLIENT_FLOPS = "cum_client_flops"
WALL_S = "wall_s"  # the round's wall time; in the summary, the rounds' total
ROUND_KEYS = frozenset(
    {
        ROUND,
        CLIENTS,
        TEST_ACCURACY,
        TEST_LOSS,
        BYTES_DOWN,
        BYTES_UP,
        CLIENT_FLOPS,
        CUM_BYTES_DOWN,
        CUM_BYTES_UP,
        CUM_CLIENT_FLOPS,
        WALL_S,
    }
)

# ---- keys of some metrics lines
VAL_ACCURACY = "val_accuracy"  # with dataset.validation
PHASES = "phases"  # exchanges of a round that ran more than one
# with secure aggregation (fedge.methods.secure), on the rounds it completes: BYTES_DOWN and
# BYTES_UP split into the method's own messages (PAYLOAD: what the server configured for each
# client, serialized alone, and each client's masked input, its reply to the third exchange) and
# the rest of the protocol (SECAGG: the participant ids, key agreement, the share forwards riding
# with the method's message, unmasking); PAYLOAD + SECAGG = BYTES, both ways
PAYLOAD_BYTES_DOWN = "payload_bytes_down"
PAYLOAD_BYTES_UP = "payload_bytes_up"
SECAGG_BYTES_DOWN = "secagg_bytes_down"
SECAGG_BYTES_UP = "secagg_bytes_up"
CLIENT_FLOPS_EFFECTIVE = "client_flops_effective"  # FLOPs of non-zero weights (sparse models)
CUM_CLIENT_FLOPS_EFFECTIVE = "cum_client_flops_effective"
# with measure.memory (also in the summary): the per-round peak (tensor accounting, as
# CLIENT_TENSOR_PEAK_BYTES; on a CUDA device the CUDA allocator's peak per client step:
# torch.cuda.max_memory_allocated after reset_peak_memory_stats, less what the step started
# with, plus the resident model), and the growth of the process RSS high-water mark during the steps
CLIENT_PEAK_BYTES = "client_peak_bytes"
CLIENT_TENSOR_PEAK_BYTES = "client_tensor_peak_bytes"
CLIENT_RSS_GROWTH_BYTES = "client_rss_growth_bytes"
# with the time model (clients.profiles' gflops and links; fedge.runtime.fleet): the round's
# simulated seconds, their running total (also in the summary), and each client's
# {"down_s", "compute_s", "up_s"[, "straggler": true]} by client id
SIM_TIME_S = "sim_time_s"
SIM_TIME_TOTAL_S = "sim_time_total_s"
SIM_CLIENTS = "sim_clients"
# with partition.local_test, on the rounds its splits are evaluated (local_eval_every): the
# global model's accuracy on each client's local test split (a list, index = client id, null
# for a client that holds none out), and q-FFL's four statistics of them
# (fedge.runtime.fairness.fairness_stats; the summary has each as final_<key>)
CLIENT_ACCURACY = "client_accuracy"
CLIENT_ACC_MEAN = "client_acc_mean"
CLIENT_ACC_WORST10 = "client_acc_worst10"
CLIENT_ACC_BEST10 = "client_acc_best10"
CLIENT_ACC_VAR = "client_acc_var"
FAIRNESS_KEYS = (CLIENT_ACC_MEAN, CLIENT_ACC_WORST10, CLIENT_ACC_BEST10, CLIENT_ACC_VAR)

# ---- keys of a complete summary.json
STATUS = "status"
# A run is complete once it has ended as its config decides: every round run, or stopped early
# by its own rule (a privacy budget spent: privacy.target_epsilon), which STOPPED then names.
# A run whose budget allows no round is complete with ROUNDS = 0 (its model the initial one):
# a resume could run nothing more, so it is not left claiming a run that can continue.
COMPLETE = "complete"  # the value of STATUS once the run has finished
FINAL_TEST_ACCURACY = "final_test_accuracy"
BEST_TEST_ACCURACY = "best_test_accuracy"
TOTAL_BYTES_DOWN = "total_bytes_down"
TOTAL_BYTES_UP = "total_bytes_up"
TOTAL_CLIENT_FLOPS = "total_client_flops"
ROUNDS = "rounds"  # rounds completed
MODEL_PARAMS = "model_params"
MODEL_BYTES = "model_bytes"
SUMMARY_KEYS = frozenset(
    {
        STATUS,
        FINAL_TEST_ACCURACY,
        BEST_TEST_ACCURACY,
        TOTAL_BYTES_DOWN,
        TOTAL_BYTES_UP,
        TOTAL_CLIENT_FLOPS,
        ROUNDS,
        "method",
        "model",
        "dataset",
        "seed",
        WALL_S,
        MODEL_PARAMS,
        MODEL_BYTES,
    }
)
TEST_ACCURACY_AT_BEST_VAL = "test_accuracy_at_best_val"  # with dataset.validation
STOPPED = "stopped"  # why the run ended before its last round (absent when it ran them all)


# ---- how values are spelled
NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}  # JSON string -> float


def _encode(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _encode(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_encode(x) for x in v]
    return v


def _decode(v: Any) -> Any:
    if isinstance(v, str):
        return NON_FINITE.get(v, v)
    if isinstance(v, dict):
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """``obj`` as strict JSON: non-finite floats become their :data:`NON_FINITE` strings."""
    return json.dumps(_encode(obj), indent=indent, allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Parse what :func:`dumps` wrote, the :data:`NON_FINITE` strings back to floats
    (:class:`json.JSONDecodeError`, a :class:`ValueError`, if ``text`` is not JSON)."""
    return _decode(json.loads(text))
