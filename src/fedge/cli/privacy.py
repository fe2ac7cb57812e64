"""``fedge privacy``: answer DP accounting questions without training (ε per noise multiplier,
or the most rounds within ``--target-epsilon``).
"""

from __future__ import annotations

import json
import re
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from fedge.cli.common import fail
from fedge.core.errors import ConfigError
from fedge.core.validation import format_validation_error
from fedge.privacy.dp.accounting import dp_event, epsilon, max_rounds
from fedge.privacy.dp.config import PrivacyConfig

__all__ = ["app"]

app = typer.Typer(
    help="Differential privacy: ε of DP-FedAvg / DP-FTRL runs, without training.",
    no_args_is_help=True,
)
_out = Console()

_ASSUMES = {
    (
        "gaussian",
        "poisson",
    ): "each client joins each round independently with q = m/N (add/remove one)",
    (
        "gaussian",
        "fixed",
    ): "each round a uniform m-subset, independent across rounds (replace one: sensitivity 2·clip)",
    (
        "gaussian",
        "shuffle",
    ): "a client joins at most once per pass over the population; no amplification",
    (
        "tree",
        "shuffle",
    ): "a client is a leaf at most once per tree; trees restart each pass; no amplification",
}


def _as_flags(message: str) -> str:
    """A config check's message in this command's terms: ``privacy.noise_multiplier=1.0`` as
    ``--noise-multiplier 1.0`` (the keys are this command's options)."""
    message = re.sub(r"^config key 'privacy': ", "", message)
    message = re.sub(
        r"^config key 'privacy\.([a-z_]+)': ",
        lambda m: "--" + m.group(1).replace("_", "-") + ": ",
        message,
    )
    message = re.sub(
        r"(?<!')privacy\.([a-z_]+)(=?)",
        lambda m: "--" + m.group(1).replace("_", "-") + (" " if m.group(2) else ""),
        message,
    )
    return re.sub(r"^(--[a-z-]+): \1 ", r"\1 ", message)  # the check named its flag itself


@app.command("epsilon")
def epsilon_cmd(
    mechanism: Annotated[
        str, typer.Option(help="gaussian (DP-FedAvg) | tree (DP-FTRL)")
    ] = "gaussian",
    noise_multiplier: Annotated[
        str, typer.Option(help="z, or comma-separated values: 1.13,2.33")
    ] = "1.0",
    rounds: Annotated[int, typer.Option(help="rounds T")] = 100,
    clients_per_round: Annotated[
        int, typer.Option(help="m, clients per round (expected, for poisson)")
    ] = 100,
    population: Annotated[int, typer.Option(help="N, clients in the population")] = 10_000,
    sampling: Annotated[
        str | None,
        typer.Option(help="poisson | fixed | shuffle (default: fixed; shuffle for tree)"),
    ] = None,
    delta: Annotated[float, typer.Option(help="δ")] = 1e-6,
    accountant: Annotated[str, typer.Option(help="rdp | pld")] = "rdp",
    tree_restart_rounds: Annotated[
        int | None, typer.Option(help="tree: restart every k rounds within a pass")
    ] = None,
    target_epsilon: Annotated[
        float | None, typer.Option(help="also print the most rounds with ε <= this")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """ε at δ after T rounds for each noise multiplier, from dp-accounting."""
    try:
        zs = [float(v) for v in noise_multiplier.split(",")]
    except ValueError:
        fail(f"--noise-multiplier {noise_multiplier!r}: expected numbers such as 1.0 or 1.13,2.33")
    if rounds < 0:
        fail(f"--rounds {rounds}: expected an integer >= 0")
    if sampling is None:
        sampling = "shuffle" if mechanism == "tree" else "fixed"
    if mechanism == "none":
        fail("--mechanism none has no ε; use --mechanism gaussian or tree")
    rows = []
    for z in zs:
        data = {
            "mechanism": mechanism,
            "noise_multiplier": z,
            "sampling": sampling,
            "delta": delta,
            "accountant": accountant,
            "tree_restart_rounds": tree_restart_rounds,
        }
        try:
            cfg = PrivacyConfig.model_validate(data)
            eps = epsilon(
                cfg, rounds=rounds, population=population, clients_per_round=clients_per_round
            )
            event = dp_event(
                cfg, rounds=rounds, population=population, clients_per_round=clients_per_round
            ).event
            best = (
                None
                if target_epsilon is None
                else max_rounds(
                    cfg, target_epsilon, population=population, clients_per_round=clients_per_round
                )
            )
        except ValidationError as exc:
            fail(
                _as_flags(
                    format_validation_error(exc, PrivacyConfig, prefix="privacy.").replace(
                        "\n", "; "
                    )
                )
            )
        except ConfigError as exc:
            fail(_as_flags(str(exc)))
        rows.append(
            {"noise_multiplier": z, "epsilon": eps, "max_rounds": best, "event": repr(event)}
        )
    assumes = _ASSUMES[(mechanism, sampling)]
    report = {
        "mechanism": mechanism,
        "sampling": sampling,
        "assumes": assumes,
        "accountant": accountant,
        "rounds": rounds,
        "clients_per_round": clients_per_round,
        "population": population,
        "delta": delta,
        "tree_restart_rounds": tree_restart_rounds,
        "target_epsilon": target_epsilon,
        "rows": rows,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return
    table = Table(
        title=f"{mechanism} ({accountant}), T={rounds}, m={clients_per_round}, N={population}, δ={delta:g}"
    )
    table.add_column("noise multiplier z", justify="right")
    table.add_column("ε (2 d.p.)", justify="right")
    table.add_column("ε", justify="right")
    if target_epsilon is not None:
        table.add_column(f"rounds with ε ≤ {target_epsilon:g}", justify="right")
    for r in rows:
        cells = [f"{r['noise_multiplier']:g}", f"{r['epsilon']:.2f}", f"{r['epsilon']:.6g}"]
        if target_epsilon is not None:
            cells.append(str(r["max_rounds"]))
        table.add_row(*cells)
    _out.print(table)
    _out.print(f"sampling={sampling}: {assumes}", highlight=False)
    _out.print(f"event: {rows[0]['event']}", highlight=False, soft_wrap=True)
