"""Per-algorithm calibrations against the specs' worked examples; paper modes report the rigorous eps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flower_dp.privacy import (
    GaussianStep,
    calibrate_schedule,
    dp_csgp_calibration,
    dpps_accounting,
    dyn_d2p_schedule,
    gau_lrq_schedule,
    paper,
    privsgp_vr_calibration,
    rigorous_epsilon,
)

A_CIFAR = 342_000_036.4  # PrivSGP-VR eq. (12)'s constant at its CIFAR-10 setting: 13 F0 + 6 L ||x0||^2 + 18 L b^2


def test_privsgp_vr_k_star_and_sigma():
    """PrivSGP-VR eq. (12), CIFAR-10: K* = 3120.06, c2 = 0.3724, d = 11,173,962; sigma(K=3120) = 0.225855."""
    ks = paper.k_star_privsgp_vr(3.0, 1e-5, J=3125, n_nodes=16, A=A_CIFAR, L=25, d=11_173_962, G=10, c2=0.3724)
    assert ks == pytest.approx(3120.06, abs=0.01)
    assert round(ks) == 3120
    s = paper.paper_sigma_privsgp_vr(3.0, 1e-5, num_iters=3120, J=3125, G=10, c2=0.3724)
    assert s == pytest.approx(0.225855, abs=1e-6)
    # Example 2, heterogeneous budgets: K* = 967.460
    ks2 = paper.k_star_privsgp_vr([1, 2, 3, 4], [1e-5, 1e-5, 1e-6, 1e-4], J=3125, n_nodes=4, A=A_CIFAR, L=25,
                                  d=11_173_962, G=10, c2=0.3724)
    assert ks2 == pytest.approx(967.460, abs=1e-3)


def test_privsgp_vr_paper_mode_reports_real_eps():
    """The paper's sigma at K* is ~70x too small: its rigorous eps is enormous."""
    cal = privsgp_vr_calibration(3.0, 1e-5, num_iters=3120, J=3125, G=10, calibration="paper", c2=0.3724,
                                 accountant="rdp")
    assert cal.noise_std == pytest.approx(0.225855, abs=1e-6)
    # one record of the drawn block (b = 1) moves h - T[blk] by up to 4G: unit 2G, and a sliver goes to the table term
    assert cal.noise_multiplier == pytest.approx(0.225855 / 20, rel=1e-2) and cal.noise_multiplier < 0.225855 / 20
    assert cal.eps_rigorous > 1e4 and cal.warnings
    rig = privsgp_vr_calibration(3.0, 1e-5, num_iters=3120, J=3125, G=10)
    assert 2.99 <= rig.eps_rigorous <= 3.0 and cal.sampling == rig.sampling == "fixed_size"
    # PrivSGP (no table) releases h only: half the sensitivity, and no always-present term
    plain = privsgp_vr_calibration(3.0, 1e-5, num_iters=3120, J=3125, G=10, vr=False)
    assert rig.noise_std > 2 * plain.noise_std and plain.noise_multiplier_always == math.inf


def test_dp_csgp_worked_example_w3():
    """DP-CSGP W3 (eps=3): paper sigma 0.018967 (RDP eps ~7.44), rigorous sigma 0.030063."""
    paper_cal = dp_csgp_calibration(3.0, 1e-4, num_iters=3906, J=5000, batch_size=64, G=1.5, calibration="paper",
                                    accountant="rdp")
    assert paper_cal.noise_std == pytest.approx(0.01896723, rel=1e-6)
    assert paper_cal.eps_rigorous == pytest.approx(7.44, rel=0.01)
    rig = dp_csgp_calibration(3.0, 1e-4, num_iters=3906, J=5000, batch_size=64, G=1.5, accountant="rdp")
    assert rig.noise_std == pytest.approx(0.03006288, rel=0.005)
    assert rig.eps_rigorous <= 3.0
    assert rig.eps_paper == pytest.approx(3.0 * 0.01896723 / rig.noise_std, rel=1e-6)


