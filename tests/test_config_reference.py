"""The generated configuration reference (docs/gen_config_reference.py) lists every config key.

The oracle walks the pydantic models independently of the generator: every field of
``RunConfig`` (nested sections and list items too), of the privacy section's ``PrivacyConfig``
and of each registered method's config (read from the registry, no method named here) must
appear as a row of the page, under its method's heading for method keys, with its default.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from fedge.core.config import RunConfig
from fedge.methods import get_method, method_names
from fedge.privacy.dp import PrivacyConfig

REPO = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", REPO / "docs" / "gen_config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of a model; a list of models' items as ``key[].sub``."""
    out = []
    for name, field in model.model_fields.items():
        key = prefix + name
        out.append(key)
        is_list = "list[" in str(field.annotation)
        for sub in _models(field.annotation):
            out += _keys(sub, f"{key}[]." if is_list else f"{key}.")
    return out


def _rows(markdown: str) -> dict[str, list[str]]:
    """The page's table rows by their first cell's key (`key` -> cells)."""
    rows: dict[str, list[str]] = {}
    for line in markdown.splitlines():
        m = re.match(r"\| `([^`]+)` \|(.*)\|$", line)
        if m:
            # cells end at a pipe that is neither escaped nor inside a code span
            rows.setdefault(m[1], re.split(r"(?<!\\)\|(?=(?:[^`]*`[^`]*`)*[^`]*$)", m[2]))
    return rows


def _method_part(page: str, name: str) -> str:
    m = re.search(rf"^### {re.escape(name)}\n(.*?)(?=^##|\Z)", page, flags=re.S | re.M)
    assert m, f"the config reference has no section '### {name}'"
    return m[1]


def missing_keys(page: str) -> list[str]:
    """The keys the page should list and does not (method keys checked in their own section)."""
    missing = [k for k in _keys(RunConfig) if k not in _rows(page)]
    missing += [k for k in _keys(PrivacyConfig, "privacy.") if k not in _rows(page)]
    for name in method_names():
        part = _rows(_method_part(page, name))
        missing += [
            f"{name}: {k}"
            for k in _keys((get_method(name).section or get_method(name).config), "method.")
            if k not in part
        ]
    return missing


PAGE = GEN.config_reference()


def test_every_key_of_the_run_config_and_of_every_method_is_listed():
    assert method_names(), "no registered methods"
    assert missing_keys(PAGE) == []


def test_a_row_gives_type_default_and_bounds():
    rows = _rows(PAGE)
    key_type, default, bounds = (c.strip() for c in rows["rounds"][:3])
    assert (key_type, default, bounds) == ("`int`", f"`{RunConfig().rounds}`", "≥ 1")
    field = RunConfig.model_fields["on_divergence"]
    assert field.description and " ".join(field.description.split()) in rows["on_divergence"][3]
    # a nested section's bounds (ClientsConfig.dropout: ge=0, lt=1)
    assert rows["clients.dropout"][2].strip() == "≥ 0, < 1"


@pytest.mark.parametrize("name", method_names())
def test_a_method_section_gives_each_default(name):
    config = get_method(name).section or get_method(name).config
    part = _rows(_method_part(PAGE, name))
    for key, field in config.model_fields.items():
        if field.default is not None and isinstance(field.default, (int, float, str)):
            assert part[f"method.{key}"][1].strip() == f"`{GEN.default_text(field)}`"


def test_the_check_catches_a_missing_key():
    """The check is not vacuous: a page with one RunConfig row or one method row removed fails."""
    without_rounds = re.sub(r"^\| `rounds` \|.*\n", "", PAGE, flags=re.M)
    assert missing_keys(without_rounds) == ["rounds"]
    name = method_names()[0]
    key = f"method.{next(iter((get_method(name).section or get_method(name).config).model_fields))}"
    part = _method_part(PAGE, name)
    cut = PAGE.replace(part, re.sub(rf"^\| `{re.escape(key)}` \|.*\n", "", part, flags=re.M))
    assert missing_keys(cut) == [f"{name}: {key}"]


def test_the_composition_table_has_a_row_per_mechanism_from_the_capabilities():
    """Uplink compression's row says yes exactly for the methods declaring a dense upload."""
    table = GEN.composition_table()
    header = next(line for line in table.splitlines() if line.startswith("| mechanism"))
    names = [c.strip().strip("`") for c in header.split("|")[2:-1]]
    row = next(line for line in table.splitlines() if "`method.compress`" in line)
    cells = [c.strip() for c in row.split("|")[2:-1]]
    expected = ["yes" if get_method(n).capabilities.dense_upload else "-" for n in names]
    assert names == method_names() and cells == expected
    assert "yes" in cells and "-" in cells
