"""Per-algorithm calibrations for PrivSGP(-VR), DP-CSGP, Gau-LRQ and DPPS (re-exported by :mod:`.calibration`).

Each returns a frozen record with the noise to use, ``eps_rigorous`` (PLD/RDP for exactly
that noise), ``eps_paper`` (what the paper's formula claims) and ``warnings``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_choice, check_delta, check_epsilon, check_int, check_positive
from . import paper
from .accountant import GaussianStep, LaplaceStep, rigorous_epsilon
from .calibration import CALIBRATIONS, calibrate_noise_multiplier, calibrate_schedule

__all__ = [
    "GaussianCalibration",
    "privsgp_vr_calibration",
    "dp_csgp_calibration",
    "GauLRQCalibration",
    "gau_lrq_calibration",
    "DPPSAccounting",
    "dpps_accounting",
]


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


def _gaussian_record(calibration, epsilon, delta, q, K, nu, std, eps_paper, accountant, adjacency,
                     sampling="poisson", dataset_size=None) -> GaussianCalibration:
    step = GaussianStep(q, nu, K, sampling, dataset_size)
    eps_rig = rigorous_epsilon([step], delta, accountant=accountant, adjacency=adjacency)
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
    sampling: str = "poisson",
) -> GaussianCalibration:
    """Noise for one PrivSGP-VR (``vr=True``) / PrivSGP node (privsgp-vr.md 4.2, 4.5, 8.5, 8.6 DECISIONs).

    The released gradient is bounded by ``3G`` (VR) or ``G``; with blocks of ``b`` samples the
    block-mean has sensitivity ``3G / b`` and sampling rate ``q = b / J``.  ``noise_std`` is the
    std added to that block-mean gradient; ``nu = noise_std * b / (3G)``.  ``paper`` uses eq. (11)
    (``c2`` required; the formula is independent of b, spec 8.6).  ``sampling="without_replacement"``
    (one uniform block, the paper's literal sampling) needs ``adjacency="replace_one"`` and
    ``accountant="rdp"`` (dp-accounting supports it only there).
    """
    check_choice("calibration", calibration, CALIBRATIONS)
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    K, J, block = check_int("num_iters", num_iters, minimum=1), check_int("J", J, minimum=1), check_int("block", block, minimum=1)
    sens = (3.0 if vr else 1.0) * check_positive("G", G) / block
    q = min(1.0, block / J)
    if calibration == "paper":
        if c2 is None:
            raise ValueError("calibration='paper' needs c2 (the paper never gives it; 0.3724 reproduces K* = 3120)")
        std = paper.paper_sigma_privsgp_vr(epsilon, delta, num_iters=K, J=J, G=G, c2=c2, vr=vr)
        nu = std / sens
        eps_paper = epsilon
    else:
        nu = calibrate_noise_multiplier(epsilon, delta, q, K, accountant=accountant, adjacency=adjacency,
                                        sampling=sampling, dataset_size=J)
        std = nu * sens
        eps_paper = float("nan") if c2 is None else epsilon * paper.paper_sigma_privsgp_vr(
            epsilon, delta, num_iters=K, J=J, G=G, c2=c2, vr=vr) / std  # the formula's eps ~ 1/sigma
    return _gaussian_record(calibration, epsilon, delta, q, K, nu, std, eps_paper, accountant, adjacency,
                            sampling, J)


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
    warnings: tuple[str, ...] = ()


def dpps_accounting(b: float, gamma_n_schedule, delta: float, *, accountant: str = "pld") -> DPPSAccounting:
    """Per-round ``b / gamma_n(t)`` (Theorem 1), their sum, and the accountant's Laplace composition.

    Parameters
    ----------
    b : float > 0  the paper's privacy hyperparameter
    gamma_n_schedule : array_like, shape (T,)  noise rate per round (> 0)
    delta : float in (0, 1)  for the Laplace composition

    Each round is ``LaplaceStep(nu = gamma_n(t) / b)`` (scale over the *estimated* L1 sensitivity),
    so ``eps_composed`` is tagged heuristic: the guarantee needs ``S(t) >= Delta(t)``, which the
    estimator does not prove (dpps-partpsp.md 5.1).  Unit: one node's message per round.
    """
    b = check_positive("b", b)
    g = np.asarray(gamma_n_schedule, dtype=float)
    if g.ndim != 1 or g.size == 0 or not np.all(g > 0):
        raise ValueError(f"gamma_n_schedule must be a non-empty 1-D array of values > 0, got {g!r:.80}")
    eps_round = np.array([paper.dpps_round_epsilon(b, float(x)) for x in g])
    composed = rigorous_epsilon([LaplaceStep(float(x) / b) for x in g], check_delta(delta), accountant=accountant)
    notes = ["HEURISTIC: the sensitivity is an estimate published in the clear (dpps-partpsp.md 5.1)"]
    if eps_round.max() > 50:
        notes.append(f"DPPS per-round eps b/gamma_n reaches {eps_round.max():.3g}: no meaningful DP guarantee")
        warnings.warn(notes[-1], stacklevel=2)
    return DPPSAccounting(eps_round, float(eps_round.sum()), composed, delta, True, tuple(notes))
