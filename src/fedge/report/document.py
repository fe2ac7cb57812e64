"""A report as a list of blocks (heading, paragraph, table, code, image), and the two
renderers: Markdown, and self-contained HTML (CSS inline, plots as base64 ``data:`` URIs, so it
opens offline, from an e-mail attachment, with no external fetch). Both documents come from one
block list, so they always say the same thing.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Code", "Heading", "Image", "Para", "Table", "to_html", "to_markdown"]


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Code:
    text: str
    lang: str = ""


@dataclass(frozen=True)
class Image:
    path: Path
    alt: str


Block = Heading | Para | Table | Code | Image


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block], base: Path) -> str:
    out: list[str] = []
    for b in blocks:
        match b:
            case Heading(level, text):
                out.append(f"{'#' * level} {text}")
            case Para(text):
                out.append(text)
            case Table(header, rows):
                lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
                lines.append("|" + "|".join("---" for _ in header) + "|")
                lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
                out.append("\n".join(lines))
            case Code(text, lang):
                fence = "````" if "```" in text else "```"
                out.append(f"{fence}{lang}\n{text}\n{fence}")
            case Image(path, alt):
                rel = path.relative_to(base) if path.is_relative_to(base) else path
                out.append(f"![{alt}]({rel.as_posix()})")
    return "\n\n".join(out) + "\n"


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 60rem;
       margin: 2rem auto; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; border-bottom: 2px solid #ddd; padding-bottom: .3rem; }
h2 { font-size: 1.25rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; }
th { background: #f4f4f4; }
tr:nth-child(even) td { background: #fafafa; }
pre { background: #f6f8fa; padding: .8rem; overflow-x: auto; font-size: .85rem; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #555; }
"""


def _inline_code(text: str) -> str:
    """Escape ``text`` for HTML, turning `backticks` into <code>."""
    parts = text.split("`")
    return "".join(
        f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts)
    )


def to_html(blocks: Sequence[Block], title: str) -> str:
    body: list[str] = []
    for b in blocks:
        match b:
            case Heading(level, text):
                body.append(f"<h{level}>{html.escape(text)}</h{level}>")
            case Para(text):
                body.append(f"<p>{_inline_code(text)}</p>")
            case Table(header, rows):
                head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
                trs = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                    for r in rows
                )
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
            case Code(text, lang):
                cls = f' class="language-{html.escape(lang)}"' if lang else ""
                body.append(f"<pre><code{cls}>{html.escape(text)}</code></pre>")
            case Image(path, alt):
                data = base64.b64encode(path.read_bytes()).decode("ascii")
                body.append(
                    f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'
                    f"<figcaption>{html.escape(alt)}</figcaption></figure>"
                )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
