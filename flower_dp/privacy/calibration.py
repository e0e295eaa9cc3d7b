"""Noise calibration: solve the noise so the rigorous eps meets a target, or use a paper's formula.

One generic solver, :func:`calibrate` (the shape of dp_accounting's ``calibrate_dp_mechanism``:
a factory from parameter to eps), always returns the *private side*: the eps of the
returned parameter is <= the target.  :func:`calibrate_noise_multiplier` solves a constant
noise multiplier; :func:`calibrate_schedule` solves the common scale of a whole schedule of
thousands of distinct levels in seconds.  Per-algorithm calibrations return a frozen record
with the noise to use, ``eps_rigorous`` (what PLD/RDP gives for exactly that noise) and
``eps_paper`` (what the paper's formula claims), so a run can print both.

Modes: ``calibration="rigorous"`` (default) and ``calibration="paper"``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_choice, check_delta, check_epsilon, check_int, check_positive, check_probability
from . import gdp, paper
from . import rdp_fast
from .accountant import GaussianStep, bucket_steps, rigorous_epsilon

__all__ = [
    "CALIBRATIONS",
    "calibrate",
    "calibrate_noise_multiplier",
    "calibrate_schedule",
    "DynD2PSchedule",
    "dyn_d2p_schedule",
]

CALIBRATIONS = ("rigorous", "paper")
#: Dyn-D2P variants with a closed-form schedule here; the node's registry adds "general" (user-given C_k, sigma_k)
SCHEDULE_VARIANTS = ("dyn", "dyn_c", "dyn_mu", "const", "nonprivate")
DYN_VARIANTS = SCHEDULE_VARIANTS + ("general",)


def calibrate(
    make_epsilon: Callable[[float], float], target_epsilon: float, lo: float, hi: float, *, rel_tol: float = 1e-4,
    name: str = "noise multiplier",
) -> float:
    """Smallest-noise parameter ``s`` in [lo, hi] with ``make_epsilon(s) <= target`` (eps decreasing in s).

    Bisection in log space; the returned value is on the private side.  Raises ``ValueError``
    naming the parameter (``name``) and the bracket when even ``hi`` does not reach the target.
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    lo, hi = check_positive("lo", lo), check_positive("hi", hi)
    if not lo < hi:
        raise ValueError(f"the bracket must satisfy lo < hi, got lo={lo}, hi={hi}")
    while (e_hi := make_epsilon(hi)) > target:
        if hi > 1e6:
            raise ValueError(
                f"no {name} up to {hi:g} reaches target eps {target}, got eps {e_hi:.4g} there; "
                "raise the target or reduce the steps"
            )
        lo, hi = hi, hi * 4
    while make_epsilon(lo) <= target and lo > 1e-6:
        hi, lo = lo, lo / 4
    while hi / lo - 1 > rel_tol:
        mid = math.sqrt(lo * hi)
        if make_epsilon(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    q: float,
    steps: int,
    *,
    accountant: str = "auto",
    adjacency: str = "add_remove",
    sampling: str = "poisson",
    dataset_size: int | None = None,
) -> float:
    """Smallest noise multiplier ``nu`` (std / clip bound) with rigorous eps(delta) <= target.

    ``steps`` subsampled Gaussian releases (``sampling``/``dataset_size`` as in
    :class:`GaussianStep`), neighbouring relation ``adjacency``.  The returned value is on the
    private side (rel. tolerance 1e-4).
    """
    check_epsilon(target_epsilon, "target_epsilon")
    check_delta(delta)
    check_probability("q", q)
    steps = check_int("steps", steps, minimum=1)
    return calibrate(
        lambda nu: rigorous_epsilon([GaussianStep(q, nu, steps, sampling, dataset_size)], delta, accountant=accountant,
                                    adjacency=adjacency),
        target_epsilon,
        0.3,
        3.0,
    )


