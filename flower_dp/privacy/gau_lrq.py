"""Client-level accounting and calibration of (Dynamic) Gau-LRQ (Yan et al., arXiv:2312.07060, Sec. V, eqs. 16-18).

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
replacement gives 290.5, and a "Poisson approximation" table (12.2) is not a bound for
this sampler at all.

That number is the eps of one party, the observer of the released global models (the paper's adversary);
:mod:`.parties` states every party's view and charge (another client, a network observer who knows the sample,
the server), and a schedule is calibrated to the party it is given (``party``, default ``"model_observer"``).

The guarantee is client-level.  It is record-level only when clients hold disjoint data; the
experiments' client partitions (:func:`flower_dp.experiments.gau_lrq.client_data`) may overlap, so a
record held by several clients is protected at group level only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_choice, check_int, check_positive
from . import paper
from .accountant import DEFAULT_ACCOUNTANT, GaussianStep, rigorous_epsilon
from .calibration import calibrate_schedule
from .parties import (DEFAULT_PARTY, check_party, gau_lrq_eps_by_party, gau_lrq_party_epsilon,
                      network_observer_epsilon)

__all__ = ["client_level_epsilon", "client_level_steps", "Schedule", "gau_lrq_schedule", "calibrate_party_scale"]


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
    (per-client std ``sigma_k = z_k S2 / sqrt(B)``).  ``eps_rigorous``: the eps of ``party`` (the party the schedule
    is calibrated to, :mod:`.parties`) over all K rounds; ``eps_paper``: the closed form of Lemma 1/4 (not a valid
    bound, §5.2).  ``per_client_keys``: whether each client's randomness comes from a key only it and the server
    hold (another client is then charged an eps; without, it has none).
    """

    noise_multiplier: np.ndarray
    B: int
    N: int
    eps_rigorous: float
    eps_paper: float
    warnings: tuple[str, ...] = ()
    party: str = DEFAULT_PARTY["gau_lrq"]
    per_client_keys: bool = False

    def eps_after(self, rounds: int, delta: float, party: str | None = None) -> float | None:
        """eps of ``party`` (default: the calibrated one) after the first ``rounds`` rounds; None where no eps holds
        for that party (:func:`.parties.gau_lrq_party_epsilon`)."""
        return gau_lrq_party_epsilon(self.party if party is None else party, self.noise_multiplier[:rounds], delta,
                                     B=self.B, N=self.N, per_client_keys=self.per_client_keys)

    def eps_by_party(self, rounds: int, delta: float, heuristic_note: str | None = None) -> dict[str, dict]:
        """Every party's entry after the first ``rounds`` rounds (:func:`.parties.gau_lrq_eps_by_party`)."""
        return gau_lrq_eps_by_party(self.noise_multiplier[:rounds], delta, B=self.B, N=self.N,
                                    per_client_keys=self.per_client_keys, heuristic_note=heuristic_note)

    def eps_paper_after(self, rounds: int, delta: float) -> float:
        """The paper's closed form after the first ``rounds`` rounds."""
        return paper.paper_eps_gau_lrq(self.noise_multiplier[:rounds], delta, B=self.B, N=self.N) if rounds else 0.0

    def rounds_within(self, epsilon: float, delta: float) -> int:
        """Largest prefix of rounds whose rigorous eps (of the calibrated party) is <= epsilon."""
        return max((r for r in range(len(self.noise_multiplier) + 1) if self.eps_after(r, delta) <= epsilon), default=0)


def _no_eps(party: str, per_client_keys: bool) -> ValueError:
    why = ("no eps holds against the server (it decodes each client's update)" if party == "server" else
           "another client has no eps without per-client keys (every client holds the run secret)"
           if not per_client_keys else "there is no other client (N = 1)")
    return ValueError(f"cannot calibrate the noise to party={party!r}: {why}; calibrate to 'model_observer' (the "
                      "default), 'network_observer' or, with per-client keys, 'client'")


