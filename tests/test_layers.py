"""The import graph of src/fedge keeps its layers (DESIGN.md, docs/architecture.md).

Every module under src/fedge is parsed with ``ast`` (no import executed), and every import
statement anywhere in it counts: top level, inside functions, under ``if TYPE_CHECKING:`` and
in ``try`` blocks, absolute and relative, ``import a.b`` and ``from a import b`` (where ``b`` may
be a submodule). Two properties are checked:

* no import cycles among fedge modules (a strongly connected component of more than one
  module), leaving out the edges from a package's ``__init__`` to its own submodules;
* no module imports a layer above its own, and the same-layer rules hold (the table below).

Layers, lowest first: 0 core; 1 data, models, estimators, privacy, pruning; 2 methods,
runtime; 3 experiment; 4 report, bench, attacks; 5 cli and the public API (``fedge/__init__.py``).
Within layer 1 only the imports in ``SAME_LAYER_ALLOWED`` may cross packages; within layer 2
methods and runtime do not import each other; report and bench do not import each other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "fedge"

LAYERS: dict[str, int] = {
    "core": 0,
    "data": 1,
    "models": 1,
    "estimators": 1,
    "privacy": 1,
    "pruning": 1,
    "methods": 2,
    "runtime": 2,
    "experiment": 3,
    "report": 4,
    "bench": 4,
    "attacks": 4,
    "cli": 5,
    "": 5,  # fedge/__init__.py and any top-level module: the public API
}

# Imports across packages of the same layer that the design allows (importer, imported).
# Layer 1: pruning scores weights with gradients and zeroth-order estimates. Everything else
# in the same layer is forbidden, so a new same-layer import is a deliberate change here.
SAME_LAYER_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        ("pruning", "estimators"),
    }
)

# Violations the lead is fixing now, as (importer module, imported module). Empty this list
# as they are fixed; test_known_violations_still_occur fails when an entry no longer occurs.
KNOWN_VIOLATIONS_TO_FIX: frozenset[tuple[str, str]] = frozenset()  # experiment.run -> report: fixed


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest fedge module that ``name`` names or lies inside, or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name this module imports, anywhere in its tree (functions, TYPE_CHECKING)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts)
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield target
            for alias in node.names:
                if alias.name != "*":
                    # `from fedge.x import y`: y may be the submodule fedge.x.y
                    yield f"{target}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """Edges module -> fedge modules it imports (self-imports dropped)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets: set[str] = set()
        for imported in _imported_names(tree, name, _is_package(path)):
            if imported != PACKAGE and not imported.startswith(PACKAGE + "."):
                continue
            resolved = _resolve(imported, modules)
            if resolved is not None and resolved != name:
                targets.add(resolved)
        graph[name] = targets
    return graph


def _package_of(module: str) -> str:
    """The layer key of a module: ``fedge.methods.baffle`` -> ``methods``; ``fedge`` -> ``""``."""
    parts = module.split(".")
    if len(parts) == 1:
        return ""
    if parts[1] == "__main__":  # ``python -m fedge``: the command line, so the cli's layer
        return "cli"
    sub = parts[1]
    # a top-level module fedge/x.py (not a package) belongs to the API layer
    return sub if sub in LAYERS else ""


def _strip_own_init_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Leave out a package __init__'s edges to its own submodules (re-exports)."""
    modules = _modules()
    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        if _is_package(modules[mod]):
            targets = {t for t in targets if not t.startswith(mod + ".")}
        out[mod] = set(targets)
    return out


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """(importer, imported, why) for every import that breaks the layer table."""
    found = []
    for mod in sorted(graph):
        src_pkg = _package_of(mod)
        src_layer = LAYERS[src_pkg]
        for target in sorted(graph[mod]):
            dst_pkg = _package_of(target)
            dst_layer = LAYERS[dst_pkg]
            if dst_pkg == src_pkg:
                continue
            if dst_layer > src_layer:
                found.append((mod, target, f"layer {dst_layer} above {src_layer}"))
            elif dst_layer == src_layer and (src_pkg, dst_pkg) not in SAME_LAYER_ALLOWED:
                found.append(
                    (
                        mod,
                        target,
                        f"same layer {dst_layer}: {src_pkg} may not import {dst_pkg or 'the API'}",
                    )
                )
    return found


