"""Accounting cost: rigorous eps of a long dynamic (Dyn-D2P) noise schedule.

The schedule is Dyn-D2P's ``dyn`` variant (``mu_k = mu_0 rho^(k/K)``, every step a distinct
noise level; dyn-d2p.md eq. 6-9, paper calibration so that building it costs no accountant
calls).  Figures: seconds for :func:`flower_dp.privacy.rigorous_epsilon` with its default
bucketing ("auto": equal-within-a-grid levels merged, then self-composed), and the relative
eps difference from the unbucketed computation (every step composed one by one).  Bucketing
rounds noise levels *down*, so its eps is an upper bound (difference >= 0).
"""

from __future__ import annotations

import time

__all__ = ["run"]


def _history(K: int, q: float, delta: float):
    import warnings

    from flower_dp.privacy import GaussianStep, dyn_d2p_schedule

    with warnings.catch_warnings():  # the paper calibration warns that its rigorous eps is higher: expected
        warnings.simplefilter("ignore")
        sched = dyn_d2p_schedule("dyn", epsilon=2.0, delta=delta, q=q, num_iters=K, calibration="paper")
    return [GaussianStep(q, float(v)) for v in sched.nu]


def _cold() -> None:
    """Empty the accountant's composition cache, so that timings are cold (the schedule builder
    already computed the same history once)."""
    from flower_dp.privacy import accountant

    clear = getattr(getattr(accountant, "_compose", None), "cache_clear", None)
    if clear is not None:
        clear()


def run(quick: bool = False, *, steps: int | None = None, ref_steps: int | None = None, delta: float = 1e-5) -> dict:
    """Time bucketed PLD accounting of a ``steps``-long schedule (3,000; 100 quick), and the eps error
    of bucketing against the unbucketed computation of a ``ref_steps``-long one (default: the same
    schedule; 60 steps quick).

    The unbucketed reference composes one subsampled-Gaussian PLD per distinct level: 77 s for the
    3,000 levels on an idle 2-core machine here (minutes under load), so it is measured once, cold.
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
    _cold()
    t0 = time.perf_counter()
    eps_b = rigorous_epsilon(history, delta)
    t_b = time.perf_counter() - t0
    ref = history if K_ref == K else _history(K_ref, q, delta)
    if K_ref == K:
        eps_ref_b, t_rb = eps_b, t_b
    else:
        _cold()
        t0 = time.perf_counter()
        eps_ref_b = rigorous_epsilon(ref, delta)
        t_rb = time.perf_counter() - t0
    _cold()
    t0 = time.perf_counter()
    eps_ref_u = rigorous_epsilon(ref, delta, bucket_rel=0)
    t_ru = time.perf_counter() - t0
    return {
        "steps": K,
        "distinct_noise_levels": len({s.nu for s in history}),
        "accountant": "pld",
        "delta": delta,
        "q": q,
        "seconds_bucketed": round(t_b, 3),
        "eps_bucketed": eps_b,
        "ref_steps": K_ref,
        "ref_seconds_bucketed": round(t_rb, 3),
        "ref_seconds_unbucketed": round(t_ru, 3),
        "ref_eps_bucketed": eps_ref_b,
        "ref_eps_unbucketed": eps_ref_u,
        "eps_rel_diff": (eps_ref_b - eps_ref_u) / eps_ref_u,
        "note": (f"eps_rel_diff of the same {K}-step schedule" if K_ref == K else
                 f"eps_rel_diff measured on a {K_ref}-step schedule of the same noise range"),
    }
