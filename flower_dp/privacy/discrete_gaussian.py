"""Rigorous (eps, delta) of the Poisson-subsampled multivariate discrete Gaussian (the exact-noise mode).

What is proven, and for what:

* **The base mechanism.**  Adding ``N_Z(0, sigma^2)^d`` to an integer vector whose L2 sensitivity is at most
  ``Delta`` satisfies ``rho``-zCDP with ``rho = Delta^2 / (2 sigma^2)`` (Canonne, Kamath and Steinke 2020,
  "The Discrete Gaussian for Differential Privacy", the multivariate theorem: the same as the continuous Gaussian):
  its Renyi divergence of every order ``alpha > 1`` is at most ``alpha Delta^2 / (2 sigma^2)``, for every pair of
  neighbouring inputs (both orderings).  ``noise_multiplier`` below is ``z = sigma / Delta``.
* **Poisson subsampling.**  The subsampled mechanism's RDP at integer orders ``alpha >= 2`` is bounded by Zhu and
  Wang's general upper bound (ICML 2019, "Poisson Subsampled Renyi Differential Privacy", the theorem for any
  mechanism with a given RDP curve ``eps(.)``)::

      (1/(alpha-1)) log[ (1-q)^(alpha-1) (alpha q - q + 1) + C(alpha,2) q^2 (1-q)^(alpha-2) e^eps(2)
                         + 3 sum_{l=3..alpha} C(alpha,l) q^l (1-q)^(alpha-l) e^((l-1) eps(l)) ]

  It needs nothing of the mechanism but its RDP curve, which is why it applies to the discrete Gaussian (the
  sampled-Gaussian formulas of Mironov et al. use the continuous Gaussian's shape and do not).  It is looser than
  the continuous Gaussian's exact PLD: the same eps costs more noise (the plan calibrates for it).
* **Composition and conversion.**  RDP adds over releases; the total converts to (eps, delta) by the conversion
  of Canonne, Kamath and Steinke 2020 (also Asoodeh et al.), valid for any mechanism with that RDP:
  ``eps = min_alpha  rdp(alpha) + log(1 - 1/alpha) - (log delta + log alpha) / (alpha - 1)``.

The bound is checked against an independent computation in ``tests/test_privacy_discrete_gaussian.py``: the exact
Renyi divergences and hockey-stick divergences of the one-dimensional subsampled discrete Gaussian, summed over the
integers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy.special import gammaln, logsumexp

from .._checks import check_delta

__all__ = ["ORDERS", "rdp_subsampled", "rdp_history", "epsilon_from_rdp", "exact_epsilon", "calibrate_factor"]

#: integer Renyi orders the bound is evaluated at
ORDERS = np.array(list(range(2, 65)) + [80, 96, 128, 160, 192, 256, 384, 512, 768, 1024], dtype=np.int64)


def _log_binom(n: int, k: np.ndarray) -> np.ndarray:
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def rdp_subsampled(q: float, noise_multiplier: float, orders: np.ndarray = ORDERS) -> np.ndarray:
    """RDP of one Poisson-subsampled (rate ``q``) discrete Gaussian release with ``sigma / Delta = noise_multiplier``
    at the integer ``orders`` (module doc).  ``q = 1``: the zCDP curve ``alpha / (2 z^2)`` itself."""
    z = float(noise_multiplier)
    if not (z > 0 and math.isfinite(z)):
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier!r}")
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    orders = np.asarray(orders, dtype=np.int64)
    base = orders / (2 * z * z)
    if q == 0:
        return np.zeros(len(orders))
    if q == 1:
        return base.astype(np.float64)
    lq, l1q = math.log(q), math.log1p(-q)
    out = np.empty(len(orders))
    for n, a in enumerate(orders):
        a = int(a)
        terms = [(a - 1) * l1q + math.log1p(a * q - q),
                 float(_log_binom(a, np.array(2))) + 2 * lq + (a - 2) * l1q + 2 / (2 * z * z)]
        if a >= 3:
            ls = np.arange(3, a + 1)
            terms.extend((math.log(3) + _log_binom(a, ls) + ls * lq + (a - ls) * l1q
                          + (ls - 1) * ls / (2 * z * z)).tolist())
        out[n] = float(logsumexp(terms)) / (a - 1)
    return np.minimum(out, base)  # never worse than no amplification


def rdp_history(steps: Iterable[tuple[float, float, int]], orders: np.ndarray = ORDERS) -> np.ndarray:
    """RDP of a history of ``(q, noise_multiplier, count)`` releases (composition: the sum)."""
    total = np.zeros(len(orders))
    cache: dict[tuple[float, float], np.ndarray] = {}
    for q, z, count in steps:
        key = (float(q), float(z))
        if key not in cache:
            cache[key] = rdp_subsampled(key[0], key[1], orders)
        total += int(count) * cache[key]
    return total


def epsilon_from_rdp(rdp: np.ndarray, delta: float, orders: np.ndarray = ORDERS) -> float:
    """The smallest eps over ``orders`` of the RDP-to-(eps, delta) conversion of the module doc."""
    delta = check_delta(delta)
    a = np.asarray(orders, dtype=np.float64)
    eps = rdp + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return float(max(0.0, np.min(eps)))


def exact_epsilon(steps: Iterable[tuple[float, float, int]], delta: float) -> float:
    """eps at ``delta`` of a history of ``(q, noise_multiplier, count)`` discrete Gaussian releases."""
    steps = [s for s in steps if int(s[2]) > 0]
    if not steps:
        return 0.0
    return epsilon_from_rdp(rdp_history(steps), delta)


def calibrate_factor(steps: list[tuple[float, float, int]], delta: float, target_eps: float,
                     tol: float = 1e-3) -> float:
    """The smallest ``f >= 1`` (to ``tol`` relative, rounded up) with ``exact_epsilon`` of the history whose
    multipliers are scaled by ``f`` at most ``target_eps``: how much more noise the exact mode draws for the same
    eps as the float mode's plan."""
    if not (target_eps > 0 and math.isfinite(target_eps)):
        raise ValueError(f"target_eps must be a finite number > 0, got {target_eps!r}")

    def eps(f: float) -> float:
        return exact_epsilon([(q, z * f, c) for q, z, c in steps], delta)

    lo, hi = 1.0, 1.0
    if eps(hi) <= target_eps:
        return 1.0
    while eps(hi) > target_eps:
        lo, hi = hi, hi * 2
        if hi > 2 ** 20:
            raise ValueError(f"no noise scaling up to 2^20 reaches eps {target_eps} for the exact mode")
    while hi / lo > 1 + tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= target_eps else (mid, hi)
    return hi
