"""Every ``fedge ...`` command in the README's fenced bash blocks parses, as written, with the CLI.

Parsed, not run: each command goes through Click's own parser for the real ``fedge`` app
(``make_context`` on the group, then on each subcommand it resolves), which converts every
option and argument as a run would, and refuses an unknown command, an unknown option, a
missing value or a value of the wrong type. A command that takes a preset (``fedge run``,
``fedge bench presets``, ``fedge fedpt-search``) also has its config loaded with its ``--set``
overrides and its method and privacy sections validated (``resolved_config``: no data is
loaded), so an unknown key or a bad value fails too. Running them is the presets' tests' job;
the README is also kept short (at most 200 lines).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from fedge.cli.main import app
from fedge.core.config import load_config
from fedge.experiment.build import resolved_config

README = Path(__file__).resolve().parents[1] / "README.md"
ROOT = typer.main.get_command(app)
#: commands whose first positional argument is a preset name or a YAML file
PRESET_COMMANDS = (("run",), ("bench", "presets"), ("fedpt-search",))


def bash_commands(text: str) -> list[str]:
    """The ``fedge ...`` lines of the fenced bash blocks (continuations joined, comments cut)."""
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("fedge "):
                out.append(shlex.split(line, comments=True))
    return [shlex.join(c) for c in out]


def parse(command: str) -> tuple[tuple[str, ...], click.Context]:
    """The subcommand path and the Click context the command line parses into (nothing runs)."""
    args = shlex.split(command)[1:]
    ctx = ROOT.make_context("fedge", list(args), resilient_parsing=False)
    path: list[str] = []
    cmd: click.Command = ROOT
    while isinstance(cmd, click.Group):
        rest = [*ctx._protected_args, *ctx.args]  # what the group left for its subcommand
        if not rest:
            break
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        path.append(name)
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd = sub
    assert not ctx.args, f"{command!r}: unexpected arguments {ctx.args}"
    return tuple(path), ctx


COMMANDS = bash_commands(README.read_text(encoding="utf-8"))


def test_the_readme_is_short_and_shows_commands():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200
    assert len(COMMANDS) >= 15


def _value(ctx: click.Context, kind: type, opt: str | None = None):
    """The parsed value of the command's first argument (kind=click.Argument) or of option opt."""
    for p in ctx.command.params:
        if isinstance(p, kind) and (opt is None or opt in p.opts):
            return ctx.params[p.name]
    return None


@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_parses(command):
    path, ctx = parse(command)
    if path in PRESET_COMMANDS and not _value(ctx, click.Option, "--resume"):
        source = _value(ctx, click.Argument)
        source = source[0] if isinstance(source, (list, tuple)) else source
        overrides = list(_value(ctx, click.Option, "--set") or [])
        resolved_config(load_config(source, overrides=overrides))


@pytest.mark.parametrize(
    ("command", "error"),
    [
        ("fedge run quickstart --rounds 3", click.NoSuchOption),
        ("fedge bench engines", click.UsageError),
        ("fedge export runs/x --format", click.BadOptionUsage),
        ("fedge models --input-shape", click.BadOptionUsage),
    ],
)
def test_the_parse_refuses_a_command_or_option_that_does_not_exist(command, error):
    with pytest.raises(error):
        parse(command)


def test_the_parse_reaches_the_subcommand():
    path, ctx = parse("fedge privacy epsilon --rounds 10 --noise-multiplier 1.1")
    assert path == ("privacy", "epsilon") and ctx.params["rounds"] == 10
    with pytest.raises(click.BadParameter):  # a value of the wrong type
        parse("fedge privacy epsilon --rounds ten")


def test_a_bad_config_key_in_a_readme_command_fails():
    from fedge.core.errors import ConfigError

    with pytest.raises(ConfigError):
        test_a_readme_command_parses("fedge run quickstart --set method.local_epoch=2")
