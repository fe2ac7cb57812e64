"""Every preset's metrics.jsonl, shrunk to run in minutes, as a fingerprint that a refactor must keep.

A change that claims to alter no number (the composer renovation, a module split, the formatter)
runs this before and after and compares: the metrics of every preset, and of the cross-cutting
mechanisms composed onto them (secure aggregation, DP, freezing, BAFFLE's batch mode and seeds
downlink), must be identical apart from the keys that measure time or memory.

    python benchmarks/preset_fingerprint.py --check benchmarks/results/fingerprint/portable.json
    python benchmarks/preset_fingerprint.py --check benchmarks/results/fingerprint/before.json \
        --draws torch

``--draws`` runs every case with that generator of seeded draws (default: the config's default,
``portable``). ``portable.json`` holds the default's fingerprints (the same on every machine);
``before.json`` was written before portable draws became the default, so it is checked with
``--draws torch`` (torch's draws: identical only on the machine and library versions it was
written with). After a change that alters numbers on purpose, rewrite them with ``--write``
(and ``--draws torch`` for ``before.json``). ``--check`` exits 1 and names each case, round and
key that differs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import fedge
from fedge.core.config import RunConfig

#: keys whose values measure the machine, not the computation
VOLATILE = re.compile(r"(wall|_s$|seconds|memory|rss|peak|elapsed)")

#: every preset, shrunk (fewer rounds and samples); the rest of its config as written
SHRINK: dict[str, dict[str, Any]] = {
    "quickstart": {"rounds": 2},
    "fedavg-fmnist-lenet": {"rounds": 2, "dataset.limit_train": 2000, "dataset.limit_test": 500},
    "fedsgd-fmnist-lenet": {
        "rounds": 4,
        "eval_every": 2,
        "dataset.limit_train": 2000,
        "dataset.limit_test": 500,
    },
    "baffle-fmnist-lenet": {
        "rounds": 2,
        "dataset.limit_train": 400,
        "dataset.limit_test": 500,
        "method.k": 20,
    },
    "ntk-baffle-fmnist-lenet": {
        "rounds": 2,
        "dataset.limit_train": 5000,
        "dataset.limit_test": 500,
        "method.k": 10,
        "method.prune_rounds": 3,
    },
    "fedpt-fmnist-cnn": {"rounds": 2, "dataset.limit_train": 1000, "dataset.limit_test": 500},
    "eppfl-fmnist-vgg": {
        "rounds": 2,
        "dataset.limit_train": 400,
        "dataset.limit_test": 200,
        "measure.memory": False,
    },
    "ppfl-fmnist-lenet": {"dataset.limit_train": 400, "dataset.limit_test": 200},
    "cross-device-synthetic": {"rounds": 2, "clients.num": 10000, "clients.per_round": 20},
}

#: mechanisms composed onto presets: (case name, preset, overrides beyond the preset's shrink)
COMPOSED: list[tuple[str, str, dict[str, Any]]] = [
    (
        "fedavg+secagg",
        "fedavg-fmnist-lenet",
        {"method.secure_aggregation": True, "clients.per_round": 5},
    ),
    (
        "fedavg+dp",
        "fedavg-fmnist-lenet",
        {"privacy.mechanism": "gaussian", "privacy.clip": 1.0, "privacy.noise_multiplier": 0.5},
    ),
    ("fedavg+dropout", "fedavg-fmnist-lenet", {"clients.dropout": 0.3, "clients.min_replies": 3}),
    ("fedsgd+freeze", "fedsgd-fmnist-lenet", {"method.freeze": "largest"}),
    ("baffle-batch", "baffle-fmnist-lenet", {"method.mode": "batch"}),
    (
        "baffle-batch-seeds",
        "baffle-fmnist-lenet",
        {"method.mode": "batch", "method.downlink": "seeds"},
    ),
    ("baffle+freeze", "baffle-fmnist-lenet", {"method.freeze": "largest"}),
    (
        "baffle-batch+dp",
        "baffle-fmnist-lenet",
        {
            "method.mode": "batch",
            "privacy.mechanism": "gaussian",
            "privacy.clip": 1.0,
            "privacy.noise_multiplier": 0.5,
        },
    ),
    ("fedpt+secagg", "fedpt-fmnist-cnn", {"method.secure_aggregation": True}),
    (
        "fedpt+tree",
        "fedpt-fmnist-cnn",
        {
            "privacy.mechanism": "tree",
            "privacy.sampling": "shuffle",
            "privacy.clip": 1.0,
            "privacy.noise_multiplier": 0.5,
        },
    ),
    ("quickstart+workers", "quickstart", {"clients.workers": 2}),
]


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    plain = [(name, name, dict(over)) for name, over in SHRINK.items()]
    return plain + [(name, preset, {**SHRINK[preset], **extra}) for name, preset, extra in COMPOSED]


def fingerprint(preset: str, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's metrics lines without the keys that measure time or memory."""
    with tempfile.TemporaryDirectory(prefix="fedge-fingerprint-") as tmp:
        run = fedge.run(preset, overrides=overrides, out=Path(tmp) / "run")
        return [{k: v for k, v in line.items() if not VOLATILE.search(k)} for line in run.metrics]


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    diffs = []
    for name in sorted(set(before) | set(after)):
        if name not in after or name not in before:
            diffs.append(f"{name}: only {'before' if name in before else 'after'}")
            continue
        b, a = before[name], after[name]
        if len(b) != len(a):
            diffs.append(f"{name}: {len(b)} rounds before, {len(a)} after")
        for lb, la in zip(b, a):
            for key in sorted(set(lb) | set(la)):
                if lb.get(key, "<absent>") != la.get(key, "<absent>"):
                    diffs.append(
                        f"{name} round {lb.get('round')}: {key} {lb.get(key, '<absent>')!r} -> {la.get(key, '<absent>')!r}"
                    )
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="run every case and write the fingerprints here")
    group.add_argument("--check", type=Path, help="run every case and compare with this file")
    parser.add_argument("--only", nargs="*", help="run only these cases")
    default = RunConfig.model_fields["draws"].default
    parser.add_argument(
        "--draws",
        choices=["torch", "portable"],
        default=default,
        help=f"the generator of every case's seeded draws (default: {default}, the config's)",
    )
    args = parser.parse_args(argv)
    todo = [
        (name, preset, {**over, "draws": args.draws})
        for name, preset, over in cases()
        if not args.only or name in args.only
    ]
    result = {}
    for name, preset, overrides in todo:
        print(f"{name} ...", file=sys.stderr, flush=True)
        result[name] = fingerprint(preset, overrides)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(
            json.dumps(
                {
                    "draws": args.draws,
                    "cases": {n: {"preset": p, "overrides": o} for n, p, o in todo},
                    "metrics": result,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {len(result)} fingerprints to {args.write}")
        return 0
    before = json.loads(args.check.read_text())["metrics"]
    if args.only:
        before = {k: v for k, v in before.items() if k in args.only}
    diffs = compare(before, result)
    for d in diffs:
        print(d)
    print(f"{len(result)} cases: {'identical' if not diffs else f'{len(diffs)} differences'}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
