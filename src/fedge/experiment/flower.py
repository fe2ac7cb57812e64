"""fedge runs on a Flower deployment: the ServerApp and ClientApp that ``flwr run`` starts.

The run is fixed by two ``run_config`` keys: ``fedge-config`` (the run's config as JSON text:
every SuperNode builds the same data, partition and method from it, and takes its own client,
``node_config["partition-id"]``) and ``out`` (the run directory the ServerApp writes). The
ServerApp runs :func:`fedge.experiment.run.run_experiment` with Flower's Grid as the runtime,
so the run directory is the same as the built-in engine's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from fedge.core.config import RunConfig, load_config
from fedge.core.errors import ConfigError, MessageError
from fedge.experiment.build import BuiltRun, build_run
from fedge.experiment.run import resume_experiment, run_experiment
from fedge.runtime.flower import client_app as make_client_app
from fedge.runtime.flower import server_app as make_server_app
from fedge.runtime.flower.adapter import STATE_GET, STATE_SET

__all__ = ["client_app", "configured_client_app", "loopback", "server_app", "submit", "write_app"]

_BUILT: dict[str, tuple[BuiltRun, ClientApp]] = {}  # config text -> built run and its ClientApp


def _config_text(context: Context) -> str:
    text = context.run_config.get("fedge-config")
    if not isinstance(text, str) or not text:
        raise ConfigError("the Flower run has no 'fedge-config' in its run_config; start it with "
                          "fedge's generated app (fedge.experiment.flower)")  # fmt: skip
    return text


def _node_app(context: Context) -> ClientApp:
    return _app_for(_config_text(context))


def _app_for(text: str) -> ClientApp:
    """The ClientApp of the run whose config (JSON) is ``text``, built once per process."""
    if text not in _BUILT:
        built = build_run(load_config(json.loads(text)))
        c = built.config
        app = make_client_app(built.method.program, built.clients.__getitem__, seed=c.seed,
                              measure_flops=c.measure.flops, measure_memory=c.measure.memory,
                              parties=built.method.parties)  # fmt: skip
        _BUILT.clear()
        _BUILT[text] = (built, app)
    return _BUILT[text][1]


client_app = ClientApp()


@client_app.query()
def _query(msg: Message, context: Context) -> Message:
    return _node_app(context)(msg, context)


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    return _node_app(context)(msg, context)


@client_app.query(STATE_GET)
def _state_get(msg: Message, context: Context) -> Message:
    return _node_app(context)(msg, context)


@client_app.query(STATE_SET)
def _state_set(msg: Message, context: Context) -> Message:
    return _node_app(context)(msg, context)


class _Configured:
    """A ClientApp handler for one run's config: small to pickle (the config text; the class by
    reference), and it builds the run's data and method once per process (:func:`_app_for`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, msg: Message, context: Context) -> Message:
        return _app_for(self.text)(msg, context)


def configured_client_app(config_text: str) -> ClientApp:
    """A ClientApp for the run whose config is ``config_text`` (``json.dumps(cfg.to_dict())``),
    for nodes whose ``run_config`` does not carry it, e.g. Flower's simulation engine, which
    pickles the ClientApp to its Ray actors with every message."""
    app = ClientApp()
    handler = _Configured(config_text)
    app.query()(handler)
    app.query(STATE_GET)(handler)
    app.query(STATE_SET)(handler)
    app.train()(handler)
    return app


def _server_main(grid: Grid, context: Context) -> None:
    cfg = load_config(json.loads(_config_text(context)))
    out: Any = context.run_config.get("out")
    if not isinstance(out, str) or not out:
        raise ConfigError("the Flower run has no 'out' (run directory) in its run_config")
    if context.run_config.get("resume"):  # continue the run in `out` (its config.yaml; rounds may grow)
        rounds = context.run_config.get("resume-rounds")
        resume_experiment(out, rounds=rounds if isinstance(rounds, int) and rounds > 0 else None, runtime=grid)
        return
    run_experiment(cfg, out=out, runtime=grid)  # the report is rendered by `fedge report OUT` (a layer above)


server_app = make_server_app(_server_main)


# ---- deployment: the generated Flower app, a loopback federation, submitting a run ----------------

APP_MODULE = """import fedge.experiment.flower as _fedge

server_app = _fedge.server_app
client_app = _fedge.client_app
"""

APP_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedgeapp"
version = "1.0.0"
description = "fedge on Flower (generated by fedge.experiment.flower.write_app)"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedge"

[tool.flwr.app.components]
serverapp = "fedge_app:server_app"
clientapp = "fedge_app:client_app"

[tool.flwr.app.config]
fedge-config = ""
out = ""
render = true
resume = false
resume-rounds = 0
"""

FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def write_app(path: str | Path) -> Path:
    """Write the Flower app (``pyproject.toml`` and ``fedge_app.py``) that ``flwr run`` ships to
    the SuperLink: its ServerApp and ClientApp are :data:`server_app` and :data:`client_app`.
    fedge (and torch) must be installed where the SuperLink and SuperNodes run."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    (p / "pyproject.toml").write_text(APP_PYPROJECT)
    (p / "fedge_app.py").write_text(APP_MODULE)
    return p


def _flower_bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise ConfigError(f"Flower's {name!r} command is not installed; install it with: pip install 'fedge[flower]'")
    return found


