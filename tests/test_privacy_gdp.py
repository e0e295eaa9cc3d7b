"""GDP conversions and Dyn-D2P's schedule solvers against values computed independently (numpy/scipy)."""

from __future__ import annotations

import numpy as np
import pytest

from flower_dp.privacy import gdp


@pytest.mark.parametrize(
    "eps, delta, mu",
    [(0.3, 1e-4, 0.10771596), (0.7, 1e-4, 0.22882795), (1.0, 1e-4, 0.31390246), (3.0, 1e-4, 0.81755636),
     (1.0, 1e-5, 0.26805112), (3.0, 1e-5, 0.719117)],
)
def test_mu_tot_table(eps, delta, mu):
    """mu_tot from (eps, delta) via eq. (4)."""
    assert gdp.mu_from_eps_delta(eps, delta) == pytest.approx(mu, abs=2e-6)
    assert gdp.eps_from_mu_delta(mu, delta) == pytest.approx(eps, rel=1e-4)


def test_delta_sanity_value():
    assert gdp.delta_from_mu_eps(1.0, 1.0) == pytest.approx(0.1269, abs=1e-4)


def test_unit_vector_T1():
    """eps=1, delta=1e-5, p=0.01, K=1000, rho_mu=2: mu_bar = 0.73583965, mu0 = 0.49030761; CLT recomposes to mu_tot."""
    mu_tot = gdp.mu_from_eps_delta(1.0, 1e-5)
    assert gdp.dyn_d2p_mu_bar(mu_tot, 0.01, 1000) == pytest.approx(0.73583965, abs=1e-7)
    mu0 = gdp.dyn_d2p_mu0(mu_tot, 0.01, 1000, 2.0)
    assert mu0 == pytest.approx(0.49030761, abs=1e-7)
    mus = mu0 * 2.0 ** (np.arange(1000) / 1000)
    res = gdp.clt_composed_mu(0.01, mus)
    assert res.approximate and res.mu == pytest.approx(0.26805112, abs=1e-7)


def test_unit_vector_T2_and_example_A():
    """T2: eps=3, delta=1e-4, p=0.01, K=4, rho_mu=4 -> mu_bar 2.72429319, mu0 1.04845309; Example A mu0 = 1.006824."""
    mu_tot = gdp.mu_from_eps_delta(3.0, 1e-4)
    assert gdp.dyn_d2p_mu_bar(mu_tot, 0.01, 4) == pytest.approx(2.72429319, abs=1e-7)
    assert gdp.dyn_d2p_mu0(mu_tot, 0.01, 4, 4.0) == pytest.approx(1.04845309, abs=1e-7)
    mu_a = gdp.mu_from_eps_delta(1.0, 1e-4)
    assert gdp.dyn_d2p_mu_bar(mu_a, 4e-4, 50_000) == pytest.approx(1.609046, abs=1e-6)
    assert gdp.dyn_d2p_mu0(mu_a, 4e-4, 50_000, 2.0) == pytest.approx(1.006824, abs=1e-6)


def test_exact_composition_and_errors():
    assert gdp.compose_mu([0.3, 0.4]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="eps must be > 0 and finite, got 0"):
        gdp.mu_from_eps_delta(0, 1e-5)
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\), got 1.0"):
        gdp.mu_from_eps_delta(1, 1.0)
    with pytest.raises(ValueError, match="rho_mu must be >= 1"):
        gdp.dyn_d2p_mu0(0.3, 0.01, 100, 0.5)


def test_generic_calibrate_on_a_closed_form():
    """calibrate() on the non-subsampled Gaussian GDP closed form: mu = sqrt(K)/nu; private side, tight."""
    from flower_dp.privacy import calibrate

    def eps_of(nu):
        return gdp.eps_from_mu_delta(gdp.compose_mu([1 / nu] * 100), 1e-5)

    nu = calibrate(eps_of, 2.0, 1.0, 10.0, rel_tol=1e-6)
    assert eps_of(nu) <= 2.0
    assert nu == pytest.approx(10 / gdp.mu_from_eps_delta(2.0, 1e-5), rel=1e-5)
    with pytest.raises(ValueError, match="lo < hi, got lo=3.0, hi=1.0"):
        calibrate(eps_of, 2.0, 3.0, 1.0)
    with pytest.raises(ValueError, match="num_iters must be >= 1, got 0"):
        gdp.dyn_d2p_mu_bar(0.3, 0.01, 0)
    with pytest.raises(ValueError, match="mus must be a non-empty array"):
        gdp.clt_composed_mu(0.01, [])
