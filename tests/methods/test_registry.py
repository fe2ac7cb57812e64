"""The method registry: every method registers itself in its own module, and no layer above the
methods switches on a method's name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import fedge
from fedge.core.errors import ConfigError
from fedge.methods import METHODS, Capabilities, MethodSpec, declare_method, get_method

SRC = Path(fedge.__file__).parent


def _own_files(spec: MethodSpec) -> set[Path]:
    """The module defining ``spec``'s build, or the whole package when it is one."""
    path = Path(importlib.import_module(spec.build.__module__).__file__ or "")
    return set(path.parent.rglob("*.py")) if path.name == "__init__.py" else {path}


def _config_literals(tree: ast.AST) -> set[int]:
    """ids of the string constants that are config data: the value of a ``"name"`` key in a dict
    literal (``{"name": "fedavg", ...}``) or of a ``name`` field's default."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "name":
                    out.add(id(v))
        elif isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "name" for t in targets):
                out.add(id(node.value))
    return out


def _name_uses(path: Path, names: set[str]) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    data = _config_literals(tree)
    return [
        (node.value, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in names
        and id(node) not in data
    ]


def test_no_method_name_outside_its_own_module():
    """Each registered name appears as a string in the source only in its own module (docs, tests,
    configs and benchmarks may name methods; so may a config literal such as ``{"name": ...}``):
    in particular nothing in experiment/, attacks/, report/ or cli/ switches on a name."""
    own = {name: _own_files(spec) for name, spec in METHODS.items()}
    bad = [
        f"{path.relative_to(SRC)}:{line}: {name!r}"
        for path in sorted(SRC.rglob("*.py"))
        for name, line in _name_uses(path, set(METHODS))
        if path not in own[name]
    ]
    assert not bad, "method names used outside their own module:\n" + "\n".join(bad)


def test_the_scan_finds_a_name_switch(tmp_path):
    """The check above can fail: a comparison with a name is found, a config literal is not."""
    f = tmp_path / "m.py"
    f.write_text('x = {"name": "fedavg"}\nif y == "fedsgd":\n    pass\nname = "baffle"\n')
    assert _name_uses(f, set(METHODS)) == [("fedsgd", 2)]


def test_every_method_registers_itself_in_its_own_module():
    """methods/__init__.py registers nothing itself: each build comes from its method's module,
    which declares the method with its capabilities."""
    init = (SRC / "methods" / "__init__.py").read_text(encoding="utf-8")
    assert "MethodSpec(" not in init and "declare_method(" not in init.split("__all__")[-1]
    for name, spec in METHODS.items():
        assert spec.build.__module__.startswith("fedge.methods."), name
        assert isinstance(spec.capabilities, Capabilities)
        module = importlib.import_module(spec.build.__module__)
        assert f'"{name}"' in Path(module.__file__ or "").read_text(encoding="utf-8"), name


def test_declare_method_registers_the_build_unchanged():
    from fedge.methods.fedavg import FedAvgConfig

    def build(cfg, env):  # pragma: no cover - never built
        raise AssertionError

    with pytest.raises(ConfigError, match="already registered"):
        declare_method("fedavg", "again", config=FedAvgConfig)(build)
    spec = get_method("fedpt")
    assert spec.summary_keys == ("trainable_fraction",)
    assert get_method("baffle").advice(get_method("baffle").section(clip=None)) == [
        "turn on method.clip (now null; the reference code uses 0.3)"
    ]