def _env(extra_path: str | None = None) -> dict[str, str]:
    env = {**os.environ, **FLOWER_ENV}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # flower-superexec, flwr-*
    src = str(Path(__file__).resolve().parents[2])  # fedge importable in every Flower process
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def submit(cfg: RunConfig, *, out: str | Path, superlink: str, insecure: bool = False,
           root_certificates: str | Path | None = None, workdir: str | Path | None = None,
           timeout: float | None = None, resume: bool = False, rounds: int | None = None) -> Path:  # fmt: skip
    """Run ``cfg`` on the Flower federation whose SuperLink is at ``superlink`` (HOST:PORT),
    with ``flwr run`` and the generated app; the ServerApp writes the run directory ``out``
    (an absolute path on the SuperLink's machine). TLS: ``root_certificates`` (the CA
    certificate the SuperLink's certificate is signed with), or ``insecure=True`` (loopback tests).
    ``resume=True``: continue the interrupted run in ``out`` instead (``cfg``: that run's config,
    which the SuperNodes build from; ``rounds``: a larger total, as ``fedge run --resume``); the
    nodes get their clients' states back from the run's checkpoint.
    Returns ``out`` once this run has written ``summary.json``; MessageError (with the end of
    the run's log) otherwise."""
    import tomli_w

    out = Path(out).resolve()
    if not insecure and root_certificates is None:
        raise ConfigError(f"Flower SuperLink {superlink!r}: give the CA certificate (root_certificates / "
                          "--root-certificates FILE), or insecure=True (--insecure) for a loopback test")  # fmt: skip
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="fedge-flwr-") as tmp:
            return submit(cfg, out=out, superlink=superlink, insecure=insecure, root_certificates=root_certificates,
                          workdir=tmp, timeout=timeout, resume=resume, rounds=rounds)  # fmt: skip
    work = Path(workdir)
    app = write_app(work / "app")
    home = work / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    conn: dict[str, Any] = {"address": superlink, "insecure": bool(insecure)}
    if root_certificates is not None:
        conn["root-certificates"] = str(Path(root_certificates).resolve())
    (home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": "fedge", "fedge": conn}}))
    run_config = work / "run_config.toml"
    if resume and rounds is not None:
        cfg = load_config({**cfg.to_dict(), "rounds": rounds})
    run_config.write_text(tomli_w.dumps({"fedge-config": json.dumps(cfg.to_dict()), "out": str(out),
                                         "resume": bool(resume), "resume-rounds": int(rounds or 0)}))  # fmt: skip
    env = {**_env(), "FLWR_HOME": str(home)}
    cmd = [_flower_bin("flwr"), "run", str(app), "fedge", "--stream", "--run-config", str(run_config)]
    summary = out / "summary.json"
    before = summary.stat().st_mtime_ns if summary.exists() else None
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise MessageError(f"flwr run did not finish within {timeout} s (SuperLink {superlink})") from None
    if done.returncode != 0 or not summary.exists() or summary.stat().st_mtime_ns == before:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise MessageError(f"the Flower run on {superlink} did not write {out / 'summary.json'} "
                           f"(flwr run exit {done.returncode}):\n{tail}")  # fmt: skip
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MessageError(f"Flower process exited with {proc.returncode} before listening on {port}; see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise MessageError(f"nothing listens on 127.0.0.1:{port} after {seconds} s; see {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process this module started, and the processes it started (its own session)."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # the group is the one start_new_session made for it
        try:
            proc.wait(wait)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group (Flower's superexec)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def loopback(num_nodes: int, *, workdir: str | Path,
             tls: tuple[str | Path, str | Path, str | Path] | None = None) -> Iterator[str]:  # fmt: skip
    """A Flower federation on 127.0.0.1: one SuperLink and ``num_nodes`` SuperNodes
    (``partition-id`` 0..n-1), each a separate process; yields the SuperLink's HOST:PORT. Every
    process (and what it started) is stopped when the block ends, pass or fail.

    ``tls``: ``(ca_certificate, server_certificate, server_key)`` files (the server certificate
    valid for 127.0.0.1); the SuperLink serves TLS with them and the SuperNodes trust the CA
    (submit with ``root_certificates=ca_certificate``). None: insecure."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = _env()
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []

    def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        f = log.open("wb")
        logs.append(f)
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
        procs.append(p)
        return p

    try:
        port = free_port()
        if tls is None:
            link_sec, node_sec = ["--insecure"], ["--insecure"]
        else:
            ca, cert, key = (str(Path(f).resolve()) for f in tls)
            link_sec = ["--ssl-ca-certfile", ca, "--ssl-certfile", cert, "--ssl-keyfile", key]
            node_sec = ["--root-certificates", ca]
        link = start([_flower_bin("flower-superlink"), *link_sec, "--host", "127.0.0.1", "--port", str(port),
                      "--disable-runtime-dependency-installation"], work / "superlink.log")  # fmt: skip
        _wait_port(port, link, work / "superlink.log")
        for i in range(num_nodes):
            start([_flower_bin("flower-supernode"), *node_sec, "--superlink", f"127.0.0.1:{port}",
                   "--port", str(free_port()), "--node-config", f"partition-id={i} num-partitions={num_nodes}"],
                  work / f"supernode-{i}.log")  # fmt: skip
        yield f"127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            _stop(p)
        for f in logs:
            f.close()
