"""BAFFLE Table 2 analogue (seed 000) with the skew cost measured: Fashion-MNIST, BAFFLE's LeNet,
C = 100 clients, label non-IID by Dirichlet(alpha = 0.3), epoch-level BAFFLE with one local epoch,
40 rounds, **all 100 clients every round**, and a **matched IID run** of every row (the same 100
clients, training subset, rounds, optimizer and seeds; only the partition differs), 3 seeds.

Participation: the paper states C = 100 and samples no subset (Algorithm 1 aggregates over all
C clients; its secure-aggregation noise sums to zero over all of them), so every client takes
part in every round. Its skew cost (~14 points on CIFAR-10) compares Table 2 with Table 1, whose
IID setting has C = 10; here the IID run is matched, so the cost is measured, not quoted.

Rows: BP FedAvg (client Adam, b2 0.99, batches of 20) and BAFFLE K = 100 and 200 (``--k500``:
also 500; the paper's LeNet rows are K = 200/500/1000 on CIFAR-10, Table 1 uses 100/200/500 for
MNIST-like data), each under Dirichlet 0.3 and IID.

Tuning: for each partition, the client learning rate of BAFFLE (smallest K) and of BP FedAvg is
picked from ``SCREEN_LRS`` by the final **validation** accuracy after ``screen_rounds`` rounds of
the same protocol on seed 0 (never the test set); a grid whose best sits at its edge grows one step
past it (0.03 -> 0.1; at most twice), so the pick is bracketed; the larger K reuse BAFFLE's pick.

Cost (the records' wall time, one torch thread per run on a 2-core machine running two
workers; the section lists every row's minutes below the table): on the protocol's **3,000
training samples** a 40-round run of K = 100 took 63-122 CPU-minutes (1.5-3 minutes a round),
K = 200 ~110, BP FedAvg 11-15 (an early estimate from one unshared round, ~30 minutes for K = 100,
was 2-4x too low). Full protocol: screens (2 partitions x 3 lrs x 10 rounds of K = 100) ~1.5 h,
then per seed and partition K = 100 + 200 + BP ~3.5 h, x 3 seeds x 2 partitions: **~22 CPU-hours**
(K = 500 adds ~2.5x K = 100's time per seed and partition); run it in shards. Those figures are an
avx2 EPYC's; an avx512 EPYC ran K = 200 at 95-108 s a round (~65-70 minutes a run, ~1.6x faster).

Resumable across machines: every finished run writes its row, with its full config, to
``benchmarks/results/baffle_table2/`` (commit it); rerunning reads those rows and runs only what is
missing. Parallel workers: ``--shard 0/2`` and ``--shard 1/2`` (one torch thread and one core each: ``OMP_NUM_THREADS=1 taskset -c I``).
``--save-progress`` does not carry the BAFFLE persistent-Adam context runs part-way (each holds all
100 clients' Adam moments, ~31 MB, over its 8 MB limit): start them where they can finish (a
10-round screen run, or a 40-round seed run: ~20 CPU-minutes on an avx512 EPYC, up to ~1-2
CPU-hours on a busier avx2 one, as the table's K = 100 rows).

    python benchmarks/baffle_table2.py [--shard I/N] [--k500] [--out runs/bench-baffle-table2] [--docs docs/benchmarks.md]
    python benchmarks/baffle_table2.py --table-only --docs docs/benchmarks.md   # tabulate what is recorded
    python benchmarks/baffle_table2.py --smoke --out /tmp/t2                    # seconds: the whole pipeline, tiny
    python benchmarks/baffle_table2.py --context      # the context rows (BP ~2 CPU-h; BAFFLE persistent: screen + 6 runs, ~4 CPU-h)
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedge.bench.docs import publish, records_line
from fedge.bench.screened import (
    pick_by_validation,
    read_plan_screen,
    recorded_seeded,
    run_plan,
    when_picked,
    widened_grid,
)
from fedge.bench.script import (
    parse_reproduction_args,
    progress_action,
    reproduction_parser,
    usage_errors,
)
from fedge.bench.stats import comparison, paired_difference, t_interval, verdict
from fedge.bench.tables import mean_cell, not_run_cell, per_seed_cell, run_notes, screen_cell

BASE = "baffle-fmnist-lenet"
RECORDS = Path(__file__).resolve().parent / "results" / "baffle_table2"
BP = [
    "method.name=fedavg",
    "method.batch_size=20",
    "method.client_optimizer.name=adam",
    "method.client_optimizer.b2=0.99",
]
SCREEN_LRS = (0.003, 0.01, 0.03)
PARTITIONS = {
    "Dirichlet 0.3": ["partition.name=dirichlet", "partition.alpha=0.3", "partition.min_size=5"],
    "IID": ["partition.name=iid"],
}
# Paper, LeNet on CIFAR-10 (accuracy %): Table 2 (Dirichlet 0.3, C = 100) against Table 1 (IID, C = 10).
PAPER_COST = {
    "BP FedAvg": 58.75 - 44.41,
    "BAFFLE K=200": 48.78 - 35.21,
    "BAFFLE K=500": 51.82 - 38.14,
    "BAFFLE K=1000": 53.62 - 39.71,
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The protocol; ``--smoke`` shrinks it to seconds (and records outside the committed folder)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    rounds: int = 40
    train: int = 3000
    validation: int = 1000
    test: int = 10000
    ks: tuple[int, ...] = (100, 200)
    screen_rounds: int = 10
    lrs: tuple[float, ...] = SCREEN_LRS
    records: Path = RECORDS
    extra: tuple[str, ...] = ()
    screen_extra: tuple[str, ...] = ()  # overrides of the screen runs only

    def protocol(self) -> list[str]:
        return [
            "draws=torch",  # the committed records were drawn with torch's generators
            "threads=1",
            f"rounds={self.rounds}",
            "clients.num=100",
            "clients.per_round=100",
            f"dataset.limit_train={self.train + self.validation}",
            f"dataset.validation={self.validation}",
            f"dataset.limit_test={self.test}",
            "measure.flops=false",
            *self.extra,
        ]

    def screen_common(self) -> list[str]:
        return [*self.protocol(), f"rounds={self.screen_rounds}", "seed=0", *self.screen_extra]


def smoke_plan(out: Path) -> Plan:
    return Plan(
        seeds=(0, 1),
        rounds=2,
        train=600,
        validation=100,
        test=200,
        ks=(4, 8),
        screen_rounds=1,
        lrs=(0.01, 0.03),
        records=out / "records",
        extra=("clients.num=10", "clients.per_round=10"),
    )


def families(plan: Plan) -> list[str]:
    return ["BP FedAvg", *(f"BAFFLE K={k}" for k in plan.ks)]


def grid(
    plan: Plan, results: Sequence[dict[str, Any]], family: str, part: str
) -> tuple[float, ...]:
    """``plan.lrs``, widened past an edge that won the screen so far (:func:`widened_grid`)."""
    return widened_grid(plan.lrs, lambda lr: f"screen {family}, {part}, lr={lr}", list(results))


def screen_variants(plan: Plan, results: Sequence[dict[str, Any]] = ()) -> dict[str, list[str]]:
    """The screen runs, grown by what the recorded ``results`` found (a family's grid gains one lr
    past an edge whose run had the best validation accuracy)."""
    out = {}
    for (
        part,
        p,
    ) in (
        PARTITIONS.items()
    ):  # the costly BAFFLE screens first, so that workers taking every N-th share them
        family = f"BAFFLE K={plan.ks[0]}"
        out.update(
            {
                f"screen {family}, {part}, lr={lr}": [
                    *p,
                    f"method.k={plan.ks[0]}",
                    f"method.client_optimizer.lr={lr}",
                ]
                for lr in grid(plan, results, family, part)
            }
        )
    for part, p in PARTITIONS.items():
        out.update(
            {
                f"screen BP FedAvg, {part}, lr={lr}": [*p, *BP, f"method.client_optimizer.lr={lr}"]
                for lr in grid(plan, results, "BP FedAvg", part)
            }
        )
    return out


def _pick(plan: Plan, screen: dict[str, Any], family: str, part: str) -> float | None:
    """``family``'s lr under ``part`` picked on the screen's validation accuracy over its grown grid
    (None while a screen run is missing)."""
    lrs = grid(plan, screen["results"], family, part)
    return pick_by_validation(
        screen["results"], {lr: f"screen {family}, {part}, lr={lr}" for lr in lrs}
    )


def picks(plan: Plan, screen: dict[str, Any]) -> dict[tuple[str, str], float] | None:
    """{(family, partition): lr} picked on validation, or None while a screen run is missing."""
    chosen = {}
    for part in PARTITIONS:
        for family in (f"BAFFLE K={plan.ks[0]}", "BP FedAvg"):
            if (lr := _pick(plan, screen, family, part)) is None:
                return None
            chosen[family.split(" K=")[0], part] = lr
    return chosen


def main_variants(plan: Plan, chosen: dict[tuple[str, str], float]) -> dict[str, list[str]]:
    out = {}
    for k in plan.ks:  # costly first
        for part, p in PARTITIONS.items():
            out[f"BAFFLE K={k}, {part}"] = [
                *p,
                f"method.k={k}",
                f"method.client_optimizer.lr={chosen['BAFFLE', part]}",
            ]
    for part, p in PARTITIONS.items():
        out[f"BP FedAvg, {part}"] = [
            *p,
            *BP,
            f"method.client_optimizer.lr={chosen['BP FedAvg', part]}",
        ]
    return out


def read_screen(plan: Plan) -> dict[str, Any]:
    return read_plan_screen(BASE, plan, lambda results: screen_variants(plan, results))


def run_all(
    plan: Plan,
    shard: int,
    shards: int,
    out: Path,
    only: list[tuple[str, int | None]] | None = None,
    *,
    steal: bool = True,
) -> None:
    main = when_picked(
        lambda screen: picks(plan, screen), lambda chosen: main_variants(plan, chosen)
    )
    run_plan(
        BASE,
        plan,
        lambda results: screen_variants(plan, results),
        main,
        out=out,
        shard=shard,
        shards=shards,
        only=only or (),
        steal=steal,
    )


# Context for the BP rows, outside the paper's table (``--context``): is BP under-tuned here? Its
# lr is screened at the full length (BP runs cost minutes, so a 40-round screen is affordable for
# it, not for BAFFLE), with the client Adam built fresh each round as in the table, and kept across
# rounds as BAFFLE's reference code keeps it (one torch.optim.Adam per client for the whole run).
CONTEXT_STATES = {"fresh Adam": [], "persistent Adam": ["method.client_optimizer.state=persistent"]}


def context_plan(plan: Plan) -> Plan:
    """The context's plan: the protocol of ``plan``, its screen as long as a main run (evaluated
    four times, every rounds/4: the pick reads the final validation accuracy, and
    evaluating 11,000 images is most of a BP round), records apart."""
    return dataclasses.replace(
        plan,
        screen_rounds=plan.rounds,
        records=plan.records / "context",
        screen_extra=(f"eval_every={max(1, plan.rounds // 4)}",),
    )


def context_screen_variants(
    plan: Plan, results: Sequence[dict[str, Any]] = ()
) -> dict[str, list[str]]:
    out = {}
    for part, p in PARTITIONS.items():
        for state, o in CONTEXT_STATES.items():
            family = f"BP FedAvg, {state}"
            out.update(
                {
                    f"screen {family}, {part}, lr={lr}": [
                        *p,
                        *BP,
                        *o,
                        f"method.client_optimizer.lr={lr}",
                    ]
                    for lr in grid(plan, results, family, part)
                }
            )
    return out


def context_picks(plan: Plan, screen: dict[str, Any]) -> dict[tuple[str, str], float] | None:
    """{(state, partition): lr} picked on the full-length screen's validation accuracy, or None."""
    chosen = {}
    for part in PARTITIONS:
        for state in CONTEXT_STATES:
            if (lr := _pick(plan, screen, f"BP FedAvg, {state}", part)) is None:
                return None
            chosen[state, part] = lr
    return chosen


