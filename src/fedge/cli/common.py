"""What every command shares: the consoles, the one-line error exit, comma-list parsing."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

__all__ = [
    "EXIT_BAD_INPUT",
    "err",
    "fail",
    "one_line_warnings",
    "out",
    "parse_list",
    "set_options",
]

EXIT_BAD_INPUT = 2

err = Console(stderr=True)

T = TypeVar("T")


def out() -> Console:
    """A console on stdout: the terminal's width on a terminal; piped or redirected, wide
    enough that tables keep every character (no "…" cut at 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=100_000)


def fail(exc: BaseException | str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``error: <message>`` to stderr (never wrapped) and exit with ``code``."""
    err.print(
        "[bold red]error:[/] " + escape(str(exc)), highlight=False, markup=True, soft_wrap=True
    )  # the text as is: '[x]' too
    raise typer.Exit(code)


def set_options(values: list[str] | None) -> list[str]:
    """The ``--set KEY=VALUE`` options as given; a key given twice exits 2 naming it."""
    from fedge.core.errors import ConfigError
    from fedge.core.overrides import check_unique_keys

    items = list(values or [])
    try:
        check_unique_keys(items)
    except ConfigError as exc:
        fail(exc)
    return items


def parse_list(
    option: str,
    text: str,
    kind: Callable[[str], T] = str,  # type: ignore[assignment]
    *,
    example: str,
    positive: bool = False,
) -> tuple[T, ...]:
    """``"10, 100,1000"`` -> ``(10, 100, 1000)`` for ``--option``; any bad item exits 2 with
    one line naming the option, the text and an example of what is expected."""
    what = "positive integers" if positive else ("integers" if kind is int else "names")
    try:
        items = tuple(kind(part.strip()) for part in text.split(","))
        if any(isinstance(v, str) and not v for v in items):
            raise ValueError
        if positive and any(not isinstance(v, int | float) or v < 1 for v in items):
            raise ValueError
    except ValueError:
        fail(f"{option} {text!r}: expected comma-separated {what} such as {example}")
    return items


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Show warnings as ``warning: Category: message`` on one stderr line (no source echo)."""
    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], *_: Any, **__: Any) -> None:
        err.print(
            "[yellow]warning:[/] " + escape(f"{category.__name__}: {message}"),
            highlight=False,
            soft_wrap=True,
        )

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
