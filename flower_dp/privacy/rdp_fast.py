"""Vectorised RDP of Poisson-subsampled Gaussian histories at integer orders (a fast, independent bound).

Used (1) as the search proxy inside schedule calibration, where thousands of distinct noise
levels are evaluated many times, and (2) as an independent reference for the
``dp-accounting`` numbers in the tests.  It is a valid upper bound on its own, slightly looser
than dp-accounting's RDP (integer orders only).

Formulas (Mironov, Talwar, Zhang 2019, arXiv 1908.10530, Section 3.3, integer alpha >= 2;
the same closed form serves DP-CSGP and Gau-LRQ)::

    A_alpha(q, z) = sum_{k=0..alpha} C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 z^2))
    RDP_alpha     = ln(A_alpha) / (alpha - 1)              (q = 1: alpha / (2 z^2))
    eps(delta)    = min_alpha [ sum_steps RDP_alpha + ln((alpha-1)/alpha) - (ln delta + ln alpha)/(alpha-1) ]

The conversion is Canonne, Kamath, Steinke 2020 (arXiv 2004.00010, Proposition 12), as in
dp-accounting.  Add/remove-one neighbours, noise multiplier z (``noise_multiplier``) = std / clip bound.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_delta

__all__ = ["ORDERS", "rdp_poisson_gaussian", "rdp_epsilon"]

#: Integer RDP orders used (dense where eps is usually attained, sparse above).
ORDERS = np.array(list(range(2, 65)) + [72, 80, 96, 112, 128, 160, 192, 256], dtype=np.int64)


def rdp_poisson_gaussian(q: float, noise_multiplier: np.ndarray, orders: np.ndarray = ORDERS) -> np.ndarray:
    """RDP of one Poisson(q)-subsampled Gaussian step per noise multiplier.

    Parameters
    ----------
    q : float in (0, 1]
    noise_multiplier : ndarray, shape (m,)  noise multipliers z (> 0)
    orders : ndarray, shape (a,)  integer orders >= 2

    Returns
    -------
    ndarray, shape (m, a)
    """
    from scipy.special import gammaln, logsumexp  # here: scipy costs a ClientApp's cold start seconds

    z = np.atleast_1d(np.asarray(noise_multiplier, dtype=np.float64))
    out = np.empty((z.size, orders.size))
    if q >= 1.0:
        return orders[None, :] / (2.0 * z[:, None] ** 2)
    inv2z2 = 1.0 / (2.0 * z**2)
    for j, a in enumerate(orders):
        k = np.arange(a + 1)
        log_binom = gammaln(a + 1) - gammaln(k + 1) - gammaln(a - k + 1)
        base = log_binom + (a - k) * np.log1p(-q) + k * np.log(q)
        terms = base[None, :] + ((k * k - k)[None, :]) * inv2z2[:, None]
        out[:, j] = logsumexp(terms, axis=1) / (a - 1)
    return out


def rdp_epsilon(q: float, noise_multiplier, counts, delta: float) -> float:
    """eps(delta) of ``sum_i counts[i]`` steps of Poisson(q)-subsampled Gaussian with multipliers
    ``noise_multiplier[i]``."""
    delta = check_delta(delta)
    z = np.atleast_1d(np.asarray(noise_multiplier, dtype=np.float64))
    counts = np.broadcast_to(np.asarray(counts, dtype=np.float64), z.shape)
    total = (rdp_poisson_gaussian(q, z) * counts[:, None]).sum(axis=0)
    a = ORDERS.astype(np.float64)
    eps = total + np.log1p(-1.0 / a) - (np.log(delta) + np.log(a)) / (a - 1)
    return float(max(0.0, np.min(eps)))
