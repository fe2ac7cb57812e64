"""Checks of config values, each failing with one :class:`ConfigError` that names the dotted key,
the bad value and what was expected: pydantic's validation errors formatted one line per
problem (with the valid keys and the closest one for an unknown key), non-finite numbers
anywhere in a raw config, positive counts and path arguments."""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel, ValidationError

from fedge.core.errors import ConfigError

__all__ = [
    "check_finite",
    "check_positive_int",
    "format_validation_error",
    "path_argument",
    "shorten",
    "shown",
    "validate_section",
]


def path_argument(name: str, value: Any, *, what: str = "a path") -> Path:
    """``value`` (a caller's argument ``name``) as a path: a non-empty str or path-like, else a
    :class:`ConfigError` naming the argument."""
    if isinstance(value, (str, PurePath)) and str(value):
        return Path(value)
    raise ConfigError(
        f"{name}={value!r} ({type(value).__name__}): expected {what}, as a str or pathlib.Path"
    )


_NON_FINITE_TEXT = re.compile(r"^[+-]?(inf|infinity|nan)$", re.IGNORECASE)


#: Keys where +inf is a meaningful setting (DP's "no clipping", for the no-privacy oracle).
_INF_ALLOWED = frozenset({"privacy.clip"})


def check_finite(raw: Any, prefix: str = "") -> None:
    """Raise :class:`ConfigError` at the first non-finite number anywhere in a config mapping.

    Floats that are inf or nan, and strings a float field would read as such (``"inf"``,
    ``"-Infinity"``, ``"nan"``), are refused with the dotted key: no learning rate, sigma,
    clip or partition parameter can be non-finite, and catching it here (before any section
    is validated by its component) means no run directory is ever created for it."""
    if isinstance(raw, dict):
        for k, v in raw.items():
            check_finite(v, f"{prefix}{k}.")
    elif isinstance(raw, list | tuple):
        for i, v in enumerate(raw):
            check_finite(v, f"{prefix}{i}.")
    elif (isinstance(raw, float) and not math.isfinite(raw)) or (
        isinstance(raw, str) and _NON_FINITE_TEXT.match(raw.strip())
    ):
        key = prefix.rstrip(".") or "<root>"
        text = str(raw).strip().lower()
        if key in _INF_ALLOWED and text in ("inf", "+inf", "infinity", "+infinity"):
            return
        raise ConfigError(
            f"config key {key!r}: {raw!r} is not a finite number; give a finite value"
        )


def check_positive_int(what: str, value: object) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an int >= 1 (a bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")


_SHOWN = 100  # characters of a value an error echoes


def shorten(text: str, limit: int = _SHOWN) -> str:
    """``text``, or its first ``limit`` characters and how many it has (an error line never
    echoes a 100 kB ``--set`` value in full)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def shown(value: Any) -> str:
    """``repr(value)`` for an error line, :func:`shorten`-ed."""
    return shorten(repr(value))


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (sub)model a validation error location points into."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return sorted(model.model_fields)


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], *, prefix: str = ""
) -> str:
    """One line per problem: ``config key 'a.b': <what is wrong> (got <value>)``."""
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        key = prefix + ".".join(str(p) for p in loc) if loc else prefix.rstrip(".") or "<root>"
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = (
                f" (did you mean {prefix}{'.'.join(map(str, loc[:-1] + (close[0],)))}?)"
                if close
                else ""
            )
            lines.append(f"unknown config key {key!r}{hint}; valid keys here: {', '.join(valid)}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            # a check of a whole section names its values itself, as do checks that say "got ...":
            # echoing the value again would be noise
            named = isinstance(got, dict) or f"got {got!r}" in msg or f"got {got}" in msg
            if named and not isinstance(got, dict):  # a huge value named by the check: cut it
                for text in (repr(got), str(got)):
                    if len(text) > _SHOWN:
                        msg = msg.replace(text, shorten(text))
            lines.append(f"config key {key!r}: {msg}" + ("" if named else f" (got {shown(got)})"))
    return "\n".join(lines)


def validate_section(model: type[BaseModel], data: dict[str, Any], *, prefix: str) -> BaseModel:
    """Validate ``data`` against ``model``; raise :class:`ConfigError` with dotted keys."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, prefix=prefix)) from None
