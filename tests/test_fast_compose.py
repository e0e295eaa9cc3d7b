"""flower_dp.privacy.fast_compose against dp-accounting called directly, and the bucketing sandwich."""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp

from benchmarks.accounting import _history, rounded_up
from flower_dp.privacy import GaussianStep, LaplaceStep, accountant, rigorous_delta, rigorous_epsilon
from flower_dp.privacy.fast_compose import FastPLD, FastRDP, compose_pld, rdp_subsampled_gaussian, subsampled_gaussian_pmf


@pytest.mark.parametrize("q,sigma", [(1e-3, 0.3), (32 / 3750, 0.86), (32 / 3750, 4.47), (0.01, 2.24), (0.1, 0.6),
                                     (0.5, 1.7), (0.9, 10.0)])
@pytest.mark.parametrize("h", [1e-3, 2e-3])
def test_pmf_is_dp_accountings_connect_the_dots_pmf(q, sigma, h):
    """Same loss grid, same probabilities (to the round-off of the differences / expm1(h)), same infinity mass."""
    ref = dpa_pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=h)
    for add, pmf in ((False, ref._pmf_remove), (True, ref._pmf_add)):
        dense = pmf.to_dense_pmf()
        lower, probs, inf = subsampled_gaussian_pmf(q, sigma, h, add)
        assert (lower, probs.size) == (dense._lower_loss, dense.size), (add, lower, probs.size)
        np.testing.assert_allclose(probs, dense._probs, rtol=0, atol=2e-12)
        assert inf == pytest.approx(dense._infinity_mass, rel=1e-9, abs=1e-18)


@pytest.mark.parametrize("q", [32 / 3750, 0.05])
def test_rdp_is_dp_accountings_rdp_at_every_default_order(q):
    sigmas = np.array([0.5, 0.9, 2.0, 5.0])
    ours = rdp_subsampled_gaussian(q, sigmas)
    ref = np.array([dpa_rdp._compute_rdp_poisson_subsampled_gaussian(q, s, dpa_rdp.DEFAULT_RDP_ORDERS) for s in sigmas])
    assert np.array_equal(np.isinf(ours), np.isinf(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(ours[fin], ref[fin], rtol=1e-9, atol=1e-15)


def test_composition_matches_dp_accounting_level_by_level():
    """20 levels with counts 1..400: the one-pass FFT composition against PLDAccountant / RdpAccountant."""
    rng = np.random.default_rng(0)
    q, h = 0.01, 2e-3
    nus = np.linspace(0.8, 2.0, 20)
    counts = rng.integers(1, 400, size=20)
    pld = dpa.pld.PLDAccountant(value_discretization_interval=h)
    rdp = dpa.rdp.RdpAccountant()
    for nu, c in zip(nus, counts):
        ev = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(float(nu)))
        pld.compose(ev, int(c))
        rdp.compose(ev, int(c))
    fast = compose_pld([q] * 20, nus, counts, h)
    ref_eps = pld.get_epsilon(1e-5)
    assert fast.get_epsilon(1e-5) == pytest.approx(ref_eps, rel=1e-7)
    assert fast.get_delta(ref_eps) == pytest.approx(pld.get_delta(ref_eps), rel=1e-6)
    fr = FastRDP([q] * 20, nus, counts)
    assert fr.get_epsilon(1e-5) == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-10)
    assert fr.get_delta(2.0) == pytest.approx(rdp.get_delta(2.0), rel=1e-9)


def test_fast_path_from_two_poisson_gaussian_levels():
    """Two or more Poisson-subsampled Gaussian levels: fast_compose (rounded up); one, or a Laplace step: dp-accounting."""
    many = tuple(GaussianStep(0.01, 1.0 + 0.01 * i, 5) for i in range(accountant.FINE_LEVELS + 1))
    two = many[:accountant.FAST_MIN_LEVELS]
    for hist in (many, two):
        acc, _ = accountant._compose(hist, "pld", "add_remove", 2e-3)
        assert isinstance(acc, accountant._RoundedUp) and isinstance(acc.acc, FastPLD)
        rdp = accountant._compose(hist, "rdp", "add_remove", 2e-3)[0]
        assert isinstance(rdp, accountant._RoundedUp) and isinstance(rdp.acc, FastRDP)
    assert isinstance(accountant._compose(many[:1], "pld", "add_remove", 2e-3)[0], dpa.pld.PLDAccountant)
    assert isinstance(accountant._compose(many[:1], "rdp", "add_remove", 2e-3)[0], dpa.rdp.RdpAccountant)
    mixed = many + (LaplaceStep(50.0, 3),)
    assert isinstance(accountant._compose(mixed, "pld", "add_remove", 2e-3)[0], dpa.pld.PLDAccountant)


