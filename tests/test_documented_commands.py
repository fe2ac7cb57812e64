"""The commands and Python names the README and the documentation site show exist as written.

Every ``fedge ...`` command in their bash blocks and inline code names a real (sub)command and
real options, every preset it names exists, and every ``--set`` it shows validates for that
preset; every ``python benchmarks/X.py ...`` names a script that exists and options its
parser accepts (read from its ``--help``); every ``fedge.x.y`` named in code resolves, and every
config key named in inline code (``method.ema_also_raw``) exists. Running them is the tests' and
benchmarks' job; this catches documentation that drifted from the code.
"""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import click
import pytest
import typer
from pydantic import BaseModel

from fedge.cli.main import app
from fedge.core.config import RunConfig, load_config
from fedge.data.partition import PARTITIONERS
from fedge.data.registry import DATASETS
from fedge.experiment.build import method_config, privacy_config
from fedge.methods import METHODS
from fedge.models import model_info, model_names
from fedge.privacy.dp import PrivacyConfig

REPO = Path(__file__).resolve().parents[1]
#: the README and every page of the site (docs/**/*.md; the config reference is generated, and
#: tests/test_config_reference.py checks it)
DOCS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")))
#: subcommands whose positional arguments are presets (or YAML files)
PRESET_ARGS = (["run"], ["fedpt-search"], ["bench", "presets"])


def _placeholder(arg: str) -> bool:
    """A stand-in for the reader's own file or run (RUN, RUN_DIR, CONFIG, my-experiment.yaml)."""
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_-]*", arg)) or arg.startswith("my-")


def _code(doc: str) -> list[str]:
    """The lines of ``doc``'s code blocks (continuations joined) and its inline code spans."""
    text = (REPO / doc).read_text(encoding="utf-8")
    lines = [
        s
        for b in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
        for s in b.replace("\\\n", " ").splitlines()
    ]
    return lines + re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def _commands(prefix: str) -> list[tuple[str, str]]:
    """(document, command) for every code line or span holding ``prefix`` (from there on)."""
    found = []
    for doc in DOCS:
        for line in _code(doc):
            at = line.find(prefix)
            if at < 0 or "..." in line or "[" in line:  # an elided or optional-argument sketch
                continue
            found.append((doc, re.split(r"\s[;&]\s|\s#|`", line[at:])[0].strip()))
    return found


FEDGE = _commands("fedge ")
SCRIPTS = _commands("python benchmarks/")
ROOT = typer.main.get_command(app)


def _parse(line: str) -> tuple[list[str], dict[str, list[str]], list[str]] | None:
    """(subcommand path, {option: [values]}, positional arguments); None for prose naming alternatives."""
    tokens = shlex.split(line)[1:]
    path: list[str] = []
    cmd = ROOT
    while isinstance(cmd, click.Group) and tokens and not tokens[0].startswith("-"):
        if tokens[0] not in cmd.commands and any(re.fullmatch(r"[a-z]+/[a-z]+", t) for t in tokens):
            return None  # "fedge flower superlink/supernode": prose naming alternatives
        assert tokens[0] in cmd.commands, (
            f"{line!r}: no command {' '.join(['fedge', *path, tokens[0]])!r}"
        )
        path.append(tokens.pop(0))
        cmd = cmd.commands[path[-1]]
    options = {
        o: p
        for p in cmd.params
        if isinstance(p, click.Option)
        for o in (*p.opts, *p.secondary_opts)
    }
    given: dict[str, list[str]] = {}
    positional: list[str] = []
    while tokens:
        tok = tokens.pop(0)
        if not tok.startswith("-"):
            positional.append(tok)
            continue
        name, eq, value = tok.partition("=")
        assert name in options, (
            f"{line!r}: 'fedge {' '.join(path)}' has no option {name}; it has {sorted(options)}"
        )
        opt = options[name]
        if opt.is_flag or opt.count:
            given.setdefault(name, [])
        else:
            given.setdefault(name, []).append(
                value if eq or not tokens else tokens.pop(0)
            )  # prose: no value
    return path, given, positional


def test_the_docs_show_commands():
    assert sum(doc == "README.md" for doc, _ in FEDGE) >= 15
    assert sum(doc.startswith("docs/guide/") for doc, _ in FEDGE) >= 30
    assert {"baffle_table1", "ntk_table3", "zo_precision"} <= {
        re.search(r"benchmarks/(\w+)\.py", c)[1] for _, c in SCRIPTS
    }


@pytest.mark.parametrize(("doc", "line"), FEDGE)
def test_a_documented_fedge_command_names_real_commands_options_and_presets(doc, line):
    parsed = _parse(line)
    if parsed is None:
        return
    path, given, positional = parsed
    if path not in PRESET_ARGS or "--resume" in given:
        return
    for arg in positional:
        if not _placeholder(arg):  # an unknown preset, config key or value fails here
            cfg = load_config(arg, overrides=given.get("--set", []))
            method_config(cfg)
            privacy_config(cfg)


