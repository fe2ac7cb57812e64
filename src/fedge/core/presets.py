"""Where a run config's mapping is read from: a preset shipped with fedge (``quickstart``) or a
YAML file, parsed as YAML's safe loader reads it except that a key given twice is an error."""

from __future__ import annotations

import difflib
import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fedge.core.errors import ConfigError
from fedge.core.rundir_schema import CONFIG

__all__ = [
    "describe_yaml_error",
    "looks_like_path",
    "preset_names",
    "preset_path",
    "read_config_file",
    "read_yaml",
]


def _preset_dir() -> Path:
    return Path(str(resources.files("fedge") / "configs"))


def preset_names() -> list[str]:
    """Names of the YAML presets shipped with fedge."""
    return sorted(p.stem for p in _preset_dir().glob("*.yaml"))


def looks_like_path(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` was written as a path rather than a preset name: it has a
    directory separator (``runs/x``, ``./x``, ``x/``) or starts with a dot (``.x``, ``..``).
    Preset names are plain words. Read the text the user typed: a ``Path`` has already dropped a
    leading ``./`` and a trailing ``/``."""
    s = str(name_or_path)
    return "/" in s or os.sep in s or s.startswith(".")


def preset_path(name_or_path: str | Path) -> Path:
    """Resolve a preset name (``quickstart``) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if p.is_dir():
            run = (
                f" (to continue the run in it: fedge run --resume {p})"
                if (p / CONFIG).is_file()
                else ""
            )
            raise ConfigError(f"config file {str(p)!r} is a directory; give a YAML file{run}")
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        return p
    if looks_like_path(name_or_path):
        raise ConfigError(
            f"config file {str(name_or_path)!r} does not exist; give a YAML file or a preset name "
            f"({', '.join(preset_names())})"
        )
    cand = _preset_dir() / f"{name_or_path}.yaml"
    if cand.is_file():
        return cand
    close = difflib.get_close_matches(str(name_or_path), preset_names(), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(
        f"unknown preset {str(name_or_path)!r}{hint}; expected a YAML file path or one of: "
        + ", ".join(preset_names())
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: PyYAML
    keeps the last silently, so a second ``method:`` section would replace the first whole."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if (
                key_node.tag == "tag:yaml.org,2002:merge"
            ):  # '<<: *base' merges; its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader names it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice, first on line {first}",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str) -> Any:
    """Parse config text: YAML as :func:`yaml.safe_load` reads it, but a repeated key is a
    :class:`yaml.YAMLError` (see :func:`describe_yaml_error`)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """``at line L, column C (problem)``: a YAML error on one line."""
    mark = getattr(exc, "problem_mark", None)
    where = f"at line {mark.line + 1}, column {mark.column + 1} " if mark is not None else ""
    return f"{where}({getattr(exc, 'problem', None) or exc.__class__.__name__})"


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping a config file holds (:func:`preset_path` resolves a preset name to its file);
    :class:`ConfigError` naming the file when it is not UTF-8, not YAML, unreadable, empty or
    not a mapping."""
    try:
        raw = read_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 YAML"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML {describe_yaml_error(exc)}; fix it"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"config file {str(path)!r} cannot be read: {exc.strerror or exc}"
        ) from None
    if raw is None:  # nothing but blanks and comments: a truncated or unsaved file, most likely
        raise ConfigError(
            f"config file {str(path)!r} holds no settings (empty, or only comments); write the "
            "keys to change, or '{}' to run every default on purpose"
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping, got {type(raw).__name__}"
        )
    return raw
