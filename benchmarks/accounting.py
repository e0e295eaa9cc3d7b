"""Accounting cost: rigorous eps of a long dynamic (Dyn-D2P) noise schedule.

The schedule is Dyn-D2P's ``dyn`` variant (``mu_k = mu_0 rho^(k/K)``, every step a distinct
noise level; Dyn-D2P eqs. 6-9, paper calibration, so that building it costs one accountant
call).  Two lengths:

- 3,000 steps (``accounting_seconds_3000``, ``accounting_eps_rel_diff``): seconds for
  :func:`flower_dp.privacy.rigorous_epsilon` with its default bucketing ("auto": levels rounded
  down onto a grid, then self-composed), and the relative eps difference from the unbucketed
  computation of the same schedule (every level composed as it is).
- 30,000 steps, 30,000 distinct levels (``accounting_seconds_30000``,
  ``accounting_eps_rel_diff_30000``).  The unbucketed value is too slow to compute here, so the
  error is certified by a sandwich: the same schedule with every level rounded UP onto a fine
  grid (more noise: a LOWER bound of the unbucketed eps, same accountant, same discretization)
  gives ``(bucketed - lower) / lower >= (bucketed - exact) / exact``.

Bucketing rounds noise levels *down*, so its eps is an upper bound (difference >= 0).
"""

from __future__ import annotations

import math
import statistics
import time

__all__ = ["run", "rounded_up", "check_sandwich"]


def _history(K: int, q: float, delta: float):
    import warnings

    from flower_dp.privacy import GaussianStep, dyn_d2p_schedule

    with warnings.catch_warnings():  # the paper calibration warns that its rigorous eps is higher: expected
        warnings.simplefilter("ignore")
        sched = dyn_d2p_schedule("dyn", epsilon=2.0, delta=delta, q=q, num_iters=K, calibration="paper")
    return [GaussianStep(q, float(v)) for v in sched.noise_multiplier]


def rounded_up(history, levels: int):
    """The history with every noise level rounded UP (more noise) onto ``levels`` points equally spaced in
    ``nu^-2`` (one grid per sampling rate), equal levels merged: its eps is a LOWER bound of the history's.

    For certifying the bucketing error only (``(upper - lower) / lower`` bounds the relative error from
    above); never for accounting.  Steps: GaussianStep with finite nu.
    """
    from collections import Counter

    from flower_dp.privacy import GaussianStep

    out: Counter = Counter()
    for q in {s.q for s in history}:
        group = [s for s in history if s.q == q]
        us = [s.noise_multiplier ** -2.0 for s in group]
        u0, du = min(us), (max(us) - min(us)) / max(1, levels - 1)
        for s, u in zip(group, us):
            k = math.floor((u - u0) / du + 1e-9) if du > 0 else 0  # the grid point at or below u: more noise
            nu = max(s.noise_multiplier, (u0 + k * du) ** -0.5)
            out[(q, nu, s.sampling, s.dataset_size)] += s.count
    return [GaussianStep(q, nu, c, smp, n) for (q, nu, smp, n), c in out.items()]


def _cold() -> None:
    """Empty the accountant's composition cache, so that timings are cold (the schedule builder
    already computed the same history once)."""
    from flower_dp.privacy import accountant

    clear = getattr(getattr(accountant, "_compose", None), "cache_clear", None)
    if clear is not None:
        clear()


def _timed_cold(fn, repeats: int):
    out, times = None, []
    for _ in range(repeats):
        _cold()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, times


