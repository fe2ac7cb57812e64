"""The privacy leakage table for every method (issue 12, benchmarks 1 and 2).

Every cell comes from running the attack on what the adversary observes in a tiny run of the
method (:mod:`fedge.attacks.table`): data reconstruction (DLG / BAFFLE's K-value matching)
on each client's upload, membership inference (loss threshold, shadow models, offline LiRA)
on the final model, property inference (class 0 in the batch) on the uploads. The rows
"fedavg (lenet-ppfl)" and "ppfl" form the PPFL Table 2 analogue.

    OMP_NUM_THREADS=1 python benchmarks/privacy_leakage.py --docs docs/benchmarks.md
    OMP_NUM_THREADS=1 python benchmarks/privacy_leakage.py --rows "fedsgd, batch 1" --json out.json

The raw results behind docs/benchmarks.md are ``benchmarks/results/privacy_leakage/results.json``
(commit it); to re-measure some rows and keep the rest:

    OMP_NUM_THREADS=1 python benchmarks/privacy_leakage.py --rows "LABEL" ... \
        --merge-into benchmarks/results/privacy_leakage/results.json \
        --json benchmarks/results/privacy_leakage/results.json --docs docs/benchmarks.md
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from fedge.attacks.table import ROWS, objective_note, privacy_row
from fedge.bench.docs import update_section
from fedge.bench.script import (
    load_measurement,
    measurement_parser,
    measurement_settings,
    save_measurement,
)

SETTINGS = {
    "dataset": "fashion-mnist",
    "clients": 4,
    "iterations": 200,
    "mia_clients": 2,
    "mia_per_client": 32,
    "mia_rounds": 3,
    "mia_samples": 64,
    "shadows": 2,
    "pia_clients": 24,
    "test": 600,
    "draws": "torch",  # the committed results were drawn with torch's generators
}


def _f(v: Any, fmt: str = ".3f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "—"


def _cells(r: dict[str, Any]) -> list[str]:
    d, m, p = r["dra"], r["mia"], r["pia"]
    if "skipped" in d:
        dra = ["—", "—", "—"]
    else:
        seen = " (sealed)" if d.get("sealed") else " (masked)" if d.get("masked") else ""
        if "clipped" in d:
            seen += f", {d['clipped']:.0%} clipped"
        if "server" in d:  # EPPFL: the edge server's inversion; S_a's masked view beside it
            sa = d["server"]
            seen += f" at S_e; {sa['attack']}{' (masked)' if sa['masked'] else ''} at S_a: {sa['median_mse']:.3g}{objective_note(sa)}"
        mse = (
            f"**{d['median_mse']:.3g}**"
            if d["median_mse"] < d["mean_image"]
            else f"{d['median_mse']:.3g}"
        )
        dra = [f"{d['attack']}{seen}", mse + objective_note(d), f"{d['mean_image']:.3g}"]
    if "skipped" in m:
        mia = ["—"] * 5
    else:
        mia = [
            _f(m["test_accuracy"], ".2f"),
            " / ".join(_f(m[k]["auc"]) for k in ("loss", "shadow", "lira")),
            " / ".join(_f(m[k]["tpr_at_1pct_fpr"], ".2f") for k in ("loss", "shadow", "lira")),
            " / ".join(_f(m[k]["tpr_at_01pct_fpr"], ".2f") for k in ("loss", "shadow", "lira")),
            " / ".join(_f(m[k]["precision"], ".2f") for k in ("loss", "shadow", "lira")),
        ]
    pia = "—" if "skipped" in p else _f(p["auc"]) + (" (masked)" if p.get("masked") else "")
    if "edge server" in p.get("attack", ""):
        pia += (
            f" (at S_e: the labels it receives; activations alone {_f(p['auc_activations'])})"
            if p.get("labels_in_clear")
            else " (at S_e)"
        )
    return dra + mia + [pia]


def render(
    results: list[dict[str, Any]],
    settings: dict[str, Any],
    seconds: float,
    merged: list[str] | None = None,
) -> str:
    s = settings
    head = [
        "method (what the server sees)",
        "DRA attack",
        "DRA median MSE",
        "mean image",
        "test acc.",
        "MIA AUC loss / shadow / LiRA",
        "TPR@1%FPR",
        "TPR@0.1%FPR",
        "precision",
        "PIA AUC",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for r in results:
        lines.append("| " + " | ".join([r["row"], *_cells(r)]) + " |")
        for k in ("dra", "mia", "pia"):
            if "skipped" in r[k]:
                notes.append(f"- {r['row']}, {k.upper()}: {r[k]['skipped']}.")
    t2 = [r for r in results if r["row"].startswith(("fedavg, lenet-ppfl", "ppfl, lenet-ppfl"))]
    table2 = ""
    if len(t2) == 2:
        rows2 = [
            "| | DRA MSE (mean image) | PIA AUC | MIA precision (loss / shadow / LiRA) | MIA AUC (loss / shadow / LiRA) |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in t2:
            c = _cells(r)
            rows2.append(
                f"| {'end-to-end FL (fedavg)' if r['row'].startswith('fedavg') else 'PPFL'} | {c[1]} ({c[2]}) | {c[8]} | {c[7]} | {c[4]} |"
            )
        table2 = (
            '\n\nPPFL Table 2 analogue on the small `lenet-ppfl` (the two rows above; Fashion-MNIST, IID, reduced as stated; the AlexNet-PPFL version is the section "PPFL Table 2 analogue on AlexNet-PPFL"; '
            "PPFL's own Table 2 trains to convergence on MNIST/CIFAR10 with AlexNet/VGG9):\n\n"
            + "\n".join(rows2)
        )
    later = (
        f"Rows measured in a later run than the rest (same settings, merged with `--merge-into`): "
        f"{'; '.join(merged)}.\n\n"
        if merged
        else ""
    )
    body = f"""Every cell is the result of running the attack on what the adversary observes (issue 12;
`src/fedge/attacks/table.py`); a cell the harness cannot measure names the reason below the
table. Reduced to fit shared CPUs, all on {s["dataset"]}, IID, `lenet-dlg` unless named:

