"""The rigorous accountant, budgets and calibration against known values and dp_accounting directly."""

from __future__ import annotations

import time

import dp_accounting as dpa
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_dp.errors import UnsupportedEventError
from flower_dp.privacy import (
    GaussianStep,
    LaplaceStep,
    NodeAccountant,
    PrivacyBudget,
    bucket_steps,
    calibrate_noise_multiplier,
    rdp_fast,
    rigorous_delta,
    rigorous_epsilon,
    epsilon_and_bound,
)


def test_known_values_sigma1_q001_1000_steps():
    """Issue 3 test values: RDP 2.1014, PLD about 1.828 (delta 1e-5)."""
    steps = [GaussianStep(0.01, 1.0, 1000)]
    assert rigorous_epsilon(steps, 1e-5, accountant="rdp") == pytest.approx(2.1014, abs=1e-3)
    assert rigorous_epsilon(steps, 1e-5, accountant="pld") == pytest.approx(1.828, abs=0.01)


def test_matches_dp_accounting_called_directly():
    """Independent path: dp_accounting's RDP accountant on the same event."""
    acc = dpa.rdp.RdpAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(1 / 3125, dpa.GaussianDpEvent(0.5222)), 3120)
    ours = rigorous_epsilon([GaussianStep(1 / 3125, 0.5222, 3120)], 1e-5, accountant="rdp")
    assert ours == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert ours == pytest.approx(3.001, abs=0.01)  # computed independently with dp-accounting


def test_composition_identities():
    """count=6 == six separate charges; order does not matter; unsampled replace_one == nu/2 add_remove."""
    one = rigorous_epsilon([GaussianStep(0.05, 1.2, 6)], 1e-5, accountant="rdp")
    six = rigorous_epsilon([GaussianStep(0.05, 1.2)] * 6, 1e-5, accountant="rdp")
    assert one == pytest.approx(six, rel=1e-12)
    a = rigorous_epsilon([GaussianStep(0.05, 1.2, 3), GaussianStep(0.05, 2.0, 3)], 1e-5, accountant="rdp")
    b = rigorous_epsilon([GaussianStep(0.05, 2.0, 3), GaussianStep(0.05, 1.2, 3)], 1e-5, accountant="rdp")
    assert a == pytest.approx(b, rel=1e-12)
    r1 = rigorous_epsilon([GaussianStep(1.0, 2.0, 10)], 1e-5, accountant="rdp", adjacency="replace_one")
    r2 = rigorous_epsilon([GaussianStep(1.0, 1.0, 10)], 1e-5, accountant="rdp")
    assert r1 == pytest.approx(r2, rel=1e-12)
    assert rigorous_epsilon([], 1e-5) == 0.0


def test_bucketing_never_below_exact_and_within_one_percent():
    """300 distinct noise levels (1 -> 2): rounding DOWN onto a grid can only raise eps, by < 1 % at rel 5e-3."""
    nus = 1.0 * 2 ** (np.arange(300) / 300)
    steps = [GaussianStep(0.01, float(v)) for v in nus]
    kw = dict(accountant="pld", discretization=1e-2)  # relative comparison: a coarse PLD is enough
    exact = rigorous_epsilon(steps, 1e-5, bucket_rel=0, **kw)
    bucketed = rigorous_epsilon(steps, 1e-5, bucket_rel=5e-3, **kw)
    assert len(bucket_steps(steps, 5e-3)) < 150
    assert exact <= bucketed <= exact * 1.01
    auto = rigorous_epsilon(steps, 1e-5, **kw)  # default grid: <= 96 levels
    assert exact <= auto <= exact * 1.01
    # the independent integer-order RDP bound is looser than both
    assert rdp_fast.rdp_epsilon(0.01, nus, 1, 1e-5) > exact


def test_auto_grid_is_uniform_in_inverse_square_noise_and_only_rounds_down():
    """"auto": at most MAX_BUCKETS levels, equally spaced in nu^-2, each step's nu rounded down (never up);
    two sampling rates share the budget of levels; exact merging when few levels."""
    from flower_dp.privacy.accountant import MAX_BUCKETS

    nus = 0.5 + 1.5 * np.arange(500) / 500
    for qs in ((0.01,), (0.01, 0.02)):
        steps = [GaussianStep(qs[i % len(qs)], float(v)) for i, v in enumerate(nus)]
        out = bucket_steps(steps)
        assert len(out) <= MAX_BUCKETS and sum(s.count for s in out) == 500
        for q in qs:
            grid = sorted({s.noise_multiplier for s in out if s.q == q})
            u = np.sort(np.asarray(grid) ** -2.0)
            gaps = np.diff(u)
            assert np.allclose(gaps / gaps.min(), np.round(gaps / gaps.min()), atol=1e-6)  # points of one lattice
            mine = [v for i, v in enumerate(nus) if qs[i % len(qs)] == q]
            assert nus.min() - 1e-12 <= min(grid) <= min(mine) and max(grid) <= max(mine)  # one grid for all rates
            for v in mine:  # every step lands on a grid point at or below its own noise
                assert any(g <= v * (1 + 1e-12) for g in grid)
    few = [GaussianStep(0.01, float(v)) for v in nus[:MAX_BUCKETS]]
    assert sorted(s.noise_multiplier for s in bucket_steps(few)) == sorted(float(v) for v in nus[:MAX_BUCKETS])