def _long(K: int, q: float, delta: float, repeats: int, fine_levels: int) -> dict:
    """The long schedule: bucketed eps and its time, and the rounded-up sandwich."""
    from flower_dp.privacy import accountant, rigorous_epsilon

    history = _history(K, q, delta)
    eps, times = _timed_cold(lambda: rigorous_epsilon(history, delta), repeats)
    merged = accountant._prepare(history, "auto", "add_remove", "auto", accountant.MAX_BUCKETS)
    h = accountant.PLD_DISCRETIZATION if len(merged) <= accountant.FINE_LEVELS else accountant.PLD_DISCRETIZATION_MANY
    # exact = min(PLD_exact, RDP_exact) >= min(PLD(up), RDP(up)): each side rounded up onto its own grid
    t0 = time.perf_counter()
    up_pld = rounded_up(history, fine_levels)
    lower_pld = rigorous_epsilon(up_pld, delta, accountant="pld", bucket_rel=0, discretization=h)
    lower_rdp = rigorous_epsilon(rounded_up(history, max(2, fine_levels // 8)), delta, accountant="rdp", bucket_rel=0)
    t_lower = time.perf_counter() - t0
    lower = min(lower_pld, lower_rdp)
    pld = rigorous_epsilon(history, delta, accountant="pld")
    pld_half = rigorous_epsilon(history, delta, accountant="pld", discretization=h / 2)
    return {
        "steps": K,
        "distinct_noise_levels": len({s.noise_multiplier for s in history}),
        "buckets": len(merged),
        "seconds": round(min(times), 3),
        "median_seconds": round(statistics.median(times), 3),
        "repeats_cold": repeats,
        "eps": eps,
        "eps_pld": pld,
        "eps_rdp": rigorous_epsilon(history, delta, accountant="rdp"),
        "pld_discretization": h,
        "lower_eps": lower,
        "lower_levels_pld": len(up_pld),
        "lower_seconds": round(t_lower, 2),
        "eps_rel_diff": (eps - lower) / lower,
        # not part of the sandwich: how far the PLD discretization h itself is from a finer one (same buckets)
        "eps_pld_half_discretization": pld_half,
        "pld_discretization_rel_diff": (pld - pld_half) / pld_half,
    }


def check_sandwich(K: int, *, delta: float = 1e-5, fine_levels: int = 2048, dp_accounting: bool = False) -> dict:
    """Offline check that ``lower <= exact <= bucketed`` for the ``K``-step schedule, exact = every level composed
    (PLD and RDP through flower_dp.privacy.fast_compose; ``dp_accounting=True`` also composes the PLD level by
    level through dp-accounting's PLDAccountant, minutes for 3,000 levels).  Minutes at K = 30,000.

    ``python -c "from benchmarks.accounting import check_sandwich as c; print(c(3000, dp_accounting=True))"``
    """
    import dp_accounting as dpa

    from flower_dp.privacy import accountant, rigorous_epsilon

    q = 32 / 3750
    history = _history(K, q, delta)
    h = accountant.PLD_DISCRETIZATION_MANY
    out: dict = {"steps": K, "bucketed": rigorous_epsilon(history, delta)}
    t0 = time.perf_counter()
    out["lower"] = min(rigorous_epsilon(rounded_up(history, fine_levels), delta, accountant="pld", bucket_rel=0,
                                        discretization=h),
                       rigorous_epsilon(rounded_up(history, max(2, fine_levels // 8)), delta, accountant="rdp",
                                        bucket_rel=0))
    out["lower_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    out["exact_pld"] = rigorous_epsilon(history, delta, accountant="pld", bucket_rel=0, discretization=h)
    out["exact_rdp"] = rigorous_epsilon(history, delta, accountant="rdp", bucket_rel=0)
    out["exact_seconds"] = round(time.perf_counter() - t0, 1)
    exact = min(out["exact_pld"], out["exact_rdp"])
    if dp_accounting:
        t0 = time.perf_counter()
        acc = dpa.pld.PLDAccountant(value_discretization_interval=h)
        for s in history:
            acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s.noise_multiplier)), s.count)
        out["exact_pld_dp_accounting"] = acc.get_epsilon(delta)
        out["dp_accounting_seconds"] = round(time.perf_counter() - t0, 1)
    out["contains_exact"] = out["lower"] <= exact <= out["bucketed"]
    out["rel_err"] = (out["bucketed"] - exact) / exact
    out["rel_err_bound"] = (out["bucketed"] - out["lower"]) / out["lower"]
    return out


def run(quick: bool = False, *, steps: int | None = None, ref_steps: int | None = None, delta: float = 1e-5,
        long_steps: int | None = None) -> dict:
    """Time bucketed PLD accounting of a ``steps``-long schedule (3,000; 100 quick), and the eps error
    of bucketing against the unbucketed computation of a ``ref_steps``-long one (default: the same
    schedule; 60 steps quick); then the ``long_steps`` (30,000; 1,000 quick) schedule with its sandwich.

    The unbucketed reference composes one subsampled-Gaussian PLD per distinct level (it took 62 s for the
    3,000 levels through dp-accounting level by level; flower_dp.privacy.fast_compose now takes seconds).
    """
    try:
        from flower_dp.privacy import rigorous_epsilon
    except ImportError as exc:  # pragma: no cover - the privacy package exists in this repo
        from ._common import missing

        return missing("flower_dp.privacy.rigorous_epsilon", exc)
    K = steps if steps is not None else (100 if quick else 3000)
    K_ref = ref_steps if ref_steps is not None else (60 if quick else K)
    q = 32 / 3750  # Fashion-MNIST split over 16 nodes, batch 32
    history = _history(K, q, delta)
    eps_b, times = _timed_cold(lambda: rigorous_epsilon(history, delta), 1 if quick else 3)
    t_b = min(times)
    ref = history if K_ref == K else _history(K_ref, q, delta)
    if K_ref == K:
        eps_ref_b, t_rb = eps_b, t_b
    else:
        eps_ref_b, (t_rb,) = _timed_cold(lambda: rigorous_epsilon(ref, delta), 1)
    eps_ref_u, (t_ru,) = _timed_cold(lambda: rigorous_epsilon(ref, delta, bucket_rel=0), 1)
    K_long = long_steps if long_steps is not None else (1000 if quick else 30_000)
    return {
        "steps": K,
        "distinct_noise_levels": len({s.noise_multiplier for s in history}),
        "accountant": "auto (min of PLD and RDP)",
        "delta": delta,
        "q": q,
        "seconds_bucketed": round(t_b, 3),
        "median_seconds_bucketed": round(statistics.median(times), 3),
        "eps_bucketed": eps_b,
        "ref_steps": K_ref,
        "ref_seconds_bucketed": round(t_rb, 3),
        "ref_seconds_unbucketed": round(t_ru, 3),
        "ref_eps_bucketed": eps_ref_b,
        "ref_eps_unbucketed": eps_ref_u,
        "eps_rel_diff": (eps_ref_b - eps_ref_u) / eps_ref_u,
        "note": (f"eps_rel_diff of the same {K}-step schedule" if K_ref == K else
                 f"eps_rel_diff measured on a {K_ref}-step schedule of the same noise range"),
        "long": _long(K_long, q, delta, 1 if quick else 3, 256 if quick else 2048),
    }
