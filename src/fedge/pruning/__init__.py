"""Foresight pruning: masks, saliency scores and the iterative schedule of seed 004.

NTK foresight pruning (seed 004, "When foresight pruning meets zeroth-order optimization",
Sec. 4.2 and Algorithm 1) finds a sparse mask at initialisation whose NTK trace stays close to
the dense model's, using forward passes only on devices; BP-free (BAFFLE) training then runs on
the sparse model, perturbing only the kept coordinates.

- :mod:`.masks`: which weights are prunable (conv and linear weights), density, applying masks,
  and masks on the wire (bitmap or index list, whichever is smaller).
- :mod:`.saliency`: the NTK statistic (Eq. 13, 15) and score (Eq. 14): data-free on the server,
  or data-based with devices sending K scalars; SNIP, magnitude and random baselines.
- :mod:`.schedule`: Algorithm 1's exponential schedule ``d_t = d^(t/T_p)`` with a global threshold.

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