def test_documented_benchmark_scripts_exist_and_take_the_options_shown():
    scripts: dict[str, set[str]] = {}
    for _, line in SCRIPTS:
        name = re.search(r"benchmarks/(\w+\.py)", line)[1]
        assert (REPO / "benchmarks" / name).is_file(), f"{line!r}: no script benchmarks/{name}"
        scripts.setdefault(name, set()).update(
            t.split("=")[0] for t in shlex.split(line) if t.startswith("--")
        )
    # one interpreter reads every script's --help (each parser exits after printing it)
    program = (
        "import contextlib, io, runpy, sys\n"
        "sys.path.insert(0, 'benchmarks')\n"  # as `python benchmarks/X.py` has it: scripts import each other
        "for name in sys.argv[1:]:\n"
        "    sys.argv = [name, '--help']; out = io.StringIO()\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out):\n"
        "        runpy.run_path('benchmarks/' + name, run_name='__main__')\n"
        "    print('=== ' + name); print(out.getvalue())\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", program, *sorted(scripts)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    helps = dict(re.findall(r"^=== (\S+)\n(.*?)(?=^=== |\Z)", res.stdout, flags=re.S | re.M))
    for name, flags in scripts.items():
        accepted = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", helps.get(name, "")))
        assert accepted, f"benchmarks/{name} --help printed no options:\n{helps.get(name)}"
        assert flags <= accepted, (
            f"benchmarks/{name}: the docs use {sorted(flags - accepted)}, not in its --help"
        )


def _resolve(dotted: str) -> object:
    """``fedge.a.b.c``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


PY_NAMES = sorted(
    {
        (doc, n)
        for doc in DOCS
        for line in _code(doc)
        for n in re.findall(r"(?<![\w/.])fedge(?:\.[A-Za-z_]\w*)+", line)
        if not re.search(r"\.(json|ya?ml|pt|md|html|safetensors)$", n)
    }
)


@pytest.mark.parametrize(("doc", "dotted"), PY_NAMES)
def test_a_documented_python_name_exists(doc, dotted):
    _resolve(dotted)


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _has_key(models: list[type[BaseModel]], parts: list[str]) -> bool:
    for m in models:
        field = m.model_fields.get(parts[0])
        if field is not None and (
            len(parts) == 1 or _has_key(_models(field.annotation), parts[1:])
        ):
            return True
    return False


#: the config classes a documented ``section.key`` may belong to: the method and privacy sections
#: are checked against every method's and the privacy mechanisms' own classes (the sections
#: themselves take any key); a dataset or partition key may also be a registered one's option
SECTIONS: dict[str, list[type[BaseModel]]] = {
    **{name: _models(f.annotation) for name, f in RunConfig.model_fields.items()},
    "method": [spec.section for spec in METHODS.values()],
    "privacy": [PrivacyConfig],
}
EXTRA_KEYS = {
    "dataset": {k for spec in DATASETS.values() for k in spec.options},
    "partition": {k for spec in PARTITIONERS.values() for k in spec.params},
    "model": {k for name in model_names() for k in model_info(name).defaults},
}
CONFIG_KEYS = sorted(
    {
        (doc, m[0])
        for doc in DOCS
        for line in _code(doc)
        if (
            m := re.fullmatch(
                r"(clients|dataset|partition|model|method|measure|privacy)\.[\w.]+(=\S+)?", line
            )
        )
        and not re.search(r"\.(json|onnx|safetensors|pt)$", line)
    }
)


@pytest.mark.parametrize(("doc", "key"), CONFIG_KEYS)
def test_a_documented_config_key_exists(doc, key):
    section, *parts = key.split("=")[0].split(".")
    assert _has_key(SECTIONS[section], parts) or parts[0] in EXTRA_KEYS.get(section, ()), (
        f"{doc} names config key {key!r}, which no {section} config class has"
    )


def test_the_check_catches_a_drifted_command():
    with pytest.raises(AssertionError, match="no option --rounds"):
        _parse("fedge run quickstart --rounds 3")
    with pytest.raises(AssertionError, match="no command 'fedge bench engines'"):
        _parse("fedge bench engines")
    with pytest.raises(AttributeError, match="register_plugin"):
        _resolve("fedge.register_plugin")
    assert len(PY_NAMES) >= 20 and ("README.md", "fedge.register_dataset") in PY_NAMES
    assert (
        len(CONFIG_KEYS) >= 50 and ("docs/benchmarks.md", "method.ema_also_raw=true") in CONFIG_KEYS
    )
    assert _has_key(SECTIONS["method"], ["client_optimizer", "lr"])
    assert not _has_key(SECTIONS["method"], ["client_optimizer", "learning_rate"])
    assert not _has_key(SECTIONS["clients"], ["per_rounds"])
    assert _parse("fedge run quickstart --set rounds=3 -q") == (
        ["run"],
        {"--set": ["rounds=3"], "-q": []},
        ["quickstart"],
    )
