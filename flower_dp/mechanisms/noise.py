"""Gaussian and Laplace noise vectors drawn from an explicit ``torch.Generator``.

STYLE.md 2.10: randomness is always passed in.  Derive the generator with
``flower_dp.rng.torch_generator(key, node, "noise", k)``, ``key`` the node's private key
(``node_secret(plan.reproducible, plan.seed)``: a secret from OS entropy, or the seed in the
reproducible simulation mode, where every backend draws the same noise), so nodes/iterations are
independent (COMMON.md 5, invariant 8) and nobody outside the node can recompute the noise.
"""

from __future__ import annotations

import torch

from flower_dp._checks import check_int, check_nonnegative

__all__ = ["gaussian_noise", "laplace_noise", "TAIL_CUT_STD", "GAUSSIAN_SAMPLER"]

#: The largest |draw| / std :func:`gaussian_noise` can produce: Box-Muller over 53-bit uniforms, sqrt(2 ln 2^53).
#: The Gaussian accountants assume an untruncated tail; the mass they miss per release is at most
#: ``q * P(Z > TAIL_CUT_STD - sensitivity / std)`` (about 1e-14 at noise multiplier 1), far below any delta used here.
TAIL_CUT_STD = 8.57
#: What results files record as the push-sum nodes' Gaussian sampler (``noise.gaussian_sampler``); results without it
#: were drawn with torch's float32 sampler, cut at 5.77 std (before commit 4575d7e).
GAUSSIAN_SAMPLER = "torch-float64"


def _check_gen(generator, device) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}; "
            "use flower_dp.rng.torch_generator(key, node, 'noise', k) with key = node_secret(...)"
        )
    if torch.device(generator.device).type != torch.device(device).type:
        raise ValueError(
            f"generator device must match device {str(device)!r}, got generator on {str(generator.device)!r}; "
            "pass torch_generator(..., device=device)"
        )


def gaussian_noise(
    d: int, std: float, generator: torch.Generator, *, dtype: torch.dtype = torch.float32, device="cpu",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """i.i.d. ``N(0, std^2)`` noise.

    torch's own sampler (on the CPU: Box-Muller over the generator's mt19937 stream) in float64, then rounded to
    ``dtype``: float32 draws are cut at 5.77 std (24-bit uniforms), float64 draws at 8.57 std; see
    :data:`TAIL_CUT_STD`.  ``out`` gives the same numbers as a new tensor, bit for bit (tested on the CPU).

    Parameters
    ----------
    d : int
        Length of the vector (>= 0).
    std : float
        Standard deviation per coordinate (>= 0), in the units of the vector it is added to.
        ``std == 0`` returns zeros and draws nothing from ``generator``.
    generator : torch.Generator
        On the same device type as ``device``.
    out : Tensor, shape (d,), optional
        Contiguous buffer of ``dtype`` on ``device`` to draw into (overwritten and returned).

    Returns
    -------
    Tensor, shape (d,), ``dtype`` on ``device`` (``out`` when given)
    """
    d = check_int("d", d, minimum=0)
    std = check_nonnegative("std", std, hint="std is a standard deviation; 0 means no noise")
    if out is not None and (tuple(out.shape) != (d,) or out.dtype != dtype or out.device.type != torch.device(device).type
                            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous ({d},) {dtype} tensor on {device!r}, got shape {tuple(out.shape)}, "
                         f"{out.dtype} on {out.device}; pass a buffer of the noise's shape")
    if std == 0.0:
        return torch.zeros(d, dtype=dtype, device=device) if out is None else out.zero_()
    _check_gen(generator, device)
    # Drawn in float64 whatever ``dtype``: torch's float32 sampler builds each draw from a 24-bit uniform, so no draw
    # exceeds sqrt(2 ln 2^24) = 5.77 std (the tail beyond it is missing and thinned before it), an output region that
    # a neighbouring input reaches and this one cannot: a delta no Gaussian accountant charges.  float64 draws use
    # 53-bit uniforms, so the cut is at sqrt(2 ln 2^53) = 8.57 std (tail mass 1e-17 per coordinate).
    noise = torch.randn(d, generator=generator, dtype=torch.float64, device=device).mul_(std)
    if out is None:
        return noise if dtype == torch.float64 else noise.to(dtype)
    return out.copy_(noise)  # what the new tensor holds, bit for bit


def laplace_noise(
    d: int, scale: float, generator: torch.Generator, *, dtype: torch.dtype = torch.float32, device="cpu"
) -> torch.Tensor:
    """i.i.d. ``Laplace(0, scale)`` noise (density ``exp(-|t|/scale) / (2 scale)``).

    Drawn as the difference of two independent ``Exp(1)`` vectors times ``scale`` (exact,
    no inverse-CDF edge cases), so ``E|n| = scale`` and ``std = sqrt(2) scale``.

    Parameters
    ----------
    d : int
        Length of the vector (>= 0).
    scale : float
        Laplace scale ``b`` (>= 0; the DPPS spec's ``S/b``).  0 returns zeros and draws nothing.
    generator : torch.Generator

    Returns
    -------
    Tensor, shape (d,), ``dtype`` on ``device``
    """
    d = check_int("d", d, minimum=0)
    scale = check_nonnegative("scale", scale, hint="scale is the Laplace b; 0 means no noise")
    if scale == 0.0:
        return torch.zeros(d, dtype=dtype, device=device)
    _check_gen(generator, device)
    e1 = torch.empty(d, dtype=dtype, device=device).exponential_(1.0, generator=generator)
    e2 = torch.empty(d, dtype=dtype, device=device).exponential_(1.0, generator=generator)
    return e1.sub_(e2).mul_(scale)