- DRA: round 1, {s["clients"]} clients each holding exactly the batch its upload depends on; DLG
  (L-BFGS, {s["iterations"]} iterations; iDLG labels for one sample) on gradients and −Δ/η of
  deltas, K-value matching (`baffle-k`) and DLG on the Stein estimate for BAFFLE batch mode
  (the better of the two is shown), DLG on the update a FedKSeed, DeComFL or FeedSign client's
  scalars rebuild with the public seeds, Σ scalar·direction (`dlg-seed-sum`; its model change
  is −η times it; under secure aggregation the server sees only the sum and the harness
  refuses), PPFL's ciphertext read as float32 plaintext (a quarter of
  random float32 words exceed 1.8e19, so its squared-error objective is not finite and DLG cannot
  take a step: the cell is the dummy start's MSE, marked "no finite objective"); MSE in [0, 1]
  pixels to the client's images (one image: the closest; a batch: matched one to one, least total
  MSE), beside the training set's mean image scored the same way. DLG
  returns its best iterate by matching loss, each iterate scored where it stands.
  EPPFL's devices send the server only a masked M_c, so its DRA is the edge server's:
  each device's released activations (the kept outputs of M_c, clipped to L1 norm C and
  Laplace-noised with scale 2C/ε when DP is on) inverted to the input with the round's M_c
  (Adam, {s["iterations"]} iterations, inside the pixel box, no image prior: under noise it
  fits the noise; `eppfl-inversion` at S_e). The aggregation server S_a's view of the same
  run is attacked too: each device's M_c upload (W_c + r_i in the fixed-point ring) decoded
  as if it were the plaintext, DLG on −(W_c − W_c⁰)/η ("at S_a" in the DRA cell); what it
  decodes is the mask (the same in the three EPPFL rows, which share the run seed).
- DP rows (`privacy.mechanism=gaussian`, clip C, noise multiplier z; central DP as
  `fedge.methods.private` implements it): each client clips its K loss differences to L2
  norm C and the server adds N(0, (zC)²) to their sum, so the curious server sees every
  client's clipped, **un-noised** K values: the noise and ε do not protect the single upload
  (ε is not the point of these rows; they measure what clipping alone hides). C = 0.001 is
  below every one-sample client's ‖ΔL‖ (~0.002-0.004 at K = 10, ~0.012 at K = 100, ~0.04 at
  K = 1000): "N% clipped" is the measured share of uploads at the clip. The server does not
  know the scale α = min(1, C/‖ΔL‖), so besides `baffle-k` (known scale) the harness runs
  `baffle-k-fit`, the K-value match with s ≥ 0 fitted in closed form (relative residual
  ‖t‖²(1 − cos²)); the better of the three (with `baffle-stein`) is shown. MIA and PIA run
  on the DP-trained model and DP runs (the PIA server simulates the clipped client).
