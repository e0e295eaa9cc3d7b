"""The exact discrete Gaussian: integer noise drawn in integer arithmetic from a cryptographic keystream.

``N_Z(0, sigma^2)`` is the law on the integers with ``P[X = x]`` proportional to ``exp(-x^2 / (2 sigma^2))``
(Canonne, Kamath and Steinke 2020, "The Discrete Gaussian for Differential Privacy").  :func:`discrete_gaussian`
draws it exactly: the proposal is a discrete Laplace, every acceptance is a Bernoulli with a rational parameter
decided by comparing uniform integers (:mod:`._discrete_gaussian_kernel`), and the randomness is the node's
ChaCha20 keystream (:func:`flower_dp.rng.exact_noise_stream`), so no floating-point number is computed on the way
from the key to the integers and the privacy proof for the discrete Gaussian holds for what the code draws.

``sigma`` is represented exactly as ``s / (sqrt(2) L)`` with integers ``s, L`` (:func:`exact_sigma`): the smallest
such value >= the requested sigma at a resolution of 2^-24 relative (so the noise is never below the requested
one).  The number of trials is random but independent of any data: the noise is drawn before it is added.

Speed: with numba (``pip install flower-dp[fast]``) the kernel is compiled; without it the same function runs as
plain Python (the same numbers, about 100x slower).  ``FLOWER_DP_EXACT_KERNEL`` = ``auto`` (default) | ``numba`` |
``python`` chooses.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np

from flower_dp._checks import check_int

from . import _discrete_gaussian_kernel as _k

__all__ = ["discrete_gaussian", "exact_sigma", "discrete_gaussian_pmf", "KERNEL_ENV", "SIGMA_MAX", "SIGMA_MIN"]

KERNEL_ENV = "FLOWER_DP_EXACT_KERNEL"
#: the range of sigma (grid units) the sampler accepts: its integers stay far below 2^62 in between
SIGMA_MIN, SIGMA_MAX = 2.0 ** -4, 2.0 ** 24
_RESOLUTION_BITS = 24  # s >= 2^24 when sigma allows: sigma is rounded up by at most 2^-24 relative


def exact_sigma(sigma: float) -> tuple[int, int]:
    """``(s, L)`` with ``s / (sqrt(2) L)`` the smallest value >= ``sigma`` of that form with ``s >= 2^24`` (``L``
    a power of two; ``L = 1`` once ``sigma sqrt(2) >= 2^24``), checked in exact rational arithmetic."""
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and SIGMA_MIN <= sigma <= SIGMA_MAX):
        raise ValueError(f"sigma must be a finite number in [{SIGMA_MIN}, {SIGMA_MAX}] (grid units), got {sigma!r}; "
                         "choose the grid so that the noise std is in that range")
    target = Fraction(sigma) ** 2 * 2  # s^2 / L^2 >= 2 sigma^2
    L = 1
    while sigma * math.sqrt(2) * L < 2 ** _RESOLUTION_BITS:
        L *= 2
    s = max(1, math.isqrt(int(target * L * L)))
    while Fraction(s * s, L * L) < target:
        s += 1
    return s, L


def discrete_gaussian_pmf(sigma2: Fraction | float, xs: np.ndarray) -> np.ndarray:
    """``P[X = x]`` of ``N_Z(0, sigma2)`` at the integers ``xs`` (float64; the normaliser summed over
    ``|x| <= 40 sigma + 40``, beyond which the mass is below 1e-300)."""
    sig2 = float(sigma2)
    lim = int(40 * math.sqrt(sig2) + 40)
    grid = np.arange(-lim, lim + 1, dtype=np.float64)
    z = np.exp(-grid * grid / (2 * sig2)).sum()
    xs = np.asarray(xs, dtype=np.float64)
    return np.exp(-xs * xs / (2 * sig2)) / z


_JIT_KERNEL = None


def _kernel():
    """The compiled :func:`._discrete_gaussian_kernel.sample_into`, or the Python one (``FLOWER_DP_EXACT_KERNEL``)."""
    global _JIT_KERNEL
    mode = os.environ.get(KERNEL_ENV, "auto")
    if mode not in ("auto", "numba", "python"):
        raise ValueError(f"{KERNEL_ENV} must be 'auto', 'numba' or 'python', got {mode!r}")
    if mode == "python":
        return _k.sample_into
    if _JIT_KERNEL is None:
        try:
            import numba
        except ImportError:
            if mode == "numba":
                raise
            return _k.sample_into
        del numba
        _JIT_KERNEL = _compiled()
    return _JIT_KERNEL


def _compiled():
    """numba resolves a jitted function's callees from its module's globals at compile time: a private copy of the
    kernel module whose names are the jitted functions."""
    import importlib.util

    spec = importlib.util.find_spec(_k.__name__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import numba

    opts = {"cache": False, "nogil": True, "error_model": "numpy"}
    for name in ("uniform", "_bernoulli_tie", "bernoulli", "bernoulli_exp_frac", "bernoulli_exp_sq", "bernoulli_exp",
                 "discrete_laplace", "sample_into"):
        setattr(mod, name, numba.njit(**opts)(getattr(mod, name)))
    return mod.sample_into


#: keystream words asked for per sample (about 2x what a sample reads on average; more are appended when short)
_WORDS_PER_SAMPLE = 24


def discrete_gaussian(d: int, sigma: float, stream) -> np.ndarray:
    """``d`` i.i.d. draws of ``N_Z(0, sigma'^2)``, ``sigma' = s / (sqrt(2) L)`` of :func:`exact_sigma` (>= sigma,
    within 2^-24 relative), as an int64 vector.

    Parameters
    ----------
    d : int
        Number of draws (>= 0).
    sigma : float
        Standard-deviation parameter in grid units, in [:data:`SIGMA_MIN`, :data:`SIGMA_MAX`].
    stream : flower_dp.rng.KeyStream
        The node's keystream for this release (:func:`flower_dp.rng.exact_noise_stream`); read from where it is.
    """
    d = check_int("d", d, minimum=0)
    s, L = exact_sigma(sigma)
    t = math.isqrt((s * s) // (2 * L * L)) + 1  # floor(sigma') + 1 (floor of sqrt of the floor is exact)
    if not hasattr(stream, "words62"):
        raise TypeError(f"stream must be a flower_dp.rng.KeyStream, got {type(stream).__name__}; "
                        "use flower_dp.rng.exact_noise_stream(key, node, k)")
    out = np.empty(d, dtype=np.int64)
    if d == 0:
        return out
    kernel = _kernel()
    python = kernel is _k.sample_into
    words = stream.words62(d * _WORDS_PER_SAMPLE + 64)
    i, pos = 0, 0
    while True:
        buf = words.tolist() if python else words  # plain ints: the Python kernel's arithmetic is exact either way
        if python:
            i, pos = _k.sample_into(_ListView(buf), pos, out, i, s, L, t)
        else:
            i, pos = kernel(words, pos, out, i, s, L, t)
        if i < 0:
            raise RuntimeError("discrete Gaussian proposal beyond 2^61 grid units (probability < exp(-2^20)); "
                               "draw again from a fresh stream")
        if i >= d:
            return out
        words = np.concatenate([words[pos:], stream.words62((d - i) * _WORDS_PER_SAMPLE + 64)])
        pos = 0


class _ListView:
    """A list of Python ints with the ``shape`` the kernel reads (the kernel indexes ``words[pos]``)."""

    __slots__ = ("_l", "shape")

    def __init__(self, lst):
        self._l = lst
        self.shape = (len(lst),)

    def __getitem__(self, i):
        return self._l[i]