def calibrate_schedule(
    shape,
    target_epsilon: float,
    delta: float,
    q: float,
    *,
    accountant: str = "auto",
    adjacency: str = "add_remove",
    rel_tol: float = 5e-3,
    sampling: str = "poisson",
    dataset_size: int | None = None,
) -> float:
    """Common scale ``s`` so that the schedule ``nu_k = s * shape[k]`` meets the target on the private side.

    Each step is a q-subsampled Gaussian with multiplier ``nu_k`` (std / clip bound), sampled as
    ``sampling`` / ``dataset_size`` say (:class:`GaussianStep`).
    Fast for long schedules with thousands of distinct levels: the scale is first found with the
    vectorised integer-order RDP bound (:mod:`.rdp_fast`), then refined with the chosen
    dp-accounting accountant (bucketed, never below the exact eps) by a bracketed secant in
    log-log space; the result has ``eps(s) <= target`` and is within ``rel_tol`` of the root.

    Parameters
    ----------
    shape : array_like, shape (K,)  positive relative noise levels
    target_epsilon, delta : the budget
    q : float in (0, 1]  sampling rate

    Returns
    -------
    float
        The scale ``s``.
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    delta, q = check_delta(delta), check_probability("q", q)
    shape = np.asarray(shape, dtype=np.float64)
    if shape.ndim != 1 or shape.size == 0 or not (np.all(shape > 0) and np.all(np.isfinite(shape))):
        raise ValueError(f"shape must be a non-empty 1-D array of finite values > 0, got {shape!r:.80}")
    grid = bucket_steps([GaussianStep(q, float(v)) for v in shape], max_buckets=256)
    z_shape = np.array([g.noise_multiplier for g in grid])
    counts = np.array([g.count for g in grid], dtype=np.float64)
    half = 2.0 if adjacency == "replace_one" else 1.0  # proxy only; the final check is native

    def proxy(s: float) -> float:
        return rdp_fast.rdp_epsilon(q, s * z_shape / half, counts, delta)

    def real(s: float) -> float:
        return rigorous_epsilon([GaussianStep(q, float(v), 1, sampling, dataset_size) for v in s * shape], delta,
                                accountant=accountant, adjacency=adjacency)

    s0 = calibrate(proxy, target, 0.3, 3.0, rel_tol=1e-4)
    # local elasticity d ln eps / d ln s from the proxy, for the first jump towards the real root
    slope = math.log(proxy(s0 * 0.95) / max(proxy(s0), 1e-300)) / math.log(0.95)
    slope = min(max(slope, -6.0), -0.5) if math.isfinite(slope) else -2.0
    lo, hi = None, None  # real(lo) > target >= real(hi)
    pts: list[tuple[float, float]] = []
    s, e = s0, real(s0)
    for _ in range(30):
        pts.append((math.log(s), math.log(max(e, 1e-300)) - math.log(target)))
        if e <= target:
            hi = (s, e) if hi is None or s < hi[0] else hi
        else:
            lo = (s, e) if lo is None or s > lo[0] else lo
        if hi is not None and (hi[1] >= target * (1 - rel_tol) or (lo is not None and hi[0] / lo[0] - 1 < rel_tol / 4)):
            return hi[0]
        if len(pts) == 1:
            x = pts[0][0] - pts[0][1] / slope
        else:  # secant through the last two points in log-log space (interpolates or extrapolates)
            (x0, y0), (x1, y1) = pts[-2], pts[-1]
            x = x1 - y1 * (x1 - x0) / (y1 - y0) if y1 != y0 else x1 - y1 / slope
        x += 0.5 * rel_tol / abs(slope)  # aim slightly inside the private side
        if lo is not None and hi is not None:  # stay strictly inside the bracket
            xl, xh = math.log(lo[0]), math.log(hi[0])
            x = min(max(x, xl + 0.05 * (xh - xl)), xh - 0.05 * (xh - xl))
        s = math.exp(min(max(x, pts[-1][0] - 0.4), pts[-1][0] + 0.4))
        e = real(s)
    if hi is None:
        raise ValueError(f"could not reach target eps {target}; got eps {e:.4g} at scale {s:.4g}")
    return hi[0]


@dataclass(frozen=True)
class DynD2PSchedule:
    """Per-iteration clip bounds and noise for the Dyn-D2P family (Algorithms 1-5; eqs. 4, 6, 8, 9).

    Attributes
    ----------
    clip : ndarray (K,)  C_k, per-sample L2 clip bound
    noise_multiplier : ndarray (K,)  1/mu_k (std over sensitivity f C_k)
    noise_std_sum : ndarray (K,)  std of the Gaussian added to the SUM of clipped gradients = noise_multiplier_k f C_k
    eps_rigorous : float  PLD/RDP eps of exactly this schedule at ``delta``
    eps_paper : float     eps the paper's GDP-CLT accountant claims for it
    """

    variant: str
    calibration: str
    epsilon: float
    delta: float
    q: float
    clip: np.ndarray = field(repr=False)
    noise_multiplier: np.ndarray = field(repr=False)
    noise_std_sum: np.ndarray = field(repr=False)
    eps_rigorous: float
    eps_paper: float
    mu_tot: float
    warnings: tuple[str, ...] = ()
    sensitivity_factor: int = 1

    @property
    def adjacency(self) -> str:
        """Neighbouring relation the accountant uses (f = 1: add/remove, f = 2: replace-one)."""
        return "add_remove" if self.sensitivity_factor == 1 else "replace_one"

    def steps(self) -> list[GaussianStep]:
        """One accountant step per iteration; multipliers relative to the clip bound C_k (= f noise_multiplier_k)."""
        return [GaussianStep(self.q, float(v) * self.sensitivity_factor) for v in self.noise_multiplier]


def _dyn_shapes(variant: str, K: int, clip0: float, clip_bar: float, rho_c: float, rho_mu: float):
    t = np.arange(K) / K
    decaying_clip = clip0 * rho_c ** (-t)
    growing = rho_mu**t
    clip = decaying_clip if variant in ("dyn", "dyn_c") else np.full(K, clip_bar)
    shape = growing if variant in ("dyn", "dyn_mu") else np.ones(K)
    return clip, shape


def dyn_d2p_schedule(
    variant: str,
    *,
    epsilon: float,
    delta: float,
    q: float,
    num_iters: int,
    clip0: float = 4.0,
    clip_bar: float = 2.0,
    rho_c: float = 2.0,
    rho_mu: float = 2.0,
    calibration: str = "rigorous",
    sensitivity_factor: int = 1,
    accountant: str = "auto",
) -> DynD2PSchedule:
    """The (C_k, sigma_k) table of a Dyn-D2P variant, identical at every node.

    ``paper``: the GDP-CLT schedule of the paper (eq. 6, 8, 9): ``mu_k = mu_0 rho_mu^(k/K)``
    (dyn, dyn_mu) or ``mu_bar`` (dyn_c, const), meeting ``mu_tot(eps, delta)`` under the CLT.
    ``rigorous``: the same shape, with the overall scale solved (:func:`calibrate_schedule`) so
    that the PLD/RDP eps of ``PoissonSampled(q, Gaussian(f nu_k))`` over all k is <= ``epsilon``
    (within 0.5 %).  ``sensitivity_factor`` f = 1: add/remove adjacency; f = 2: replace-one
    (``nu_k`` is then relative to 2 C_k and the accountant uses adjacency ``replace_one``).

    Returns
    -------
    DynD2PSchedule
        Arrays of shape (K,): ``clip`` C_k, ``nu`` = 1/mu_k, ``noise_std_sum`` = nu_k f C_k (std
        on the SUM of clipped gradients; divide by B for the mean).  Paper mode warns (and records
        in ``warnings``) when the rigorous eps exceeds the target.
    """
    check_choice("variant", variant, SCHEDULE_VARIANTS)
    check_choice("calibration", calibration, CALIBRATIONS)
    K = check_int("num_iters", num_iters, minimum=1)
    clip0, clip_bar = check_positive("clip0", clip0), check_positive("clip_bar", clip_bar)
    for name, v in (("rho_c", rho_c), ("rho_mu", rho_mu)):
        if check_positive(name, v) < 1:
            raise ValueError(f"{name} must be >= 1 (1 = no change over time), got {v}")
    clip, shape = _dyn_shapes(variant, K, clip0, clip_bar, rho_c, rho_mu)
    if variant == "nonprivate":
        inf = np.full(K, np.inf)
        return DynD2PSchedule(variant, calibration, float("inf"), 0.0, 1.0, np.full(K, np.inf), inf, inf,
                              float("inf"), float("inf"), float("inf"))
    epsilon, delta, q = check_epsilon(epsilon), check_delta(delta), check_probability("q", q)
    f = sensitivity_factor
    if f not in (1, 2):
        raise ValueError(f"sensitivity_factor must be 1 (add/remove) or 2 (replace-one), got {f!r}")
    adjacency = "add_remove" if f == 1 else "replace_one"
    mu_tot = gdp.mu_from_eps_delta(epsilon, delta)
    notes: list[str] = []
    if calibration == "paper":
        mu0 = gdp.dyn_d2p_mu0(mu_tot, q, K, rho_mu) if variant in ("dyn", "dyn_mu") else gdp.dyn_d2p_mu_bar(mu_tot, q, K)
        mu = mu0 * shape
    else:
        # nu_k relative to f C_k; the accountant takes multipliers relative to C_k: f * nu_k
        mu = shape / calibrate_schedule(f / shape, epsilon, delta, q, accountant=accountant, adjacency=adjacency)
    nu = 1.0 / mu
    eps_rig = rigorous_epsilon([GaussianStep(q, float(v) * f) for v in nu], delta, accountant=accountant,
                               adjacency=adjacency)
    clt = gdp.clt_composed_mu(q, mu).mu
    eps_paper = gdp.eps_from_mu_delta(clt, delta)
    if mu.max() > 1:
        notes.append(
            f"max per-step mu = {mu.max():.3f} > 1: the GDP-CLT accountant (eq. 6) is optimistic here"
        )
    if calibration == "paper" and eps_rig > epsilon * 1.001:
        notes.append(f"paper calibration: the rigorous eps of this schedule is {eps_rig:.4f}, above the target {epsilon}")
        warnings.warn(f"Dyn-D2P {variant}: " + notes[-1], stacklevel=2)
    return DynD2PSchedule(variant, calibration, epsilon, delta, q, clip, nu, nu * f * clip,
                          eps_rig, eps_paper, mu_tot, tuple(notes), f)
