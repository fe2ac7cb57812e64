"""``fedge run``: train a federation and write its run directory (or resume one)."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from fedge.cli.common import err, fail, one_line_warnings, out, set_options
from fedge.core.errors import ConfigError, DivergenceError, FedgeError, MessageError
from fedge.core.rundir_schema import (
    CONFIG,
    CUM_BYTES_DOWN,
    CUM_BYTES_UP,
    FINAL_TEST_ACCURACY,
    ROUND,
    ROUNDS,
    STOPPED,
    SUMMARY,
    TEST_ACCURACY,
    loads,
)
from fedge.experiment.progress import Progress
from fedge.experiment.rundir import RunDir, default_run_path
from fedge.report import render_report
from fedge.runtime.spec import Runtime

__all__ = ["moved_text", "run"]


def _default_out(source: str) -> Path:
    return default_run_path(Path(source).stem if source.endswith((".yaml", ".yml")) else source)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a batch scheduler's stop, ``timeout``) raised where the run is, so that
    it stops as after Ctrl-C: temporary files removed, a claim undone, a resumable directory."""


@contextmanager
def _sigterm_stops_like_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`_Terminated` in this process (Python's default
    ends it on the spot, leaving a half-made claim or temporary files). Forked client workers
    inherit the handler; they die of the signal as before (the pool stops them with it)."""
    me = os.getpid()

    def stop(signum: int, frame: Any) -> None:
        if os.getpid() != me:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise _Terminated

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (an embedding app): leave its handling alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(target: Path | None, exc: KeyboardInterrupt) -> NoReturn:
    """The line after Ctrl-C or SIGTERM: how to continue, or that nothing was written."""
    what = "terminated (SIGTERM)" if isinstance(exc, _Terminated) else "interrupted"
    if target is not None and (target / CONFIG).is_file():
        err.print(
            f"{what}; continue with: fedge run --resume {target}", markup=False, soft_wrap=True
        )
    else:
        err.print(
            f"{what} before the run wrote anything; nothing to resume: run the command again",
            markup=False,
            soft_wrap=True,
        )
    raise typer.Exit(143 if isinstance(exc, _Terminated) else 130) from None


def moved_text(line: dict[str, Any]) -> str:
    """The bytes a metrics ``line`` says were moved, each figure naming its links: the run's
    total between server and clients, then (for a method with side parties, e.g. EPPFL's edge)
    what the client↔party links carried in this round (``bytes.client->edge`` and back)."""
    from fedge.report import format_bytes

    text = f"{format_bytes(line[CUM_BYTES_DOWN] + line[CUM_BYTES_UP])} moved server↔client"
    links = {k[len("bytes.") :]: v for k, v in line.items() if k.startswith("bytes.")}
    if links:
        ends = sorted({end for link in links for end in link.split("->") if end != "client"})
        text += f", {format_bytes(sum(links.values()))} client↔{'/'.join(ends)} this round"
    return text


class _Lines(Progress):
    """One plain line per round on stdout (round, test accuracy, bytes moved, time since the
    command started), and one per finished step of a long phase inside a round (NTK-Ori's
    pruning rounds), for a stdout that is not a terminal (``| cat``, a log file, nohup, CI),
    where a live bar would show only its last state."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.started = False
        self.total_rounds = 0

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def _elapsed(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=int(time.monotonic() - self.t0))

    def start(self, total_rounds: int, done: int) -> None:
        self.started = True
        self.total_rounds = total_rounds

    def phase(self, rnd: int, name: str, done: int, total: int) -> None:
        print(
            f"round {rnd}/{self.total_rounds}: {name} {done}/{total} done (saved), {self._elapsed()}",
            flush=True,
        )

    def round(self, line: dict[str, Any], total_rounds: int) -> None:
        acc = line.get(TEST_ACCURACY)
        moved = moved_text(line)
        print(
            f"round {line[ROUND]}/{total_rounds}: "
            + (f"acc {acc:.4f}, " if acc is not None else "acc -, ")
            + f"{moved}, {self._elapsed()}",
            flush=True,  # a pipe is block-buffered: each line as its round ends
        )


def _progress(quiet: bool) -> _Bar | _Lines:
    """The rich bar (on stderr) on a terminal; plain lines when stdout is not one."""
    return _Bar(not quiet) if quiet or sys.stdout.isatty() else _Lines()


class _Bar(Progress):
    """A rich progress line: rounds done, clients done in the running round, accuracy, bytes,
    and a clock running from the moment the command started (data loading and round 1 included)."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self.progress = (
            RichProgress(
                TextColumn("[bold]round"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[inside]}"),
                TextColumn("{task.fields[acc]}"),
                TextColumn("{task.fields[bytes]}"),
                TimeElapsedColumn(),
                console=err,
                transient=False,
            )
            if enabled
            else None
        )
        self.task: Any = None
        self.started = False  # the run got as far as its rounds
        self.phase_text = ""  # the running round's long phase so far ("pruning 3/50 done")

    def __enter__(self) -> _Bar:
        if self.progress is not None:
            self.progress.__enter__()
            self.task = self.progress.add_task(
                "run", total=None, inside="preparing", acc="", bytes=""
            )
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            if (
                exc[0] is not None and not self.started
            ):  # refused before any round: no bar left above the error
                self.progress.remove_task(self.task)
                live = self.progress.live
                live.transient = True  # a terminal: the bar is erased
                quiet = live.console.quiet
                live.console.quiet = (
                    quiet or not live.console.is_terminal
                )  # a pipe: not even its blank line
                try:
                    self.progress.__exit__(*exc)
                finally:
                    live.console.quiet = quiet
                return
            self.progress.__exit__(*exc)

    def start(self, total_rounds: int, done: int) -> None:
        self.started = True
        if self.progress is not None:
            self.progress.update(self.task, total=total_rounds, completed=done, inside="")

    def clients(self, rnd: int, exchange: int, done: int, total: int) -> None:
        if self.progress is not None:
            step = f" step {exchange}" if exchange > 1 else ""
            phase = f" ({self.phase_text})" if self.phase_text else ""
            self.progress.update(
                self.task, inside=f"round {rnd}{step}{phase}: {done}/{total} clients"
            )

    def phase(self, rnd: int, name: str, done: int, total: int) -> None:
        self.phase_text = f"{name} {done}/{total} done"
        if self.progress is not None:
            self.progress.update(self.task, inside=f"round {rnd}: {self.phase_text}")

    def round(self, line: dict[str, Any], total_rounds: int) -> None:
        self.phase_text = ""
        if self.progress is None:
            return
        acc = line.get("test_accuracy")
        self.progress.update(
            self.task,
            completed=line[ROUND],
            inside="",
            acc=f"acc {acc:.4f}" if acc is not None else "",
            bytes=moved_text(line),
        )


def run(
    ctx: typer.Context,
    config: Annotated[
        str | None, typer.Argument(help="preset name (see configs/) or path to a YAML file")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a config key: --set rounds=20")
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="run directory to write (default runs/<preset>-<time>)"),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="continue the interrupted run in this directory")
    ] = None,
    allow_config_change: Annotated[
        bool,
        typer.Option(
            "--allow-config-change",
            metavar="",
            help="with --resume: accept edits of the run's config.yaml (recorded in config_changes.jsonl)",
        ),
    ] = False,
    measure_memory: Annotated[
        bool,
        typer.Option(
            "--measure-memory",
            metavar="",
            help="a flag (no value): measure client peak memory, as --set measure.memory=true",
        ),
    ] = False,
    workers: Annotated[
        int | None, typer.Option("--workers", help="client worker processes")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", metavar="", help="no progress bar")
    ] = False,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="engine (built-in), flower-sim (the same rounds through Flower's ServerApp/ClientApp "
            "on simulated nodes: --backend) or flower (a Flower deployment: --superlink)",
        ),
    ] = "engine",
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="with --runtime flower-sim: local (in-process grid, the default) or ray "
            "(Flower's simulation engine; pip install 'fedge\\[flower-sim]')",
        ),
    ] = None,
    superlink: Annotated[
        str | None,
        typer.Option("--superlink", help="with --runtime flower: the SuperLink's HOST:PORT"),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure", metavar="", help="with --runtime flower: no TLS (loopback tests only)"
        ),
    ] = False,
    root_certificates: Annotated[
        Path | None,
        typer.Option(
            "--root-certificates",
            help="with --runtime flower: the CA certificate the SuperLink's TLS certificate is signed with",
        ),
    ] = None,
) -> None:
    """Train a federation and write its run directory."""
    from fedge.core.config import load_config
    from fedge.experiment.resume import resume_experiment
    from fedge.experiment.run import run_experiment

    if ctx.args:
        flag = " (--measure-memory, --allow-config-change and --quiet are flags and take no value)"
        fail(
            f"unexpected argument {ctx.args[0]!r}{flag}; e.g. fedge run quickstart --measure-memory"
        )
    overrides = set_options(set_)
    if measure_memory:
        overrides.append("measure.memory=true")
    if workers is not None:
        overrides.append(f"clients.workers={workers}")
    try:
        chosen = Runtime.of(runtime, backend, flags=True)
    except ConfigError as exc:
        fail(exc)
    if chosen.name != "flower":
        given = [
            f
            for f, on in (
                ("--superlink", superlink is not None),
                ("--insecure", insecure),
                ("--root-certificates", root_certificates is not None),
            )
            if on
        ]
        if given:
            verb = "goes" if len(given) == 1 else "go"
            fail(
                f"{' and '.join(given)} {verb} with --runtime flower (got --runtime {runtime}); add --runtime flower "
                "to run on a Flower deployment, or drop them"
            )
    if resume is not None and out_dir is not None:
        fail(
            f"--resume {resume} continues the run in that directory; --out {out_dir} cannot move it (drop --out)"
        )
    if allow_config_change and resume is None:
        fail(
            "--allow-config-change goes with --resume RUN_DIR (it accepts edits of that run's config.yaml)"
        )
    target: Path | None = None
    try:
        with one_line_warnings(), _sigterm_stops_like_ctrl_c():
            if resume is not None:
                extend = [o for o in set_ or [] if o.split("=", 1)[0].strip() == "rounds"]
                extra = (
                    ([f"the config {config}"] if config is not None else [])
                    + [f"--set {o}" for o in set_ or [] if o not in extend or len(extend) > 1]
                    + (["--measure-memory"] if measure_memory else [])
                    + ([f"--workers {workers}"] if workers is not None else [])
                )
                if extra:
                    edit = (
                        f" (to change the run's config: edit {resume / CONFIG} and add --allow-config-change)"
                        if chosen.name != "flower"
                        else ""
                    )
                    fail(
                        "--resume takes only the run directory (its config.yaml fixes everything else) "
                        f"and optionally --set rounds=N to train a run further; drop {', '.join(extra)}{edit}"
                    )
                rounds = None
                if extend:
                    value = extend[0].split("=", 1)[1].strip() if "=" in extend[0] else ""
                    try:
                        rounds = int(value)
                    except ValueError:
                        fail(f"--set {extend[0]}: rounds must be a whole number of rounds")
                target = resume
                if chosen.name == "flower":
                    from fedge.experiment.flower import submit

                    if superlink is None:
                        fail(
                            "--runtime flower needs --superlink HOST:PORT (and --root-certificates FILE, or --insecure)"
                        )
                    if allow_config_change:
                        fail(
                            "--allow-config-change is not supported with --runtime flower; resume on the engine or "
                            "--runtime flower-sim to record a config change"
                        )
                    if not (resume / CONFIG).is_file():
                        fail(
                            f"--resume {resume}: no config.yaml there; give the run directory (readable here, "
                            "and the same path on the SuperLink's machine)"
                        )
                    path = submit(
                        load_config(RunDir(resume).read_config()),
                        out=resume,
                        superlink=superlink,
                        insecure=insecure,
                        root_certificates=root_certificates,
                        resume=True,
                        rounds=rounds,
                    )
                else:
                    with _progress(quiet) as bar:
                        path = resume_experiment(
                            resume,
                            rounds=rounds,
                            progress=bar,
                            render=render_report,
                            allow_config_change=allow_config_change,
                            runtime=chosen,
                        )
            else:
                if config is None:
                    fail(
                        "give a preset or YAML file (e.g. fedge run quickstart), or --resume RUN_DIR"
                    )
                cfg = load_config(config, overrides=overrides)
                target = out_dir or _default_out(config)
                if chosen.name == "flower":
                    from fedge.experiment.flower import submit

                    if superlink is None:
                        fail(
                            "--runtime flower needs --superlink HOST:PORT (and --root-certificates FILE, or --insecure)"
                        )
                    path = submit(
                        cfg,
                        out=target,
                        superlink=superlink,
                        insecure=insecure,
                        root_certificates=root_certificates,
                    )
                else:
                    with _progress(quiet) as bar:
                        path = run_experiment(
                            cfg,
                            out=target,
                            progress=bar,
                            render=render_report,
                            runtime=chosen,
                        )
    except DivergenceError as exc:  # a step size too large (a non-finite message among them)
        fail(exc)
    except MessageError as exc:
        fail(exc, code=1)
    except FedgeError as exc:
        fail(exc)
    except KeyboardInterrupt as exc:
        _interrupted(target, exc)
    summary = loads((path / SUMMARY).read_text())
    acc = summary.get(FINAL_TEST_ACCURACY)
    console = out()
    stopped = summary.get(STOPPED)
    if stopped:  # the run's own rule ended it early (a privacy budget): say why, on the terminal
        console.print(f"stopped early: {stopped}", markup=False)
    console.print(
        f"final test accuracy: {acc:.4f}" if acc is not None else "final test accuracy: n/a"
    )
    console.print(f"run directory: {path}", markup=False)
    if stopped and not summary.get(ROUNDS):
        # complete (nothing is left that a resume could run) but nothing trained: not a success
        err.print(
            "the run trained no round: its model is the untrained initial one; "
            + (
                "raise privacy.target_epsilon or privacy.noise_multiplier until round 1 fits "
                "(fedge privacy epsilon gives ε per round)"
                if "target_epsilon" in str(stopped)
                else "change the setting that stopped it"
            ),
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