def context_variants(chosen: dict[tuple[str, str], float]) -> dict[str, list[str]]:
    return {
        f"BP FedAvg, {state}, {part}": [
            *PARTITIONS[part],
            *BP,
            *CONTEXT_STATES[state],
            f"method.client_optimizer.lr={lr}",
        ]
        for (state, part), lr in chosen.items()
    }


def run_context(plan: Plan, shard: int, shards: int, out: Path, *, steal: bool = True) -> None:
    """The context's screen, then its rows over the plan's seeds (under ``out/context``)."""
    cplan = context_plan(plan)
    main = when_picked(lambda screen: context_picks(cplan, screen), context_variants)
    run_plan(
        BASE,
        cplan,
        lambda results: context_screen_variants(cplan, results),
        main,
        out=out / "context",
        shard=shard,
        shards=shards,
        steal=steal,
    )
    zplan = zo_context_plan(plan)
    zmain = when_picked(
        lambda screen: zo_context_picks(zplan, screen),
        lambda chosen: zo_context_variants(zplan, chosen),
    )
    run_plan(
        BASE,
        zplan,
        lambda results: zo_context_screen_variants(zplan, results),
        zmain,
        out=out / "context-baffle-persistent",
        shard=shard,
        shards=shards,
        steal=steal,
    )


