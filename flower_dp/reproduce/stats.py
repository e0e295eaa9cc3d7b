"""Statistical tests for a reproduction's claims, over seeds: paired differences with a t-interval, and two one-sided
tests (TOST) for equivalence.

Seeds pair the cells of a claim: two runs with the same seed share the initial model, the data split and the
minibatch order (the privacy noise is each node's own secret), so a claim compares the per-seed differences
``a_s - b_s``.  Every test here reads those differences only.

* :func:`paired_interval`: the mean difference with its two-sided ``level`` t-interval (Student, ``n - 1`` degrees
  of freedom).
* :func:`superiority`: "A beats B".  Passes when the 95 % interval lies above 0; fails *substantively* when it lies
  below 0 (B beats A), or when it holds 0 but lies below ``min_effect`` (no advantage as large as the smallest one the
  claim is about: the interval rules it out); otherwise the seeds cannot tell (**not discriminating**).
* :func:`equivalence`: "A is comparable to B" within ``margin`` (stated before the run): TOST at level alpha, i.e.
  the ``1 - 2 alpha`` interval inside ``(-margin, margin)`` passes; an interval entirely outside fails substantively;
  an interval that straddles a margin cannot tell (not discriminating: its half-width is too large for the margin,
  or the difference sits on it).

A test "could have failed at the measured spread" exactly when its verdict is not "not discriminating": a pass whose
interval excludes the failing side, or a fail the interval proves.  :func:`decide` names the category the
scoreboard counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as _st

from ..errors import ConfigError

__all__ = ["PairedInterval", "TestResult", "paired_differences", "paired_interval", "superiority", "equivalence",
           "CATEGORIES"]

#: the scoreboard's categories of a claim (in its order); "regime" checks the setting (noise binds), not the paper;
#: "incomplete": too few seeds have run for the test (a sweep under way)
CATEGORIES = ("substantive pass", "substantive fail", "by construction", "not discriminating", "regime", "incomplete")


@dataclass(frozen=True)
class PairedInterval:
    """The mean of ``n`` paired differences and its two-sided ``level`` t-interval ``[lo, hi]``."""

    n: int
    mean: float
    sd: float
    half_width: float
    lo: float
    hi: float
    level: float


@dataclass(frozen=True)
class TestResult:
    """A claim's test: the kind ("superiority" or "equivalence"), its interval, the statistic and p-value, the
    margin or smallest effect of interest, the verdict (True pass, False fail, None cannot tell) and its category
    (one of :data:`CATEGORIES`)."""

    kind: str
    interval: PairedInterval
    t: float
    p: float
    threshold: float
    passed: bool | None
    category: str

    def describe(self) -> str:
        iv = self.interval
        what = (f"TOST margin +-{self.threshold:g}, {iv.level:.0%} CI" if self.kind == "equivalence"
                else f"{iv.level:.0%} CI, smallest effect of interest {self.threshold:g}")
        return (f"paired diff {iv.mean:+.4f} over {iv.n} seeds, {what} [{iv.lo:+.4f}, {iv.hi:+.4f}] "
                f"(half-width {iv.half_width:.4f}), t = {self.t:.2f}, p = {self.p:.3g}")


def paired_differences(a: dict | Sequence[float], b: dict | Sequence[float]) -> np.ndarray:
    """``a_s - b_s`` over the seeds both have: ``a``/``b`` map seed -> value (dicts), or are equal-length sequences
    already in seed order."""
    if isinstance(a, dict) and isinstance(b, dict):
        seeds = sorted(set(a) & set(b))
        return np.array([float(a[s]) - float(b[s]) for s in seeds], dtype=float)
    if isinstance(a, dict) or isinstance(b, dict):
        raise ConfigError("paired_differences needs both arms as seed -> value dicts or both as sequences; got one "
                          "of each: pass both the same way")
    if len(a) != len(b):
        raise ConfigError(f"paired arms must have one value per seed each, got {len(a)} and {len(b)} values; pass "
                          "the seeds both arms ran")
    return np.asarray(a, dtype=float) - np.asarray(b, dtype=float)


def paired_interval(diffs: Sequence[float], level: float = 0.95) -> PairedInterval:
    """The mean of ``diffs`` and its two-sided ``level`` Student-t interval (n - 1 degrees of freedom)."""
    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1), got {level!r}; e.g. 0.95")
    d = np.asarray(diffs, dtype=float)
    d = d[np.isfinite(d)]
    n = int(d.size)
    if n < 2:
        raise ConfigError(f"a paired interval needs at least 2 seeds with both arms, got {n}; run more seeds")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = float(_st.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return PairedInterval(n, mean, sd, half, mean - half, mean + half, level)


def _t_stat(mean: float, sd: float, n: int, null: float = 0.0) -> float:
    se = sd / math.sqrt(n)
    if se == 0:
        return math.copysign(math.inf, mean - null) if mean != null else 0.0
    return (mean - null) / se


def superiority(diffs: Sequence[float], *, min_effect: float, level: float = 0.95) -> TestResult:
    """"A beats B" on the paired differences ``a - b``: the two-sided ``level`` t-interval (see the module doc)."""
    if not min_effect >= 0:
        raise ConfigError(f"min_effect must be >= 0, got {min_effect!r}; e.g. 0.02 (2 accuracy points)")
    iv = paired_interval(diffs, level)
    t = _t_stat(iv.mean, iv.sd, iv.n)
    p = float(_st.t.sf(t, iv.n - 1)) if math.isfinite(t) else (0.0 if t > 0 else 1.0)  # one-sided, H1: A > B
    if iv.lo > 0:
        passed, cat = True, "substantive pass"
    elif iv.hi < 0 or iv.hi < min_effect:
        passed, cat = False, "substantive fail"
    else:
        passed, cat = None, "not discriminating"
    return TestResult("superiority", iv, t, p, float(min_effect), passed, cat)


def equivalence(diffs: Sequence[float], *, margin: float, alpha: float = 0.05) -> TestResult:
    """"A is comparable to B" within ``margin``: two one-sided t-tests at level ``alpha`` on ``a - b`` (equivalently
    the ``1 - 2 alpha`` interval inside ``(-margin, margin)``); ``p`` is the larger one-sided p-value."""
    if not margin > 0:
        raise ConfigError(f"margin must be > 0, got {margin!r}; state it before the run, e.g. 0.02")
    if not 0 < alpha < 0.5:
        raise ConfigError(f"alpha must be in (0, 0.5), got {alpha!r}; e.g. 0.05")
    iv = paired_interval(diffs, 1 - 2 * alpha)
    t_lo = _t_stat(iv.mean, iv.sd, iv.n, -margin)  # H0: diff <= -margin
    t_hi = _t_stat(iv.mean, iv.sd, iv.n, margin)   # H0: diff >= +margin
    df = iv.n - 1
    p = max(float(_st.t.sf(t_lo, df)), float(_st.t.cdf(t_hi, df)))
    if -margin < iv.lo and iv.hi < margin:
        passed, cat = True, "substantive pass"
    elif iv.lo >= margin or iv.hi <= -margin:
        passed, cat = False, "substantive fail"
    else:
        passed, cat = None, "not discriminating"
    return TestResult("equivalence", iv, min(abs(t_lo), abs(t_hi)), p, float(margin), passed, cat)
