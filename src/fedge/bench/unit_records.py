"""Run a table's units (one variant at one seed each) with a committed record per finished unit,
and read the table back from those records alone.

A unit runs as :func:`fedge.bench.variants.run_seeded_variants` lays it out (run directory
``out_root/seed-S/<label>``, run record ``records/runs/seed-S/<label>.json`` holding the resolved
config and the run's row), and beside its run record the script's own figures of that run
(``records/figures/seed-S/<label>.json``: whatever the table needs that the row lacks, such as
memory peaks or the trainable fraction). Each unit is recorded as soon as it finishes, so a table
is resumable unit by unit across machines, and ``--table-only`` rendering needs neither the run
directories nor the data: a unit is read from its records (its config checked against the one the
script asks for), or is listed as missing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedge.bench.variants import run_variants
from fedge.core.rundir_schema import SUMMARY

__all__ = [
    "Figures",
    "cpu_estimate",
    "records_main",
    "records_parser",
    "records_section",
    "run_units",
    "wall_minutes",
]

#: A script's figures of one finished run: ``(run_dir, row)`` with ``row`` the run's
#: :func:`fedge.bench.variants.run_variants` row; a JSON-serializable dict.
Figures = Callable[[str, dict[str, Any]], dict[str, Any]]


def _figures_record(records: Path, seed: int, label: str) -> Path:
    return records / "figures" / f"seed-{seed}" / f"{label.replace('/', '-')}.json"


def run_units(
    base: str,
    variants: dict[str, list[str]],
    *,
    seeds: Sequence[int],
    out_root: str | Path,
    common: list[str],
    records: str | Path,
    figures: Figures,
    run: bool = True,
) -> dict[str, Any]:
    """Run (or read) every unit of ``variants`` × ``seeds`` and return ``{"rows": {label: [one
    dict per seed: the unit's figures, its run row under "row", and "seed"]}, "missing": [unit,
    ...]}``; a label is in ``rows`` only when every seed of it is there.

    With ``run`` each unit missing from ``records`` is run (resumed from its run directory when
    interrupted) and recorded at once, its figures by ``figures``; without it nothing runs and
    the units without records are ``missing`` (``label@seed``). A record made by a different
    config is an error (:func:`fedge.bench.variants.run_variants`), and so is a run record without
    its figures record and without the run directory to make it from."""
    records = Path(records)
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in variants}
    missing = []
    for seed in seeds:
        for label, overrides in variants.items():
            out = Path(out_root) if run else records / ".unused"
            got = run_variants(
                base,
                {label: overrides},
                out_root=out / f"seed-{seed}",
                common=[*common, f"seed={seed}"],
                run=run,
                records=records / "runs" / f"seed-{seed}",
            )
            if got["missing"]:
                missing.append(f"{label}@{seed}")
                continue
            row = got["results"][0]
            rec = _figures_record(records, seed, label)
            run_dir = row.get("run_dir") or (
                str(out / f"seed-{seed}" / label.replace("/", "-")) if run else None
            )
            if rec.exists():
                figs = json.loads(rec.read_text())
            elif run_dir is not None and (Path(run_dir) / SUMMARY).exists():
                figs = figures(run_dir, {**row, "run_dir": run_dir})
                rec.parent.mkdir(parents=True, exist_ok=True)
                tmp = rec.with_suffix(".json.tmp")  # written whole, then renamed
                tmp.write_text(json.dumps(figs, indent=1, sort_keys=True) + "\n")
                tmp.replace(rec)
            else:
                raise FileNotFoundError(
                    f"{label}, seed {seed}: a run record but no figures record {rec} and no run "
                    "directory to make it from; delete the run record under "
                    f"{records / 'runs' / f'seed-{seed}'} to rerun the unit"
                )
            row = {k: v for k, v in row.items() if k != "run_dir"}
            rows[label].append({**figs, "row": row, "seed": seed})
    incomplete = {m.rsplit("@", 1)[0] for m in missing}
    return {
        "rows": {k: v for k, v in rows.items() if k not in incomplete},
        "missing": missing,
    }


def cpu_estimate(missing: Sequence[str], units: int, minutes_per_run: float) -> str:
    """A line saying how many of ``units`` runs are not yet recorded (``missing``) and about how
    many CPU-minutes (one thread each) they need at ``minutes_per_run`` each.

    >>> cpu_estimate(["a@1", "b@1"], 4, 2.5)
    '2 of 4 runs not yet recorded: about 5 CPU-minutes (2.5 per run, one thread each)'
    """
    return (
        f"{len(missing)} of {units} runs not yet recorded: about {len(missing) * minutes_per_run:g} "
        f"CPU-minutes ({minutes_per_run:g} per run, one thread each)"
    )


def records_section(
    intro: str,
    report: dict[str, Any],
    *,
    records: str,
    command: str,
    render: str,
    body: Callable[[], list[str]],
) -> str:
    """A docs section read from unit records: ``intro`` (the protocol), the commands that run and
    render it, then ``body()`` (the table, its reading, the CPU-minutes) once ``report`` is
    ``complete``, else the units it still awaits.

    >>> print(records_section("Protocol.", {"complete": False, "missing": ["a@1"]},
    ...     records="benchmarks/results/t/", command="python t.py", render="python t.py --table-only",
    ...     body=lambda: ["never read"]))
    Protocol.
    <BLANKLINE>
    Run (resumable per run, records under `benchmarks/results/t/`): `python t.py`; render: `python t.py --table-only`
    <BLANKLINE>
    Awaiting records (runs to come): a@1.
    """
    parts = [
        intro,
        f"Run (resumable per run, records under `{records}`): `{command}`; render: `{render}`",
    ]
    if report["complete"]:
        parts += body()
    else:
        parts.append("Awaiting records (runs to come): " + ", ".join(report["missing"]) + ".")
    return "\n\n".join(parts)


def wall_minutes(rows: dict[str, dict[str, Any]], *, total: bool = False) -> str:
    """The sentence giving each row's ``cpu_minutes`` (all its seeds' runs), or with ``total`` their sum.

    >>> wall_minutes({"a": {"cpu_minutes": 1.26}, "b": {"cpu_minutes": 2.0}}).split(": ")[-1]
    'a 1.3; b 2.0.'
    >>> wall_minutes({"a": {"cpu_minutes": 1.26}, "b": {"cpu_minutes": 2.0}}, total=True)[:30]
    "Wall minutes of all 2 rows' ru"
    """
    where = (
        "(one thread each, all seeds; on a shared machine, so at least their CPU time; each run "
        "record names the machine it ran on)"
    )
    if total:
        minutes = sum(r["cpu_minutes"] for r in rows.values())
        return f"Wall minutes of all {len(rows)} rows' runs {where}: {minutes:.1f}."
    each = "; ".join(f"{k} {r['cpu_minutes']:.1f}" for k, r in rows.items())
    return f"Wall minutes of each row's runs {where}: {each}."


def records_parser(
    description: str | None, *, out: str, records: Path, seeds: int
) -> argparse.ArgumentParser:
    """The flags of a script whose table is built from unit records: ``--out``, ``--docs``,
    ``--seeds`` (default ``seeds``), ``--records`` (default ``records``), ``--table-only``,
    ``--estimate`` and ``--set KEY=VALUE`` (repeatable: one more override for every run)."""
    from fedge.bench.script import runs_parser

    ap = runs_parser(description, out=out)
    ap.add_argument("--seeds", type=int, default=seeds)
    ap.add_argument(
        "--records", default=str(records), help="where finished runs are recorded (commit them)"
    )
    ap.add_argument("--table-only", action="store_true", help="render the records, run nothing")
    ap.add_argument(
        "--estimate", action="store_true", help="print the CPU cost of the runs not yet recorded"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more override for every run (a smaller setting for a test)",
    )
    return ap


def records_main(
    args: Any,
    *,
    read: Callable[..., dict[str, Any]],
    units: int,
    minutes_per_run: float,
    section: Callable[[dict[str, Any]], str],
    name: str,
    title: str,
    root: Path,
) -> int:
    """The body of such a script's ``main`` after parsing (:func:`records_parser`): with
    ``--estimate`` print what the missing units cost; else run them (unless ``--table-only``),
    render the table from the records alone, print it and, with ``--docs``, write it as the
    section ``name`` headed ``title`` (its first line :func:`fedge.bench.docs.records_line`,
    shown relative to ``root``). ``read(records, seeds, [run=, out=,] extra=)``: the script's
    report, with its ``missing`` units."""
    from fedge.bench.docs import records_line, update_section

    records, seeds = Path(args.records), range(args.seeds)
    if args.estimate:
        missing = read(records, seeds, extra=args.set)["missing"]
        print(cpu_estimate(missing, units, minutes_per_run))
        return 0
    if not args.table_only:
        read(records, seeds, run=True, out=args.out, extra=args.set)
    text = section(read(records, seeds, extra=args.set))
    print(text)
    if args.docs:
        update_section(args.docs, name, title, text, machine=records_line(records, root=root))
    return 0
