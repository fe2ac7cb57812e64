"""A screened reproduction table: a learning-rate screen on validation, then every variant x seed,
run resumably by parallel workers and read back from its records (:func:`run_screened`).
Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fedge.bench.variants import recorded, run_seeded_variants, run_variants
from fedge.core.errors import ConfigError
from fedge.experiment.claim import RunDirBusyError

__all__ = [
    "Plan",
    "Screen",
    "grid_step",
    "main_tasks",
    "pick_by_validation",
    "read_plan_screen",
    "recorded_grown",
    "recorded_probes",
    "recorded_screen",
    "recorded_seeded",
    "run_plan",
    "run_screened",
    "validation_score",
    "when_picked",
    "widened_grid",
]

T = TypeVar("T")


def validation_score(row: dict[str, Any], window: int = 1) -> float | None:
    """A screen run's score: its final **validation** accuracy, or with ``window`` > 1 the mean of
    its last ``window`` validation evaluations (a run whose accuracy still swings from one
    evaluation to the next — label skew, few local steps — is judged by where it sits, not by
    where its last evaluation happened to land); None for a diverged run or one without a
    validation set."""
    if "diverged_round" in row:
        return None
    if window <= 1:
        return row.get("final_val_accuracy")
    vals = [v for v in row.get("val_accuracy_by_round") or [] if v is not None][-window:]
    return statistics.mean(vals) if vals else None


def pick_by_validation(
    results: list[dict[str, Any]], labels: dict[float, str], *, window: int = 1
) -> float | None:
    """The value (a learning rate) whose run, ``labels[value]``, has the best
    :func:`validation_score` (final validation accuracy, or the mean of the last ``window``
    evaluations; ties: the smaller value); None while one of them is not recorded. A run that
    diverged (``diverged_round``) scores below every run that did not. The test set is never
    looked at."""
    rows = {r["label"]: r for r in results}
    if any(label not in rows for label in labels.values()):
        return None
    scored = []
    for value, label in labels.items():
        val = validation_score(rows[label], window)
        if "diverged_round" in rows[label]:
            val = -math.inf
        elif val is None:
            raise ConfigError(
                f"screen run {label!r} has no validation accuracy; give the protocol dataset.validation=N"
            )
        scored.append((val, -value, value))
    return max(scored)[2]


def grid_step(x: float, *, up: bool) -> float:
    """The next learning rate past ``x`` on the 1-3-10 ladder (0.03 -> 0.1 up, 0.01 -> 0.003 down);
    off the ladder, a factor of sqrt(10)."""
    e = math.floor(math.log10(x) + 1e-9)
    m = round(x / 10**e, 6)
    nxt = {
        (1.0, True): 3 * 10**e,
        (3.0, True): 10 ** (e + 1),
        (1.0, False): 3 * 10 ** (e - 1),
        (3.0, False): 10**e,
    }.get((m, up), x * 10 ** (0.5 if up else -0.5))
    return float(f"{nxt:.3g}")


def widened_grid(
    grid: Sequence[float],
    label_of: Callable[[float], str],
    results: list[dict[str, Any]],
    *,
    steps: int = 2,
    window: int = 1,
) -> tuple[float, ...]:
    """``grid``, grown one :func:`grid_step` past an edge where the best **validation** run sits
    (:func:`pick_by_validation`), again while the new edge is best, at most ``steps`` times: a
    screen whose pick sits at the edge of its grid has not bracketed the optimum. A value added
    but not yet recorded is in the grid returned (the caller screens it; the pick waits for it).
    ``label_of(lr)``: the screen run's label; ``window``: as :func:`pick_by_validation`."""
    lrs = sorted(grid)
    for _ in range(steps):
        best = pick_by_validation(results, {lr: label_of(lr) for lr in lrs}, window=window)
        if best is None or (len(lrs) > 1 and lrs[0] < best < lrs[-1]):
            break
        if best == lrs[-1]:
            lrs.append(grid_step(best, up=True))
        else:
            lrs.insert(0, grid_step(best, up=False))
    return tuple(lrs)


