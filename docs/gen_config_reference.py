"""The configuration reference page, generated from the pydantic models at documentation build.

:func:`config_reference` walks :class:`fedge.core.config.RunConfig` (nested sections too), the
privacy section's :class:`fedge.privacy.dp.PrivacyConfig`, every registered method's config
(``fedge.methods.method_names()`` / ``get_method(name).config``, read generically from the
registry), and the model, dataset and partitioner registries, and writes one Markdown page: for
each key its type, default, bounds (``gt``/``ge``/``lt``/``le``) and description. Nothing is
written by hand, so the page cannot drift from the code.

This file is also the MkDocs hook (``hooks:`` in mkdocs.yml): :func:`on_files` adds the page as
``reference/config.md`` to every build; ``tests/test_config_reference.py`` imports it by path.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PAGE = "reference/config.md"


@dataclass(frozen=True)
class Row:
    """One documented key: its dotted name and what the model says about it."""

    key: str
    type: str
    default: str
    bounds: str
    description: str


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (alone, in a union, in a list or a dict's values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def _is_list_of_models(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (list, tuple):
        return bool(_models_in(annotation))
    return any(_is_list_of_models(a) for a in typing.get_args(annotation))


def type_name(annotation: Any) -> str:
    """A short, readable spelling of a type annotation (``int | None``, ``"stop" | "continue"``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return "None"
    if origin is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def default_text(field: FieldInfo) -> str:
    """The default as it reads in YAML (``null``, ``true``), "required", or "section"."""
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:  # a factory that takes the validated data
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    value = _plain(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return str(value)


_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "≤"),
)


def bounds_text(field: FieldInfo) -> str:
    """The numeric bounds of a field (``> 0, ≤ 1``), from its metadata (``Field(gt=0, le=1)``)."""
    out = []
    for item in field.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(item, kind):
                out.append(f"{sign} {getattr(item, attr)}")
        if isinstance(item, annotated_types.MinLen):
            out.append(f"length ≥ {item.min_length}")
        if isinstance(item, annotated_types.MaxLen):
            out.append(f"length ≤ {item.max_length}")
    return ", ".join(out)


def rows(model: type[BaseModel], prefix: str = "") -> Iterator[Row]:
    """Every key of ``model`` as ``prefix + name``, nested models' keys after their section's row
    (``clients.profiles[].fraction`` for a list of models)."""
    for name, field in model.model_fields.items():
        key = prefix + name
        yield Row(
            key,
            type_name(field.annotation),
            default_text(field),
            bounds_text(field),
            " ".join((field.description or "").split()),
        )
        nested = _models_in(field.annotation)
        inner = f"{key}[]." if _is_list_of_models(field.annotation) else f"{key}."
        for sub in nested:
            yield from rows(sub, inner)


def _cell(text: str) -> str:
    """Plain text in a table cell: a pipe escaped (it would end the cell)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Code in a table cell: Python-Markdown's tables keep a pipe inside a code span as is."""
    return "`" + text.replace("`", "'").replace("\n", " ") + "`"


def table(items: list[Row]) -> str:
    """A Markdown table of rows (key, type, default, bounds, description)."""
    lines = ["| key | type | default | bounds | description |", "|---|---|---|---|---|"]
    for r in items:
        lines.append(
            f"| `{r.key}` | {_code(r.type)} | {_code(r.default)} | {_cell(r.bounds)} | "
            f"{_cell(r.description)} |"
        )
    return "\n".join(lines)


def _doc(obj: Any) -> str:
    """The first paragraph of a docstring, reST's ``code`` written as Markdown's `code`."""
    return " ".join((obj.__doc__ or "").split("\n\n")[0].split()).replace("``", "`")


def method_sections() -> list[tuple[str, str, type[BaseModel]]]:
    """(name, description, config class) of every registered method, from the registry."""
    from fedge.methods import get_method, method_names

    out = []
    for name in method_names():
        spec = get_method(name)
        # the whole method.* section: the method's own keys and the mechanisms it can take
        out.append((name, spec.description, spec.section or spec.config))
    return out


#: where methods/index.md shows the composition table (filled in from the registry)
COMPOSITION_MARKER = "<!-- composition-table -->"


