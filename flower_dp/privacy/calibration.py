"""Noise calibration: solve the noise so the rigorous eps meets a target, or use a paper's formula.

One generic solver, :func:`calibrate` (the shape of dp_accounting's ``calibrate_dp_mechanism``:
a factory from parameter to eps), always returns the *private side*: the eps of the
returned parameter is <= the target.  Per-algorithm calibrations return a frozen record
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
from .accountant import GaussianStep, LaplaceStep, bucket_steps, rigorous_epsilon

__all__ = [
    "CALIBRATIONS",
    "calibrate",
    "calibrate_noise_multiplier",
    "calibrate_schedule",
    "DynD2PSchedule",
    "dyn_d2p_schedule",
    "GaussianCalibration",
    "privsgp_vr_calibration",
    "dp_csgp_calibration",
    "GauLRQCalibration",
    "gau_lrq_calibration",
    "DPPSAccounting",
    "dpps_accounting",
]

CALIBRATIONS = ("rigorous", "paper")
DYN_VARIANTS = ("dyn", "dyn_c", "dyn_mu", "const", "nonprivate")


def calibrate(
    make_epsilon: Callable[[float], float], target_epsilon: float, lo: float, hi: float, *, rel_tol: float = 1e-4
) -> float:
    """Smallest-noise parameter ``s`` in [lo, hi] with ``make_epsilon(s) <= target`` (eps decreasing in s).

    Bisection in log space; the returned value is on the private side.  Raises ``ValueError``
    naming the bracket when even ``hi`` does not reach the target.
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    lo, hi = check_positive("lo", lo), check_positive("hi", hi)
    if not lo < hi:
        raise ValueError(f"the bracket must satisfy lo < hi, got lo={lo}, hi={hi}")
    while make_epsilon(hi) > target:
        if hi > 1e6:
            raise ValueError(
                f"no noise level up to {hi:g} reaches target eps {target}; raise the target or reduce the steps"
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
    accountant: str = "pld",
    adjacency: str = "add_remove",
) -> float:
    """Smallest noise multiplier ``nu`` (std / clip bound) with rigorous eps(delta) <= target.

    ``steps`` Poisson(q)-subsampled Gaussian releases, neighbouring relation ``adjacency``.
    The returned value is on the private side (rel. tolerance 1e-4).
    """
    check_epsilon(target_epsilon, "target_epsilon")
    check_delta(delta)
    check_probability("q", q)
    steps = check_int("steps", steps, minimum=1)
    return calibrate(
        lambda nu: rigorous_epsilon([GaussianStep(q, nu, steps)], delta, accountant=accountant, adjacency=adjacency),
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
    accountant: str = "pld",
    adjacency: str = "add_remove",
    rel_tol: float = 5e-3,
) -> float:
    """Common scale ``s`` so that the schedule ``nu_k = s * shape[k]`` meets the target on the private side.

    Each step is a Poisson(q)-subsampled Gaussian with multiplier ``nu_k`` (std / clip bound).
    Fast for long schedules with thousands of distinct levels: the scale is first found with the
    vectorised integer-order RDP bound (:mod:`.rdp_fast`), then refined with the chosen
    dp-accounting accountant (bucketed, never below the exact eps) by a bracketed secant in
    log-log space; the result has ``eps(s) <= target`` and is within ``rel_tol`` of the root.

    Parameters
    ----------
    shape : array_like, shape (K,)  positive relative noise levels
    target_epsilon, delta : the budget
    q : float in (0, 1]  Poisson sampling rate

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
    z_shape = np.array([g.nu for g in grid])
    counts = np.array([g.count for g in grid], dtype=np.float64)
    half = 2.0 if adjacency == "replace_one" else 1.0  # proxy only; the final check is native

    def proxy(s: float) -> float:
        return rdp_fast.rdp_epsilon(q, s * z_shape / half, counts, delta)

    def real(s: float) -> float:
        return rigorous_epsilon([GaussianStep(q, float(v)) for v in s * shape], delta, accountant=accountant,
                                adjacency=adjacency)

    s0 = calibrate(proxy, target, 0.3, 3.0, rel_tol=1e-4)
    # local elasticity d ln eps / d ln s from the proxy, for the first jump towards the real root
    slope = math.log(proxy(s0 * 0.95) / max(proxy(s0), 1e-300)) / -math.log(0.95)
    slope = min(max(slope, -6.0), -0.5) if math.isfinite(slope) else -2.0
    lo, hi = None, None  # real(lo) > target >= real(hi)
    s, e = s0, real(s0)
    for _ in range(40):
        if e <= target:
            hi = (s, e)
        else:
            lo = (s, e)
        if hi is not None and (hi[1] >= target * (1 - rel_tol) or (lo is not None and hi[0] / lo[0] - 1 < rel_tol)):
            return hi[0]
        if lo is None:  # eps ~ 1/nu^2 roughly: jump near the root, slightly past it
            s = hi[0] * min(0.99, (target / hi[1]) ** (1 / slope) * 1.002)
        elif hi is None:
            s = lo[0] * max(1.01, (target / lo[1]) ** (1 / slope) * 1.002)
        else:  # secant on log eps vs log s, kept strictly inside the bracket
            x0, x1 = math.log(lo[0]), math.log(hi[0])
            y0, y1 = math.log(lo[1]) - math.log(target), math.log(max(hi[1], 1e-300)) - math.log(target)
            x = x1 - y1 * (x1 - x0) / (y1 - y0) if y1 != y0 else 0.5 * (x0 + x1)
            x = min(max(x, x0 + 0.1 * (x1 - x0)), x1 - 0.1 * (x1 - x0))
            s = math.exp(x)
        e = real(s)
    if hi is None:
        raise ValueError(f"could not reach target eps {target}; got eps {e:.4g} at scale {s:.4g}")
    return hi[0]


@dataclass(frozen=True)
class DynD2PSchedule:
    """Per-iteration clip bounds and noise for the Dyn-D2P family (dyn-d2p.md 3.7, 4.4).

    Attributes
    ----------
    clip : ndarray (K,)  C_k, per-sample L2 clip bound
    nu : ndarray (K,)    noise multiplier 1/mu_k (std over sensitivity f C_k)
    noise_std_sum : ndarray (K,)  std of the Gaussian added to the SUM of clipped gradients = nu_k f C_k
    eps_rigorous : float  PLD/RDP eps of exactly this schedule at ``delta``
    eps_paper : float     eps the paper's GDP-CLT accountant claims for it
    """

    variant: str
    calibration: str
    epsilon: float
    delta: float
    q: float
    clip: np.ndarray = field(repr=False)
    nu: np.ndarray = field(repr=False)
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
        """One accountant step per iteration; multipliers relative to the clip bound C_k (= f nu_k)."""
        return [GaussianStep(self.q, float(v) * self.sensitivity_factor) for v in self.nu]


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
    accountant: str = "pld",
) -> DynD2PSchedule:
    """The (C_k, sigma_k) table of a Dyn-D2P variant, identical at every node.

    ``paper``: the GDP-CLT schedule of the paper (eq. 6, 8, 9): ``mu_k = mu_0 rho_mu^(k/K)``
    (dyn, dyn_mu) or ``mu_bar`` (dyn_c, const), meeting ``mu_tot(eps, delta)`` under the CLT.
    ``rigorous``: the same shape, with the overall scale bisected until the PLD/RDP eps of
    ``PoissonSampled(q, Gaussian(nu_k))`` over all k is <= ``epsilon``.
    """
    check_choice("variant", variant, DYN_VARIANTS)
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
            f"max per-step mu = {mu.max():.3f} > 1: the GDP-CLT accountant (eq. 6) is optimistic here (dyn-d2p.md 4.6)"
        )
    if calibration == "paper" and eps_rig > epsilon * 1.001:
        notes.append(f"paper calibration: the rigorous eps of this schedule is {eps_rig:.4f}, above the target {epsilon}")
        warnings.warn(f"Dyn-D2P {variant}: " + notes[-1], stacklevel=2)
    return DynD2PSchedule(variant, calibration, epsilon, delta, q, clip, nu, nu * f * clip,
                          eps_rig, eps_paper, mu_tot, tuple(notes), f)


@dataclass(frozen=True)
class GaussianCalibration:
    """A constant-noise Gaussian calibration: ``nu`` per step, the std it means, and both eps."""

    calibration: str
    epsilon: float
    delta: float
    q: float
    num_iters: int
    nu: float
    noise_std: float
    eps_rigorous: float
    eps_paper: float
    warnings: tuple[str, ...] = ()


def _gaussian_record(calibration, epsilon, delta, q, K, nu, std, eps_paper, accountant, adjacency) -> GaussianCalibration:
    eps_rig = rigorous_epsilon([GaussianStep(q, nu, K)], delta, accountant=accountant, adjacency=adjacency)
    notes = ()
    if eps_rig > epsilon * 1.001:
        notes = (f"{calibration} calibration: rigorous eps = {eps_rig:.4g} exceeds the target {epsilon}",)
    return GaussianCalibration(calibration, epsilon, delta, q, K, nu, std, eps_rig, eps_paper, notes)


def privsgp_vr_calibration(
    epsilon: float,
    delta: float,
    *,
    num_iters: int,
    J: int,
    G: float,
    block: int = 1,
    vr: bool = True,
    calibration: str = "rigorous",
    c2: float | None = None,
    accountant: str = "pld",
    adjacency: str = "add_remove",
) -> GaussianCalibration:
    """Noise for one PrivSGP-VR (``vr=True``) / PrivSGP node (privsgp-vr.md 4.2, 4.5 DECISION).

    The released gradient is bounded by ``3G`` (VR) or ``G``; with blocks of ``b`` samples the
    block-mean has sensitivity ``3G / b`` and sampling rate ``q = b / J``.  ``noise_std`` is the
    std added to that gradient.  ``paper`` uses eq. (11) (``c2`` required).
    """
    check_choice("calibration", calibration, CALIBRATIONS)
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    K, J, block = check_int("num_iters", num_iters, minimum=1), check_int("J", J, minimum=1), check_int("block", block, minimum=1)
    sens = (3.0 if vr else 1.0) * check_positive("G", G) / block
    q = min(1.0, block / J)
    if calibration == "paper":
        if c2 is None:
            raise ValueError("calibration='paper' needs c2 (the paper never gives it; 0.3724 reproduces K* = 3120)")
        std = paper.paper_sigma_privsgp_vr(epsilon, delta, num_iters=K, J=J, G=G, c2=c2, vr=vr) / block
        nu = std / sens
        eps_paper = epsilon
    else:
        nu = calibrate_noise_multiplier(epsilon, delta, q, K, accountant=accountant, adjacency=adjacency)
        std = nu * sens
        eps_paper = float("nan") if c2 is None else epsilon * paper.paper_sigma_privsgp_vr(
            epsilon, delta, num_iters=K, J=J, G=G, c2=c2, vr=vr) / (std * block)
    return _gaussian_record(calibration, epsilon, delta, q, K, nu, std, eps_paper, accountant, adjacency)


def dp_csgp_calibration(
    epsilon: float,
    delta: float,
    *,
    num_iters: int,
    J: int,
    batch_size: int,
    G: float,
    calibration: str = "rigorous",
    c2: float = 1.0,
    accountant: str = "pld",
) -> GaussianCalibration:
    """Noise std on the batch-mean clipped gradient for DP-CSGP (dp-csgp.md 4.1-4.3).

    ``paper``: Prop. 2 ``sigma = c2 G sqrt(T ln(1/delta)) / (J eps)``; ``rigorous``: smallest ``z``
    with eps <= target for Poisson(q = B/J) over T steps, ``sigma = z G / B``.
    """
    check_choice("calibration", calibration, CALIBRATIONS)
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    K, J, B = check_int("num_iters", num_iters, minimum=1), check_int("J", J, minimum=1), check_int("batch_size", batch_size, minimum=1)
    G = check_positive("G", G)
    q = min(1.0, B / J)
    sigma_paper = paper.paper_sigma_dp_csgp(epsilon, delta, num_iters=K, J=J, G=G, c2=c2)
    if calibration == "paper":
        std, eps_paper = sigma_paper, epsilon
    else:
        std = calibrate_noise_multiplier(epsilon, delta, q, K, accountant=accountant) * G / B
        eps_paper = epsilon * sigma_paper / std  # the formula's eps scales as 1/sigma
    return _gaussian_record(calibration, epsilon, delta, q, K, std * B / G, std, eps_paper, accountant, "add_remove")


@dataclass(frozen=True)
class GauLRQCalibration:
    """Per-round noise multipliers ``z_k`` (std of the noise on the client SUM over S2) for Gau-LRQ.

    Per-client per-coordinate std is ``sigma_k = z_k S2 / sqrt(B)`` (gau-lrq.md 5.3).
    """

    calibration: str
    epsilon: float
    delta: float
    q: float
    z: np.ndarray = field(repr=False)
    eps_rigorous: float
    eps_paper: float
    warnings: tuple[str, ...] = ()

    def sigma(self, k: int, S2: float, B: int) -> float:
        return float(self.z[k] * S2 / math.sqrt(B))


def gau_lrq_calibration(
    epsilon: float,
    delta: float,
    *,
    num_rounds: int,
    B: int,
    N: int,
    tau: float = 1.0,
    calibration: str = "rigorous",
    accountant: str = "pld",
) -> GauLRQCalibration:
    """Client-level calibration of (Dynamic) Gau-LRQ (gau-lrq.md 5.3, 6.3).

    ``tau = 1`` is the fixed scheme.  ``paper``: the closed form (Lemma 4, eq. 17/18);
    ``rigorous``: the same shape ``z_k ∝ tau^(k/4)`` with a common scale bisected until the
    Poisson(q = B/N)-subsampled Gaussian accountant meets the target.
    """
    check_choice("calibration", calibration, CALIBRATIONS)
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    K = check_int("num_rounds", num_rounds, minimum=1)
    N = check_int("N", N, minimum=1)
    B = check_int("B", B, minimum=1, maximum=N)
    q = B / N
    z_paper = paper.gau_lrq_dynamic_z(epsilon, delta, num_rounds=K, B=B, N=N, tau=tau)
    if calibration == "paper":
        z = z_paper
    else:
        shape = z_paper / z_paper[0]
        z = calibrate_schedule(shape, epsilon, delta, q, accountant=accountant) * shape
    eps_rig = rigorous_epsilon([GaussianStep(q, float(s)) for s in z], delta, accountant=accountant)
    eps_pap = paper.paper_eps_gau_lrq(z, delta, B=B, N=N)
    notes = ()
    if eps_rig > epsilon * 1.001:
        notes = (f"paper calibration: rigorous eps = {eps_rig:.4g} exceeds the target {epsilon}",)
    return GauLRQCalibration(calibration, epsilon, delta, q, z, eps_rig, eps_pap, notes)


@dataclass(frozen=True)
class DPPSAccounting:
    """DPPS/PartPSP privacy numbers: per-round paper eps, basic composition, and a Laplace
    composition over rounds.  HEURISTIC: the sensitivity is an estimate published in the clear."""

    eps_round_paper: np.ndarray = field(repr=False)
    eps_basic: float
    eps_composed: float
    delta: float
    heuristic: bool = True


def dpps_accounting(b: float, gamma_n_schedule, delta: float, *, accountant: str = "pld") -> DPPSAccounting:
    """Per-round ``b / gamma_n(t)`` (Theorem 1), their sum, and the accountant's Laplace composition."""
    g = np.asarray(gamma_n_schedule, dtype=float)
    eps_round = np.array([paper.dpps_round_epsilon(b, float(x)) for x in g])
    check_delta(delta)
    if eps_round.max() > 50:
        # per-round eps this large: numerical accountants break down and no composition theorem beats
        # the basic sum by anything that matters; the basic sum is a valid bound for pure-DP steps.
        composed = float(eps_round.sum())
        warnings.warn(
            f"DPPS per-round eps b/gamma_n reaches {eps_round.max():.3g}: no meaningful DP guarantee", stacklevel=2
        )
    else:
        composed = rigorous_epsilon([LaplaceStep(float(x) / b) for x in g], delta, accountant=accountant)
    return DPPSAccounting(eps_round, float(eps_round.sum()), composed, delta)