Screen = dict[str, list[str]] | Callable[[list[dict[str, Any]]], dict[str, list[str]]]


def _grower(screen: Screen) -> Callable[[list[dict[str, Any]]], dict[str, list[str]]]:
    return screen if callable(screen) else (lambda _results: screen)


def recorded_grown(
    base: str, screen: Screen, *, common: list[str], records: str | Path
) -> dict[str, Any]:
    """:func:`fedge.bench.variants.recorded` of a screen that grows with its results (see
    :func:`run_screened`): the recorded runs of the screen as it stands, grown as far as its records take it."""
    grow = _grower(screen)
    current = grow([])
    while True:
        rep = recorded(base, current, common=common, records=records)
        bigger = grow(rep["results"])
        if bigger.keys() == current.keys():
            return rep
        current = bigger


def _work_share(
    items: Sequence[T],
    shard: int,
    shards: int,
    run_one: Callable[[T], None],
    *,
    steal: bool,
    own: bool = True,
) -> None:
    """Run worker ``shard``'s items (every ``shards``-th, with ``own``), then, with ``steal``, the
    others'; an item whose run another process is running now (RunDirBusyError) is left to it."""
    mine = [x for i, x in enumerate(items) if i % shards == shard]
    theirs = [x for i, x in enumerate(items) if i % shards != shard]
    for item in (mine if own else []) + (theirs if steal else []):
        try:
            run_one(item)
        except RunDirBusyError:
            continue


def main_tasks(
    variants: Sequence[str], seeds: Sequence[int], only: Sequence[tuple[str, int | None]] = ()
) -> list[tuple[str, int]]:
    """The main runs of a table, (label, seed), **seed-major**: every variant's first seed before
    any second seed, so a table that is stopped part-way has one seed of every row (a complete,
    if unreplicated, table) rather than three seeds of its first rows and nothing of the rest.
    ``only`` as in :func:`run_screened`."""
    return [
        (label, seed)
        for seed in seeds
        for label in variants
        if not only or any(label == o and s in (None, seed) for o, s in only)
    ]