def test_dynamic_schedule_of_3000_steps_is_fast():
    """3,000 distinct levels are accounted in seconds (bucketed), and the bound is above the exact RDP value."""
    nus = 0.8 * 2.5 ** (-np.arange(3000) / 3000) + 0.6
    steps = [GaussianStep(0.01, float(v)) for v in nus]
    t0 = time.process_time()
    eps = rigorous_epsilon(steps, 1e-5)
    assert time.process_time() - t0 < 20
    assert len(bucket_steps(steps)) <= 96
    assert 0 < eps < rdp_fast.rdp_epsilon(0.01, nus, 1, 1e-5)


def test_rigorous_delta_round_trip_and_dp_accounting_pld():
    steps = [GaussianStep(0.01, 1.0, 1000)]
    eps = rigorous_epsilon(steps, 1e-5)
    assert rigorous_delta(steps, eps) == pytest.approx(1e-5, rel=0.05)
    acc = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 1000)
    assert eps == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)


def test_poisson_replace_one_is_charged_the_symmetrised_pair():
    """Poisson(q < 1) under replace-one: the PLD of the symmetrised pair (:mod:`flower_dp.privacy.replace_one`), never
    below dp-accounting's REPLACE_ONE pair ((1-q) N(0) + q N(1), (1-q) N(0) + q N(-1)) nor the attained pair (nu/2,
    add/remove, both orders); without subsampling replace-one is the Gaussian with the sensitivity doubled."""
    steps = [GaussianStep(0.05, 2.0, 100)]
    reported, bound = epsilon_and_bound(steps, 1e-5, adjacency="replace_one")
    assert bound == "pld_symmetrised_pair"
    native = dpa.pld.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3)
    native.compose(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(2.0)), 100)
    attained = rigorous_epsilon([GaussianStep(0.05, 1.0, 100)], 1e-5, accountant="pld")
    assert rigorous_epsilon(steps, 1e-5) < native.get_epsilon(1e-5) < attained < reported
    full = [GaussianStep(1.0, 4.0, 10)]
    assert rigorous_epsilon(full, 1e-5, adjacency="replace_one") == pytest.approx(
        rigorous_epsilon([GaussianStep(1.0, 2.0, 10)], 1e-5), rel=1e-6)


def test_sampling_without_replacement_privsgp_vr():
    """PrivSGP-VR's setting: fixed-size sampling w/o replacement, replace-one, CIFAR eps=3, K=3120 -> z* = 0.5548
    relative to the replace-one sensitivity (2 x clip), i.e. nu = 1.1096 relative to the clip bound, by
    dp-accounting's RDP bound for sampling without replacement: the RDP the accountant keeps for this sampler.
    The PLD of the symmetrised pair is the other proven bound; the smaller of the two is reported."""
    step = GaussianStep(1 / 3125, 2 * 0.5548, 3120, sampling="without_replacement", dataset_size=3125)
    assert step.sampling == "fixed_size"  # the old name is an alias
    native = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    native.compose(dpa.SampledWithoutReplacementDpEvent(3125, 1, dpa.GaussianDpEvent(0.5548)), 3120)
    assert native.get_epsilon(1e-5) == pytest.approx(3.0, abs=0.01)
    rdp_eps, bound = epsilon_and_bound([step], 1e-5, accountant="rdp", adjacency="replace_one")
    assert bound == "rdp_without_replacement" and rdp_eps == pytest.approx(native.get_epsilon(1e-5), rel=1e-9)
    pld_eps, bound = epsilon_and_bound([step], 1e-5, accountant="pld", adjacency="replace_one")
    assert bound == "pld_symmetrised_pair"
    assert rigorous_epsilon([step], 1e-5, adjacency="replace_one") == pytest.approx(min(rdp_eps, pld_eps), rel=1e-12)
    with pytest.raises(UnsupportedEventError, match="fixed_size.*adjacency='replace_one'"):
        rigorous_epsilon([step], 1e-5)  # add/remove would change the batch size: refused
    with pytest.raises(ValueError, match="dataset_size is required"):
        GaussianStep(0.1, 1.0, sampling="without_replacement")


