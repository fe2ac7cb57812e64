"""A screened reproduction table read back from its records.

:func:`fedge.bench.variants.run_screened` runs a paper table the way a reviewer accepts it (a
learning-rate screen on validation, then every variant x seed) and records every finished run
under ``records`` (``screen/``, ``seed-S/``, ``probe/``). The reproduction scripts
(``benchmarks/baffle_table1.py``, ``baffle_table2.py``, ``ntk_table3.py``,
``baffle_delta_loss.py``) build their ``main`` with :func:`when_picked` and tabulate from the
records alone with :func:`recorded_screen` and :func:`recorded_seeded`, so ``--table-only`` on
any machine renders what the workers recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fedge.bench.variants import (
    Screen,
    diverged_note,
    recorded,
    recorded_grown,
    run_screened,
    run_seeded_variants,
)

__all__ = [
    "Plan",
    "cost_note",
    "machines_note",
    "mean_cell",
    "per_seed_cell",
    "read_plan_screen",
    "recorded_probes",
    "recorded_screen",
    "recorded_seeded",
    "run_notes",
    "run_plan",
    "when_picked",
]

T = TypeVar("T")


class Plan(Protocol):
    """A reproduction's protocol as a script's frozen ``Plan`` dataclass holds it (``baffle_table2.py``,
    ``ntk_table3.py``; ``--smoke`` swaps in a tiny one): its seeds, its records folder, the
    overrides of every main run and those of the screen runs."""

    @property
    def seeds(self) -> tuple[int, ...]: ...

    @property
    def records(self) -> Path: ...

    def protocol(self) -> list[str]: ...

    def screen_common(self) -> list[str]: ...


def recorded_screen(
    base: str, screen: Screen, *, common: list[str], records: str | Path
) -> dict[str, Any]:
    """The screen runs of a :func:`fedge.bench.variants.run_screened` table as recorded under ``records/screen``
    (nothing runs; the rest are ``"missing"``); a growing screen as far as its records grew it."""
    return recorded_grown(base, screen, common=common, records=Path(records) / "screen")


def recorded_seeded(
    base: str,
    variants: dict[str, list[str]],
    *,
    seeds: Sequence[int],
    common: list[str],
    records: str | Path,
) -> dict[str, Any]:
    """:func:`run_seeded_variants` reading only ``records`` (``records/seed-S``): the table of
    whatever seeds are recorded, nothing runs."""
    return run_seeded_variants(
        base,
        variants,
        seeds=seeds,
        out_root="/nonexistent",
        common=common,
        run=False,
        records=records,
    )


def recorded_probes(
    base: str, variants: dict[str, list[str]], *, common: list[str], records: str | Path
) -> dict[str, dict[str, Any]]:
    """The probe runs of a :func:`fedge.bench.variants.run_screened` table (``probe_common``,
    recorded under ``records``, e.g. ``records/probe``) by label: the finished ones only. A probe
    that diverged measured no complete round, so its label is absent and the table's cell says
    "-" as for a probe not run yet."""
    rows = recorded(base, variants, common=common, records=records)["results"]
    return {r["label"]: r for r in rows if "diverged_round" not in r}


def when_picked(
    pick: Callable[[dict[str, Any]], T | None], variants: Callable[[T], dict[str, list[str]]]
) -> Callable[[dict[str, Any]], dict[str, list[str]] | None]:
    """The ``main`` of :func:`fedge.bench.variants.run_screened`: ``variants(pick(screen))`` — the table's variants
    built from what ``pick`` chose on the screen report — or None while ``pick`` returns None
    (a screen run is missing)."""

    def main(screen: dict[str, Any]) -> dict[str, list[str]] | None:
        chosen = pick(screen)
        return None if chosen is None else variants(chosen)

    return main


def per_seed_cell(row: dict[str, Any], key: str = "final_test_accuracy") -> str:
    """A :func:`run_seeded_variants` row's ``key`` of every finished seed run, in seed order, then
    the seeds that diverged: ``0.8123, 0.8201, seed 2 diverged (round 40)``."""
    return ", ".join(
        [
            *(f"{x[key]:.4f}" for x in row["runs"]),
            *([diverged_note(row["diverged"])] if row.get("diverged") else []),
        ]
    )


def mean_cell(row: dict[str, Any], key: str = "final_test_accuracy") -> str:
    """A :func:`run_seeded_variants` row's mean ± sample std of ``key`` over its seeds:
    ``0.8123 ± 0.0057``, or ``0.8123 (one seed)`` (one seed has no spread to show)."""
    return f"{row[key]:.4f}" + (
        f" ± {row[key + '_std']:.4f}" if row["seeds"] > 1 else " (one seed)"
    )


def machine_name(m: dict[str, Any]) -> str:
    """One machine of a record's ``machines``, as the docs name it: CPU (vector extension, cores), torch."""
    isa = f"{m['isa']}, " if m.get("isa") else ""
    return f"{m['cpu']} ({isa}{m['cores']} cores), torch {m['torch']}"


