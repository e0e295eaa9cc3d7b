"""flower_dp.reproduce.stats against scipy.stats computed directly, and the verdict categories on known numbers."""

import math

import numpy as np
import pytest
from scipy import stats as st

from flower_dp.errors import ConfigError
from flower_dp.reproduce.stats import equivalence, paired_differences, paired_interval, superiority

A = [0.812, 0.805, 0.820, 0.799, 0.815]
B = [0.790, 0.788, 0.801, 0.785, 0.796]


def test_paired_interval_matches_scipy():
    d = np.subtract(A, B)
    iv = paired_interval(d, 0.95)
    lo, hi = st.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=st.sem(d))
    assert iv.lo == pytest.approx(lo, rel=1e-12) and iv.hi == pytest.approx(hi, rel=1e-12)
    assert iv.mean == pytest.approx(float(np.mean(d))) and iv.n == 5


def test_superiority_t_and_p_match_scipy_paired_ttest():
    r = superiority(paired_differences(A, B), min_effect=0.01)
    ref = st.ttest_rel(A, B, alternative="greater")
    assert r.t == pytest.approx(ref.statistic, rel=1e-10) and r.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert r.passed is True and r.category == "substantive pass"


def test_superiority_reversed_and_undecided():
    assert superiority(paired_differences(B, A), min_effect=0.01).category == "substantive fail"
    noisy = [0.03, -0.02, 0.05, -0.04, 0.01]  # mean +0.006, half-width ~0.045: cannot tell
    r = superiority(noisy, min_effect=0.01)
    assert r.passed is None and r.category == "not discriminating"
    tight = [0.001, -0.001, 0.002, 0.0, -0.002]  # holds 0, but rules out an advantage of 0.01
    r = superiority(tight, min_effect=0.01)
    assert r.passed is False and r.category == "substantive fail" and r.interval.hi < 0.01


def test_tost_matches_two_scipy_one_sided_tests():
    d = np.array([0.004, -0.003, 0.006, 0.001, -0.002])
    m = 0.02
    r = equivalence(d, margin=m)
    p_lo = st.ttest_1samp(d, -m, alternative="greater").pvalue
    p_hi = st.ttest_1samp(d, m, alternative="less").pvalue
    assert r.p == pytest.approx(max(p_lo, p_hi), rel=1e-10)
    lo, hi = st.t.interval(0.90, len(d) - 1, loc=d.mean(), scale=st.sem(d))
    assert (r.interval.lo, r.interval.hi) == (pytest.approx(lo), pytest.approx(hi))
    assert r.passed is True and r.category == "substantive pass" and r.p < 0.05


def test_tost_fail_and_undecided():
    assert equivalence([0.05, 0.06, 0.055, 0.052, 0.058], margin=0.02).category == "substantive fail"
    wide = [0.04, -0.03, 0.05, -0.045, 0.01]  # mean ~0.005, 90 % half-width > 0.02: cannot tell
    r = equivalence(wide, margin=0.02)
    assert r.passed is None and r.category == "not discriminating"
    # TOST's p-value exceeds alpha exactly when the 1 - 2 alpha interval leaves the margin
    assert r.p > 0.05


def test_paired_by_seed_dicts_and_bad_input():
    d = paired_differences({0: 0.8, 1: 0.7, 2: 0.9}, {1: 0.6, 2: 0.85, 3: 0.1})
    assert d.tolist() == pytest.approx([0.1, 0.05])
    with pytest.raises(ConfigError, match="at least 2 seeds"):
        paired_interval([0.1])
    with pytest.raises(ConfigError, match="margin must be > 0"):
        equivalence([0.1, 0.2], margin=0)
    with pytest.raises(ConfigError, match="one value per seed"):
        paired_differences([0.1, 0.2], [0.1])
    assert math.isinf(superiority([0.01, 0.01, 0.01], min_effect=0.0).t)
