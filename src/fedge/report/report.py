"""The report of one run, in Markdown and in self-contained HTML.

Both documents are rendered from one list of blocks (heading, paragraph, table, code, image),
so they always say the same thing. The HTML carries its CSS inline and its plots as base64
``data:`` URIs: it opens offline, from an e-mail attachment, with no external fetch.

Number formats: bytes in decimal units (1 MB = 10^6 B) with the exact count beside them,
FLOPs with SI prefixes, accuracy (logged as a fraction) in percent.
"""

from __future__ import annotations

import base64
import html
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedge.report.plots import plot_run
from fedge.report.runlog import RunLog, load_run

__all__ = [
    "format_accuracy",
    "format_bytes",
    "format_duration",
    "format_flops",
    "render_report",
]

_DASH = "—"
_FULL_TABLE_ROWS = 20  # longer tables show their first and last _EDGE_ROWS rows
_EDGE_ROWS = 5
_MAX_EXTRA_COLUMNS = 6  # method-specific metrics shown in the per-round table

# ---- number formatting --------------------------------------------------------------------


def _si(n: float, units: Sequence[tuple[float, str]], base_unit: str) -> str:
    sign, a = ("-" if n < 0 else ""), abs(n)
    for div, name in units:
        if a >= div:
            v = a / div
            digits = 0 if v >= 100 else 1 if v >= 10 else 2
            return f"{sign}{v:.{digits}f} {name}"
    return f"{sign}{a:g} {base_unit}".rstrip()


_BYTE_UNITS = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
_FLOP_UNITS = ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"),
               (1e6, "MFLOP"), (1e3, "kFLOP"))  # fmt: skip


def format_bytes(n: float | None, *, exact: bool = False) -> str:
    """Human-readable byte count in decimal units: ``format_bytes(1_234_567) == "1.23 MB"``.

    Args:
        n: a byte count (``None`` gives a dash).
        exact: append the exact count: ``"1.23 MB (1,234,567 B)"``.
    """
    if n is None:
        return _DASH
    text = _si(n, _BYTE_UNITS, "B")
    if exact and abs(n) >= 1000:
        text += f" ({int(n):,} B)"
    return text


def format_flops(n: float | None, *, exact: bool = False) -> str:
    """Human-readable FLOP count: ``format_flops(2.5e9) == "2.50 GFLOP"``.

    Args:
        n: a FLOP count (``None`` gives a dash).
        exact: append the exact count: ``"2.50 GFLOP (2,500,000,000)"``.
    """
    if n is None:
        return _DASH
    text = _si(n, _FLOP_UNITS, "FLOP")
    if exact and abs(n) >= 1000:
        text += f" ({int(n):,})"
    return text


def format_accuracy(acc: float | None) -> str:
    """An accuracy logged as a fraction, in percent: ``format_accuracy(0.8765) == "87.65%"``."""
    return _DASH if acc is None else f"{100 * acc:.2f}%"