#: multi-level ledgers that dp-accounting composed level by level before the fast path took them: the
#: engine benchmark's Dyn-D2P node after 4 rounds (16 levels, q = 1/4), PrivSGP-VR's two alternating
#: levels, and a few levels with large counts (where the float round-off of the two is largest)
LEDGERS = {
    "dyn_d2p_16": [GaussianStep(0.25, 3.504818673501397 * 0.957602 ** i) for i in range(16)],
    "two_levels": [GaussianStep(1 / 3125, 1.1096, 1560), GaussianStep(1 / 3125, 0.9, 1560)],
    "big_counts": [GaussianStep(0.01, float(v), c) for v, c in zip((1.0, 0.87, 0.76, 0.66, 0.5), (4100, 3000, 900, 2500, 700))],
}


def _level_by_level(steps, kind, h=accountant.PLD_DISCRETIZATION):
    acc = dpa.pld.PLDAccountant(value_discretization_interval=h) if kind == "pld" else dpa.rdp.RdpAccountant()
    for s in steps:
        acc.compose(dpa.PoissonSampledDpEvent(s.q, dpa.GaussianDpEvent(s.noise_multiplier)), s.count)
    return acc


@pytest.mark.parametrize("name", sorted(LEDGERS))
def test_fast_path_is_never_below_dp_accounting_level_by_level(name):
    """What a multi-level ledger reported before (dp-accounting, level by level) <= what it reports now <= that
    times 1 + 2 FAST_ROUND_UP, for PLD and RDP at the project's deltas and below; rigorous_delta never below either."""
    steps = LEDGERS[name]
    for kind in ("pld", "rdp"):
        ref = _level_by_level(steps, kind)
        for delta in (1e-4, 1e-5, 1e-7):
            old, new = ref.get_epsilon(delta), rigorous_epsilon(steps, delta, accountant=kind, bucket_rel=0)
            assert old <= new <= old * (1 + 2 * accountant.FAST_ROUND_UP), (kind, delta, old, new)
        for eps in (0.5 * old, old):
            assert rigorous_delta(steps, eps, accountant=kind, bucket_rel=0) >= ref.get_delta(eps), (kind, eps)
    auto = rigorous_epsilon(steps, 1e-5)
    assert auto == min(rigorous_epsilon(steps, 1e-5, accountant=k) for k in ("pld", "rdp"))


def test_bucketed_eps_is_an_upper_bound_within_one_percent_and_the_sandwich_brackets_the_exact_one():
    """The benchmark's 3,000-step Dyn-D2P schedule held in 300 distinct levels of 10 steps (exact is then cheap):
    exact (every level composed) <= bucketed (72 levels rounded down) <= 1.01 exact, and the same schedule rounded
    UP onto a fine grid is below exact, so (bucketed - lower) / lower bounds the bucketing error from above (what
    the 30,000-step benchmark reports as accounting_eps_rel_diff_30000)."""
    q, delta, h = 32 / 3750, 1e-5, 2e-3
    nus = [s.noise_multiplier for s in _history(3000, q, delta)][::10]
    steps = [GaussianStep(q, float(v), 10) for v in nus]
    exact = rigorous_epsilon(steps, delta, bucket_rel=0, discretization=h)
    bucketed = rigorous_epsilon(steps, delta, discretization=h)
    assert len(accountant.bucket_steps(steps)) <= accountant.MAX_BUCKETS < len(nus)
    assert exact <= bucketed <= 1.01 * exact
    up = rounded_up(steps, 2048)
    assert len(up) > accountant.MAX_BUCKETS and sum(s.count for s in up) == 3000
    assert min(s.noise_multiplier for s in up) >= min(nus) and max(s.noise_multiplier for s in up) >= max(nus) * (1 - 1e-12)
    lower = min(rigorous_epsilon(up, delta, accountant="pld", bucket_rel=0, discretization=h),
                rigorous_epsilon(rounded_up(steps, 32), delta, accountant="rdp", bucket_rel=0))
    assert 0.99 * exact < lower <= exact
    assert (bucketed - exact) / exact <= (bucketed - lower) / lower < 0.01
