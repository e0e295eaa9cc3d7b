"""Privacy mechanisms: flat parameter vectors, per-sample clipping, noise, compressors, LRQ.

- :mod:`.flat` — model <-> flat 1-D vector helpers (node state is flat).
- :mod:`.clipping` — per-sample L2 clipping with ``torch.func``; the plain batch gradient.
- :mod:`.noise` — Gaussian and Laplace noise from an explicit ``torch.Generator``.
- :mod:`.compressors` — identity, rand_a, gsgd_b, top-k with exact bit counts.
- :mod:`.lrq` — the layered randomized quantizer with exactly Gaussian error (Gau-LRQ, Sec. IV).
"""

from flower_dp.mechanisms import lrq
from flower_dp.mechanisms.clipping import ClipStats, batch_gradient, check_no_batchnorm, per_sample_clipped_grad_sum
from flower_dp.mechanisms.ghost_clipping import GHOST_SUPPORTED_LAYERS, check_ghost_supported, ghost_clipped_grad_sum
from flower_dp.mechanisms.compressors import (
    COMPRESSORS,
    GSGD,
    Compressor,
    Identity,
    RandA,
    TopK,
    make_compressor,
)
from flower_dp.mechanisms.flat import (
    flatten_params,
    flatten_tensors,
    load_flat_params_,
    param_slices,
    trainable_named_parameters,
    unflatten_tensors,
    unflatten_to_dict,
)
from flower_dp.mechanisms.lrq import (
    LRQMessage,
    empirical_entropy,
    lrq_bits_fixed,
    lrq_bits_paper,
    lrq_key,
    lrq_levels,
    lrq_message_bits,
    lrq_w_min,
)
from flower_dp.mechanisms.noise import gaussian_noise, laplace_noise

__all__ = [
    "flatten_params",
    "flatten_tensors",
    "unflatten_tensors",
    "unflatten_to_dict",
    "load_flat_params_",
    "param_slices",
    "trainable_named_parameters",
    "ClipStats",
    "per_sample_clipped_grad_sum",
    "batch_gradient",
    "check_no_batchnorm",
    "ghost_clipped_grad_sum",
    "check_ghost_supported",
    "GHOST_SUPPORTED_LAYERS",
    "gaussian_noise",
    "laplace_noise",
    "Compressor",
    "Identity",
    "RandA",
    "GSGD",
    "TopK",
    "COMPRESSORS",
    "make_compressor",
    "lrq",
    "LRQMessage",
    "lrq_key",
    "lrq_w_min",
    "lrq_levels",
    "lrq_bits_fixed",
    "lrq_bits_paper",
    "lrq_message_bits",
    "empirical_entropy",
]
