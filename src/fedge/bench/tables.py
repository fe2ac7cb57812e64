"""Markdown tables and cells of benchmark reports: a variants table, a seeded table (mean ±
std over seeds), the cells of screens, seeds and paired differences, and the notes closing a
reproduction's section (what its runs cost, where they ran)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedge.bench.docs import command_section, markdown_table
from fedge.bench.screened import validation_score

__all__ = [
    "cost_note",
    "diverged_note",
    "machine_name",
    "machines_note",
    "mean_cell",
    "not_run_cell",
    "per_seed_cell",
    "run_notes",
    "screen_cell",
    "seed_gaps",
    "seeded_markdown",
    "variants_markdown",
]


UP, DOWN = "up B/client/round (mean of all rounds)", "down B/client/round (mean of all rounds)"


PRUNING = "pruning phases B/client (up / down)"


def _flops_cell(r: dict[str, Any], key: str) -> str:
    """GFLOP per client per round (``key`` + ``_per_client_round``); a row recorded before that
    figure existed shows its sum over the round's clients, marked ``(sum)``."""
    per_client = r.get(f"{key}_per_client_round")
    if per_client is not None:
        return f"{per_client / 1e9:.2f}"
    summed = r.get(f"{key}_per_round")
    if summed is None:  # not measured (measure.flops=false), or no effective count
        return "not measured" if key == "client_flops" else "-"
    return f"{summed / 1e9:.1f} (sum)"


def _pruning_cell(r: dict[str, Any]) -> str:
    if not r.get("pretraining_phases"):
        return "-"
    return (
        f"{r['pretraining_bytes_up_per_client']:.0f} / {r['pretraining_bytes_down_per_client']:.0f}"
    )


def variants_markdown(report: dict[str, Any], command: str, intro: str) -> str:
    """A markdown table of ``report``. Bytes and GFLOP are per client per round, averaged over
    all rounds (:func:`fedge.bench.variants.per_client_costs`); a column of NTK-Ori's
    pruning-phase bytes, and columns for effective FLOPs and client memory, appear when some
    variant logged them (``-`` where a variant did not)."""
    results = report["results"]
    effective = any(r.get("client_flops_effective_per_round") is not None for r in results)
    memory = any(r.get("client_tensor_peak_bytes") is not None for r in results)
    pruning = any(r.get("pretraining_phases") for r in results)
    flops = (
        "client GFLOP/client/round, executed (mean of all rounds)"
        if effective
        else "client GFLOP/client/round (mean of all rounds)"
    )
    head = (
        ["variant", "overrides", "final acc", "best acc", UP, DOWN] + [PRUNING] * pruning + [flops]
    )
    head += (
        ["effective GFLOP/client/round"] * effective
        + ["client peak MiB (tensors)"] * memory
        + ["wall s"]
    )
    rows = []
    for r in results:
        cells = [
            r["label"],
            f"`{' '.join(r['overrides']) or '-'}`",
            f"{r['final_test_accuracy']:.4f}",
            f"{r['best_test_accuracy']:.4f}",
            f"{r['bytes_up_per_client_round']:.0f}",
            f"{r['bytes_down_per_client_round']:.0f}",
        ]
        cells += [_pruning_cell(r)] * pruning + [_flops_cell(r, "client_flops")]
        if effective:
            cells.append(_flops_cell(r, "client_flops_effective"))
        if memory:
            peak = r.get("client_tensor_peak_bytes")
            cells.append("-" if peak is None else f"{peak / 2**20:.2f}")
        cells.append(f"{r['wall_s']:.0f}")
        rows.append(cells)
    common = " ".join(report["common"])
    base = f"Base: `{report['base']}`" + (f" with `{common}`" if common else "")
    return command_section(
        [intro], command, [base, "", *markdown_table(head, rows), *_missing_note(report)]
    )


def _missing_note(report: dict[str, Any]) -> list[str]:
    """The lines naming the variants not run yet (none when every one is)."""
    missing = report.get("missing") or []
    return ["", f"Not run yet (the command resumes them): {', '.join(missing)}"] if missing else []


def diverged_note(gone: Sequence[dict[str, Any]]) -> str:
    """``[{"seed": 2, "round": 40}]`` as a table says it: "seed 2 diverged (round 40)"."""
    return ", ".join(f"seed {d['seed']} diverged (round {d['round']})" for d in gone)