def test_dyn_d2p_schedule_T1_values():
    """Dyn-D2P (paper mode): sigma_k for dyn / dyn_c / dyn_mu / const at k = 0, 500, 999."""
    kw = dict(epsilon=1.0, delta=1e-5, q=0.01, num_iters=1000, clip0=4.0, clip_bar=2.0, rho_c=2.0, rho_mu=2.0,
              calibration="paper", accountant="rdp")
    table = {
        "dyn": [8.15814382, 4.07907191, 2.04236531],
        "dyn_c": [5.43596692, 3.84380907, 2.71986808],
        "dyn_mu": [4.07907191, 2.88433941, 2.04095014],
        "const": [2.71798346, 2.71798346, 2.71798346],
    }
    for variant, expected in table.items():
        s = dyn_d2p_schedule(variant, **kw)
        np.testing.assert_allclose(s.noise_std_sum[[0, 500, 999]], expected, rtol=1e-6)
        assert s.eps_paper == pytest.approx(1.0, rel=1e-5)
    assert dyn_d2p_schedule("dyn", **kw).clip[500] == pytest.approx(2.82842712)


def test_dyn_d2p_rigorous_meets_target_and_paper_overshoots():
    """Short-run regime (large per-step mu): the paper schedule's PLD eps is above the target; rigorous meets it."""
    kw = dict(epsilon=1.0, delta=1e-4, q=0.05, num_iters=60, clip0=4.0, rho_c=2.5, rho_mu=2.5)
    pap = dyn_d2p_schedule("dyn", calibration="paper", **kw)
    rig = dyn_d2p_schedule("dyn", calibration="rigorous", **kw)
    assert pap.eps_rigorous > 1.0
    assert 1.0 * (1 - 5e-3) <= rig.eps_rigorous <= 1.0
    assert rig.noise_multiplier[0] > rig.noise_multiplier[-1]  # growing budget: noise multiplier falls over time
    assert rigorous_epsilon(rig.steps(), 1e-4) == pytest.approx(rig.eps_rigorous)
    np.testing.assert_allclose(rig.noise_multiplier[1:] / rig.noise_multiplier[:-1], 2.5 ** (-1 / 60), rtol=1e-9)  # shape kept


def test_gau_lrq_fixed_and_dynamic_examples():
    """Gau-LRQ MNIST N=1920, B=80, K=30, eps=3, delta=1e-5, tau=0.9, accounted for the sampler
    the strategy runs (B of N without replacement, replace-one client): the tight dominating pair gives 50.4
    for the paper's z = 0.516 (the old RDP bound for sampling without replacement said 290.5)."""
    fixed = gau_lrq_schedule(epsilon=3.0, delta=1e-5, num_rounds=30, B=80, N=1920, calibration="paper")
    assert fixed.noise_multiplier[0] == pytest.approx(0.516, abs=1e-3)
    assert fixed.noise_multiplier[0] * 1.0 / math.sqrt(80) == pytest.approx(0.05772, abs=1e-5)
    assert 50.3 <= fixed.eps_rigorous <= 55.0
    assert fixed.eps_paper == pytest.approx(3.0, rel=1e-9)
    dyn = gau_lrq_schedule(epsilon=3.0, delta=1e-5, num_rounds=30, B=80, N=1920, tau=0.9, calibration="paper")
    assert dyn.noise_multiplier[0] / math.sqrt(80) == pytest.approx(0.08898, abs=1e-5)
    assert dyn.noise_multiplier[29] / math.sqrt(80) == pytest.approx(0.04145, abs=1e-5)
    assert dyn.eps_rigorous > fixed.eps_rigorous  # the dynamic schedule costs more
    rig = gau_lrq_schedule(epsilon=3.0, delta=1e-5, num_rounds=30, B=80, N=1920)
    # the noise that meets eps = 3 for this sampler, no more (within the calibration's 0.1 %)
    assert 2.99 <= rig.eps_rigorous <= 3.0 and np.ptp(rig.noise_multiplier) == 0.0
    assert rig.eps_after(30, 1e-5) == pytest.approx(rig.eps_rigorous)


