"""``--set KEY=VALUE`` overrides of a run config: the strings a caller gives (a list, or a
mapping of keys to values), applied to the config's nested mapping with values parsed as YAML
scalars; switching a choice section's ``name`` drops the old choice's keys."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import yaml

from fedge.core.errors import ConfigError
from fedge.core.validation import shorten, shown

__all__ = ["CHOICE_SECTIONS", "apply_overrides", "check_unique_keys", "override_strings"]


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


CHOICE_SECTIONS = ("partition", "model", "method")


def override_strings(overrides: Any) -> list[str]:
    """``KEY=VALUE`` strings from the overrides a caller gives: a list of such strings (``--set``),
    or a mapping (``{"rounds": 5, "method.client_optimizer.lr": 0.05}``, where a nested mapping
    such as ``{"method": {"local_epochs": 2}}`` sets the keys it names and keeps the section's
    others); values may be paths and numpy scalars. Anything else is a :class:`ConfigError`."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError(
            f"overrides={overrides!r} is one string; give a list of 'KEY=VALUE' strings "
            f"([{overrides!r}]) or a mapping ({{'rounds': 5}})"
        )
    if isinstance(overrides, Mapping):
        out: list[str] = []

        def add(prefix: str, mapping: Mapping[Any, Any]) -> None:
            for k, v in mapping.items():
                if not isinstance(k, str) or not k:
                    raise ConfigError(
                        f"overrides: key {k!r} is not a config key name; give keys such as 'rounds' or 'method.lr'"
                    )
                key = f"{prefix}{k}"
                if isinstance(v, Mapping) and v:
                    add(f"{key}.", v)
                    continue
                try:
                    text = json.dumps(v, default=_plain_value)  # JSON is YAML
                except (TypeError, ValueError):
                    raise ConfigError(
                        f"overrides: {key}={v!r} ({type(v).__name__}) is not a config value; give a "
                        "number, string, bool, None, or a list or mapping of them"
                    ) from None
                out.append(f"{key}={text}")

        add("", overrides)
        return out
    if isinstance(overrides, (list, tuple)) and all(isinstance(o, str) for o in overrides):
        return list(overrides)
    raise ConfigError(
        f"overrides={overrides!r}: expected a list of 'KEY=VALUE' strings or a mapping of keys to "
        "values, e.g. {'rounds': 5}"
    )


def check_unique_keys(overrides: list[str], *, option: str = "--set") -> None:
    """Refuse a key given twice (``--set rounds=1 --set rounds=2``) with a :class:`ConfigError`
    naming it, as a config file with a key twice is refused (:func:`fedge.core.presets.read_yaml`):
    which one was meant is a guess. Only for what one caller gives at once: a program that layers
    overrides (a benchmark's common keys, then a variant's) applies them in order instead."""
    seen: dict[str, str] = {}
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in seen:
            raise ConfigError(
                f"{option} {key} given twice ({option} {shorten(seen[key])} and {option} "
                f"{shorten(item)}); give each key once"
            )
        seen[key] = item


def _plain_value(v: Any) -> Any:
    """A path as its string, a numpy scalar or 0-d array as its Python value (for JSON)."""
    if isinstance(v, PurePath):
        return str(v)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "shape", None) == ():
        return item()
    raise TypeError(type(v).__name__)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML scalars) to a nested dict.

    Overriding the ``name`` of a choice section (``method.name=fedavg`` on a BAFFLE preset)
    switches to another component: the section's other keys from the file belong to the old
    choice and are dropped; the section's keys given as overrides are kept, in any order.
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, sub = key.strip().partition(".")
        if section in CHOICE_SECTIONS and sub == "name" and isinstance(out.get(section), dict):
            if out[section].get("name") != _parse_value(value):
                out[section] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {shown(item)}: expected KEY=VALUE, e.g. --set rounds=20")
        parts = key.strip().split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(
                    f"--set {shown(item)}: {'.'.join(parts[: i + 1])!r} is a value ({shown(nxt)}), not a section"
                )
            node = nxt
        node[parts[-1]] = _parse_value(value)
    return out
