"""Gaussian differential privacy (Dong, Roth, Su 2019) as Dyn-D2P uses it (its Propositions 1-3).

- :func:`delta_from_mu_eps` — eq. (4): ``delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.
- :func:`mu_from_eps_delta` / :func:`eps_from_mu_delta` — its inverses (brentq, monotone).
- :func:`compose_mu` — exact composition of GDP mechanisms: ``sqrt(sum mu_k^2)``.
- :func:`clt_composed_mu` — Bu et al. 2020 / Dyn-D2P eq. (6), ``p sqrt(sum (exp(mu_k^2) - 1))``.

.. warning::
   The subsampled composition is a central-limit *approximation*, not a bound; it
   underestimates the privacy loss when per-step ``mu_k`` is near or above 1
   (Opacus's ``accountants/gdp.py`` carries the same warning).  It is returned as
   ``GDPResult(mu, approximate=True)``; use :mod:`flower_dp.privacy.accountant` for a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_delta, check_epsilon, check_int, check_nonnegative, check_positive, check_probability

__all__ = [
    "GDPResult",
    "delta_from_mu_eps",
    "mu_from_eps_delta",
    "eps_from_mu_delta",
    "compose_mu",
    "clt_composed_mu",
    "dyn_d2p_mu_bar",
    "dyn_d2p_mu0",
]


@dataclass(frozen=True)
class GDPResult:
    """A GDP parameter and whether it comes from an approximation (CLT) rather than a bound."""

    mu: float
    approximate: bool


def delta_from_mu_eps(mu: float, eps: float) -> float:
    """delta of a mu-GDP mechanism at ``eps`` (Dyn-D2P eq. 4)."""
    mu = check_positive("mu", mu)
    eps = check_nonnegative("eps", eps)
    from scipy.stats import norm  # here, not at import: scipy.stats alone is ~1 s of a ClientApp's cold start

    # e^eps * Phi(b) in log space: e^eps alone overflows for eps > ~709 (large mu, tiny noise)
    second = math.exp(min(eps + float(norm.logcdf(-eps / mu - mu / 2)), 709.0))
    return float(max(0.0, norm.cdf(-eps / mu + mu / 2) - second))


def mu_from_eps_delta(eps: float, delta: float) -> float:
    """The mu such that mu-GDP implies exactly (eps, delta)-DP (inverse of eq. 4 in mu)."""
    eps = check_epsilon(eps)
    delta = check_delta(delta)
    from scipy.optimize import brentq

    return float(brentq(lambda m: delta_from_mu_eps(m, eps) - delta, 1e-6, 50, xtol=1e-14))


def eps_from_mu_delta(mu: float, delta: float) -> float:
    """The eps at which a mu-GDP mechanism has the given delta (inverse of eq. 4 in eps)."""
    mu = check_positive("mu", mu)
    delta = check_delta(delta)
    if delta_from_mu_eps(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_from_mu_eps(mu, hi) > delta:
        hi *= 2
    from scipy.optimize import brentq

    return float(brentq(lambda e: delta_from_mu_eps(mu, e) - delta, 0.0, hi, xtol=1e-14))


def compose_mu(mus) -> float:
    """Exact composition of mu_k-GDP mechanisms (no subsampling): ``sqrt(sum mu_k^2)``."""
    arr = np.asarray(mus, dtype=np.float64)
    if (arr < 0).any() or not np.isfinite(arr).all():
        raise ValueError("every mu_k must be finite and >= 0, got " + str(arr[(arr < 0) | ~np.isfinite(arr)][:3]))
    return float(np.sqrt(np.sum(arr**2)))


def clt_composed_mu(p: float, mus) -> GDPResult:
    """Subsampled CLT composition ``p sqrt(sum_k expm1(mu_k^2))`` (Dyn-D2P eq. 6, Bu et al. 2020 Thm 5).

    Parameters
    ----------
    p : float in (0, 1]  Poisson sampling rate
    mus : array_like, shape (K,)  per-step GDP parameters (1 / noise multiplier)

    Returns
    -------
    GDPResult
        ``approximate=True`` always.

    .. warning::
       This is a central-limit *approximation* (p -> 0, K -> inf), not a bound.  Opacus's
       ``accountants/gdp.py`` warns the same: it "can underestimate privacy expenditure".
       With per-step mu_k >~ 1 (B = 1, p = 1/J) the true eps is 20-70 % above
       the target.  Report :func:`flower_dp.privacy.rigorous_epsilon` next to it.
    """
    p = check_probability("p", p)
    arr = np.asarray(mus, dtype=np.float64)
    if arr.size == 0 or (arr < 0).any() or not np.isfinite(arr).all():
        raise ValueError(f"mus must be a non-empty array of finite values >= 0, got {arr[:3]!r}")
    return GDPResult(float(p * np.sqrt(np.sum(np.expm1(arr**2)))), approximate=True)


def dyn_d2p_mu_bar(mu_tot: float, p: float, num_iters: int) -> float:
    """Constant per-step mu meeting ``mu_tot`` under eq. (6): ``sqrt(log1p(mu_tot^2 / (p^2 K)))`` (eq. 9)."""
    mu_tot = check_positive("mu_tot", mu_tot)
    p = check_probability("p", p)
    num_iters = check_int("num_iters", num_iters, minimum=1)
    return float(math.sqrt(math.log1p(mu_tot**2 / (p**2 * num_iters))))


def dyn_d2p_mu0(mu_tot: float, p: float, num_iters: int, rho_mu: float) -> float:
    """mu_0 of the growing schedule ``mu_k = mu_0 rho_mu^(k/K)`` meeting ``mu_tot`` under eq. (6) (eq. 8).

    Bracketed by ``[mu_bar / rho_mu, mu_bar]`` and solved with brentq (Dyn-D2P eqs. 8-9).
    """
    rho_mu = check_positive("rho_mu", rho_mu)
    if rho_mu < 1:
        raise ValueError(f"rho_mu must be >= 1 (the budget grows over time), got {rho_mu}")
    hi = dyn_d2p_mu_bar(mu_tot, p, num_iters)
    if rho_mu == 1:
        return hi
    r = rho_mu ** (2 * np.arange(num_iters) / num_iters)
    target = (mu_tot / p) ** 2
    from scipy.optimize import brentq

    return float(brentq(lambda m: np.expm1(m * m * r).sum() - target, hi / rho_mu, hi, xtol=1e-14))
