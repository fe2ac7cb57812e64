"""Every preset's metrics.jsonl, shrunk to run in minutes, as a fingerprint that a refactor must keep.

A change that claims to alter no number (the composer renovation, a module split, the formatter)
runs this before and after and compares: the metrics of every preset, and of the cross-cutting
mechanisms composed onto them (secure aggregation, DP, freezing, BAFFLE's batch mode and seeds
downlink), must be identical apart from the keys that measure time or memory.

    python benchmarks/preset_fingerprint.py --check benchmarks/results/fingerprint/portable.json
    python benchmarks/preset_fingerprint.py --check benchmarks/results/fingerprint/before.json \
        --draws torch

``--draws`` runs every case with that generator of seeded draws (default: the config's default,
``portable``). ``portable.json`` holds the default's fingerprints; ``before.json`` was written
before portable draws became the default, so it is checked with ``--draws torch``. After a
change that alters numbers on purpose, rewrite them with ``--write`` (and ``--draws torch`` for
``before.json``); ``--write FILE --only CASE ...`` replaces just those cases in a file this
machine wrote with the same draws. ``--check`` exits 1 and names each case, round and key that differs.

Portable draws make the seeded numbers the same on every machine, not the training arithmetic:
float32 forwards and sums run on each CPU's kernels, so a fingerprint checked on another CPU (or
torch version) than the one it was written on differs in the last bits, and BAFFLE's finite
differences (σ = 1e-4) amplify them: ``portable.json`` as an Intel Xeon wrote it differed on an
AMD EPYC in 56 values, losses, FLOP ratios and BAFFLE's estimate norms by up to 3.5e-5 relative
and one accuracy by one test image in 500 (it is now the AMD EPYC's, with every preset). The
file records the machine it was written on, and ``--check`` says when it is another and counts
the differences within ``--rtol``. To check a change, write a baseline on your machine before
it:

    git stash && python benchmarks/preset_fingerprint.py --write /tmp/before.json && git stash pop
    python benchmarks/preset_fingerprint.py --check /tmp/before.json

``--rtol R`` accepts numbers within R relative of the file's (for a check across machines; the
default, 0, asks for equality).
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
from fedge.experiment.provenance import machine

#: what decides a run's roundoff: the CPU, its widest vector extension and torch's version
ARITHMETIC = ("cpu", "isa", "torch")

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
    "baffle-activity-fmnist-mlp": {
        "rounds": 2,
        "dataset.limit_train": 1400,
        "dataset.validation": 200,
        "dataset.limit_test": 500,
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
    "fedzo-fmnist-lenet": {"rounds": 2, "dataset.limit_train": 400, "dataset.limit_test": 500},
    "fedkseed-fmnist-lenet": {
        "rounds": 2,
        "dataset.limit_train": 400,
        "dataset.limit_test": 500,
        "method.local_steps": 10,
    },
    "decomfl-fmnist-lenet": {"rounds": 2, "dataset.limit_train": 400, "dataset.limit_test": 500},
    "feedsign-fmnist-lenet": {
        "rounds": 20,
        "eval_every": 10,
        "dataset.limit_train": 400,
        "dataset.limit_test": 500,
    },
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


def within(b: Any, a: Any, rtol: float) -> bool:
    """Whether ``a`` equals ``b`` up to ``rtol`` relative (numbers only; anything else: equal)."""
    numbers = (int, float)
    if isinstance(b, bool) or isinstance(a, bool) or not isinstance(b, numbers):
        return bool(a == b)
    if not isinstance(a, numbers):
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def compare(
    before: dict[str, Any], after: dict[str, Any], rtol: float = 0.0
) -> tuple[list[str], int]:
    """The differences (one line each) beyond ``rtol``, and how many were within it."""
    diffs, close = [], 0
    for name in sorted(set(before) | set(after)):
        if name not in after or name not in before:
            diffs.append(f"{name}: only {'before' if name in before else 'after'}")
            continue
        b, a = before[name], after[name]
        if len(b) != len(a):
            diffs.append(f"{name}: {len(b)} rounds before, {len(a)} after")
        for lb, la in zip(b, a):
            for key in sorted(set(lb) | set(la)):
                vb, va = lb.get(key, "<absent>"), la.get(key, "<absent>")
                if vb == va:
                    continue
                if rtol and within(vb, va, rtol):
                    close += 1
                else:
                    diffs.append(f"{name} round {lb.get('round')}: {key} {vb!r} -> {va!r}")
    return diffs, close


def machine_note(written: dict[str, Any] | None) -> str | None:
    """A line when the file was written on another machine than this one (else None)."""
    here = machine()
    if written is None:
        return "the file does not say which machine wrote it: float32 roundoff may differ here"
    if all(written.get(k) == here[k] for k in ARITHMETIC):
        return None
    there = ", ".join(f"{k} {written.get(k)}" for k in ARITHMETIC)
    mine = ", ".join(f"{k} {here[k]}" for k in ARITHMETIC)
    return (
        f"written on {there}; checked on {mine}: float32 kernels round differently there, so "
        "last-bit differences are expected (--rtol 1e-4 accepts most; to check a change, "
        "--write a baseline on this machine before it)"
    )


def kept_cases(
    path: Path, draws: str, here: dict[str, Any], parser: argparse.ArgumentParser
) -> dict[str, Any]:
    """The fingerprint file ``path`` that ``--write --only`` updates: its other cases stay, so it
    must hold the same draws and come from this machine's arithmetic (else the file would mix
    two machines' roundoff)."""
    try:
        content: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        parser.error(f"--write {path} --only: cannot read the fingerprint file to update ({exc})")
    if content.get("draws") != draws:
        parser.error(
            f"--write {path} --only: the file holds draws={content.get('draws')!r} fingerprints, "
            f"these cases run with draws={draws!r}; give --draws {content.get('draws')} or "
            "write another file"
        )
    if content.get("machine") != here:
        parser.error(
            f"--write {path} --only: the file was written on {content.get('machine')}, this is "
            f"{here}; its other cases would keep that machine's roundoff: rewrite every case "
            "(--write without --only) or write another file"
        )
    return content


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--write",
        type=Path,
        help="run every case and write the fingerprints here (with --only: update those cases)",
    )
    group.add_argument("--check", type=Path, help="run every case and compare with this file")
    parser.add_argument("--only", nargs="*", help="run only these cases")
    default = RunConfig.model_fields["draws"].default
    parser.add_argument(
        "--draws",
        choices=["torch", "portable"],
        default=default,
        help=f"the generator of every case's seeded draws (default: {default}, the config's)",
    )
    parser.add_argument(
        "--rtol",
        type=float,
        default=0.0,
        help="with --check: accept numbers within this relative difference (default 0: equal)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.rtol < 1:
        parser.error(f"--rtol {args.rtol}: give a relative tolerance in [0, 1), e.g. 1e-5")
    if args.rtol and not args.check:
        parser.error("--rtol goes with --check")
    if args.check:
        try:
            written = json.loads(args.check.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            parser.error(f"--check {args.check}: cannot read a fingerprint file there ({exc})")
    here = {k: machine()[k] for k in ARITHMETIC}
    content: dict[str, Any] = {"draws": args.draws, "machine": here, "cases": {}, "metrics": {}}
    if args.write and args.only and args.write.exists():  # those cases replace theirs only
        content = kept_cases(args.write, args.draws, here, parser)
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
        content["cases"].update({n: {"preset": p, "overrides": o} for n, p, o in todo})
        content["metrics"].update(result)
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(content, indent=1) + "\n")
        print(
            f"wrote {len(result)} fingerprints to {args.write} ({len(content['metrics'])} in all)"
        )
        return 0
    before = written["metrics"]
    if args.only:
        before = {k: v for k, v in before.items() if k in args.only}
    note = machine_note(written.get("machine"))
    if note:
        print(note)
    diffs, close = compare(before, result, args.rtol)
    for d in diffs:
        print(d)
    verdict = "identical" if not diffs else f"{len(diffs)} differences"
    if close:
        verdict += f" ({close} more within --rtol {args.rtol:g})"
    print(f"{len(result)} cases: {verdict}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