def test_dpps_accounting_example():
    """DPPS, b=3, gamma_n 1e-3/1e-4/1e-5 over 240/300/180 rounds -> basic 6.37e7."""
    sched = [1e-3] * 240 + [1e-4] * 300 + [1e-5] * 180
    with pytest.warns(UserWarning, match="no meaningful DP"):
        acc = dpps_accounting(3.0, sched, 1e-5)
    assert any("HEURISTIC" in w for w in acc.warnings)
    assert acc.eps_basic == pytest.approx(6.372e7, rel=1e-3)
    assert acc.eps_round_paper[0] == pytest.approx(3000.0)
    assert acc.heuristic
    # gamma_n = 1, b = 0.1, T = 720: basic 72.0, Laplace-RDP ~16.11 (PLD is tighter)
    small = dpps_accounting(0.1, [1.0] * 720, 1e-5)
    assert small.eps_basic == pytest.approx(72.0)
    assert small.eps_composed < 16.2
    assert dpps_accounting(0.1, [1.0] * 720, 1e-5, accountant="rdp").eps_composed < 16.2


def test_dyn_d2p_example_c_clt_accurate_and_replace_one():
    """Dyn-D2P (B=64, p=0.0256, K=3900): mu_bar 0.194492, mu0 0.132030; PLD const ~1.0085.

    A 3,900-step dynamic schedule is accounted in seconds (bucketing)."""
    kw = dict(epsilon=1.0, delta=1e-4, q=0.0256, num_iters=3900, clip0=7.0, clip_bar=3.0, rho_c=2.0, rho_mu=2.0,
              calibration="paper")
    const = dyn_d2p_schedule("const", **kw)
    assert 1 / const.noise_multiplier[0] == pytest.approx(0.194492, abs=1e-6)
    assert const.noise_std_sum[0] == pytest.approx(15.424774, rel=1e-6)
    assert const.eps_rigorous == pytest.approx(1.0085, abs=0.01)
    dyn = dyn_d2p_schedule("dyn", **kw)
    assert 1 / dyn.noise_multiplier[0] == pytest.approx(0.132030, abs=1e-6)
    assert dyn.noise_std_sum[0] == pytest.approx(53.018345, rel=1e-6)
    assert 1.0 < dyn.eps_rigorous < 1.03  # spec bracket [1.0053, 1.0132] plus bucketing slack
    assert not any("mu" in w for w in dyn.warnings)  # all mu_k < 1: the CLT regime


def test_dyn_d2p_variants_reduce_and_nonprivate():
    """rho = 1 collapses every variant onto const; nonprivate has no noise."""
    kw = dict(epsilon=1.0, delta=1e-5, q=0.01, num_iters=50, clip0=2.0, clip_bar=2.0, rho_c=1.0, rho_mu=1.0,
              calibration="paper")
    ref = dyn_d2p_schedule("const", **kw).noise_std_sum
    for v in ("dyn", "dyn_c", "dyn_mu"):
        np.testing.assert_allclose(dyn_d2p_schedule(v, **kw).noise_std_sum, ref, rtol=1e-9)
    npv = dyn_d2p_schedule("nonprivate", **kw)
    assert np.all(np.isinf(npv.noise_multiplier)) and npv.eps_rigorous == float("inf")


