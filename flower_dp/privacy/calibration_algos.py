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
from .accountant import (SAMPLING_ALIASES, SAMPLINGS, TABLE_SAMPLING, GaussianStep, LaplaceStep, rigorous_epsilon,
                         table_epsilon)
from .calibration import CALIBRATIONS, calibrate, calibrate_noise_multiplier, calibrate_schedule

__all__ = [
    "GaussianCalibration",
    "privsgp_vr_calibration",
    "dp_csgp_calibration",
    "DPPSAccounting",
    "dpps_accounting",
]


@dataclass(frozen=True)
class GaussianCalibration:
    """A constant-noise Gaussian calibration: the std to add, the accountant steps it means, and both eps.

    One noise release per iteration, described once: ``noise_std`` is what the node draws,
    :meth:`steps` is what the accountant charges for it.  The sampled part has multiplier
    ``noise_multiplier`` (std over the per-record clip unit) with rate ``q`` and ``sampling``;
    ``noise_multiplier_always`` (PrivSGP-VR's
    table average, present at every step whichever block is drawn) is a non-sampled Gaussian
    charged alongside (``inf``: none).
    """

    calibration: str
    epsilon: float
    delta: float
    q: float
    num_iters: int
    noise_multiplier: float
    noise_std: float
    eps_rigorous: float
    eps_paper: float
    warnings: tuple[str, ...] = ()
    sampling: str = "poisson"
    dataset_size: int | None = None
    noise_multiplier_always: float = math.inf
    adjacency: str = "add_remove"

    def steps(self, count: int | None = None) -> list[GaussianStep]:
        """The accountant steps of ``count`` iterations (default: all ``num_iters``)."""
        count = self.num_iters if count is None else count
        return _step_pair(self.q, self.noise_multiplier, self.noise_multiplier_always, count, self.sampling,
                          self.dataset_size)


def _step_pair(q, nu, nu_always, count, sampling, dataset_size) -> list[GaussianStep]:
    if math.isfinite(nu_always) and sampling == "fixed_size":  # PrivSGP-VR: the table carries the draws forward
        sampling = TABLE_SAMPLING
    out = [GaussianStep(q, nu, count, sampling, dataset_size if sampling != "poisson" else None)]
    if math.isfinite(nu_always):
        out.append(GaussianStep(1.0, nu_always, count))
    return out


def _gaussian_record(calibration, epsilon, delta, q, K, nu, std, eps_paper, accountant, adjacency,
                     sampling="poisson", dataset_size=None, nu_always=math.inf) -> GaussianCalibration:
    sampling = SAMPLING_ALIASES.get(sampling, sampling)
    steps = _step_pair(q, nu, nu_always, K, sampling, dataset_size)
    eps_rig = rigorous_epsilon(steps, delta, accountant=accountant, adjacency=adjacency)
    notes = ()
    if eps_rig > epsilon * 1.001:
        notes = (f"{calibration} calibration: rigorous eps = {eps_rig:.4g} exceeds the target {epsilon}",)
    return GaussianCalibration(calibration, epsilon, delta, q, K, nu, std, eps_rig, eps_paper, notes, sampling,
                               dataset_size if sampling == "fixed_size" else None, nu_always, adjacency)


#: candidate shares of the noise variance given to PrivSGP-VR's always-present table term
_TABLE_SHARES = np.geomspace(1e-4, 0.5, 60)


