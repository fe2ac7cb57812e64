"""The leakage table of every method: for each :class:`Row` (one method configuration) data
reconstruction (:mod:`fedge.attacks.reconstruct_run`, or activation inversion at an edge
server), membership inference on the released model (Yeom et al. 2018, Shokri et al. 2017,
offline LiRA of Carlini et al., S&P 2022; :mod:`fedge.attacks.membership_run`) and property
inference (Melis et al., S&P 2019; :mod:`fedge.attacks.property`), each run on what the
adversary observes in a tiny run of the method (:func:`privacy_row`, written to
docs/benchmarks.md by benchmarks/privacy_leakage.py); a cell that cannot be measured says why
(``{"skipped": reason}``). :func:`leakage_table` is the earlier DLG-only table
(:data:`LEAKAGE_ROWS`). See docs/privacy/attacks.md.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedge.attacks.harness import attack_config, observe_run, upload_of
from fedge.attacks.inversion import activation_inversion
from fedge.attacks.membership_run import membership_attacks, replay
from fedge.attacks.property import edge_pia_attack, pia_attack
from fedge.attacks.reconstruct_run import reconstruction_attack
from fedge.experiment.build import build_run

__all__ = [
    "LEAKAGE_ROWS",
    "ROWS",
    "Row",
    "leakage_table",
    "objective_note",
    "privacy_row",
    "privacy_table",
]

_SGD = {"name": "sgd", "lr": 0.1}


@dataclass(frozen=True)
class Row:
    label: str
    method: dict[str, Any]
    batch: int = 1  # samples per client in the DRA run (what one upload depends on)
    model: str = "lenet-dlg"
    pia_method: dict[str, Any] | None = None  # the method with batch 8 (None: ``method``)
    skip: dict[str, str] = field(default_factory=dict)  # attack -> why it is not measured
    privacy: dict[str, Any] | None = None  # the run's ``privacy:`` section (None: no DP)


def _baffle(k: int, secagg: bool) -> dict[str, Any]:
    return {"name": "baffle", "mode": "batch", "k": k, "ema": None, "secure_aggregation": secagg}


# Central DP on BAFFLE's K loss differences: clients clip the K values to L2 norm C, the server
# adds N(0, (zC)²) to their sum. C = 1e-3 is below every one-sample client's ‖ΔL‖ on lenet-dlg
# at σ's default (~0.002-0.004 at K=10, ~0.012 at K=100, ~0.04 at K=1000): clipping is active.
_DP = {"mechanism": "gaussian", "clip": 1e-3, "noise_multiplier": 1.0}
_DP_LABEL = f"DP clip {_DP['clip']:g}, z={_DP['noise_multiplier']:g}"
# The seed-and-scalar peers at their presets' sizes (configs/*-fmnist-lenet.yaml), and whether
# secure aggregation is their default: the server rebuilds a client's update Σ scalar·direction
# from its scalars and the public seeds (the harness's ``seed_scalars``).
_PEERS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("fedkseed, K=1024, 50 local steps", {"name": "fedkseed", "k": 1024, "local_steps": 50}, True),
    ("decomfl, P=5, 10 local steps", {"name": "decomfl", "p": 5, "local_steps": 10}, True),
    ("feedsign, 1 step a round", {"name": "feedsign"}, False),
)
_PEER_SECAGG = (
    "not run: under secure aggregation the server sees only the sum of the clients' scalars, so "
    "no client's update can be rebuilt (the harness refuses; the row without it measures the leak)"
)
_EPPFL_DP_CLIP = 100.0  # configs/eppfl-fmnist-vgg.yaml's per-sample L1 clip
_PPFL_PIA = (
    "not run: the server cannot simulate an upload to train the classifier on (the client program "
    "runs in an attested enclave whose session key the server lacks); it observes AES-GCM ciphertext"
)

ROWS: tuple[Row, ...] = (
    Row(
        "fedavg, 1 local SGD step, batch 1",
        {"name": "fedavg", "local_epochs": 1, "batch_size": 1, "client_optimizer": _SGD},
        pia_method={"name": "fedavg", "local_epochs": 1, "batch_size": 8, "client_optimizer": _SGD},
    ),
    Row(
        "fedsgd, batch 1",
        {"name": "fedsgd", "batch_size": 1},
        pia_method={"name": "fedsgd", "batch_size": 8},
    ),
    Row("fedsgd, batch 8", {"name": "fedsgd", "batch_size": 8}, batch=8),
    Row(
        "fedsgd, batch 1, secure aggregation",
        {"name": "fedsgd", "batch_size": 1, "secure_aggregation": True},
        pia_method={"name": "fedsgd", "batch_size": 8, "secure_aggregation": True},
    ),
    *(
        Row(f"baffle batch, K={k}, no secure aggregation", _baffle(k, False))
        for k in (10, 100, 1000)
    ),
    *(
        Row(f"baffle batch, K={k}, secure aggregation (default)", _baffle(k, True))
        for k in (10, 100, 1000)
    ),
    *(
        Row(
            f"baffle batch, K={k}, {_DP_LABEL}, no secure aggregation",
            _baffle(k, False),
            privacy=_DP,
        )
        for k in (10, 100, 1000)
    ),
    Row(f"baffle batch, K=100, {_DP_LABEL}, secure aggregation", _baffle(100, True), privacy=_DP),
    *(
        Row(
            f"baffle epoch, K={k}, 1 local step, batch 1",
            {
                "name": "baffle",
                "mode": "epoch",
                "k": k,
                "ema": None,
                "batch_size": 1,
                "local_epochs": 1,
                "client_optimizer": _SGD,
            },
            pia_method={
                "name": "baffle",
                "mode": "epoch",
                "k": k,
                "ema": None,
                "batch_size": 8,
                "local_epochs": 1,
                "client_optimizer": _SGD,
            },
        )
        for k in (10, 100, 1000)
    ),
    Row(
        "ntk-baffle batch, K=100, density 0.5, no secure aggregation",
        {
            "name": "ntk-baffle",
            "mode": "batch",
            "k": 100,
            "ema": None,
            "density": 0.5,
            "secure_aggregation": False,
        },
    ),
    Row(
        "ntk-baffle batch, K=100, density 0.5, secure aggregation (default)",
        {"name": "ntk-baffle", "mode": "batch", "k": 100, "ema": None, "density": 0.5},
    ),
    *(
        Row(
            f"{label}, batch 1, no secure aggregation{'' if on else ' (default)'}",
            {**peer, "batch_size": 1, "secure_aggregation": False},
            pia_method={**peer, "batch_size": 8, "secure_aggregation": False},
        )
        for label, peer, on in _PEERS
    ),
    *(
        Row(
            f"{label}, batch 1, secure aggregation{' (default)' if on else ''}",
            {**peer, "batch_size": 1, "secure_aggregation": True},
            skip={"dra": _PEER_SECAGG, "pia": _PEER_SECAGG},
        )
        for label, peer, on in _PEERS
    ),
    Row(
        "fedpt, largest layer frozen, 1 local SGD step, batch 1",
        {
            "name": "fedpt",
            "freeze": "largest",
            "local_epochs": 1,
            "batch_size": 1,
            "client_optimizer": _SGD,
        },
        pia_method={
            "name": "fedpt",
            "freeze": "largest",
            "local_epochs": 1,
            "batch_size": 8,
            "client_optimizer": _SGD,
        },
    ),
    Row(
        "eppfl, 1 local epoch, batch 1",
        {"name": "eppfl", "local_epochs": 1, "batch_size": 1},
        pia_method={"name": "eppfl", "local_epochs": 1, "batch_size": 8},
    ),
    *(
        Row(
            f"eppfl, 1 local epoch, batch 1, Laplace ε={eps:g} (clip {_EPPFL_DP_CLIP:g})",
            {
                "name": "eppfl",
                "local_epochs": 1,
                "batch_size": 1,
                "dp": {"epsilon": eps, "clip": _EPPFL_DP_CLIP},
            },
            pia_method={
                "name": "eppfl",
                "local_epochs": 1,
                "batch_size": 8,
                "dp": {"epsilon": eps, "clip": _EPPFL_DP_CLIP},
            },
        )
        for eps in (5.0, 1.0)
    ),
    Row(
        "fedavg, lenet-ppfl, 1 local SGD step, batch 1",
        {"name": "fedavg", "local_epochs": 1, "batch_size": 1, "client_optimizer": _SGD},
        model="lenet-ppfl",
        pia_method={"name": "fedavg", "local_epochs": 1, "batch_size": 8, "client_optimizer": _SGD},
    ),
    Row(
        "ppfl, lenet-ppfl, 1 local epoch, batch 1 (sealed uploads)",
        # the MIA attacks the released model: every layer released (the default keeps the classifier in the
        # enclaves, measured in the PPFL Table 2 analogue)
        {
            "name": "ppfl",
            "rounds_per_stage": 1,
            "local_epochs": 1,
            "batch_size": 1,
            "min_batch_size": 1,
            "keep_last_in_tee": False,
        },
        model="lenet-ppfl",
        skip={"pia": _PPFL_PIA},
    ),
)


def _quiet(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def privacy_row(
    row: Row,
    *,
    dataset: str = "fashion-mnist",
    clients: int = 4,
    iterations: int = 300,
    mia_clients: int = 4,
    mia_per_client: int = 64,
    mia_rounds: int = 10,
    mia_samples: int = 200,
    shadows: int = 2,
    pia_clients: int = 32,
    test: int = 1000,
    draws: str | None = None,
) -> dict[str, Any]:
    """Every attack on one row; each cell a result dict or ``{"skipped": reason}``, with its cost;
    ``draws``: the runs' generator (None: the config's default)."""
    out: dict[str, Any] = {"row": row.label}
    if "dra" in row.skip:
        out["dra"] = {"skipped": row.skip["dra"]}
    else:
        t = time.perf_counter()
        cfg = attack_config(
            row.method,
            clients=clients,
            per_client=row.batch,
            dataset=dataset,
            model=row.model,
            privacy=row.privacy,
            draws=draws,
        )
        # an edge server's view: the released activations
        eppfl = upload_of(cfg) == "edge_activations"
        run = _quiet(lambda: observe_run(cfg, parties=("edge",) if eppfl else ()))
        s = (
            activation_inversion(run, iterations=iterations)
            if eppfl
            else reconstruction_attack(run, iterations=iterations)
        )
        sizes = (
            [p.message.nbytes for p in run.party_records if p.message.config.get("op") == "step"]
            if eppfl
            else [v.reply_bytes for v in run.views]
        )
        best = min(s["attacks"], key=lambda a: s["attacks"][a]["median_mse"])
        out["dra"] = {
            "attack": best,
            "median_mse": s["attacks"][best]["median_mse"],
            "label_accuracy": s["attacks"][best].get("label_accuracy"),
            "all": {a: v["median_mse"] for a, v in s["attacks"].items()},
            "mean_image": s["baseline_mean_image_mse"],
            "mid_gray": s["baseline_mid_gray_mse"],
            "masked": s.get("masked", False),
            "sealed": any(v.sealed for v in run.views),
            "finite_objective": s["attacks"][best].get("finite_objective", 1.0),
            "upload_bytes": sorted(sizes)[len(sizes) // 2],
            "seconds": time.perf_counter() - t,
        }
        if eppfl:  # the aggregation server S_a's view of the same run: the masked M_c uploads
            sa = reconstruction_attack(run, iterations=iterations)
            a = min(sa["attacks"], key=lambda k: sa["attacks"][k]["median_mse"])
            out["dra"]["server"] = {
                "attack": a,
                "median_mse": sa["attacks"][a]["median_mse"],
                "masked": sa["masked"],
                "finite_objective": sa["attacks"][a].get("finite_objective", 1.0),
                "mean_image": sa["baseline_mean_image_mse"],
            }
        if (
            row.privacy and not out["dra"]["masked"]
        ):  # is the client's clip active on what the server sees?
            clip = float(row.privacy["clip"])
            norms = [
                float(sum((v.double() ** 2).sum() for v in w.upload.values()) ** 0.5)
                for w in run.views
            ]
            out["dra"]["clip"] = clip
            out["dra"]["clipped"] = sum(n >= clip * (1 - 1e-4) for n in norms) / len(norms)
        out["dra"]["seconds"] = time.perf_counter() - t  # with S_a's attack
    if "mia" in row.skip:
        out["mia"] = {"skipped": row.skip["mia"]}
    else:
        t = time.perf_counter()
        cfg = attack_config(
            row.method,
            clients=mia_clients,
            per_client=mia_per_client,
            dataset=dataset,
            model=row.model,
            test=test,
            rounds=mia_rounds,
            privacy=row.privacy,
            draws=draws,
        )
        built = _quiet(lambda: build_run(cfg))
        rep = _quiet(lambda: replay(built, [cfg.rounds]))
        model = rep.models[cfg.rounds]
        acc = _accuracy(model, built)
        r = _quiet(
            lambda: membership_attacks(
                built,
                model,
                samples=mia_samples,
                shadows=shadows,
                trained=rep.trained_by(cfg.rounds),
            )
        )
        out["mia"] = {**r, "test_accuracy": acc, "seconds": time.perf_counter() - t}
    if "pia" in row.skip:
        out["pia"] = {"skipped": row.skip["pia"]}
    else:
        t = time.perf_counter()
        cfg = attack_config(
            row.pia_method or row.method,
            clients=pia_clients,
            per_client=8,
            dataset=dataset,
            model=row.model,
            test=test,
            privacy=row.privacy,
            draws=draws,
        )
        if (
            upload_of(cfg) == "edge_activations"
        ):  # the edge server's view: each device's released activations
            run = _quiet(lambda: observe_run(cfg, parties=("edge",)))
            out["pia"] = {**edge_pia_attack(run, prop=0), "seconds": time.perf_counter() - t}
        else:
            run = _quiet(lambda: observe_run(cfg))
            out["pia"] = {**pia_attack(run, prop=0), "seconds": time.perf_counter() - t}
    return out


def _accuracy(model: Any, built: Any) -> float:
    import torch  # noqa: PLC0415

    ds = built.dataset
    model.eval()
    with torch.no_grad():
        return float((model(ds.x_test).argmax(-1) == ds.y_test).double().mean())


def objective_note(dra: dict[str, Any]) -> str:
    """What to append to a DRA cell whose target gave no finite matching loss for some clients
    (ciphertext read as floats): their reconstruction never left its dummy start."""
    share = dra.get("finite_objective", 1.0)
    if share >= 1.0:
        return ""
    return (
        " (no finite objective: the dummy start)"
        if share == 0
        else f" (finite objective for {share:.0%} of clients)"
    )


def privacy_table(
    rows: list[str] | None = None, progress: Callable[[str], None] | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    """:func:`privacy_row` for every row of :data:`ROWS` (or those labelled ``rows``)."""
    out = []
    for row in ROWS:
        if rows is not None and row.label not in rows:
            continue
        if progress is not None:
            progress(row.label)
        out.append(privacy_row(row, **kwargs))
    return out


# The leakage table of docs/benchmarks.md ("Privacy leakage"): label -> (method section, batch).
LEAKAGE_ROWS: dict[str, tuple[dict[str, Any], int]] = {
    "fedsgd, batch 1": ({"name": "fedsgd", "batch_size": 1}, 1),
    "fedsgd, batch 8": ({"name": "fedsgd", "batch_size": 8}, 8),
    "fedavg, 1 local SGD step, batch 1": (
        {
            "name": "fedavg",
            "local_epochs": 1,
            "batch_size": 1,
            "client_optimizer": {"name": "sgd", "lr": 0.1},
        },
        1,
    ),
    "fedsgd, batch 1, secure aggregation": (
        {"name": "fedsgd", "batch_size": 1, "secure_aggregation": True},
        1,
    ),
    "baffle batch, K=10, no secure aggregation": (
        {"name": "baffle", "mode": "batch", "k": 10, "ema": None, "secure_aggregation": False},
        1,
    ),
    "baffle batch, K=100, no secure aggregation": (
        {"name": "baffle", "mode": "batch", "k": 100, "ema": None, "secure_aggregation": False},
        1,
    ),
    "baffle batch, K=1000, no secure aggregation": (
        {"name": "baffle", "mode": "batch", "k": 1000, "ema": None, "secure_aggregation": False},
        1,
    ),
    "baffle batch, K=100, secure aggregation (default)": (
        {"name": "baffle", "mode": "batch", "k": 100, "ema": None},
        1,
    ),
}


def leakage_table(
    *,
    clients: int = 4,
    iterations: int = 300,
    dataset: str = "fashion-mnist",
    rows: list[str] | None = None,
    optimizer: str = "dlg",
) -> list[dict[str, Any]]:
    """One line per (row, attack): median/mean MSE, label accuracy and the baselines."""
    out = []
    for label in rows or list(LEAKAGE_ROWS):
        method, per_client = LEAKAGE_ROWS[label]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = observe_run(
                attack_config(method, clients=clients, per_client=per_client, dataset=dataset)
            )
        s = reconstruction_attack(run, iterations=iterations, optimizer=optimizer)
        for attack, a in s["attacks"].items():
            out.append(
                {
                    "row": label,
                    "attack": attack,
                    "masked": s["masked"],
                    "median_mse": a["median_mse"],
                    "mean_mse": a["mean_mse"],
                    "label_accuracy": a["label_accuracy"],
                    "mean_image": s["baseline_mean_image_mse"],
                    "mid_gray": s["baseline_mid_gray_mse"],
                    "upload_bytes": statistics.median(v.reply_bytes for v in run.views),
                }
            )
    return out
