"""Reconstructed images scored against a client's own: per-image pixel MSE in [0, 1] space,
the one-to-one matching of a batch of reconstructions to the client's local set (the usual
scoring of batch gradient inversion), the mean-image and mid-gray baselines an attack must
beat, and the truth-over-reconstruction grid written beside an attack's result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedge.experiment.build import BuiltRun

__all__ = [
    "baseline_mse",
    "image_grid",
    "match_images",
    "mean_image",
    "mid_gray",
    "pixel_box",
    "pixel_mse",
]


def pixel_mse(
    a: torch.Tensor, b: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """Per-image MSE in [0, 1] pixel space of normalized images a, b of shape (B, C, H, W)."""
    s = torch.tensor(std).view(1, -1, 1, 1)
    m = torch.tensor(mean).view(1, -1, 1, 1)
    pa, pb = (a * s + m).clamp(0, 1), (b * s + m).clamp(0, 1)
    return ((pa - pb) ** 2).flatten(1).mean(1)


def _nearest(img: torch.Tensor, local: torch.Tensor, ds: Any) -> tuple[float, int]:
    """(pixel MSE, index) of the image of ``local`` closest to ``img`` (1, C, H, W)."""
    mse = torch.cat(
        [
            pixel_mse(img.expand(len(chunk), *img.shape[1:]), chunk, ds.mean, ds.std)
            for chunk in local.split(4096)
        ]
    )
    i = int(mse.argmin())
    return float(mse[i]), i


def match_images(recs: torch.Tensor, local: torch.Tensor, ds: Any) -> list[tuple[float, int]]:
    """(pixel MSE, index into ``local``) for each of the B images of ``recs`` (B, C, H, W).

    B = 1: the closest image of ``local``. B > 1: a one-to-one assignment of the B images to
    B distinct images of ``local`` minimizing the summed MSE (the Hungarian method,
    :func:`scipy.optimize.linear_sum_assignment`), the usual scoring of batch gradient
    inversion: matching each image to its closest independently lets one good reconstruction
    (or the batch's mean repeated B times) stand for every sample."""
    if len(recs) == 1:
        return [_nearest(recs, local, ds)]
    if len(recs) > len(local):
        raise ValueError(
            f"{len(recs)} reconstructions for a local set of {len(local)} images: "
            "a one-to-one assignment needs at most as many reconstructions as images"
        )
    from scipy.optimize import linear_sum_assignment  # noqa: PLC0415

    cost = torch.stack(
        [
            torch.cat(
                [
                    pixel_mse(r[None].expand(len(chunk), *r.shape), chunk, ds.mean, ds.std)
                    for chunk in local.split(4096)
                ]
            )
            for r in recs
        ]
    )
    rows, cols = linear_sum_assignment(cost.double().numpy())
    at = dict(zip(rows.tolist(), cols.tolist(), strict=True))
    return [(float(cost[j, at[j]]), at[j]) for j in range(len(recs))]


def pixel_box(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel range [0, 1] in the dataset's normalized input space, as (low, high) of shape (1, C, 1, 1)."""
    m, s = torch.tensor(ds.mean).view(1, -1, 1, 1), torch.tensor(ds.std).view(1, -1, 1, 1)
    return (0 - m) / s, (1 - m) / s


def mean_image(built: BuiltRun, limit: int = 10_000) -> torch.Tensor:
    """The training set's mean image (its first ``limit`` images; not only the attacked
    clients' few), in the run's normalized input space: the baseline an attack must beat."""
    from fedge.data.registry import load_dataset  # noqa: PLC0415

    d, ds = built.config.dataset, built.dataset
    ref = load_dataset(
        d.name,
        root=d.root,
        resize=d.resize,
        limit_train=limit,
        limit_test=1,
        seed=built.config.seed,
    )
    s_ref, m_ref = torch.tensor(ref.std).view(1, -1, 1, 1), torch.tensor(ref.mean).view(1, -1, 1, 1)
    pixels = (ref.x_train * s_ref + m_ref).mean(0, keepdim=True)
    return (pixels - torch.tensor(ds.mean).view(1, -1, 1, 1)) / torch.tensor(ds.std).view(
        1, -1, 1, 1
    )


def mid_gray(ds: Any, like: torch.Tensor) -> torch.Tensor:
    """Mid-gray (pixel value 0.5) in the dataset's normalized input space, shaped as ``like``."""
    return ((0.5 - torch.tensor(ds.mean)) / torch.tensor(ds.std)).view(1, -1, 1, 1).expand_as(like)


def baseline_mse(image: torch.Tensor, b: int, local: torch.Tensor, ds: Any) -> list[float]:
    """A baseline ``image`` (1, C, H, W) scored as a reconstruction of a batch of ``b``: ``b``
    copies of it matched to ``local`` (:func:`match_images`)."""
    return [m for m, _ in match_images(image.expand(b, *image.shape[1:]), local, ds)]


def image_grid(
    truth: torch.Tensor,
    rec: torch.Tensor,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    path: Path,
) -> Path:
    """Two rows (truth over reconstruction) in [0, 1] pixel space; PNG with Pillow, else PGM/PPM."""
    s, m = torch.tensor(std).view(1, -1, 1, 1), torch.tensor(mean).view(1, -1, 1, 1)
    rows = [torch.cat(list((v * s + m).clamp(0, 1)), dim=-1) for v in (truth, rec)]  # (C, H, n*W)
    img = (torch.cat(rows, dim=-2) * 255).round().to(torch.uint8)  # (C, 2H, nW)
    scale = max(1, 112 // img.shape[-2])
    img = img.repeat_interleave(scale, -1).repeat_interleave(scale, -2)
    c, h, w = img.shape
    pixels = img.permute(1, 2, 0).contiguous().numpy()
    try:
        from PIL import Image  # noqa: PLC0415

        path = path.with_suffix(".png")
        Image.fromarray(pixels[..., 0] if c == 1 else pixels).save(path)
    except ImportError:
        path = path.with_suffix(".pgm" if c == 1 else ".ppm")
        path.write_bytes(f"P{5 if c == 1 else 6}\n{w} {h}\n255\n".encode() + pixels.tobytes())
    return path