- MIA: the method trained {s["mia_rounds"]} rounds on {s["mia_clients"]} clients x
  {s["mia_per_client"]} samples; {s["mia_samples"]} members vs {s["mia_samples"]} test
  non-members; loss threshold, a Shokri-style attack model from {s["shadows"]} shadow models
  (each a run of the same method and config with another seed on half of the attacker's
  data = test samples not used as non-members) and offline LiRA from the same shadows;
  precision at the threshold of best balanced accuracy. TPR@0.1%FPR with {s["mia_samples"]}
  non-members is the TPR at zero false positives.
- PIA: round 1, {s["pia_clients"]} clients x 8 samples (fedsgd/fedavg/fedpt/baffle-epoch/eppfl
  at batch 8 so the upload depends on all 8); "class 0 occurs in the batch"; the server simulates
  the client program on 64 auxiliary batches (test split) per broadcast, logistic regression.
  EPPFL's is the edge server's (S_a's masked M_c gives a classifier nothing to read). Each
  step message carries the batch's labels in the clear (as the paper), and the property is a
  function of the labels, so the edge server reads it exactly (AUC 1.0, with or without DP);
  beside it ("activations alone") the attack a server without the labels could run: it
  simulates the device pipeline (M_c of the round in training mode, kept positions, L1 clip and
  Laplace noise when DP is on) on 64 auxiliary batches, trains a per-sample "is class 0"
  classifier on the released activations and scores each device by its most confident sample.
  Under DP the Laplace noise (scale 2C/ε per released value) is far above the values (L1 ≤ C
  over all of a sample's): the same seeds draw the same noise scaled by 1/ε, so after
  standardization the ε = 5 and ε = 1 rows give the classifier the same features.

{chr(10).join(lines)}

{chr(10).join(notes)}{table2}

{later}Total {seconds / 60:.1f} min on one thread of a shared machine (several other jobs running).

Reproduce: `OMP_NUM_THREADS=1 python benchmarks/privacy_leakage.py --docs docs/benchmarks.md`
(raw results: `benchmarks/results/privacy_leakage/results.json`; re-measure rows with
`--rows ... --merge-into` that file, see the script's docstring)
"""
    return body


def main(argv: list[str] | None = None) -> int:
    ap = measurement_parser(__doc__, section="privacy-leakage", example="mia_rounds=5")
    ap.add_argument("--rows", nargs="*", help="row labels (default: every row)")
    ap.add_argument(
        "--merge-into",
        help="measure --rows and put them into this --json file of an earlier run (same "
        "settings; rows with the same label replaced, table order kept), then render the whole",
    )
    args = ap.parse_args(argv)
    if args.from_json:
        saved = load_measurement(args.from_json)
        if args.docs:
            update_section(
                args.docs,
                "privacy-leakage",
                "Privacy leakage of every method",
                render(saved["results"], saved["settings"], saved["seconds"], saved.get("merged")),
            )
        return 0
    settings = measurement_settings(ap, args.set, SETTINGS)
    torch.set_num_threads(1)
    rows = [r for r in ROWS if not args.rows or r.label in args.rows]
    if args.rows and len(rows) != len(args.rows):
        print(
            f"unknown row among {args.rows}; expected labels from {[r.label for r in ROWS]}",
            file=sys.stderr,
        )
        return 2
    t0, results = time.perf_counter(), []
    for row in rows:
        t = time.perf_counter()
        results.append(privacy_row(row, **settings))
        print(f"{row.label}: {time.perf_counter() - t:.0f} s  {_cells(results[-1])}", flush=True)
    seconds = time.perf_counter() - t0
    if args.merge_into:
        saved = load_measurement(args.merge_into)
        # results saved before the draws setting existed were drawn with torch's generators
        if {"draws": "torch", **saved["settings"]} != settings:
            print(
                f"--merge-into {args.merge_into!r} was measured with {saved['settings']}, not {settings}; "
                "pass the same --set values",
                file=sys.stderr,
            )
            return 2
        fresh = {r["row"]: r for r in results}
        old = {r["row"]: r for r in saved["results"]}
        results = [
            fresh.get(r.label) or old[r.label] for r in ROWS if r.label in fresh or r.label in old
        ]
        seconds = sum(
            c.get("seconds", 0.0) for r in results for c in (r["dra"], r["mia"], r["pia"])
        )
        merged = sorted(
            set(saved.get("merged", [])) | set(fresh), key=[r.label for r in ROWS].index
        )
    else:
        merged = []
    if args.json:
        save_measurement(
            args.json,
            {"settings": settings, "seconds": seconds, "results": results, "merged": merged},
        )
    if args.docs:
        update_section(
            args.docs,
            "privacy-leakage",
            "Privacy leakage of every method",
            render(results, settings, seconds, merged),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
