"""The exact-noise release of a clipped gradient sum: integers on a public grid plus exact discrete Gaussian noise.

``noise_sampler="exact"`` (:data:`NOISE_SAMPLERS`) replaces the float Gaussian release ``sum_s clip_C(g_s) + N(0,
(z C)^2 I)`` by one whose proof survives floating point:

1. **Grid.**  A public scale ``gamma = C / (GRID_PER_SQRT_D sqrt(d))`` (:func:`grid_scale`): the clipped per-sample
   gradient, divided by ``gamma``, has L2 norm at most ``c = C / gamma = GRID_PER_SQRT_D sqrt(d)`` grid units.
2. **Conditional randomised rounding** (Kairouz, Liu and Steinke 2021, "The Distributed Discrete Gaussian
   Mechanism"): each per-sample vector is rounded coordinatewise up or down at random (unbiased), and the rounding
   is redrawn until its integer squared norm is at most ``D2`` (:func:`rounding_bound`, their bound
   ``c^2 + d/4 + sqrt(2 log(1/beta)) (c + sqrt(d)/2)`` with ``beta`` = :data:`ROUNDING_BETA`, floored to an
   integer); after :data:`ROUNDING_TRIES` failures (probability ``beta^tries``) the sample contributes the zero
   vector.  The bound is *enforced* by an exact int64 check, so every record's integer vector has L2 norm at most
   ``sqrt(D2)`` whatever the floating-point errors of the gradient and clipping before it: the integer sum's L2
   sensitivity (add/remove one record) is ``Delta = sqrt(D2)`` for every value of the rounding coins.  The proof
   pairs the datasets' shared records with the same coins, so the coins must be independent across records and
   hidden: they come from the node's ChaCha20 keystream (purpose ``"rounding"``), as its Poisson sample does.
3. **Noise.**  ``N_Z(0, sigma^2)^d`` from :func:`flower_dp.mechanisms.discrete_gaussian.discrete_gaussian` on the
   node's ChaCha20 keystream, ``sigma = z C / gamma`` grid units (rounded up to the sampler's exact grid).
4. **Release.**  The int64 vector ``m = sum_s round(g_s / gamma) + noise``; anything computed from it (``gamma m /
   B``, the model step, the push-sum shares) is post-processing.  The accountant charges the discrete Gaussian with
   noise multiplier ``sigma / Delta`` (:mod:`flower_dp.privacy.discrete_gaussian`).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from .discrete_gaussian import discrete_gaussian, exact_sigma

__all__ = ["NOISE_SAMPLERS", "EXACT_SAMPLER_LABEL", "GRID_PER_SQRT_D", "ROUNDING_BETA", "ROUNDING_TRIES",
           "grid_scale", "rounding_bound", "inflation", "round_conditional", "exact_release", "check_noise_sampler"]

#: The values of the switch (``noise_sampler``): the float Gaussian (numpy's ziggurat) or the exact mode.
NOISE_SAMPLERS = ("float", "exact")
#: What records name as the exact mode's Gaussian sampler.
EXACT_SAMPLER_LABEL = "cks-discrete-chacha20"
#: grid units per sqrt(d) of the clip bound: the rounding inflates the sensitivity by ~1 + 1/(8 GRID_PER_SQRT_D^2)
GRID_PER_SQRT_D = 16
ROUNDING_BETA = math.exp(-20)
ROUNDING_TRIES = 8


def check_noise_sampler(value) -> str:
    """``value`` if it is one of :data:`NOISE_SAMPLERS`, else a ValueError naming them."""
    if value not in NOISE_SAMPLERS:
        raise ValueError(f"noise_sampler must be one of {NOISE_SAMPLERS}, got {value!r}; 'float' draws numpy's "
                         "float64 Gaussian, 'exact' the discrete Gaussian on an integer grid (docs/privacy.md)")
    return value


def grid_scale(clip: float, d: int) -> float:
    """The grid step ``gamma`` (parameter units per grid unit) for clip bound ``clip`` and dimension ``d``."""
    return float(clip) / (GRID_PER_SQRT_D * math.sqrt(d))


def rounding_bound(d: int, beta: float = ROUNDING_BETA) -> int:
    """``D2``: the integer bound on a rounded record's squared L2 norm (grid units; ``c = GRID_PER_SQRT_D sqrt d``)."""
    c = GRID_PER_SQRT_D * math.sqrt(d)
    kls = c * c + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(d) / 2)
    return int(math.floor(min(kls, (c + math.sqrt(d)) ** 2)))


def inflation(d: int) -> float:
    """``sqrt(D2) / c``: how much the rounding inflates the L2 sensitivity (>= 1, rounded up)."""
    return math.nextafter(math.sqrt(rounding_bound(d)) / (GRID_PER_SQRT_D * math.sqrt(d)), math.inf)


def _uniform(coins, shape: tuple[int, ...]) -> np.ndarray:
    """Uniforms on [0, 1) from ``coins``: a :class:`flower_dp.rng.KeyStream` (53-bit grid) or a numpy Generator."""
    if hasattr(coins, "uniform53"):
        return coins.uniform53(math.prod(shape)).reshape(shape)
    return coins.random(shape)


def round_conditional(v: np.ndarray, d2: int, rng) -> tuple[np.ndarray, int]:
    """Each row of ``v`` (float64, grid units) rounded at random to a neighbouring integer vector with squared norm
    <= ``d2`` (redrawn up to :data:`ROUNDING_TRIES` times, then zero); the coins come from ``rng`` (a
    :class:`flower_dp.rng.KeyStream` in the nodes, or a numpy Generator).  Returns ``(int64 rows, rows zeroed)``."""
    lo = np.floor(v)
    frac = v - lo
    lo = lo.astype(np.int64)
    out = np.zeros(v.shape, dtype=np.int64)
    todo = np.arange(v.shape[0])
    for _ in range(ROUNDING_TRIES):
        if not len(todo):
            break
        r = lo[todo] + (_uniform(rng, frac[todo].shape) < frac[todo])
        ok = np.einsum("ij,ij->i", r, r) <= d2  # exact: int64, |entries| <= c + 1, d (c + 1)^2 < 2^63
        out[todo[ok]] = r[ok]
        todo = todo[~ok]
    return out, int(len(todo))


def exact_release(per_sample: torch.Tensor, clip: float, std_sum: float, coins: np.random.Generator,
                  stream) -> tuple[np.ndarray, float, float, int]:
    """The exact release of the clipped per-sample gradients ``per_sample`` (shape (B, d), norms <= ``clip``).

    ``std_sum`` is the noise std on the sum in parameter units (the float mode's ``z clip``).  Returns
    ``(m, gamma, noise_multiplier, zeroed)``: the int64 release, the grid step, the multiplier to charge
    (``sigma / sqrt(D2)`` with the sampler's exact sigma, rounded down) and how many records' roundings fell back
    to zero."""
    d = int(per_sample.shape[1])
    gamma = grid_scale(clip, d)
    d2 = rounding_bound(d)
    v = per_sample.detach().to("cpu", torch.float64).numpy() / gamma
    ints, zeroed = round_conditional(v, d2, coins)
    total = ints.sum(axis=0, dtype=np.int64)
    sigma = std_sum / gamma
    noise = discrete_gaussian(d, sigma, stream)
    s, L = exact_sigma(sigma)
    z = math.sqrt(Fraction(s * s, 2 * L * L) / d2)
    return total + noise, gamma, math.nextafter(z, 0.0), zeroed