def run_screened(
    base: str,
    screen: Screen,
    main: Callable[[dict[str, Any]], dict[str, list[str]] | None],
    *,
    screen_common: list[str],
    protocol: list[str],
    seeds: Sequence[int],
    records: str | Path,
    out: str | Path,
    shard: int = 0,
    shards: int = 1,
    probe_common: list[str] | None = None,
    poll_s: float = 30.0,
    only: Sequence[tuple[str, int | None]] = (),
    steal: bool = True,
) -> dict[str, list[str]]:
    """Run a paper table the way a reviewer accepts it, resumably and in parallel workers.

    1. The ``screen`` runs (``screen_common``; e.g. learning rates on a validation split). A
       callable ``screen(recorded results)`` grows the screen with what it has found (e.g.
       :func:`widened_grid`: one more learning rate past an edge that won); it is screened until
       it stops growing. A screen run that diverges is recorded as diverged (the worst of its
       grid), not an error; so is a main run (step 3), which the tables list as diverged.
    2. ``main(screen report)`` turns the recorded screen into the table's variants (None while a
       screen run is missing: a worker waits, polling every ``poll_s`` s, for the others).
    3. Every variant × seed with ``protocol + [seed=S]``, seed-major (:func:`main_tasks`); with
       ``probe_common``, each variant once more under it (e.g. one metered round) after its first seed
       (a probe that diverges is recorded as diverged too; :func:`fedge.bench.screened.recorded_probes`
       leaves it out).

    Worker ``shard`` of ``shards`` takes every ``shards``-th run of each list (start ``shards``
    processes with one torch thread each); with ``steal`` (the default) it then takes the other
    workers' runs that nobody is running now (:meth:`fedge.experiment.rundir.RunDir.busy`: not
    started, or left unfinished by a stopped worker), so no core idles while another has work,
    and a worker waiting for the screen screens meanwhile. Stealing sees only the runs under
    ``out``: workers on different machines pass ``steal=False`` (or split by ``only``).
    ``only``: (label, seed or None for every seed) pairs
    that restrict step 3 to those runs (before sharding), to send chosen runs to a machine; an
    unknown label is an error naming the table's labels. Finished runs are recorded under
    ``records`` (``screen/``, ``seed-S/``, ``probe/``) and read back instead of rerun, on any
    machine. Returns the main variants."""
    if not 0 <= shard < shards:
        raise ConfigError(
            f"shard {shard} of {shards}: expected 0 <= shard < shards, e.g. --shard 0/2"
        )
    root, out = Path(records), Path(out)

    grow = _grower(screen)
    current = grow([])

    def screen_one(label: str) -> None:
        run_variants(
            base,
            {label: current[label]},
            out_root=out / "screen",
            common=screen_common,
            records=root / "screen",
            record_divergence=True,
        )  # a step size that diverges loses the screen

    _work_share(list(current), shard, shards, screen_one, steal=steal)
    while True:
        rep = recorded(base, current, common=screen_common, records=root / "screen")
        if (
            bigger := grow(rep["results"])
        ).keys() != current.keys():  # the screen grew: screen the new runs
            current = bigger
            _work_share(list(current), shard, shards, screen_one, steal=steal)
            continue
        if (variants := main(rep)) is not None:
            break
        time.sleep(poll_s)  # another worker is still screening
        if steal:  # ... unless it stopped: then its screen runs are free to take
            _work_share(list(current), shard, shards, screen_one, steal=True, own=False)
    unknown = sorted({label for label, _ in only if label not in variants})
    if unknown:
        raise ConfigError(
            f"--only {unknown}: not a variant of this table; expected one of {list(variants)}"
        )
    tasks = main_tasks(list(variants), seeds, only)

    def main_one(task: tuple[str, int]) -> None:
        label, seed = task
        run_variants(
            base,
            {label: variants[label]},
            out_root=out / f"seed-{seed}",
            common=[*protocol, f"seed={seed}"],
            records=root / f"seed-{seed}",
            record_divergence=True,
        )  # a seed that diverges is a result
        if probe_common is not None and seed == seeds[0]:
            run_variants(
                base,
                {label: variants[label]},
                out_root=out / "probe",
                common=probe_common,
                records=root / "probe",
                record_divergence=True,
            )  # a probe that diverges is recorded; its table shows no figures

    _work_share(tasks, shard, shards, main_one, steal=steal)
    return variants


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
    """The screen runs of a :func:`run_screened` table as recorded under ``records/screen``
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
    """:func:`fedge.bench.variants.run_seeded_variants` reading only ``records``
    (``records/seed-S``): the table of whatever seeds are recorded, nothing runs."""
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
    """The probe runs of a :func:`run_screened` table (``probe_common``,
    recorded under ``records``, e.g. ``records/probe``) by label: the finished ones only. A probe
    that diverged measured no complete round, so its label is absent and the table's cell says
    "-" as for a probe not run yet."""
    rows = recorded(base, variants, common=common, records=records)["results"]
    return {r["label"]: r for r in rows if "diverged_round" not in r}


def when_picked(
    pick: Callable[[dict[str, Any]], T | None], variants: Callable[[T], dict[str, list[str]]]
) -> Callable[[dict[str, Any]], dict[str, list[str]] | None]:
    """The ``main`` of :func:`run_screened`: ``variants(pick(screen))`` — the table's variants
    built from what ``pick`` chose on the screen report — or None while ``pick`` returns None
    (a screen run is missing)."""

    def main(screen: dict[str, Any]) -> dict[str, list[str]] | None:
        chosen = pick(screen)
        return None if chosen is None else variants(chosen)

    return main


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
    """:func:`run_screened` of ``plan``: its screen overrides, protocol,
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