def not_run_cell(report: dict[str, Any], label: str) -> str:
    """The cell of a variant absent from a :func:`fedge.bench.variants.run_seeded_variants`
    report's results: every seed diverged (which seeds, which rounds), or it is not run yet."""
    gone = (report.get("diverged") or {}).get(label)
    return diverged_note(gone) if gone else "not run yet"


def seeded_markdown(report: dict[str, Any], command: str, intro: str) -> str:
    """Mean ± std over seeds per variant (the columns a reviewer asks for)."""
    has_val = any("test_accuracy_at_best_val" in r for r in report["results"])
    head = ["variant", "seeds", "final test acc", "best test acc"] + [
        "test acc at best val"
    ] * has_val
    pruning = any(r.get("pretraining_phases") for r in report["results"])
    head += (
        [UP] + [PRUNING] * pruning + ["client GFLOP/client/round (mean of all rounds)", "wall s"]
    )
    rows = []

    def ms(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:.4f} ± {r[key + '_std']:.4f}" if key in r else "-"

    for r in report["results"]:
        cells = [
            r["label"],
            str(r["seeds"]),
            ms(r, "final_test_accuracy"),
            ms(r, "best_test_accuracy"),
        ]
        cells += [ms(r, "test_accuracy_at_best_val")] * has_val
        cells += [
            f"{r['bytes_up_per_client_round']:.0f}",
            *[_pruning_cell(r)] * pruning,
            _flops_cell(r, "client_flops"),
            f"{r['wall_s']:.0f}",
        ]
        rows.append(cells)
    base = f"Base: `{report['base']}`, seeds {', '.join(map(str, report['seeds']))}; mean ± sample std."
    return command_section(
        [intro], command, [base, "", *markdown_table(head, rows), *_missing_note(report)]
    )


def screen_cell(row: dict[str, Any] | None, window: int = 1) -> str:
    """A screen table's cell: the run's :func:`fedge.bench.screened.validation_score`,
    "diverged (round N)", or "not run" (``row`` None)."""
    if row is None:
        return "not run"
    if "diverged_round" in row:
        return f"diverged (round {row['diverged_round']})"
    return f"{validation_score(row, window):.4f}"


def seed_gaps(d: dict[str, Any]) -> str:
    """A :func:`fedge.bench.stats.paired_difference`'s per-seed differences in points,
    ``"0: +0.7, 1: +0.5"``."""
    return ", ".join(f"{s}: {100 * x:+.1f}" for s, x in zip(d["seeds"], d["diffs"], strict=True))


def per_seed_cell(row: dict[str, Any], key: str = "final_test_accuracy") -> str:
    """A :func:`fedge.bench.variants.run_seeded_variants` row's ``key`` of every finished seed
    run, in seed order, then the seeds that diverged: ``0.8123, 0.8201, seed 2 diverged (round
    40)``."""
    return ", ".join(
        [
            *(f"{x[key]:.4f}" for x in row["runs"]),
            *([diverged_note(row["diverged"])] if row.get("diverged") else []),
        ]
    )


def mean_cell(row: dict[str, Any], key: str = "final_test_accuracy") -> str:
    """A :func:`fedge.bench.variants.run_seeded_variants` row's mean ± sample std of ``key``
    over its seeds: ``0.8123 ± 0.0057``, or ``0.8123 (one seed)`` (one seed has no spread to show)."""
    return f"{row[key]:.4f}" + (
        f" ± {row[key + '_std']:.4f}" if row["seeds"] > 1 else " (one seed)"
    )


def machine_name(m: dict[str, Any]) -> str:
    """One machine of a record's ``machines``, as the docs name it: CPU (vector extension, cores), torch."""
    isa = f"{m['isa']}, " if m.get("isa") else ""
    return f"{m['cpu']} ({isa}{m['cores']} cores), torch {m['torch']}"


def machines_note(rows: Sequence[dict[str, Any]]) -> str:
    """Where the runs of :func:`fedge.bench.variants.run_seeded_variants` rows ran, from each
    record's ``machines`` (:mod:`fedge.experiment.provenance`): per machine, the runs (and rounds, when a run was
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
