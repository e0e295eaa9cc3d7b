"""Client-level accounting and calibration of (Dynamic) Gau-LRQ (spec ``gau-lrq.md`` §5.2-5.3, §6.2-6.3).

Each round the server draws exactly B of the N clients uniformly without replacement; the sum of
their clipped updates (L2 <= S2) carries ``N(0, (z_k S2)^2 I)`` (LRQ's decoding error, or the
Gaussian of Gau-SGD / QG-SGD); the neighbouring relation is replace-one *client* (a client's whole
update replaced, so the sum moves by up to 2 S2).  That is :class:`~.accountant.GaussianStep` with
``sampling="fixed_size"``, ``q = B/N``, ``nu = z_k`` under ``adjacency="replace_one"``, accounted with
the PLD of the symmetrised dominating pair of ``((1-q) N(0, z^2) + q N(2, z^2), N(0, z^2))``
(:mod:`.replace_one`: proven for sampling without replacement at every order) or RDP's bound for
sampling without replacement, whichever is smaller.

At the paper's MNIST setting (z = 0.51624, K = 30, N = 1920, B = 80, delta = 1e-5) this is 51.23 (the
pair itself, composed in each order, attains 50.42: a lower bound); RDP's bound for sampling without
replacement gives 290.5, and the "Poisson approximation" of the spec's table (12.2) is not a bound for
this sampler at all.

The guarantee is client-level.  It is record-level only when clients hold disjoint data; the
experiments' client partitions (:func:`flower_dp.experiments.gau_lrq.client_data`) may overlap, so a
record held by several clients is protected at group level only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_choice, check_int, check_positive
from . import paper
from .accountant import DEFAULT_ACCOUNTANT, GaussianStep, rigorous_epsilon
from .calibration import calibrate_schedule

__all__ = ["client_level_epsilon", "client_level_steps", "Schedule", "gau_lrq_schedule"]


def client_level_steps(noise_multiplier, *, B: int, N: int) -> list[GaussianStep]:
    """The accountant steps of rounds with noise multipliers ``noise_multiplier`` (z_k: std on the sum / S2), B of N
    clients."""
    N = check_int("N", N, minimum=1)
    B = check_int("B", B, minimum=1, maximum=N)
    z = np.asarray(noise_multiplier, dtype=np.float64).ravel()
    vals, counts = np.unique(z, return_counts=True)
    return [GaussianStep(B / N, float(v), int(c), "fixed_size", N) for v, c in zip(vals, counts)]


def client_level_epsilon(noise_multiplier, delta: float, *, B: int, N: int,
                         accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """Rigorous client-level eps of rounds with noise multipliers ``noise_multiplier`` (z_k, shape (k,)) at
    ``delta``; 0 for no rounds.

    Each round: B of N clients uniformly without replacement, sum of clipped updates plus
    ``N(0, (z_k S2)^2 I)``, replace-one client adjacency; the smallest of the valid bounds (PLD of the
    symmetrised dominating pair, RDP), see the module docstring.
    """
    z = np.asarray(noise_multiplier, dtype=np.float64).ravel()
    if z.size == 0:
        return 0.0
    return rigorous_epsilon(client_level_steps(z, B=B, N=N), delta, accountant=accountant, adjacency="replace_one")


@dataclass(frozen=True)
class Schedule:
    """Per-round noise multipliers of (Dynamic) Gau-LRQ and what they cost.

    ``noise_multiplier`` : shape (K,), z_k, std of the noise on the SUM of the B clipped updates over S2
    (per-client std ``sigma_k = z_k S2 / sqrt(B)``).  ``eps_rigorous``: :func:`client_level_epsilon`
    over all K rounds; ``eps_paper``: the closed form of Lemma 1/4 (not a valid bound, §5.2).
    """

    noise_multiplier: np.ndarray
    B: int
    N: int
    eps_rigorous: float
    eps_paper: float
    warnings: tuple[str, ...] = ()

    def eps_after(self, rounds: int, delta: float) -> float:
        """Rigorous eps after the first ``rounds`` rounds."""
        return client_level_epsilon(self.noise_multiplier[:rounds], delta, B=self.B, N=self.N)

    def eps_paper_after(self, rounds: int, delta: float) -> float:
        """The paper's closed form after the first ``rounds`` rounds."""
        return paper.paper_eps_gau_lrq(self.noise_multiplier[:rounds], delta, B=self.B, N=self.N) if rounds else 0.0

    def rounds_within(self, epsilon: float, delta: float) -> int:
        """Largest prefix of rounds whose rigorous eps is <= epsilon."""
        return max((r for r in range(len(self.noise_multiplier) + 1) if self.eps_after(r, delta) <= epsilon), default=0)


def gau_lrq_schedule(*, epsilon: float, delta: float, num_rounds: int, B: int, N: int, tau: float = 1.0,
                     calibration: str = "rigorous", noise_multiplier: float | None = None) -> Schedule:
    """Noise multipliers z_k for K rounds (spec §5.3, §6.2-6.3).

    - ``noise_multiplier`` given: constant z (budget-stop mode; the budget decides the rounds).
    - ``calibration="paper"``: ``z_k = sqrt(C' G tau^(k/2))`` (eq. 17/18; tau = 1: Alg. 1 line 2).
    - ``calibration="rigorous"``: the same shape ``z_k ∝ tau^(k/4)``, one common scale bisected
      until :func:`client_level_epsilon` over K rounds is <= epsilon (private side, rel. tol 1e-3):
      the noise that meets the target, no more.
    """
    check_choice("calibration", calibration, ("rigorous", "paper"))
    K = check_int("num_rounds", num_rounds, minimum=1)
    N = check_int("N", N, minimum=1)
    B = check_int("B", B, minimum=1, maximum=N)
    z_paper = paper.gau_lrq_dynamic_noise_multipliers(epsilon, delta, num_rounds=K, B=B, N=N, tau=tau)
    if noise_multiplier is not None:
        z = np.full(K, check_positive("noise_multiplier", noise_multiplier))
    elif calibration == "paper":
        z = z_paper
    else:
        shape = z_paper / z_paper[0]
        try:
            scale = calibrate_schedule(shape, epsilon, delta, B / N, accountant=DEFAULT_ACCOUNTANT,
                                       adjacency="replace_one", rel_tol=1e-3, sampling="fixed_size", dataset_size=N)
        except ValueError as exc:
            raise ValueError(f"cannot calibrate the noise multiplier z (noise std on the sum over S2) to epsilon = "
                             f"{epsilon} at delta = {delta} over K = {K} rounds with B = {B} of N = {N} clients, got "
                             f"({exc}); raise epsilon, or lower K or B / N") from exc
        z = scale * shape
    eps_r = client_level_epsilon(z, delta, B=B, N=N)
    warn = ()
    if noise_multiplier is None and eps_r > epsilon * 1.001:
        warn = (f"paper calibration: the rigorous client-level eps of this schedule is {eps_r:.4g}, above the "
                f"target {epsilon} (the closed form is not a valid bound, spec §5.2)",)
    return Schedule(z, B, N, eps_r, paper.paper_eps_gau_lrq(z, delta, B=B, N=N), warn)