def machines_note(rows: Sequence[dict[str, Any]]) -> str:
    """Where the runs of :func:`run_seeded_variants` rows ran, from each record's ``machines``
    (:mod:`fedge.experiment.provenance`): per machine, the runs (and rounds, when a run was
    resumed on another machine) it computed; runs recorded before records held it are counted.
    Empty when there are no runs."""
    ran: dict[str, list[str]] = {}
    unknown = 0
    for row in rows:
        for run in row["runs"]:
            segs = run.get("machines")
            if not segs:
                unknown += 1
                continue
            whole = len(segs) == 1
            for seg in segs:
                a, b = seg["rounds"]
                where = f"{row['label']} seed {run['seed']}" + (
                    "" if whole else f" (rounds {a}-{b})"
                )
                if seg["machine"] is None:
                    ran.setdefault("not recorded", []).append(where)
                else:
                    ran.setdefault(machine_name(seg["machine"]), []).append(where)
    parts = [f"{name}: {', '.join(runs)}" for name, runs in ran.items()]
    if not parts and not unknown:
        return ""
    if unknown:
        parts.append(
            f"{unknown} run{'s' if unknown > 1 else ''} recorded before records named their machine"
        )
    return (
        "Where the runs ran (from the records; a run resumed on another machine is the same run up to float roundoff): "
        + "; ".join(parts)
        + "."
    )


def _ran_on(run: dict[str, Any]) -> str:
    """Which machine computed ``run``, by instruction set (what sets a CPU's speed here):
    ``"avx2"``, ``"avx512f"``, ...; ``"resumed across machines"`` when its rounds ran on
    machines of different instruction sets; ``"machine not recorded"`` for older records."""
    tags = {
        seg["machine"]["isa"] if seg.get("machine") else "machine not recorded"
        for seg in run.get("machines") or []
    }
    if not tags:
        return "machine not recorded"
    return tags.pop() if len(tags) == 1 else "resumed across machines"


def cost_note(rows: Sequence[dict[str, Any]]) -> str:
    """What each row's runs cost, from the records: the wall time of their rounds (training and
    evaluation, summed over every session of a resumed run; start-up excluded), in minutes,
    min-max over the row's seeds. What a reader needs to plan a rerun, measured rather than
    estimated. Where the section's runs ran on machines of different instruction sets (a 3x
    difference in speed has been seen between an avx2 and an avx512 EPYC), the minutes are
    grouped by instruction set, one sentence each (known ones first, then runs resumed across
    machines, then runs whose machine was not recorded), so a range never mixes machines.
    Empty when there are no runs."""
    timed = [
        (row["label"], _ran_on(run), run["wall_s"] / 60)
        for row in rows
        for run in row["runs"]
        if run.get("wall_s") is not None
    ]
    if not timed:
        return ""
    isas = {
        seg["machine"]["isa"]
        for row in rows
        for run in row["runs"]
        for seg in run.get("machines") or []
        if seg.get("machine")
    }
    several = len(isas) > 1  # runs of unrecorded machines alone do not split the ranges

    def minutes(group: list[tuple[str, str, float]]) -> str:
        by_label: dict[str, list[float]] = {}
        for label, _, m in group:
            by_label.setdefault(label, []).append(m)
        spans = {label: (f"{min(m):.0f}", f"{max(m):.0f}") for label, m in by_label.items()}
        return "; ".join(
            f"{label} {lo if lo == hi else f'{lo}-{hi}'}" for label, (lo, hi) in spans.items()
        )

    head = (
        "Minutes a run took (from the records: its rounds' wall time, evaluation included, one torch thread, on "
        "the machines named below; min-max over seeds"
    )
    if not several:
        return f"{head}): {minutes(timed)}."
    unknown = ("resumed across machines", "machine not recorded")
    order = sorted({where for _, where, _ in timed} - set(unknown)) + [
        u for u in unknown if any(w == u for _, w, _ in timed)
    ]
    groups = [
        f"{'On ' + where if where not in unknown else where[0].upper() + where[1:]}: "
        f"{minutes([t for t in timed if t[1] == where])}."
        for where in order
    ]
    return f"{head}, grouped by the machine's instruction set). " + " ".join(groups)


def run_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The lines closing a reproduction's section: :func:`cost_note` then :func:`machines_note`,
    each after a blank line; none for notes that are empty."""
    return [line for note in (cost_note(rows), machines_note(rows)) if note for line in ("", note)]


def run_plan(
    base: str,
    plan: Plan,
    screen: Screen,
    main: Callable[[dict[str, Any]], dict[str, list[str]] | None],
    *,
    out: str | Path,
    shard: int,
    shards: int,
    probe_common: list[str] | None = None,
    only: Sequence[tuple[str, int | None]] = (),
    steal: bool = True,
) -> None:
    """:func:`fedge.bench.variants.run_screened` of ``plan``: its screen overrides, protocol,
    seeds and records, worker ``shard`` of ``shards`` (taking idle workers' runs with ``steal``),
    the runs ``only`` names (all when empty)."""
    run_screened(
        base,
        screen,
        main,
        screen_common=plan.screen_common(),
        protocol=plan.protocol(),
        seeds=plan.seeds,
        records=plan.records,
        out=out,
        shard=shard,
        shards=shards,
        probe_common=probe_common,
        only=only,
        steal=steal,
    )


def read_plan_screen(base: str, plan: Plan, screen: Screen) -> dict[str, Any]:
    """:func:`recorded_screen` of ``plan``: the screen runs its workers recorded."""
    return recorded_screen(base, screen, common=plan.screen_common(), records=plan.records)
