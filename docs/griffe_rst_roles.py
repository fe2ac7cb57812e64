"""A griffe extension for the API reference: the code's reST roles read as Markdown code.

The docstrings are Google style with reST cross-reference roles (``:class:`~fedge.x.Y```),
which mkdocstrings would print as written. This rewrites each role as inline code holding the
name (the last component after ``~``, as Sphinx shows it), and a literal block's ``::`` as
``:``, so the reference reads as the docstrings mean it. Loaded by mkdocs.yml (``extensions:`` of the python handler).
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)\.?([^`]+)`")


def markdown_roles(text: str) -> str:
    """``:class:`~a.b.C``` -> `C`; ``:func:`a.b``` -> `a.b`; a literal block's ``::`` -> ``:``
    (the indented block after it is already a Markdown code block)."""
    text = re.sub(r"(?<=\S)::\n(?=\n)", ":\n", text)
    return _ROLE.sub(lambda m: f"`{m[2].split('.')[-1] if m[1] else m[2]}`", text)


class RstRoles(Extension):
    """Rewrite the roles of every object's docstring as it is loaded."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_roles(obj.docstring.value)
