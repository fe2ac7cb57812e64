"""Foresight pruning (seed 004, "When foresight pruning meets zeroth-order optimization", Sec. 4.2,
Algorithm 1): masks, NTK saliency scores and the iterative schedule. Design notes: docs/decisions.md#pruning.

>>> from fedge.core.rng import generator
>>> from fedge.models import build_model
>>> net = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0)
>>> masks = prune(net, density=0.2, rounds=5, generator=generator(0, "prune"), num_inputs=8)
>>> round(density(masks, net), 3)
0.2
"""

from fedge.pruning.masks import (
    MaskBytes,
    apply_masks_,
    check_masks,
    decode_masks,
    dense_masks,
    density,
    encode_masks,
    mask_bytes,
    prunable_parameters,
    rescale_,
)
from fedge.pruning.saliency import (
    DEFAULT_EPS,
    DEFAULT_SAMPLES,
    NTKStatistic,
    gaussian_inputs,
    magnitude_saliency,
    ntk_forward_statistic,
    ntk_saliency,
    ntk_saliency_from_differences,
    ntk_saliency_zeroth_order,
    ntk_statistic_differences,
    random_saliency,
    snip_saliency,
)
from fedge.pruning.schedule import (
    SCORERS,
    ScoreContext,
    ScoreName,
    Scorer,
    density_schedule,
    keep_counts,
    prune,
    prune_step,
    pruning_rounds,
)

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_SAMPLES",
    "SCORERS",
    "MaskBytes",
    "NTKStatistic",
    "ScoreContext",
    "ScoreName",
    "Scorer",
    "apply_masks_",
    "check_masks",
    "decode_masks",
    "dense_masks",
    "density",
    "density_schedule",
    "encode_masks",
    "gaussian_inputs",
    "keep_counts",
    "magnitude_saliency",
    "mask_bytes",
    "ntk_forward_statistic",
    "ntk_saliency",
    "ntk_saliency_from_differences",
    "ntk_saliency_zeroth_order",
    "ntk_statistic_differences",
    "prunable_parameters",
    "prune",
    "prune_step",
    "pruning_rounds",
    "random_saliency",
    "rescale_",
    "snip_saliency",
]
