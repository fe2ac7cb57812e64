"""Privacy columns of a run from ``RUN_DIR/attacks/*.json`` (written by ``fedge attack``):
one short cell per attack family, for ``fedge compare``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PRIVACY_COLUMNS", "privacy_cells"]

PRIVACY_COLUMNS = ("DRA MSE (mean img)", "MIA AUC", "MIA precision", "PIA AUC")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def privacy_cells(run_dir: str | Path) -> dict[str, str]:
    """Column -> cell for the attacks this run has results for (absent columns: no result).

    DRA: the lowest median reconstruction MSE over the dlg/ig attacks, with the mean-image
    baseline; MIA: the strongest of the loss-threshold, shadow-model and LiRA attacks by AUC,
    and its precision; PIA: the property-inference AUC."""
    folder = Path(run_dir) / "attacks"
    cells: dict[str, str] = {}
    dra = []
    for kind in ("dlg", "ig"):
        r = _read(folder / f"{kind}.json") or {}
        base = _num(r.get("baseline_mean_image_mse"))
        for name, a in (r.get("attacks") or {}).items():
            if isinstance(a, dict) and _num(a.get("median_mse")) is not None:
                dra.append((float(a["median_mse"]), name, base))
    if dra:
        mse, name, base = min(dra, key=lambda t: t[0])
        cells[PRIVACY_COLUMNS[0]] = (
            f"{mse:.3g} ({base:.3g}) {name}" if base is not None else f"{mse:.3g} {name}"
        )
    mias = []
    plain = _read(folder / "mia.json")
    if plain is not None:
        mias.append(("loss", plain))
    shadow = _read(folder / "mia-shadow.json") or {}
    mias += [(k, shadow[k]) for k in ("loss", "shadow", "lira") if isinstance(shadow.get(k), dict)]
    mias = [(k, r) for k, r in mias if _num(r.get("auc")) is not None]
    if mias:
        name, r = max(mias, key=lambda t: float(t[1]["auc"]))
        cells[PRIVACY_COLUMNS[1]] = f"{float(r['auc']):.3f} {name}"
        precision = _num(r.get("precision", r.get("best_precision")))
        if precision is not None:
            cells[PRIVACY_COLUMNS[2]] = f"{precision:.3f}"
    pia = _read(folder / "pia.json")
    if pia is not None and _num(pia.get("auc")) is not None:
        cells[PRIVACY_COLUMNS[3]] = f"{float(pia['auc']):.3f}" + (
            " masked" if pia.get("masked") else ""
        )
    return cells