def _vr_table_share(q: float, K: int, c_sampled: float, c_always: float, std: float, delta: float) -> float:
    """Share ``a`` of the variance that the always-present term gets: the grid point with the least eps under
    PrivSGP-VR's table bound (:func:`flower_dp.privacy.accountant.table_epsilon`), all grid points at once.

    Splitting one Gaussian ``N(0, std^2)`` into independent ``N(0, (1-a) std^2) + N(0, a std^2)`` and
    charging each part for its own sensitivity is valid for every ``a`` (the release is a post-processing
    of the two parts), so the choice only affects tightness; it depends on public values only.  The eps of
    the chosen split is the minimum over the grid of continuous functions of ``std``, so it is continuous in
    ``std`` and a calibration can meet its target closely.
    """
    a = _TABLE_SHARES
    # in noise units: mu_hit = 2 c_sampled / (std sqrt(1 - a)), mu_always = 2 c_always / (std sqrt(a)) at every step
    eps = table_epsilon(q, K, (2.0 * c_sampled) ** 2 / ((1 - a) * std**2), K * (2.0 * c_always) ** 2 / (a * std**2),
                        delta)
    return float(a[int(np.argmin(eps))])


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
    accountant: str = "auto",
    adjacency: str | None = None,
    sampling: str = "fixed_size",
    noise_std: float | None = None,
) -> GaussianCalibration:
    """Noise for one PrivSGP-VR (``vr=True``) / PrivSGP / DP2-SGD node (PrivSGP-VR, Theorem 2, eq. 11).

    ``sampling="fixed_size"`` (PrivSGP, PrivSGP-VR: the code splits the data once into ``J // block``
    fixed blocks and draws one uniformly per step, ``q = 1 / (J // block)``), replace-one adjacency
    (the default for it; add/remove is refused).  Per-sample gradients are clipped to ``G``:

    - PrivSGP releases the block mean ``h``: replacing one record moves it by ``2G / b``, so the
      per-record unit is ``C = G / b`` and ``nu = noise_std / C``.
    - PrivSGP-VR releases ``h - T[blk] + avg``.  When the target's block is drawn, ``h - T[blk]`` moves
      by up to ``4G / b`` (unit ``C = 2G / b``); the table average ``avg`` moves by up to
      ``2G / (b n_blocks)`` at *every* step, drawn or not.  The noise is split (validly) into
      a sampled part with variance share ``1 - a`` (``nu``) and an always-present part with share ``a``
      (``nu_always``, unit ``G / (b n_blocks)``), ``a`` chosen on public values to minimise eps.

    ``sampling="poisson"`` (DP2-SGD, A(DP)2SGD: Poisson batches of expected size ``block`` = B,
    ``q = B / J``, unit ``C = G / B``, add/remove by default).

    ``paper`` uses eq. (11) (``c2`` required; the formula is independent of b).
    ``noise_std`` given: that std (> 0), split and accounted the same way (``eps_paper`` is nan).
    """
    check_choice("calibration", calibration, CALIBRATIONS)
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    K, J, block = check_int("num_iters", num_iters, minimum=1), check_int("J", J, minimum=1), check_int("block", block, minimum=1)
    G = check_positive("G", G)
    sampling = check_choice("sampling", SAMPLING_ALIASES.get(sampling, sampling), SAMPLINGS)
    if adjacency is None:
        adjacency = "replace_one" if sampling == "fixed_size" else "add_remove"
    if sampling == "fixed_size":
        if adjacency != "replace_one":
            raise ValueError(f"fixed-size blocks are accounted under adjacency='replace_one' only, got {adjacency!r}; "
                             "leave adjacency unset (removing a record would change the blocks)")
        n_blocks = J // block
        if n_blocks < 1:
            raise ValueError(f"block = {block} exceeds J = {J}, got no block; lower the block size")
        q, population = 1.0 / n_blocks, n_blocks
    else:
        if vr:
            raise ValueError("PrivSGP-VR draws fixed blocks; sampling='poisson' is for DP2-SGD / A(DP)2SGD")
        q, population = min(1.0, block / J), None
    c_sampled = (2.0 if vr else 1.0) * G / block
    c_always = G / (block * population) if vr else math.inf

    def split(std: float) -> tuple[float, float]:
        if not vr:
            return std / c_sampled, math.inf
        a = _vr_table_share(q, K, c_sampled, c_always, std, delta)
        return std * math.sqrt(1 - a) / c_sampled, std * math.sqrt(a) / c_always

    def eps_of(std: float) -> float:
        nu, nu_a = split(std)
        return rigorous_epsilon(_step_pair(q, nu, nu_a, K, sampling, population), delta, accountant=accountant,
                                adjacency=adjacency)

    if noise_std is not None:
        std, eps_paper = check_positive("noise_std", noise_std), float("nan")
    elif calibration == "paper":
        if c2 is None:
            raise ValueError("calibration='paper' needs c2 (the paper never gives it; 0.3724 reproduces K* = 3120)")
        std = paper.paper_sigma_privsgp_vr(epsilon, delta, num_iters=K, J=J, G=G, c2=c2, vr=vr)
        eps_paper = epsilon
    else:
        if vr:
            nu0 = calibrate_noise_multiplier(epsilon, delta, q, K, accountant=accountant, adjacency=adjacency,
                                             sampling=sampling, dataset_size=population)
            s0 = nu0 * c_sampled  # the sampled part alone: a lower end for the total std
            std = calibrate(eps_of, epsilon, s0, s0 * 1.5, rel_tol=2e-3, name="noise std")
        else:
            std = calibrate_noise_multiplier(epsilon, delta, q, K, accountant=accountant, adjacency=adjacency,
                                             sampling=sampling, dataset_size=population) * c_sampled
        eps_paper = float("nan") if c2 is None else epsilon * paper.paper_sigma_privsgp_vr(
            epsilon, delta, num_iters=K, J=J, G=G, c2=c2, vr=vr) / std  # the formula's eps ~ 1/sigma
    nu, nu_a = split(std)
    return _gaussian_record(calibration, epsilon, delta, q, K, nu, std, eps_paper, accountant, adjacency,
                            sampling, population, nu_a)


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
    accountant: str = "auto",
) -> GaussianCalibration:
    """Noise std on the batch-mean clipped gradient for DP-CSGP (its Proposition 2).

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
class DPPSAccounting:
    """DPPS/PartPSP privacy numbers: per-round paper eps, basic composition, and a Laplace
    composition over rounds.  HEURISTIC: the sensitivity is an estimate published in the clear."""

    eps_round_paper: np.ndarray = field(repr=False)
    eps_basic: float
    eps_composed: float
    delta: float
    heuristic: bool = True
    warnings: tuple[str, ...] = ()


def dpps_accounting(b: float, gamma_n_schedule, delta: float, *, accountant: str = "auto") -> DPPSAccounting:
    """Per-round ``b / gamma_n(t)`` (Theorem 1), their sum, and the accountant's Laplace composition.

    Parameters
    ----------
    b : float > 0  the paper's privacy hyperparameter
    gamma_n_schedule : array_like, shape (T,)  noise rate per round (> 0)
    delta : float in (0, 1)  for the Laplace composition

    Each round is ``LaplaceStep(nu = gamma_n(t) / b)`` (scale over the *estimated* L1 sensitivity),
    so ``eps_composed`` is tagged heuristic: the guarantee needs ``S(t) >= Delta(t)``, which the
    estimator does not prove (the paper's Theorem 1 assumes the real sensitivity).  Unit: one node's message per round.
    """
    b = check_positive("b", b)
    g = np.asarray(gamma_n_schedule, dtype=float)
    if g.ndim != 1 or g.size == 0 or not np.all(g > 0):
        raise ValueError(f"gamma_n_schedule must be a non-empty 1-D array of values > 0, got {g!r:.80}")
    eps_round = np.array([paper.dpps_round_epsilon(b, float(x)) for x in g])
    composed = rigorous_epsilon([LaplaceStep(float(x) / b) for x in g], check_delta(delta), accountant=accountant)
    notes = ["HEURISTIC: the sensitivity is an estimate published in the clear"]
    if eps_round.max() > 50:
        notes.append(f"DPPS per-round eps b/gamma_n reaches {eps_round.max():.3g}: no meaningful DP guarantee")
        warnings.warn(notes[-1], stacklevel=2)
    return DPPSAccounting(eps_round, float(eps_round.sum()), composed, delta, True, tuple(notes))
