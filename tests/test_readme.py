"""The README's commands exist as written: every ``fedge ...`` line in its bash blocks names a real
(sub)command and real options, every preset it names exists, and every ``--set`` it shows is a
valid config for that preset. (Running them is the tests' and benchmarks' job; this catches a
README that drifted from the CLI.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from fedge.cli.main import app
from fedge.core.config import load_config
from fedge.experiment.build import method_config, privacy_config

README = Path(__file__).resolve().parents[1] / "README.md"
#: positional arguments the README writes as stand-ins for the reader's own files
PLACEHOLDERS = {"CONFIG", "RUN", "my-experiment.yaml"}


def _fedge_lines() -> list[str]:
    text = README.read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("fedge "):
                lines.append(line.strip())
    return lines


LINES = _fedge_lines()
ROOT = typer.main.get_command(app)


def _parse(line: str) -> tuple[list[str], click.Command, dict[str, list[str]], list[str]]:
    """(subcommand path, its click command, {option: [values]}, positional arguments)."""
    tokens = shlex.split(line, comments=True)[1:]
    path: list[str] = []
    cmd = ROOT
    while isinstance(cmd, click.Group) and tokens and not tokens[0].startswith("-"):
        assert tokens[0] in cmd.commands, f"{line!r}: no command {' '.join(['fedge', *path, tokens[0]])!r}"
        path.append(tokens.pop(0))
        cmd = cmd.commands[path[-1]]
    assert not isinstance(cmd, click.Group), f"{line!r}: {' '.join(['fedge', *path])!r} needs a subcommand"
    options = {o: p for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    given: dict[str, list[str]] = {}
    positional: list[str] = []
    while tokens:
        tok = tokens.pop(0)
        if not tok.startswith("-"):
            positional.append(tok)
            continue
        name, eq, value = tok.partition("=")
        assert name in options, f"{line!r}: 'fedge {' '.join(path)}' has no option {name}; it has {sorted(options)}"
        opt = options[name]
        if opt.is_flag or opt.count:
            given.setdefault(name, [])
        else:
            given.setdefault(name, []).append(value if eq else tokens.pop(0))
    return path, cmd, given, positional


def test_the_readme_shows_fedge_commands():
    assert len(LINES) >= 30
    assert any(line.startswith("fedge run quickstart") for line in LINES)


@pytest.mark.parametrize("line", LINES)
def test_a_readme_command_names_real_commands_options_and_presets(line):
    path, _, given, positional = _parse(line)
    if path not in (["run"], ["fedpt-search"]) or "--resume" in given:
        return
    assert len(positional) == 1, f"{line!r}: expected one preset or config file, got {positional}"
    if positional[0] in PLACEHOLDERS:
        return
    cfg = load_config(positional[0], overrides=given.get("--set", []))  # an unknown preset or key fails here
    method_config(cfg)
    privacy_config(cfg)


def test_the_check_catches_a_drifted_command():
    with pytest.raises(AssertionError, match="no option --rounds"):
        _parse("fedge run quickstart --rounds 3")
    with pytest.raises(AssertionError, match="no command 'fedge bench engines'"):
        _parse("fedge bench engines")
    _, _, given, positional = _parse("fedge run quickstart --set rounds=3 -q  # comment")
    assert given == {"--set": ["rounds=3"], "-q": []} and positional == ["quickstart"]