def test_dyn_d2p_replace_one_needs_more_noise():
    kw = dict(epsilon=2.0, delta=1e-5, q=0.02, num_iters=100, variant="const", accountant="pld")
    f1 = dyn_d2p_schedule(**kw)
    f2 = dyn_d2p_schedule(sensitivity_factor=2, **kw)
    assert f2.adjacency == "replace_one" and f2.eps_rigorous <= 2.0
    assert f2.noise_std_sum[0] > f1.noise_std_sum[0]
    assert rigorous_epsilon(f2.steps(), 1e-5, adjacency="replace_one") == pytest.approx(f2.eps_rigorous)
    with pytest.raises(ValueError, match="sensitivity_factor must be 1 .* got 3"):
        dyn_d2p_schedule(sensitivity_factor=3, **kw)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dyn_d2p_schedule("fast", epsilon=1, delta=1e-5, q=0.1, num_iters=10), "unknown variant 'fast'"),
        (lambda: dyn_d2p_schedule("dyn", epsilon=1, delta=1e-5, q=0.1, num_iters=10, calibration="gdp"),
         "unknown calibration 'gdp'"),
        (lambda: dyn_d2p_schedule("dyn", epsilon=1, delta=1e-5, q=0.1, num_iters=10, rho_mu=0.5), "rho_mu must be >= 1"),
        (lambda: dp_csgp_calibration(-1, 1e-4, num_iters=10, J=100, batch_size=10, G=1), "eps must be > 0 .* got -1"),
        (lambda: privsgp_vr_calibration(1, 1e-5, num_iters=10, J=100, G=1, calibration="paper"), "needs c2"),
        (lambda: paper.paper_sigma_privsgp_vr(1, 2.0, num_iters=10, J=100, G=1, c2=1), "delta must be in \\(0, 1\\), got 2.0"),
        (lambda: paper.gau_lrq_dynamic_noise_multipliers(1, 1e-5, num_rounds=10, B=10, N=100, tau=1.5), "tau must be in \\(0, 1\\]"),
        (lambda: gau_lrq_schedule(epsilon=1, delta=1e-5, num_rounds=10, B=200, N=100), "B must be <= 100, got 200"),
        (lambda: dpps_accounting(0, [1e-3], 1e-5), "b must be > 0 .* got 0"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_dyn_d2p_example_a_documents_the_clt_gap():
    """Dyn-D2P (B=1, p=4e-4, K=50,000, eps=1): PLD eps of const is ~1.214, not 1."""
    with pytest.warns(UserWarning, match="rigorous eps of this schedule is 1.2"):
        s = dyn_d2p_schedule("const", epsilon=1.0, delta=1e-4, q=4e-4, num_iters=50_000, clip_bar=3.0,
                             calibration="paper")
    assert s.noise_std_sum[0] == pytest.approx(1.864459, rel=1e-6)
    assert s.eps_rigorous == pytest.approx(1.214, abs=0.02)
    assert s.eps_paper == pytest.approx(1.0, rel=1e-6)
    assert any("mu = 1.609 > 1" in w for w in s.warnings)


@settings(max_examples=4, deadline=None)
@given(eps=st.floats(0.5, 4.0), q=st.floats(0.01, 0.2), rho=st.floats(1.0, 4.0), k=st.integers(5, 40))
def test_calibrated_schedule_never_exceeds_target(eps, q, rho, k):
    """Property: the scale solved for a falling-noise schedule gives eps <= target, within 0.5 % of it."""
    shape = rho ** (-np.arange(k) / k)
    s = calibrate_schedule(shape, eps, 1e-5, q, accountant="pld")
    got = rigorous_epsilon([GaussianStep(q, float(v)) for v in s * shape], 1e-5)
    assert eps * (1 - 5e-3) <= got <= eps


def test_privsgp_vr_without_replacement_and_blocks():
    """PrivSGP-VR: w/o replacement + replace-one gives z* = 0.5548 over 2 x 3G, i.e. nu = 1.1096 over 3G;
    8.6: with blocks of b the paper sigma is unchanged and nu = sigma b / (3G)."""
    swor = privsgp_vr_calibration(3.0, 1e-5, num_iters=3120, J=3125, G=10, accountant="rdp", adjacency="replace_one",
                                  sampling="without_replacement", vr=False)
    # z* (RDP for sampling without replacement, the one RDP bound proven for this sampler) meets eps = 3
    assert swor.noise_multiplier == pytest.approx(2 * 0.5548, rel=2e-4) and 2.99 <= swor.eps_rigorous <= 3.0
    with pytest.raises(ValueError, match="replace_one"):
        privsgp_vr_calibration(3.0, 1e-5, num_iters=10, J=100, G=10, adjacency="add_remove")
    blk = privsgp_vr_calibration(3.0, 1e-5, num_iters=3120, J=3125, G=10, block=5, calibration="paper", c2=0.3724,
                                 accountant="rdp")
    assert blk.noise_std == pytest.approx(0.225855, abs=1e-6) and blk.noise_multiplier == pytest.approx(0.225855 * 5 / 20, rel=1e-2)
    assert blk.q == pytest.approx(5 / 3125)
