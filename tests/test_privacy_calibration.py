"""Per-algorithm calibrations against the specs' worked examples; paper modes report the rigorous eps."""

from __future__ import annotations

import numpy as np
import pytest

from flower_dp.privacy import (
    GaussianStep,
    dp_csgp_calibration,
    dpps_accounting,
    dyn_d2p_schedule,
    gau_lrq_calibration,
    paper,
    privsgp_vr_calibration,
    rigorous_epsilon,
)

A_CIFAR = 342_000_036.4  # privsgp-vr.md 4.4: 13 F0 + 6 L ||x0||^2 + 18 L b^2


def test_privsgp_vr_k_star_and_sigma():
    """privsgp-vr.md 4.4 Example 1: K* = 3120.06 with c2 = 0.3724, d = 11,173,962; sigma(K=3120) = 0.225855."""
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
    """The paper's sigma at K* is ~70x too small: its rigorous eps is enormous (privsgp-vr.md 4.5)."""
    cal = privsgp_vr_calibration(3.0, 1e-5, num_iters=3120, J=3125, G=10, calibration="paper", c2=0.3724,
                                 accountant="rdp")
    assert cal.noise_std == pytest.approx(0.225855, abs=1e-6)
    assert cal.nu == pytest.approx(0.00753, abs=1e-4)
    assert cal.eps_rigorous > 1e4 and cal.warnings
    rig = privsgp_vr_calibration(3.0, 1e-5, num_iters=3120, J=3125, G=10, accountant="rdp")
    assert rig.nu == pytest.approx(0.5222, rel=0.01)  # RDP z* in privsgp-vr.md 4.5
    assert rig.eps_rigorous <= 3.0


def test_dp_csgp_worked_example_w3():
    """dp-csgp.md 4.4 W3 (eps=3): paper sigma 0.018967 (RDP eps ~7.44), rigorous sigma 0.030063."""
    paper_cal = dp_csgp_calibration(3.0, 1e-4, num_iters=3906, J=5000, batch_size=64, G=1.5, calibration="paper",
                                    accountant="rdp")
    assert paper_cal.noise_std == pytest.approx(0.01896723, rel=1e-6)
    assert paper_cal.eps_rigorous == pytest.approx(7.44, rel=0.01)
    rig = dp_csgp_calibration(3.0, 1e-4, num_iters=3906, J=5000, batch_size=64, G=1.5, accountant="rdp")
    assert rig.noise_std == pytest.approx(0.03006288, rel=0.005)
    assert rig.eps_rigorous <= 3.0
    assert rig.eps_paper == pytest.approx(3.0 * 0.01896723 / rig.noise_std, rel=1e-6)


def test_dyn_d2p_schedule_T1_values():
    """dyn-d2p.md 4.5 T1 (paper mode): sigma_k for dyn / dyn_c / dyn_mu / const at k = 0, 500, 999."""
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
    """Example D regime (B=32, J=3000, eps=3): the paper schedule's PLD eps is above 3; rigorous mode meets 3."""
    kw = dict(epsilon=3.0, delta=1e-4, q=32 / 3000, num_iters=470, clip0=4.0, rho_c=2.5, rho_mu=2.5)
    pap = dyn_d2p_schedule("dyn", calibration="paper", **kw)
    rig = dyn_d2p_schedule("dyn", calibration="rigorous", **kw)
    assert pap.eps_rigorous > 3.0
    assert 2.9 < rig.eps_rigorous <= 3.0
    assert rig.nu[0] > rig.nu[-1]  # growing budget: noise multiplier falls over time
    assert rigorous_epsilon(rig.steps(), 1e-4) == pytest.approx(rig.eps_rigorous)


def test_gau_lrq_fixed_and_dynamic_examples():
    """gau-lrq.md 5.4 / 6.3: MNIST N=1920, B=80, K=30, eps=3, delta=1e-5, tau=0.9."""
    fixed = gau_lrq_calibration(3.0, 1e-5, num_rounds=30, B=80, N=1920, calibration="paper", accountant="rdp")
    assert fixed.z[0] == pytest.approx(0.516, abs=1e-3)
    assert fixed.sigma(0, S2=1.0, B=80) == pytest.approx(0.05772, abs=1e-5)
    # spec: 12.2 with integer orders 2..256; dp-accounting's default orders (fractional too) are tighter
    assert 11.0 < fixed.eps_rigorous <= 12.25
    assert fixed.eps_paper == pytest.approx(3.0, rel=1e-9)
    dyn = gau_lrq_calibration(3.0, 1e-5, num_rounds=30, B=80, N=1920, tau=0.9, calibration="paper", accountant="rdp")
    assert dyn.sigma(0, 1.0, 80) == pytest.approx(0.08898, abs=1e-5)
    assert dyn.sigma(29, 1.0, 80) == pytest.approx(0.04145, abs=1e-5)
    assert dyn.eps_rigorous > fixed.eps_rigorous  # gau-lrq.md 6.3: under RDP the dynamic schedule costs more (16.2 vs 12.2)
    rig = gau_lrq_calibration(3.0, 1e-5, num_rounds=30, B=80, N=1920, accountant="rdp")
    assert rig.z[0] == pytest.approx(0.908, rel=0.01) and rig.eps_rigorous <= 3.0


def test_dpps_accounting_example():
    """dpps-partpsp.md 5.3: b=3, gamma_n 1e-3/1e-4/1e-5 over 240/300/180 rounds -> basic 6.37e7."""
    sched = [1e-3] * 240 + [1e-4] * 300 + [1e-5] * 180
    with pytest.warns(UserWarning, match="no meaningful DP"):
        acc = dpps_accounting(3.0, sched, 1e-5)
    assert acc.eps_basic == pytest.approx(6.372e7, rel=1e-3)
    assert acc.eps_round_paper[0] == pytest.approx(3000.0)
    assert acc.heuristic
    small = dpps_accounting(0.1, [1.0] * 720, 1e-5)
    assert small.eps_composed < small.eps_basic == pytest.approx(72.0)