def composition_table() -> str:
    """What composes with what, from each registered method's capabilities and the options the
    composer attaches to its section (``fedge.methods.compose``): it cannot drift from the code."""
    from fedge.methods import get_method, method_names

    names = method_names()
    specs = {n: get_method(n) for n in names}

    def has(name: str, key: str) -> str:
        section = specs[name].section or specs[name].config
        return "yes" if key in section.model_fields else "-"

    def dp(name: str) -> str:
        return "yes" if specs[name].capabilities.sums_replies else "-"

    rows = [
        (
            "[secure aggregation](../privacy/secure-aggregation.md) (`method.secure_aggregation`)",
            lambda n: has(n, "secure_aggregation"),
        ),
        ("[DP](../privacy/dp.md) (`privacy.*`)", dp),
        ("`method.freeze`", lambda n: has(n, "freeze")),
        ("EMA evaluation (`method.ema`)", lambda n: has(n, "ema")),
        (
            "[uplink compression](compression.md) (`method.compress`)",
            lambda n: has(n, "compress"),
        ),
    ]
    out = [
        "| mechanism | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, cell in rows:
        out.append(f"| {label} | " + " | ".join(cell(n) for n in names) + " |")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: fill in the composition table where a page asks for it."""
    if COMPOSITION_MARKER in markdown:
        markdown = markdown.replace(COMPOSITION_MARKER, composition_table())
    return markdown


def _model_options(name: str) -> type[BaseModel] | None:
    """A registered model's options config, when the registry exposes it."""
    from fedge.models import registry

    entry = getattr(registry, "_entry", None)
    try:
        config = getattr(entry(name), "config", None) if entry else None
    except Exception:  # noqa: BLE001  (a registry that changed shape: fall back to defaults)
        return None
    return config if isinstance(config, type) and issubclass(config, BaseModel) else None


def _defaults_table(prefix: str, options: Mapping[str, Any]) -> str:
    lines = ["| key | default |", "|---|---|"]
    for k, v in options.items():
        v = _plain(v)
        text = "null" if v is None else ("true" if v is True else "false" if v is False else v)
        lines.append(f"| `{prefix}{k}` | {_code(str(text))} |")
    return "\n".join(lines)


def config_reference() -> str:
    """The whole page, Markdown."""
    from fedge.core.config import RunConfig
    from fedge.data.partition import PARTITIONERS
    from fedge.data.registry import DATASETS
    from fedge.models import model_info, model_names
    from fedge.privacy.dp import PrivacyConfig

    out = [
        "# Configuration reference",
        "",
        "Generated from the pydantic models when the site is built "
        "(`docs/gen_config_reference.py`), so it lists exactly what the code accepts. A run's "
        "config is one nested mapping: a preset or YAML file plus `--set key=value` overrides "
        "(see [Configs](../guide/configs.md)). Bounds: `>` `≥` `<` `≤` are pydantic's "
        "`gt` `ge` `lt` `le`; a key without bounds takes any value of its type.",
        "",
        "## Run (`RunConfig`)",
        "",
        _doc(RunConfig),
        "The `partition`, `model`, `method` and `privacy` sections take the keys of the "
        "component they name, listed in the sections below.",
        "",
        table(list(rows(RunConfig))),
        "",
        "## Privacy (`privacy.*`)",
        "",
        _doc(PrivacyConfig),
        "",
        table(list(rows(PrivacyConfig, "privacy."))),
        "",
        "## Methods (`method.*`)",
        "",
        "Each registered method validates the `method` section with its own config class.",
        "",
    ]
    for name, description, config in method_sections():
        out += [
            f"### {name}",
            "",
            f"{description}. Config class: `{config.__module__}.{config.__qualname__}`.",
            "",
            table(list(rows(config, "method."))),
            "",
        ]
    out += [
        "## Models (`model.*`)",
        "",
        "`model.name` picks the model; `model.activation`, `model.norm` and the model's own "
        "options follow (`fedge models` lists them with parameter counts).",
        "",
    ]
    for name in model_names():
        info = model_info(name)
        config = _model_options(name)
        out += [f"### {name}", "", info.description + ".", ""]
        if info.activations:
            out.append(f"`model.activation`: one of {', '.join(info.activations)}.")
        if info.norms:
            out.append(f"`model.norm`: one of {', '.join(info.norms)}.")
        out.append("")
        if config is not None and config.model_fields:
            out += [table(list(rows(config, "model."))), ""]
        else:
            out += [_defaults_table("model.", info.defaults), ""]
    out += [
        "## Datasets (`dataset.*`)",
        "",
        "Besides the fixed `dataset` keys above, each dataset takes its own options:",
        "",
        "| dataset | description | options (default) |",
        "|---|---|---|",
    ]
    for name, spec in sorted(DATASETS.items()):
        opts = ", ".join(f"`{k}` ({_cell(str(_plain(v)))})" for k, v in spec.options.items())
        out.append(f"| `{name}` | {_cell(spec.description)} | {opts or '-'} |")
    out += [
        "",
        "## Partitions (`partition.*`)",
        "",
        "| partitioner | description | parameters (default) |",
        "|---|---|---|",
    ]
    for name, spec in sorted(PARTITIONERS.items()):
        opts = ", ".join(f"`{k}` ({_cell(str(_plain(v)))})" for k, v in spec.params.items())
        out.append(f"| `{name}` | {_cell(spec.description)} | {opts or '-'} |")
    out.append("")
    return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the build."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=config_reference()))
    return files