def zo_context_plan(plan: Plan) -> Plan:
    """BAFFLE's smallest K with the client Adam kept across rounds: screened as the table's BAFFLE
    rows are (``plan.screen_rounds`` rounds), so that its row matches the persistent BP row's
    optimizer state; records apart."""
    return dataclasses.replace(plan, records=plan.records / "context-baffle-persistent")


def _zo_family(plan: Plan) -> str:
    return f"BAFFLE K={plan.ks[0]}, persistent Adam"


def zo_context_screen_variants(
    plan: Plan, results: Sequence[dict[str, Any]] = ()
) -> dict[str, list[str]]:
    family, k = _zo_family(plan), plan.ks[0]
    return {
        f"screen {family}, {part}, lr={lr}": [
            *p,
            f"method.k={k}",
            *CONTEXT_STATES["persistent Adam"],
            f"method.client_optimizer.lr={lr}",
        ]
        for part, p in PARTITIONS.items()
        for lr in grid(plan, results, family, part)
    }


def zo_context_picks(plan: Plan, screen: dict[str, Any]) -> dict[str, float] | None:
    """{partition: lr} picked on the screen's final validation accuracy, or None."""
    chosen = {}
    for part in PARTITIONS:
        if (lr := _pick(plan, screen, _zo_family(plan), part)) is None:
            return None
        chosen[part] = lr
    return chosen