def _cycle_pairs(components: list[list[str]], graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    pairs = set()
    for comp in components:
        members = set(comp)
        for a in comp:
            for b in graph[a] & members:
                pairs.add((a, b))
    return pairs


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    return [c for c in strongly_connected_components(graph) if len(c) > 1]


# --- the checker itself, on hand-made graphs and sources --------------------------------


def test_scc_finds_cycles_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set(), "f": {"f2"}, "f2": {"f"}}
    comps = sorted(c for c in strongly_connected_components(graph) if len(c) > 1)
    assert comps == [["a", "b", "c"], ["f", "f2"]]


def test_import_collection_sees_type_checking_function_and_relative_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from ..core import rng\n"
        "if TYPE_CHECKING:\n"
        "    from fedge.methods.base import X\n"
        "def f():\n"
        "    import fedge.bench.comm\n"
    )
    names = set(_imported_names(ast.parse(source), "fedge.runtime.engine", is_package=False))
    assert {
        "fedge.runtime.sibling",
        "fedge.core.rng",
        "fedge.methods.base.X",
        "fedge.bench.comm",
    } <= names
    names_pkg = set(
        _imported_names(ast.parse("from .engine import run\n"), "fedge.runtime", is_package=True)
    )
    assert "fedge.runtime.engine" in names_pkg


def test_layer_checker_flags_upward_and_same_layer_imports() -> None:
    graph = {
        "fedge.core.rng": {"fedge.methods.base"},  # upward
        "fedge.methods.base": {"fedge.runtime.engine", "fedge.core.rng"},  # same layer, forbidden
        "fedge.runtime.engine": set(),
        "fedge.pruning.saliency": {"fedge.estimators.backprop"},  # allowed same-layer
        "fedge.estimators.backprop": set(),
        "fedge.cli.main": {"fedge.experiment.run"},  # downward
        "fedge.experiment.run": set(),
    }
    got = {(a, b) for a, b, _ in layer_violations(graph)}
    assert got == {
        ("fedge.core.rng", "fedge.methods.base"),
        ("fedge.methods.base", "fedge.runtime.engine"),
    }


def test_graph_is_real() -> None:
    """The graph reaches every layer (guards against a parser that silently finds nothing)."""
    graph = import_graph()
    assert len(graph) > 50
    imported_pkgs = {_package_of(t) for targets in graph.values() for t in targets}
    assert {
        "core",
        "data",
        "models",
        "estimators",
        "methods",
        "runtime",
        "experiment",
    } <= imported_pkgs
    # known top-level edges, absolute to a module and to a package's __init__:
    assert "fedge.core.errors" in graph["fedge.core.config"]
    assert {"fedge.methods.base", "fedge.estimators"} <= graph["fedge.methods.baffle.batch"]
    for mod in graph:
        assert _package_of(mod) in LAYERS, f"{mod} is in no layer; add its package to LAYERS"


# --- the real package --------------------------------------------------------------------


def _current_violations() -> tuple[list[str], set[tuple[str, str]]]:
    graph = import_graph()
    acyclic = _strip_own_init_edges(graph)
    lines: list[str] = []
    pairs: set[tuple[str, str]] = set()
    for comp in _cycles(acyclic):
        for a, b in sorted(_cycle_pairs([comp], acyclic)):
            pairs.add((a, b))
            lines.append(f"{a} imports {b} (import cycle among {', '.join(comp)})")
    for a, b, why in layer_violations(graph):
        pairs.add((a, b))
        lines.append(f"{a} imports {b} ({why})")
    return lines, pairs


def test_no_cycles_and_no_upward_imports() -> None:
    lines, _ = _current_violations()
    unexpected = [
        line
        for line in lines
        if tuple(line.split(" (")[0].split(" imports ")) not in KNOWN_VIOLATIONS_TO_FIX
    ]
    for line in unexpected:
        print(line)
    assert not unexpected, "layer violations:\n" + "\n".join(unexpected)


@pytest.mark.skipif(not KNOWN_VIOLATIONS_TO_FIX, reason="no known violations left to fix")
def test_known_violations_still_occur() -> None:
    """An allow-listed pair that no longer occurs must leave the list (so it cannot go stale)."""
    _, pairs = _current_violations()
    stale = sorted(KNOWN_VIOLATIONS_TO_FIX - pairs)
    assert not stale, f"fixed, remove from KNOWN_VIOLATIONS_TO_FIX: {stale}"
