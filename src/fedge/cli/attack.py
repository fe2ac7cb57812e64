"""``fedge attack``: privacy attacks as measurements against a run (issue 12).

    fedge attack RUN_DIR --attack dlg|ig [--iterations 300] [--samples 10] [--seed 0]
    fedge attack RUN_DIR --attack mia [--samples 1000]
    fedge attack RUN_DIR --attack mia-shadow [--samples 1000] [--shadows 4]
    fedge attack RUN_DIR --attack mia|mia-shadow --rounds 1,5,10 | --all-rounds
    fedge attack RUN_DIR --attack pia [--samples 40] [--property-class 0]

``dlg`` re-runs round 1 of the run's own config (same seed, same data, so the same uploads)
with every exchange observed (:class:`fedge.attacks.observe.Observer`) and attacks each
client's upload as the server receives it — DLG/iDLG on FedSGD gradients and FedAvg deltas;
for batch-level BAFFLE both matching the K loss differences directly and DLG on the Stein
estimate; under secure aggregation the same attacks on the masked vector; for EPPFL, whose
devices send the server only a masked M_c, the edge server's view instead: each device's
released (kept, clipped, noisy) activations inverted to the input with the round's M_c
(:mod:`fedge.attacks.inversion`). ``ig`` runs the
same with Inverting Gradients' objective (cosine + total variation, Adam). ``mia`` runs the
loss-threshold membership attack on the run's final model (training samples vs test samples;
the members are samples of clients the run aggregated in at least one round, as its summary
records them — re-running its rounds from its config for a run written before that record —
so a run that samples clients or loses some is scored on samples the model did train on);
``mia-shadow`` adds Shokri et al.'s shadow-model attack and offline LiRA, with ``--shadows``
shadow models trained by the run's own config (another seed) on half of the test samples not
used as non-members. With ``--rounds``/``--all-rounds`` the membership attacks run against
the global model after each listed round — what every method broadcasts to the next round's
clients, so an honest-but-curious holder of the broadcasts can attack it: the run is re-run
from its config (same seed and data, so the same models; the last round's equals the saved
final model) and its global model copied after each listed round; shadow models are their
own round-r models (``attacks/mia-rounds.json``, ``attacks/mia-shadow-rounds.json``). The
members are the same for every listed round: samples of clients aggregated by the first listed
round (too few for ``--samples`` is an error naming the ways out). ``pia`` re-runs the run's config for ⌈samples / clients a round⌉ rounds
with each client's local set cut to the one batch its upload is computed on, and infers from
each upload whether ``--property-class`` occurs in that batch (Melis et al. 2019; auxiliary
data: the test split). Every re-run assumes the run is reproducible from its config; one that
drew its noise from the OS CSPRNG (``privacy.secure_noise``, EPPFL's ``method.dp.secure_noise``)
is not, and the attacks that re-run it warn that their figures describe the re-run.
Results go to ``RUN_DIR/attacks/NAME.json`` and, for ``dlg``, an image grid per attack
(top: the client's image matched to the reconstruction, one to one for a batch; bottom: the
reconstruction).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from fedge.attacks.harness import warn_if_not_replayable
from fedge.attacks.images import image_grid
from fedge.attacks.membership_run import (
    attack_name,
    example_rounds,
    membership_attacks,
    membership_by_round,
    trained_clients,
)
from fedge.attacks.property import property_attack
from fedge.attacks.reconstruct_run import reconstruct_data
from fedge.cli.common import err, fail, one_line_warnings, out
from fedge.core.config import load_config
from fedge.core.errors import ConfigError, FedgeError
from fedge.core.rundir_schema import SUMMARY, loads
from fedge.experiment import storage
from fedge.experiment.build import build_run
from fedge.experiment.export import load_trained_model
from fedge.experiment.rundir import RunDir

__all__ = ["attack", "register"]

ATTACKS = ("dlg", "ig", "mia", "mia-shadow", "pia")


_WRITE_FIX = (
    "results go to RUN_DIR/attacks/: make the run directory writable (and free space), or copy "
    "the run to a writable place and attack the copy"
)


def _attacks_folder(run_dir: Path) -> Path:
    """``RUN_DIR/attacks``, created, and shown to be writable before the attack's work (a
    read-only run directory is one StorageError line, not a traceback after the work)."""
    folder = run_dir / "attacks"
    with storage.failing_as(folder, "create", _WRITE_FIX):
        folder.mkdir(exist_ok=True)
    probe = folder / ".write-probe.tmp"
    with storage.failing_as(folder, "write into", _WRITE_FIX, tmp=probe):
        storage.write_file(probe, b"")
        probe.unlink()
    return folder


def _write(run_dir: Path, name: str, result: dict[str, Any]) -> Path:
    path = _attacks_folder(run_dir) / f"{name}.json"
    storage.atomic_write(path, json.dumps(result, indent=2).encode(), _WRITE_FIX)
    return path


#: piped output: a line inside an upload's inversion at most this often (each upload's end: always)
LINE_EVERY_S = 10.0


class _InversionProgress:
    """How far a reconstruction attack is: on a terminal a transient bar (uploads done, and the
    iteration block inside the running one); when stdout is not a terminal (a pipe, a log, CI),
    plain lines: the replay of round 1, each upload's end, and inside an upload the iteration
    reached, at most every :data:`LINE_EVERY_S` seconds."""

    def __init__(self, name: str, samples: int, iterations: int) -> None:
        self.name, self.t0 = name, time.monotonic()
        self.last = self.t0
        self.bar = Progress(transient=True) if sys.stdout.isatty() else None
        self.label = f"inverting {samples} uploads x {iterations} iterations"
        self.task: Any = None
        self.samples = samples

    def __enter__(self) -> _InversionProgress:
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.samples)
        else:
            self._line("replaying round 1 of the run to observe its uploads")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def _line(self, text: str) -> None:
        self.last = time.monotonic()
        elapsed = datetime.timedelta(seconds=int(self.last - self.t0))
        print(f"{self.name}: {text}, {elapsed}", flush=True)  # a pipe is block-buffered

    def upload(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total, description=self.label)
        else:
            self._line(f"upload {done}/{total} done")

    def block(self, attack: str, upload: int, uploads: int, done: int, iterations: int) -> None:
        text = f"upload {upload}/{uploads}, {attack} iteration {done}/{iterations}"
        if self.bar is not None:
            self.bar.update(self.task, description=text)
        elif time.monotonic() - self.last >= LINE_EVERY_S:
            self._line(text)


def _dlg(
    run_dir: Path, raw: dict[str, Any], iterations: int, samples: int, seed: int, optimizer: str
) -> dict[str, Any]:
    cfg = load_config({**raw, "rounds": 1})
    with one_line_warnings(), _InversionProgress(optimizer, samples, iterations) as shown:
        run, result = reconstruct_data(
            cfg,
            iterations=iterations,
            samples=samples,
            seed=seed,
            optimizer=optimizer,
            progress=shown.upload,
            on_iterations=shown.block,
        )
    ds = run.built.dataset
    images = result.pop("_images")
    folder = _attacks_folder(run_dir)
    result["images"] = {}
    for a, (t, r) in images.items():
        with storage.failing_as(folder / f"{optimizer}-{a}.png", "write", _WRITE_FIX):
            grid = image_grid(t, r, ds.mean, ds.std, folder / f"{optimizer}-{a}")
        result["images"][a] = str(grid.relative_to(run_dir))
    return result


def _parse_rounds(text: str, last: int) -> list[int]:
    try:
        rounds = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        rounds = []
    if not rounds:
        raise ConfigError(
            f"--rounds {text!r} is not a list of round numbers; expected rounds of the run "
            f"(1..{last}), e.g. --rounds {example_rounds(last)}"
        )
    return rounds


def _mia_rounds(
    raw: dict[str, Any], rounds: list[int], samples: int, seed: int, shadows: int
) -> dict[str, Any]:
    with one_line_warnings():
        built = build_run(load_config(raw))
    label = f"re-running {built.config.rounds if not rounds else max(rounds)} rounds" + (
        f" and {shadows} shadow runs" if shadows else ""
    )
    with Progress(transient=True) as bar, one_line_warnings():
        task = bar.add_task(label, total=max(shadows, 1))
        result = membership_by_round(
            built,
            rounds,
            samples=samples,
            shadows=shadows,
            seed=seed,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    return {"attack": attack_name(shadows, by_round=True), **result}


def _trained_clients(run_dir: Path, built: Any) -> list[int]:
    """:func:`~fedge.attacks.membership_run.trained_clients`, from the run's summary.json; a
    replay (a run that predates the record) shows a progress line and the replay warning."""
    summary = loads((run_dir / SUMMARY).read_text())
    with ExitStack() as during_replay:

        def announce() -> None:
            bar = during_replay.enter_context(Progress(transient=True))
            during_replay.enter_context(one_line_warnings())
            warn_if_not_replayable(built.config.to_dict())
            bar.add_task(
                f"re-running {built.config.rounds} rounds to find the clients the model trained on "
                "(the run predates its record)",
                total=None,
            )

        return trained_clients(built, summary, announce)


def _mia(
    run_dir: Path, raw: dict[str, Any], samples: int, seed: int, shadows: int
) -> dict[str, Any]:
    trained = load_trained_model(run_dir, withheld_ok=True)
    with one_line_warnings():
        built = build_run(load_config(raw))
    who = _trained_clients(run_dir, built)
    if not shadows:
        r = membership_attacks(
            built, trained.model, samples=samples, seed=seed, withheld=trained.withheld, trained=who
        )
        what = attack_name(0, withheld=bool(trained.withheld))
        extra = {"completed": r["completed"]} if "completed" in r else {}
        return {"attack": what, "method": r["method"], "chance_auc": 0.5, **r["loss"], **extra}
    with Progress(transient=True) as bar, one_line_warnings():
        task = bar.add_task(
            f"training {shadows} shadow models ({built.config.rounds} rounds each)", total=shadows
        )
        result = membership_attacks(
            built,
            trained.model,
            samples=samples,
            shadows=shadows,
            seed=seed,
            withheld=trained.withheld,
            trained=who,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    return {"attack": attack_name(shadows), **result}


def attack(
    run_dir: Annotated[
        Path, typer.Argument(help="a run directory (dlg: its config; mia: its final model)")
    ],
    attack: Annotated[
        str, typer.Option("--attack", help="dlg | ig | mia | mia-shadow | pia")
    ] = "dlg",
    iterations: Annotated[
        int, typer.Option(min=1, help="dlg/ig: optimizer iterations per upload")
    ] = 300,
    samples: Annotated[
        int,
        typer.Option(min=1, help="dlg/ig/pia: uploads attacked; mia: members and non-members each"),
    ] = 10,
    seed: Annotated[int, typer.Option(help="the attacker's seed (dummy data, sample choice)")] = 0,
    shadows: Annotated[
        int, typer.Option(min=1, help="mia-shadow: shadow models (each a full run of the config)")
    ] = 4,
    property_class: Annotated[
        int,
        typer.Option("--property-class", min=0, help="pia: the class whose presence is inferred"),
    ] = 0,
    rounds: Annotated[
        str,
        typer.Option(
            "--rounds",
            help="mia/mia-shadow: attack the global model after these rounds, e.g. 1,5,10",
        ),
    ] = "",
    all_rounds: Annotated[
        bool,
        typer.Option(
            "--all-rounds", help="mia/mia-shadow: attack the global model after every round"
        ),
    ] = False,
) -> None:
    """Measure what a run leaks: reconstruct clients' data from their uploads, or infer membership."""
    if attack not in ATTACKS:
        fail(
            f"--attack {attack!r} is not an attack here; expected one of {list(ATTACKS)} (e.g. --attack dlg)"
        )
    try:
        with one_line_warnings():  # every warning one line, as the run's own
            raw = RunDir(run_dir).read_config()
            _attacks_folder(run_dir)  # writable, before the work
            if (rounds or all_rounds) and attack not in ("mia", "mia-shadow"):
                raise ConfigError(
                    f"--rounds/--all-rounds apply to --attack mia or mia-shadow, not {attack!r}; drop them"
                )
            if rounds or all_rounds or attack in ("dlg", "ig", "pia"):
                warn_if_not_replayable(raw)
            if rounds or all_rounds:
                every = list(range(1, int(load_config(raw).rounds) + 1))
                result = _mia_rounds(
                    raw,
                    every if all_rounds else _parse_rounds(rounds, len(every)),
                    samples,
                    seed,
                    shadows if attack == "mia-shadow" else 0,
                )
            elif attack in ("dlg", "ig"):
                result = _dlg(run_dir, raw, iterations, samples, seed, attack)
            elif attack == "pia":
                with Progress(transient=True) as bar:
                    task = bar.add_task("property inference", total=1)
                    result = property_attack(
                        raw,
                        samples=samples,
                        seed=seed,
                        prop=property_class,
                        progress=lambda done, total: bar.update(task, completed=done, total=total),
                    )
            else:
                result = _mia(run_dir, raw, samples, seed, shadows if attack == "mia-shadow" else 0)
        result["seed"] = seed
        path = _write(run_dir, f"{attack}-rounds" if "rounds" in result else attack, result)
    except FedgeError as exc:
        fail(exc)
    except KeyboardInterrupt:  # Ctrl-C: one line and 130, as fedge run
        err.print(
            "interrupted; the attack wrote no result (it writes them when it ends): run the "
            "command again",
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(130) from None
    console = out()
    if "rounds" in result:
        for r, row in result["rounds"].items():
            console.print(
                f"round {r} (test accuracy {row['test_accuracy']:.3f}): "
                + ", ".join(
                    f"{k} AUC {row[k]['auc']:.3f} TPR@1%FPR {row[k]['tpr_at_1pct_fpr']:.3f} precision {row[k]['precision']:.3f}"
                    for k in ("loss", "shadow", "lira")
                    if k in row
                )
                + " (chance AUC 0.5)"
            )
    elif attack == "pia":
        console.print(
            f"property inference AUC {result['auc']:.3f} (chance 0.5) on {result['uploads']} uploads "
            f"({result['with_property']} with class {property_class})"
            + (" (uploads masked)" if result["masked"] else "")
            + (
                f"; read from the labels the edge server receives in the clear (from the released activations "
                f"alone: AUC {result['auc_activations']:.3f})"
                if result.get("labels_in_clear")
                else ""
            )
        )
    elif attack == "mia-shadow":
        for key in ("loss", "shadow", "lira"):
            r = result[key]
            console.print(
                f"{key}: membership AUC {r['auc']:.3f} (chance 0.5), TPR@1%FPR {r['tpr_at_1pct_fpr']:.3f}, "
                f"TPR@0.1%FPR {r['tpr_at_01pct_fpr']:.3f}, precision {r['precision']:.3f}"
            )
    elif attack != "mia":
        console.print(
            f"baselines: mean image MSE {result['baseline_mean_image_mse']:.4f}, "
            f"mid-gray {result['baseline_mid_gray_mse']:.4f}"
            + (" (uploads masked)" if result.get("masked") else "")
        )
        for name, a in result["attacks"].items():
            console.print(
                f"{name}: median MSE {a['median_mse']:.2e} (PSNR {a['median_psnr_db']:.1f} dB)"
                + (f", label accuracy {a['label_accuracy']:.2f}" if "label_accuracy" in a else "")
                + (
                    " — no finite objective (ciphertext read as floats): the dummy start, not an attack's result"
                    if a.get("finite_objective", 1.0) == 0
                    else ""
                )
                + f"  -> {result['images'][name]}"
            )
    else:
        if "completed" in result:
            c = result["completed"]
            console.print(
                f"the run kept its last layer in the enclaves: attacking the released layers completed with a "
                f"classifier trained on {c['aux_samples']} samples of the attacker's own (its accuracy: members "
                f"{c['accuracy']['members']:.3f}, non-members {c['accuracy']['non_members']:.3f})"
            )
        console.print(
            f"membership AUC {result['auc']:.3f} (chance 0.5), TPR@1%FPR {result['tpr_at_1pct_fpr']:.3f}, "
            f"precision {result['precision']:.3f} (best {result['best_precision']:.3f})"
        )
    console.print(f"wrote {path}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("attack")(attack)