def calibrate_party_scale(party: str, shape: np.ndarray, epsilon: float, delta: float, *, B: int, N: int,
                          per_client_keys: bool = False) -> float:
    """The common scale s of ``z_k = s shape_k`` whose eps for ``party`` over the K rounds is at most ``epsilon``
    (within rel. tol 1e-3 of the root, on the private side): ``model_observer`` and ``client`` through
    :func:`.calibration.calibrate_schedule` with the party's sampling rate, population and noise; ``network_observer``
    by bisection of its GDP mixture (monotone in s)."""
    shape = np.asarray(shape, dtype=np.float64)
    if gau_lrq_party_epsilon(party, shape[:0], delta, B=B, N=N, per_client_keys=per_client_keys) is None:
        raise _no_eps(party, per_client_keys)
    if party == "model_observer":
        return calibrate_schedule(shape, epsilon, delta, B / N, accountant=DEFAULT_ACCOUNTANT,
                                  adjacency="replace_one", rel_tol=1e-3, sampling="fixed_size", dataset_size=N)
    if party == "client":
        f = 1.0 if B == 1 else float(np.sqrt((B - 1) / B))
        return calibrate_schedule(shape * f, epsilon, delta, min(B, N - 1) / (N - 1), accountant=DEFAULT_ACCOUNTANT,
                                  adjacency="replace_one", rel_tol=1e-3, sampling="fixed_size", dataset_size=N - 1)

    def eps(s: float) -> float:
        return network_observer_epsilon(s * shape, delta, B=B, N=N)

    lo, hi = 1e-3, 1.0
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"no noise scale up to 1e6 meets epsilon = {epsilon} at delta = {delta}")
    while eps(lo) <= epsilon and lo > 1e-9:
        hi, lo = lo, lo / 2.0
    while hi / lo > 1 + 1e-4:  # eps(hi) <= epsilon < eps(lo)
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if eps(mid) > epsilon else (lo, mid)
    return hi


def gau_lrq_schedule(*, epsilon: float, delta: float, num_rounds: int, B: int, N: int, tau: float = 1.0,
                     calibration: str = "rigorous", noise_multiplier: float | None = None,
                     party: str | None = None, per_client_keys: bool = False) -> Schedule:
    """Noise multipliers z_k for K rounds (fixed, or eqs. 17-18), charged to ``party`` (:mod:`.parties`; default
    ``"model_observer"``, the paper's adversary).

    - ``noise_multiplier`` given: constant z (budget-stop mode; the budget decides the rounds).
    - ``calibration="paper"``: ``z_k = sqrt(C' G tau^(k/2))`` (eq. 17/18; tau = 1: Alg. 1 line 2).
    - ``calibration="rigorous"``: the same shape ``z_k ∝ tau^(k/4)``, one common scale solved until ``party``'s
      eps over K rounds is <= epsilon (private side, rel. tol 1e-3, :func:`calibrate_party_scale`): the noise
      that meets the target, no more.
    """
    check_choice("calibration", calibration, ("rigorous", "paper"))
    party = check_party("gau_lrq", party)
    K = check_int("num_rounds", num_rounds, minimum=1)
    N = check_int("N", N, minimum=1)
    B = check_int("B", B, minimum=1, maximum=N)
    if gau_lrq_party_epsilon(party, [], delta, B=B, N=N, per_client_keys=per_client_keys) is None:
        raise _no_eps(party, per_client_keys)
    z_paper = paper.gau_lrq_dynamic_noise_multipliers(epsilon, delta, num_rounds=K, B=B, N=N, tau=tau)
    if noise_multiplier is not None:
        z = np.full(K, check_positive("noise_multiplier", noise_multiplier))
    elif calibration == "paper":
        z = z_paper
    else:
        shape = z_paper / z_paper[0]
        try:
            scale = calibrate_party_scale(party, shape, epsilon, delta, B=B, N=N, per_client_keys=per_client_keys)
        except ValueError as exc:
            raise ValueError(f"cannot calibrate the noise multiplier z (noise std on the sum over S2) to epsilon = "
                             f"{epsilon} at delta = {delta} for party {party!r} over K = {K} rounds with B = {B} of "
                             f"N = {N} clients, got ({exc}); raise epsilon, or lower K or B / N") from exc
        z = scale * shape
    eps_r = gau_lrq_party_epsilon(party, z, delta, B=B, N=N, per_client_keys=per_client_keys)
    warn = ()
    if noise_multiplier is None and eps_r > epsilon * 1.001:
        warn = (f"paper calibration: the rigorous client-level eps of this schedule for party {party!r} is "
                f"{eps_r:.4g}, above the target {epsilon} (the closed form is not a valid bound)",)
    return Schedule(z, B, N, eps_r, paper.paper_eps_gau_lrq(z, delta, B=B, N=N), warn, party, bool(per_client_keys))