def format_duration(seconds: float | None) -> str:
    """``"12.3 s"``, ``"4 min 05 s"`` or ``"2 h 03 min"``."""
    if seconds is None:
        return _DASH
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(round(seconds), 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return _DASH
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


# ---- document blocks ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Heading:
    level: int
    text: str


@dataclass(frozen=True)
class _Para:
    text: str


@dataclass(frozen=True)
class _Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class _Code:
    text: str
    lang: str = ""


@dataclass(frozen=True)
class _Image:
    path: Path
    alt: str


_Block = _Heading | _Para | _Table | _Code | _Image


def _elide(rows: list[tuple[str, ...]], width: int, what: str) -> list[tuple[str, ...]]:
    """Keep all rows of a short table; of a long one, the first and last few and a gap row."""
    if len(rows) <= _FULL_TABLE_ROWS:
        return rows
    hidden = len(rows) - 2 * _EDGE_ROWS
    gap = (f"… {hidden} more {what} …",) + ("",) * (width - 1)
    return rows[:_EDGE_ROWS] + [gap] + rows[-_EDGE_ROWS:]


def _title(run: RunLog) -> str:
    return f"{run.method} on {run.dataset} with {run.model}"


def _key_numbers(run: RunLog) -> _Table:
    planned = run.rounds_planned
    rounds = f"{run.rounds_done}" + (f" of {planned}" if planned is not None else "")
    best = format_accuracy(run.best_accuracy)
    if run.best_round is not None and run.best_accuracy is not None:
        best += f" (round {run.best_round})"
    rows: list[tuple[str, str]] = [
        ("status", run.status),
        ("final test accuracy", format_accuracy(run.final_accuracy)),
        ("best test accuracy", best),
        ("rounds", rounds),
        ("total bytes down", format_bytes(run.total_bytes_down, exact=True)),
        ("total bytes up", format_bytes(run.total_bytes_up, exact=True)),
        ("client FLOPs (total)", format_flops(run.total_client_flops, exact=True)),
        ("wall time", format_duration(run.wall_s)),
    ]
    if run.model_params is not None:
        rows.append(("model parameters", f"{run.model_params:,}"))
    if run.model_bytes is not None:
        rows.append(("model size", format_bytes(run.model_bytes, exact=True)))
    if run.peak_memory is not None:
        rows.append(("client peak memory", format_bytes(run.peak_memory, exact=True)))
    if run.seed is not None:
        rows.append(("seed", str(run.seed)))
    return _Table(("quantity", "value"), tuple(rows))


def _stats(values: Sequence[float]) -> str:
    if not values:
        return _DASH
    return f"{_num(min(values))} / {_num(statistics.median(values))} / {_num(max(values))}"


def _label_tv(hists: Sequence[Sequence[int]], n_classes: int) -> list[float]:
    """Per-client total-variation distance between its label distribution and the pooled one.

    Heterogeneity in one number: 0 when every client is IID, 1 for disjoint label sets.
    """
    pooled = [sum(h[k] for h in hists if k < len(h)) for k in range(n_classes)]
    total = sum(pooled)
    out = []
    for h in hists:
        n = sum(h[:n_classes])
        if n and total:
            p = [(h[k] if k < len(h) else 0) / n for k in range(n_classes)]
            out.append(0.5 * sum(abs(p[k] - pooled[k] / total) for k in range(n_classes)))
    return out


def _partition_blocks(part: dict[str, Any] | None) -> list[_Block]:
    blocks: list[_Block] = [_Heading(2, "Partition")]
    if not part:
        return blocks + [_Para("No partition.json in this run directory.")]
    clients = [c for c in part.get("clients", []) if isinstance(c, dict)]
    sizes = [int(c.get("num_samples", 0)) for c in clients]
    hists = [[int(v) for v in c.get("label_hist", [])] for c in clients]
    n_classes = part.get("num_classes") or max((len(h) for h in hists), default=0)

    present = [sum(1 for v in h if v > 0) for h in hists]
    top_share = [max(h) / sum(h) for h in hists if sum(h) > 0]
    tv = _label_tv(hists, n_classes)

    params = part.get("params") or {}
    params_txt = ", ".join(f"{k}={v}" for k, v in params.items()) if params else "none"
    mean_tv = statistics.fmean(tv) if tv else None
    rows = [
        ("partitioner", f"{part.get('name', '?')} ({params_txt})"),
        ("clients", _num(part.get("num_clients", len(clients)))),
        ("classes", _num(n_classes)),
        ("samples in total", _num(sum(sizes))),
        ("samples per client (min / median / max)", _stats(sizes)),
        ("classes present per client (min / median / max)", _stats(present)),
        ("largest-class share per client (min / median / max)", _stats(top_share)),
        ("mean label TV distance to pooled (0 = IID)", _num(mean_tv, 3)),
    ]
    blocks.append(_Table(("quantity", "value"), tuple(rows)))

    def hist_text(h: list[int]) -> str:  # the classes a client holds, largest first, top 5
        top = sorted(((v, k) for k, v in enumerate(h) if v > 0), reverse=True)
        text = ", ".join(f"{k}:{v}" for v, k in top[:5])
        return text + (f", +{len(top) - 5} more" if len(top) > 5 else "")

    per_client = [
        (str(c.get("id", i)), _num(sizes[i]), str(present[i]), hist_text(hists[i]))
        for i, c in enumerate(clients)
    ]
    header = ("client", "samples", "classes", "label histogram (class:count, largest first)")
    blocks.append(_Table(header, tuple(_elide(per_client, len(header), "clients"))))
    return blocks


_ROUND_COLUMNS: tuple[tuple[str, str], ...] = (
    ("test_accuracy", "test acc"),
    ("test_top5", "top-5"),
    ("test_loss", "test loss"),
    ("train_loss", "train loss"),
    ("bytes_down", "bytes down"),
    ("bytes_up", "bytes up"),
    ("client_flops", "client FLOPs"),
    ("clients", "clients"),
    ("client_peak_bytes", "peak mem"),
    ("wall_s", "wall s"),
)
_NOT_EXTRA = {"round", "cum_bytes_down", "cum_bytes_up", "cum_client_flops"} | {
    k for k, _ in _ROUND_COLUMNS
}


def _cell(key: str, v: Any) -> str:
    if v is None:
        return _DASH
    if key in ("test_accuracy", "test_top5"):
        return format_accuracy(v)
    if key in ("bytes_down", "bytes_up", "client_peak_bytes"):
        return format_bytes(v)
    if key == "client_flops":
        return format_flops(v)
    if key == "wall_s":
        return f"{v:.2f}"
    return _num(v)


def _rounds_blocks(run: RunLog) -> list[_Block]:
    blocks: list[_Block] = [_Heading(2, "Rounds")]
    if not run.metrics:
        return blocks + [_Para("No round has completed yet.")]
    logged = set(run.numeric_keys())
    cols = [(k, name) for k, name in _ROUND_COLUMNS if k in logged]
    extras = [k for k in run.numeric_keys() if k not in _NOT_EXTRA]
    cols += [(k, k) for k in extras[:_MAX_EXTRA_COLUMNS]]
    header = ("round",) + tuple(name for _, name in cols)
    rows = [
        (str(row["round"]),) + tuple(_cell(k, row.get(k)) for k, _ in cols) for row in run.metrics
    ]
    blocks.append(_Table(header, tuple(_elide(rows, len(header), "rounds"))))
    if len(extras) > _MAX_EXTRA_COLUMNS:
        more = ", ".join(extras[_MAX_EXTRA_COLUMNS:])
        blocks.append(_Para(f"Also logged (see metrics.jsonl): {more}."))
    return blocks


_CAPTIONS = {
    "accuracy.png": "Test accuracy per round",
    "accuracy_vs_bytes.png": "Test accuracy vs cumulative bytes (down + up)",
    "loss.png": "Loss per round",
    "bytes.png": "Bytes per round",
    "accuracy_vs_flops.png": "Test accuracy vs cumulative client FLOPs",
}


def _document(run: RunLog, plots: Sequence[Path]) -> list[_Block]:
    blocks: list[_Block] = [_Heading(1, _title(run))]
    blocks.append(_Para(f"Run directory `{run.path}` — {run.status}."))
    blocks += [_Heading(2, "Key numbers"), _key_numbers(run)]
    blocks.append(_Heading(2, "Plots"))
    if plots:
        blocks += [_Image(p, _CAPTIONS.get(p.name, p.stem)) for p in plots]
    else:
        blocks.append(_Para("No plots yet (no round has been evaluated)."))
    blocks += _rounds_blocks(run)
    blocks += _partition_blocks(run.partition)
    blocks.append(_Heading(2, "Config"))
    if run.config:
        blocks.append(_Code(yaml.safe_dump(run.config, sort_keys=False).rstrip(), "yaml"))
    else:
        blocks.append(_Para("No config.yaml in this run directory."))
    return blocks


# ---- renderers ------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _to_markdown(blocks: Sequence[_Block], base: Path) -> str:
    out: list[str] = []
    for b in blocks:
        match b:
            case _Heading(level, text):
                out.append(f"{'#' * level} {text}")
            case _Para(text):
                out.append(text)
            case _Table(header, rows):
                lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
                lines.append("|" + "|".join("---" for _ in header) + "|")
                lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
                out.append("\n".join(lines))
            case _Code(text, lang):
                fence = "````" if "```" in text else "```"
                out.append(f"{fence}{lang}\n{text}\n{fence}")
            case _Image(path, alt):
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


def _to_html(blocks: Sequence[_Block], title: str) -> str:
    body: list[str] = []
    for b in blocks:
        match b:
            case _Heading(level, text):
                body.append(f"<h{level}>{html.escape(text)}</h{level}>")
            case _Para(text):
                body.append(f"<p>{_inline_code(text)}</p>")
            case _Table(header, rows):
                head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
                trs = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                    for r in rows
                )
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
            case _Code(text, lang):
                cls = f' class="language-{html.escape(lang)}"' if lang else ""
                body.append(f"<pre><code{cls}>{html.escape(text)}</code></pre>")
            case _Image(path, alt):
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


def render_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write ``plots/*.png``, ``report.md`` and ``report.html`` into a run directory.

    Works on runs still in progress (the report then says "incomplete (N rounds so far)"),
    so it can be re-run at any time; each call overwrites the previous report.

    Args:
        run_dir: a directory written by ``fedge run``.

    Returns:
        ``(report_md_path, report_html_path)``.

    Raises:
        NotARunDirError: ``run_dir`` is missing or has no ``metrics.jsonl``.
        RunDirError: a file in it is malformed.
    """
    run = load_run(run_dir)
    plots = plot_run(run, run.path / "plots")
    blocks = _document(run, plots)
    md_path, html_path = run.path / "report.md", run.path / "report.html"
    md_path.write_text(_to_markdown(blocks, run.path), encoding="utf-8")
    html_path.write_text(_to_html(blocks, _title(run)), encoding="utf-8")
    return md_path, html_path