def test_fixed_size_is_charged_with_the_symmetrised_pair():
    """Gau-LRQ's MNIST setting: z = 0.51624, K = 30, B = 80 of N = 1920, replace-one -> 51.23, the PLD of the
    symmetrised pair; above the attained pair A = ((1-q) N(0, z^2) + q N(2, z^2), N(0, z^2)) composed in each order
    (50.42, a lower bound) and far above Poisson add/remove at the same q."""
    step = GaussianStep(80 / 1920, 0.51624, 30, "fixed_size", 1920)
    eps, bound = epsilon_and_bound([step], 1e-5, adjacency="replace_one")
    assert bound == "pld_symmetrised_pair" and 51.2 <= eps <= 53.0
    acc = dpa.pld.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3)
    acc.compose(dpa.PoissonSampledDpEvent(80 / 1920, dpa.GaussianDpEvent(0.51624 / 2)), 30)
    attained = acc.get_epsilon(1e-5)
    assert 50.3 <= attained <= 50.6 and attained < eps < attained * 1.02
    assert eps > 3 * rigorous_epsilon([GaussianStep(80 / 1920, 0.51624, 30)], 1e-5)


def test_auto_is_the_smaller_valid_bound():
    """accountant='auto' reports min(PLD, RDP): PLD on short horizons, RDP where the PLD discretization adds up."""
    for steps in ([GaussianStep(0.01, 1.0, 1000)], [GaussianStep(0.01, 12.9, 100_000)]):
        p, r = (rigorous_epsilon(steps, 1e-5, accountant=a) for a in ("pld", "rdp"))
        assert rigorous_epsilon(steps, 1e-5) == min(p, r)

def test_mixed_laplace_and_gaussian_history():
    """Huge-eps Laplace steps (DPPS paper settings) add by basic composition to the Gaussian part."""
    g = [GaussianStep(0.01, 1.0, 100)]
    eps_g = rigorous_epsilon(g, 1e-5)
    assert rigorous_epsilon(g + [LaplaceStep(1 / 3000, 2)], 1e-5) == pytest.approx(eps_g + 6000)


def test_laplace_steps():
    """Pure eps: 10 Laplace releases with nu = 1 compose to at most 10 (and close to it at small delta)."""
    eps = rigorous_epsilon([LaplaceStep(1.0, 10)], 1e-5)
    assert 9.0 < eps <= 10.0 + 1e-6


def test_node_accountant_ledger_and_state():
    acc = NodeAccountant("rdp")
    for _ in range(5):
        acc.charge_gaussian(q=0.01, noise_multiplier=1.0)
    acc.charge_laplace(noise_multiplier=2.0)
    assert acc.steps_charged == 6 and len(acc.ledger) == 2
    eps = acc.epsilon(1e-5)
    other = NodeAccountant("rdp")
    other.load_state_dict(acc.state_dict())
    assert other.epsilon(1e-5) == eps
    with pytest.raises(ValueError, match="accountant='rdp'.*accountant='pld'"):
        NodeAccountant("pld").load_state_dict(acc.state_dict())


@settings(max_examples=5, deadline=None)
@given(eps=st.floats(0.5, 8.0), q=st.floats(0.005, 0.2), steps=st.integers(1, 500))
def test_calibrated_noise_never_exceeds_target(eps, q, steps):
    """Property (Opacus-style): the calibrated nu gives eps <= target."""
    nu = calibrate_noise_multiplier(eps, 1e-5, q, steps, accountant="rdp")
    assert rigorous_epsilon([GaussianStep(q, nu, steps)], 1e-5, accountant="rdp") <= eps
    assert rigorous_epsilon([GaussianStep(q, nu * 0.99, steps)], 1e-5, accountant="rdp") > eps * 0.98


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: GaussianStep(0.0, 1.0), "q must be in \\(0, 1\\], got 0.0"),
        (lambda: GaussianStep(1.5, 1.0), "q must be in \\(0, 1\\], got 1.5"),
        (lambda: GaussianStep(0.1, -1.0), "noise_multiplier must be > 0, got -1.0"),
        (lambda: rigorous_epsilon([GaussianStep(0.1, 1.0)], 0.0), "delta must be in \\(0, 1\\), got 0.0"),
        (lambda: rigorous_epsilon([GaussianStep(0.1, 1.0)], 1e-5, accountant="moments"), "unknown accountant 'moments'"),
        (lambda: PrivacyBudget(-1.0, 1e-5), "eps must be > 0 and finite, got -1.0"),
        (lambda: PrivacyBudget(1.0, 1e-5, unit="user"), "unknown unit 'user'"),
        (lambda: calibrate_noise_multiplier(0, 1e-5, 0.1, 10), "target_epsilon must be > 0"),
        (lambda: calibrate_noise_multiplier(1, 1e-5, 0.0, 10), "q must be in \\(0, 1\\], got 0.0"),
        (lambda: rigorous_epsilon([GaussianStep(0.1, 1.0)], 1e-5, adjacency="swap"), "unknown adjacency 'swap'"),
        (lambda: rigorous_delta([GaussianStep(0.1, 1.0)], -1.0), "epsilon must be > 0 .*got -1.0"),
        (lambda: GaussianStep(0.1, 1.0, sampling="shuffle"), "unknown sampling 'shuffle'"),
        (lambda: LaplaceStep(0.0), "noise_multiplier must be > 0, got 0.0"),
        (lambda: PrivacyBudget(1.0, 1e-5, adjacency="swap"), "unknown adjacency 'swap'"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
