"""The exact mode's accountant (flower_dp.privacy.discrete_gaussian) against independent computations.

The independent side sums over the integers: the one-dimensional discrete Gaussian P = N_Z(0, sigma^2), its shift
by an integer Delta, and the Poisson mixture Q = (1 - q) P + q P(. - Delta).  Its exact Renyi divergences (both
orderings) must be below the bound at every integer order, and its exact hockey-stick divergence (the delta at eps of
one release, and of the composition of a few releases through the exact privacy-loss distribution on the integers'
product) below the delta the bound's conversion gives.
"""

import math

import numpy as np
import pytest
from scipy.signal import fftconvolve

from flower_dp.privacy.discrete_gaussian import (ORDERS, calibrate_factor, epsilon_from_rdp, exact_epsilon,
                                                 rdp_subsampled)


def _log_pmfs(sigma: float, shift: int, q: float):
    """log P and log Q on |x| <= 60 sigma + 60 + shift, in the log domain (the far tail underflows float64)."""
    lim = int(60 * sigma) + 60 + shift
    x = np.arange(-lim, lim + 1, dtype=np.float64)
    lp = -x * x / (2 * sigma ** 2)
    lz = np.logaddexp.reduce(lp)
    lp = lp - lz
    lps = -(x - shift) ** 2 / (2 * sigma ** 2) - lz  # the same normaliser: the shift is an integer
    lmix = np.logaddexp(math.log1p(-q) + lp, math.log(q) + lps) if q < 1 else lps
    return lp, lmix


def _pmfs(sigma: float, shift: int, q: float):
    lp, lmix = _log_pmfs(sigma, shift, q)
    return np.exp(lp), np.exp(lmix)


def _renyi_log(la: np.ndarray, lb: np.ndarray, alpha: int) -> float:
    return float(np.logaddexp.reduce(alpha * la + (1 - alpha) * lb)) / (alpha - 1)


@pytest.mark.parametrize("sigma,shift,q", [(0.8, 1, 1.0), (3.0, 2, 1.0), (2.0, 2, 0.1), (5.0, 4, 0.02),
                                           (1.5, 1, 0.3), (10.0, 7, 0.05)])
def test_bound_above_the_exact_renyi_divergences(sigma, shift, q):
    z = sigma / shift
    lp, lmix = _log_pmfs(sigma, shift, q)
    bound = rdp_subsampled(q, z)
    for alpha, b in zip(ORDERS[:40], bound[:40]):
        exact = max(_renyi_log(lmix, lp, int(alpha)), _renyi_log(lp, lmix, int(alpha)))
        assert exact <= b * (1 + 1e-9) + 1e-12, (alpha, exact, b)
    if q == 1.0:  # CKS: alpha Delta^2 / (2 sigma^2) bounds the discrete Gaussian's divergence; close to it here
        ex2 = _renyi_log(lmix, lp, 2)
        assert ex2 <= 2 / (2 * z * z) + 1e-12 and ex2 == pytest.approx(2 / (2 * z * z), rel=1e-9)  # equality at integer shifts


def _hockey(a: np.ndarray, b: np.ndarray, eps: float) -> float:
    return float(np.maximum(a - math.exp(eps) * b, 0).sum())


@pytest.mark.parametrize("sigma,shift,q,eps", [(2.0, 1, 1.0, 1.0), (1.0, 1, 0.2, 1.0), (3.0, 2, 0.05, 0.5)])
def test_bound_above_the_exact_delta_of_one_release(sigma, shift, q, eps):
    p, mix = _pmfs(sigma, shift, q)
    exact = max(_hockey(mix, p, eps), _hockey(p, mix, eps))
    eps_bound = exact_epsilon([(q, sigma / shift, 1)], max(exact, 1e-300))
    assert eps_bound >= eps


def _compose_pld(a: np.ndarray, b: np.ndarray, steps: int, eps: float) -> float:
    """delta(eps) of ``steps``-fold composition by the exact privacy-loss distribution (its support: the
    distinct log-ratios, rounded up to a 1e-4 grid: a pessimistic, still independent, computation)."""
    m = a > 1e-30
    dropped = float(a[~m].sum())  # counted as infinite loss: all of it in delta (pessimistic)
    loss = np.log(a[m]) - np.log(np.maximum(b[m], 1e-320))
    w = a[m]
    grid = 1e-3
    idx = np.ceil(loss / grid).astype(np.int64)
    lo = idx.min()
    hist = np.bincount(idx - lo, weights=w)
    out, off = np.array([1.0]), 0
    for _ in range(steps):
        out = fftconvolve(out, hist).clip(min=0)
        off += lo
    losses = (np.arange(len(out)) + off) * grid
    keep = losses > eps
    return float((out[keep] * (1 - np.exp(eps - losses[keep]))).sum()) + 1 - (1 - dropped) ** steps


def test_bound_above_the_exact_delta_of_a_composition():
    sigma, shift, q, steps, eps = 1.2, 1, 0.25, 6, 2.0
    p, mix = _pmfs(sigma, shift, q)
    exact = max(_compose_pld(mix, p, steps, eps), _compose_pld(p, mix, steps, eps))
    assert 1e-12 < exact < 0.5
    assert exact_epsilon([(q, sigma / shift, steps)], exact) >= eps


def test_calibration_reaches_the_target():
    steps = [(0.01, 1.0, 500)]
    f = calibrate_factor(steps, 1e-5, 1.5)
    assert f >= 1
    assert f > 1 and exact_epsilon([(0.01, f, 500)], 1e-5) <= 1.5
    assert exact_epsilon([(0.01, f / 1.01, 500)], 1e-5) > 1.5


def test_no_sampling_is_the_zcdp_conversion():
    z, delta = 2.0, 1e-6
    rho = 1 / (2 * z * z)
    a = ORDERS.astype(float)
    ref = float(np.min(a * rho + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)))
    assert exact_epsilon([(1.0, z, 1)], delta) == pytest.approx(ref, rel=1e-12)
    assert epsilon_from_rdp(np.zeros(len(ORDERS)), delta) >= 0
