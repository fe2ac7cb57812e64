"""One registry style for every pluggable kind (methods, models, datasets, partitioners): a
:class:`Registry` refuses a name already taken and names every valid choice for an unknown one.

>>> r: Registry[int] = Registry("colour")
>>> r.register("red", 1)
1
>>> r.get("blue")
Traceback (most recent call last):
...
fedge.core.errors.UnknownNameError: unknown colour 'blue'; expected one of: red
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from fedge.core.errors import ConfigError, UnknownNameError

__all__ = ["Registry", "validate_options"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> entry, for one kind of component (``kind`` names it in error messages).

    A ``Mapping``: ``name in reg``, ``reg[name]``, ``len(reg)``, iteration in registration
    order. Lookups by :meth:`get` name the valid choices when the name is unknown.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        """Add ``entry`` under ``name``; a name already taken is a :class:`ConfigError`."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ConfigError(
                f"{self.kind} {name!r} is already registered; pick another name (registered: {', '.join(self.names())})"
            )
        self._entries[name] = entry
        return entry

    def get(self, name: str, default: Any = None) -> T:
        """The entry for ``name``; :class:`UnknownNameError` (listing the choices) if absent.

        Unlike ``Mapping.get`` an unknown name is an error, never ``default``: a typo must not
        pass silently. (``default`` exists only for signature compatibility and is ignored.)
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.kind, str(name), list(self._entries)) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def view(self) -> Mapping[str, T]:
        """A read-only live view of the entries (name -> entry)."""
        return MappingProxyType(self._entries)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and notebooks re-registering a component)."""
        self.get(name)
        del self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def validate_options(
    config: type[BaseModel], options: Mapping[str, Any], *, what: str, noun: str = "option"
) -> BaseModel:
    """Validate ``options`` with ``config``; one :class:`ConfigError` naming each bad key.

    ``what`` names the component (``"model 'lenet'"``); an unknown key lists the valid ones.
    """
    unknown = sorted(set(options) - set(config.model_fields))
    if unknown:
        valid = ", ".join(sorted(config.model_fields)) or "(none)"
        raise ConfigError(
            f"{what} has no {noun} {', '.join(map(repr, unknown))}; valid {noun}s: {valid}"
        )
    try:
        return config.model_validate(dict(options))
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"][:1]) or "<root>"
            field = config.model_fields.get(key)
            default = f"; default {field.default!r}" if field is not None else ""
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{noun} {key!r} of {what}: {msg}, got {options.get(key)!r}{default}")
        raise ConfigError("\n".join(lines)) from None
