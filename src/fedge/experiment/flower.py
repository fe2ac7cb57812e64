"""fedge runs on a Flower deployment: the ServerApp and ClientApp that ``flwr run`` starts.

The run is fixed by two ``run_config`` keys: ``fedge-config`` (the run's config as JSON text:
every SuperNode builds the same data, partition and method from it, and takes its own client,
``node_config["partition-id"]``) and ``out`` (the run directory the ServerApp writes). The
ServerApp runs :func:`fedge.experiment.run.run_experiment` with Flower's Grid as the runtime,
so the run directory is the same as the built-in engine's.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from fedge.core.config import load_config
from fedge.core.errors import ConfigError
from fedge.experiment.build import BuiltRun, build_run
from fedge.experiment.run import run_experiment
from fedge.runtime.flower import client_app as make_client_app
from fedge.runtime.flower import server_app as make_server_app

__all__ = ["client_app", "server_app"]

_BUILT: dict[str, tuple[BuiltRun, ClientApp]] = {}  # config text -> built run and its ClientApp


def _config_text(context: Context) -> str:
    text = context.run_config.get("fedge-config")
    if not isinstance(text, str) or not text:
        raise ConfigError("the Flower run has no 'fedge-config' in its run_config; start it with "
                          "fedge's generated app (fedge.experiment.flower)")  # fmt: skip
    return text


def _node_app(context: Context) -> ClientApp:
    text = _config_text(context)
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


def _server_main(grid: Grid, context: Context) -> None:
    cfg = load_config(json.loads(_config_text(context)))
    out: Any = context.run_config.get("out")
    if not isinstance(out, str) or not out:
        raise ConfigError("the Flower run has no 'out' (run directory) in its run_config")
    run_experiment(cfg, out=out, runtime=grid, render=bool(context.run_config.get("render", True)))


server_app = make_server_app(_server_main)