def zo_context_variants(plan: Plan, chosen: dict[str, float]) -> dict[str, list[str]]:
    return {
        f"{_zo_family(plan)}, {part}": [
            *PARTITIONS[part],
            f"method.k={plan.ks[0]}",
            *CONTEXT_STATES["persistent Adam"],
            f"method.client_optimizer.lr={lr}",
        ]
        for part, lr in chosen.items()
    }


def _zo_context(
    plan: Plan,
) -> tuple[list[str], dict[str, float] | None, dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The BAFFLE persistent-Adam screen as one line per partition, its picks, its recorded rows by label."""
    zplan = zo_context_plan(plan)
    screen = read_plan_screen(
        BASE, zplan, lambda results: zo_context_screen_variants(zplan, results)
    )
    rows = {r["label"]: r for r in screen["results"]}
    family = _zo_family(plan)
    lines = [
        f"{family} screen ({zplan.screen_rounds} rounds, seed 0, as the table's BAFFLE screen; validation accuracy by lr):",
        "",
    ]
    for part in PARTITIONS:
        cells = [
            f"{lr}: {screen_cell(rows.get(f'screen {family}, {part}, lr={lr}'))}"
            for lr in grid(zplan, screen["results"], family, part)
        ]
        lines.append(f"- {part}: " + ", ".join(cells))
    chosen = zo_context_picks(zplan, screen)
    if chosen is None:
        return lines, None, {}, []
    report = recorded_seeded(
        BASE,
        zo_context_variants(zplan, chosen),
        seeds=zplan.seeds,
        common=zplan.protocol(),
        records=zplan.records,
    )
    return lines, chosen, {r["label"]: r for r in report["results"]}, report["results"]


def _paired_bullet(
    what: str, d: dict[str, Any], ahead: tuple[str, str] = ("BAFFLE ahead", "BP ahead")
) -> str:
    """A paired difference A − B (:func:`paired_difference`; by default BAFFLE − BP) as a bullet
    with its verdict (:func:`fedge.bench.stats.comparison`: no paper reports it): ``ahead``
    names the verdicts for A ahead and for B ahead."""
    who = comparison(100 * d["lo"], 100 * d["hi"], ahead)
    return (
        f"- {what}: {d['mean'] * 100:+.2f} ± {d['std'] * 100:.2f} points over seeds {d['seeds']} "
        f"(95% interval {d['lo'] * 100:+.1f} to {d['hi'] * 100:+.1f}) → {who}."
    )


def context_lines(
    plan: Plan, agg: dict[str, dict[str, Any]]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The context screen and rows beside the table's BP and BAFFLE rows, and BAFFLE's smallest K
    against each context row (paired by seed); and the context's recorded rows."""
    cplan = context_plan(plan)
    screen = read_plan_screen(BASE, cplan, lambda results: context_screen_variants(cplan, results))
    rows = {r["label"]: r for r in screen["results"]}
    cols = [(state, part) for part in PARTITIONS for state in CONTEXT_STATES]
    grids = {
        (state, part): grid(cplan, screen["results"], f"BP FedAvg, {state}", part)
        for state, part in cols
    }
    out = [
        f"**Is the BP row under-tuned, and does the client optimizer's state matter?** (context rows, outside the "
        "paper's table; `--context` runs them): BP "
        f"FedAvg with its lr screened at the full length ({cplan.screen_rounds} rounds, seed 0, picked by final "
        f"validation accuracy, evaluated every {max(1, cplan.rounds // 4)} rounds; BP runs cost minutes, BAFFLE's hours, so only BP gets a full-length screen), with the "
        "client Adam built fresh each round as in the table, and kept across rounds "
        "(`method.client_optimizer.state=persistent`) as BAFFLE's reference code keeps it; and BAFFLE's smallest K "
        "with the persistent Adam too, screened as the table's BAFFLE rows, so one pair of rows matches the "
        "optimizer state.",
        "",
        "| lr | " + " | ".join(f"{state}, {part} val acc" for state, part in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for lr in sorted({lr for g in grids.values() for lr in g}):
        cells = [
            screen_cell(rows.get(f"screen BP FedAvg, {s}, {p}, lr={lr}"))
            if lr in grids[s, p]
            else "-"
            for s, p in cols
        ]
        out.append(f"| {lr} | " + " | ".join(cells) + " |")
    chosen = context_picks(cplan, screen)
    if chosen is None:
        return [*out, "", "The context screen is not finished."], []
    report = recorded_seeded(
        BASE,
        context_variants(chosen),
        seeds=cplan.seeds,
        common=cplan.protocol(),
        records=cplan.records,
    )
    ctx = {r["label"]: r for r in report["results"]}
    zo_lines, zo_chosen, zo_rows, zo_results = _zo_context(plan)
    out += ["", *zo_lines]
    out += [
        "",
        "| row | partition | lr | seeds | final test acc (mean ± std) | test acc at best val | per seed (final) |",
        "|---|---|---|---|---|---|---|",
    ]
    zo = f"BAFFLE K={plan.ks[0]}"
    lines_after = []
    matched = False  # a line pairing BAFFLE and BP with the same (persistent) optimizer state
    for part in PARTITIONS:
        entries: list[tuple[str, dict[str, Any] | None, float | None]] = [
            (
                f"BP FedAvg (the table's row, {plan.screen_rounds}-round screen)",
                agg.get(f"BP FedAvg, {part}"),
                None,
            ),
            *(
                (
                    f"BP FedAvg, {s}, full-length screen",
                    ctx.get(f"BP FedAvg, {s}, {part}"),
                    chosen[s, part],
                )
                for s in CONTEXT_STATES
            ),
            (f"{zo} (the table's row)", agg.get(f"{zo}, {part}"), None),
            (
                _zo_family(plan),
                zo_rows.get(f"{_zo_family(plan)}, {part}"),
                None if zo_chosen is None else zo_chosen[part],
            ),
        ]
        for label, r, row_lr in entries:
            if label == _zo_family(plan):
                if (
                    r is not None
                    and (bp := ctx.get(f"BP FedAvg, persistent Adam, {part}")) is not None
                ):
                    if (d := paired_difference(r, bp)) is not None:
                        lines_after.append(
                            _paired_bullet(
                                f"{part}, both with persistent Adam: {label.split(',')[0]} − BP FedAvg",
                                d,
                            )
                        )
                        matched = True
            lr_cell = "" if row_lr is None else str(row_lr)
            if r is None:
                out.append(f"| {label} | {part} | {lr_cell} | 0 | not run yet | | |")
                continue
            out.append(
                f"| {label} | {part} | {lr_cell} | {r['seeds']} | {mean_cell(r)} | "
                f"{mean_cell(r, 'test_accuracy_at_best_val')} | {per_seed_cell(r)} |"
            )
            if (
                row_lr is not None
                and label != _zo_family(plan)
                and agg.get(f"{zo}, {part}") is not None
            ):
                if (d := paired_difference(agg[f"{zo}, {part}"], r)) is not None:
                    lines_after.append(
                        _paired_bullet(
                            f"{part}: {zo} − BP FedAvg ({label.split(', ')[1]}, lr {row_lr})", d
                        )
                    )
    if lines_after:
        state = (
            'the lines "both with persistent Adam" match the optimizer state too'
            if matched
            else "no line matches the optimizer state yet: its persistent-Adam BAFFLE rows are not finished"
        )
        out += [
            "",
            f"{zo} against the context rows (final test accuracy, paired by seed; the paper has BP ahead "
            f"everywhere; the table's BAFFLE row has a fresh Adam each round; {state}):",
            "",
            *lines_after,
        ]
    out += _optimizer_state_lines(plan, agg, ctx, zo_rows)
    return out, [*report["results"], *zo_results]


def _optimizer_state_lines(
    plan: Plan,
    agg: dict[str, dict[str, Any]],
    ctx: dict[str, dict[str, Any]],
    zo_rows: dict[str, dict[str, Any]],
) -> list[str]:
    """What keeping the client Adam across rounds is worth (persistent − fresh, paired by seed), for
    BP (both rows screened at the full length) and for BAFFLE (the persistent row against the
    table's fresh row, each at the lr its own screen picked)."""
    zo, lines = f"BAFFLE K={plan.ks[0]}", []
    for part in PARTITIONS:
        pairs = [
            (
                "BP FedAvg (full-length screens)",
                ctx.get(f"BP FedAvg, persistent Adam, {part}"),
                ctx.get(f"BP FedAvg, fresh Adam, {part}"),
            ),
            (
                f"{zo} ({plan.screen_rounds}-round screens)",
                zo_rows.get(f"{_zo_family(plan)}, {part}"),
                agg.get(f"{zo}, {part}"),
            ),
        ]
        for what, kept, fresh in pairs:
            if (
                kept is not None
                and fresh is not None
                and (d := paired_difference(kept, fresh)) is not None
            ):
                lines.append(
                    _paired_bullet(
                        f"{part}: {what}, persistent − fresh Adam",
                        d,
                        ahead=("the persistent Adam ahead", "the fresh Adam ahead"),
                    )
                )
    if not lines:
        return []
    return [
        "",
        "What the client optimizer's state is worth (final test accuracy, persistent − fresh Adam, paired "
        "by seed; each row at the lr its own screen picked):",
        "",
        *lines,
    ]


def table(plan: Plan, command: str) -> str:
    screen = read_screen(plan)
    rows = {r["label"]: r for r in screen["results"]}
    cols = [(f"BAFFLE K={plan.ks[0]}", "BAFFLE", p) for p in PARTITIONS] + [
        ("BP FedAvg", "BP FedAvg", p) for p in PARTITIONS
    ]
    grids = {
        (short, part): grid(plan, screen["results"], family, part) for family, short, part in cols
    }
    lines = [
        intro(plan),
        "",
        f"Command: `{command}`",
        "",
        f"**Learning-rate screen** (client Adam lr; seed 0, the protocol's data, "
        f"{plan.screen_rounds} rounds; picked per partition by final **validation** accuracy; a grid grows one step "
        "past an edge that wins, at most twice):",
        "",
        "| lr | " + " | ".join(f"{f}, {p} val acc" for f, _, p in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for lr in sorted({lr for g in grids.values() for lr in g}):
        cells = [
            screen_cell(rows.get(f"screen {f}, {p}, lr={lr}")) if lr in grids[short, p] else "-"
            for f, short, p in cols
        ]
        lines.append(f"| {lr} | " + " | ".join(cells) + " |")
    chosen = picks(plan, screen)
    if chosen is None:
        return "\n".join([*lines, "", "The screen is not finished; no main runs yet."])
    edge = [
        f"{f} {p}" for (f, p), lr in chosen.items() if lr in (min(grids[f, p]), max(grids[f, p]))
    ]
    lines += [
        "",
        "Picked: "
        + "; ".join(f"{f} {p}: lr {lr}" for (f, p), lr in chosen.items())
        + "."
        + (f" At the edge of its grid even after widening: {', '.join(edge)}." if edge else ""),
        "",
    ]
    variants = main_variants(plan, chosen)
    report = recorded_seeded(
        BASE, variants, seeds=plan.seeds, common=plan.protocol(), records=plan.records
    )
    agg = {r["label"]: r for r in report["results"]}
    lines += [
        "| row | partition | seeds | final test acc (mean ± std) | test acc at best val | per seed (final) | "
        "up B/client/round (mean of all rounds) |",
        "|---|---|---|---|---|---|---|",
    ]
    for family in families(plan):
        for part in PARTITIONS:
            r = agg.get(f"{family}, {part}")
            if r is None:
                lines.append(
                    f"| {family} | {part} | 0 | {not_run_cell(report, f'{family}, {part}')} | | | |"
                )
                continue
            per_seed = per_seed_cell(r)
            lines.append(
                f"| {family} | {part} | {r['seeds']} | {mean_cell(r)} | {mean_cell(r, 'test_accuracy_at_best_val')} | {per_seed} "
                f"| {r['bytes_up_per_client_round']:.0f} |"
            )
    context, context_rows = context_lines(plan, agg)
    lines += ["", *verdicts(plan, agg), "", *context]
    lines += run_notes([*report["results"], *context_rows])
    return "\n".join(lines)


VERDICT_KEY = (
    "each verdict in two parts: **direction** (the 95% interval excludes 0 with the paper's sign: "
    "same direction; with the other sign: opposite direction; else not resolved) and **size** "
    "(size matches when the paper's figure lies inside the interval, else fedge's mean effect as a "
    "multiple of the paper's; the paper's figures are LeNet on CIFAR-10, ours on Fashion-MNIST)"
)


def verdicts(plan: Plan, agg: dict[str, dict[str, Any]]) -> list[str]:
    """The skew cost of every row (IID − Dirichlet, paired by seed: the same seed draws the same
    training subset and initial model for both partitions), and BAFFLE's cost against BP's, each
    with its two-part verdict against the paper (:func:`fedge.bench.stats.verdict`). A difference
    counts as a direction only when the 95% t interval of its per-seed mean excludes 0
    (:func:`fedge.bench.stats.t_interval`)."""
    costs = {}
    out = [
        "Skew cost (final test accuracy, IID − Dirichlet 0.3, per-seed paired; mean ± std over seeds; "
        f"every row of the paper shows a cost), {VERDICT_KEY}:",
        "",
    ]
    for family in families(plan):
        a, b = agg.get(f"{family}, IID"), agg.get(f"{family}, Dirichlet 0.3")
        d = paired_difference(a, b) if a is not None and b is not None else None
        if d is None:
            out.append(f"- {family}: needs both partitions on at least 2 seeds.")
            continue
        costs[family] = d
        paper = PAPER_COST.get(family)
        lo, hi, mean = 100 * d["lo"], 100 * d["hi"], 100 * d["mean"]
        where = (
            f"paper (CIFAR-10, IID at C = 10): {paper:+.2f}"
            if paper is not None
            else "the paper has no row at this K"
        )
        out.append(
            f"- {family}: {mean:+.2f} ± {d['std'] * 100:.2f} points over seeds {d['seeds']} "
            f"(95% interval {lo:+.1f} to {hi:+.1f}; {where}) → {verdict(lo, hi, mean, paper, sign=1.0)}."
        )
    bp = costs.get("BP FedAvg")
    if bp is not None:
        out += [
            "",
            "BAFFLE's skew cost against BP FedAvg's (paper, CIFAR-10: BAFFLE 13.6–13.9 points, BP 14.3 — "
            "label skew does not hurt BAFFLE more than backprop; at K = 200 the paper's difference is "
            f"{PAPER_COST['BAFFLE K=200'] - PAPER_COST['BP FedAvg']:+.2f}), {VERDICT_KEY}:",
            "",
        ]
        for family in families(plan)[1:]:
            a, b = agg.get(f"{family}, IID"), agg.get(f"{family}, Dirichlet 0.3")
            diff = (
                None
                if family not in costs or a is None or b is None
                else _cost_difference(a, b, agg["BP FedAvg, IID"], agg["BP FedAvg, Dirichlet 0.3"])
            )
            if diff is None:
                out.append(
                    f"- {family} − BP: needs both partitions of both rows on at least 2 common seeds."
                )
                continue
            mean, std, (lo, hi) = statistics.mean(diff), statistics.stdev(diff), t_interval(diff)
            paper = PAPER_COST[family] - PAPER_COST["BP FedAvg"] if family in PAPER_COST else None
            where = f"paper {paper:+.2f}" if paper is not None else "the paper has no row at this K"
            out.append(
                f"- {family} − BP: {mean * 100:+.2f} ± {std * 100:.2f} points (95% interval {lo * 100:+.1f} "
                f"to {hi * 100:+.1f}; {where}) → {verdict(100 * lo, 100 * hi, 100 * mean, paper, sign=-1.0)}."
            )
    return out


def _cost_difference(
    zi: dict[str, Any], zd: dict[str, Any], bi: dict[str, Any], bd: dict[str, Any]
) -> list[float] | None:
    """Per common seed, (ZO IID − ZO Dirichlet) − (BP IID − BP Dirichlet); None with fewer than 2 seeds."""
    by = [{r["seed"]: r["final_test_accuracy"] for r in x["runs"]} for x in (zi, zd, bi, bd)]
    seeds = sorted(set.intersection(*(set(v) for v in by)))
    if len(seeds) < 2:
        return None
    return [(by[0][s] - by[1][s]) - (by[2][s] - by[3][s]) for s in seeds]


def intro(plan: Plan) -> str:
    return f"""Protocol (the paper's Table 2 setting, on Fashion-MNIST instead of CIFAR-10): BAFFLE's LeNet
(Hardswish, GroupNorm), C = 100 clients, **all 100 every round** (the paper samples no subset),
label skew by Dirichlet(alpha = 0.3) with at least 5 samples per client, and a **matched IID
run** (same clients, data, rounds, optimizer, seeds; only the partition differs) so the skew
cost is measured; epoch-level BAFFLE (one local epoch of batches of 20, twice-FD, sigma 1e-4,
EMA 0.995 with warm-up, the reference code's 0.3 inf-norm clip), client Adam (b2 0.99, built
fresh each round; the reference code keeps one per client), FedAvg
on the server, **{plan.rounds} rounds**, **{plan.train:,} training samples** (a seeded subset of the 60,000) plus
{plan.validation:,} held out for validation, {plan.test:,} test images, seeds {", ".join(map(str, plan.seeds))}. Reduced from the paper:
{plan.train:,} of the 60,000 training images (CPU time: each run's minutes are listed at the end), K =
{"/".join(map(str, plan.ks))} (the paper's LeNet rows: 200/500/1000 on CIFAR-10). "Final" is the last round's test
accuracy; "at best val" the test accuracy of the round with the best validation accuracy. Bytes
are the serialized model delta (epoch level: BAFFLE uploads what BP FedAvg does)."""


def main(argv: list[str] | None = None) -> int:
    ap = reproduction_parser(__doc__, out="runs/bench-baffle-table2")
    ap.add_argument(
        "--k500",
        action="store_true",
        help="also K = 500 (about 2.5 CPU-hours a seed and partition)",
    )
    ap.add_argument(
        "--context",
        action="store_true",
        help="run only the context rows for BP (a full-length lr screen; client Adam fresh and persistent)",
    )
    args, shard, shards = parse_reproduction_args(ap, argv)
    plan = (
        smoke_plan(Path(args.out))
        if args.smoke
        else Plan(ks=(100, 200, 500) if args.k500 else (100, 200))
    )
    if progress_action(args, plan.records):
        return 0
    if args.context and not args.table_only:
        with usage_errors(ap):
            run_context(plan, shard, shards, Path(args.out), steal=not args.no_steal)
    elif not args.table_only:
        with usage_errors(ap):
            run_all(plan, shard, shards, Path(args.out), only=args.only, steal=not args.no_steal)
    text = table(
        plan,
        "python benchmarks/baffle_table2.py"
        + (" --k500" if args.k500 else "")
        + (" --smoke" if args.smoke else ""),
    )
    publish(
        text,
        args.docs,
        "baffle-table2",
        "BAFFLE Table 2 analogue (matched IID, 3 seeds, validation-tuned)",
        machine=records_line(plan.records, root=Path(__file__).resolve().parents[1]),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
