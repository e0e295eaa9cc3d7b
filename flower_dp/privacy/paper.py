"""The papers' own calibration formulas, by explicit name.

These are *reported*, never trusted: each was checked against a numerical accountant and found that its paper's
formula does not deliver the stated (eps, delta) at the paper's own settings.  Each
calibration in :mod:`flower_dp.privacy.calibration` that uses one of these also reports
the rigorous eps of the noise it gives.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import check_delta, check_epsilon, check_int, check_positive

__all__ = [
    "paper_sigma_privsgp_vr",
    "k_star_privsgp_vr",
    "paper_sigma_dp_csgp",
    "paper_sigma_gau_lrq",
    "paper_eps_gau_lrq",
    "gau_lrq_dynamic_noise_multipliers",
    "gau_lrq_dynamic_sigmas",
    "gau_lrq_dynamic_round_epsilons",
    "dpps_round_epsilon",
    "dpps_basic_composition",
]


def paper_sigma_privsgp_vr(
    epsilon: float, delta: float, *, num_iters: int, J: int, G: float, c2: float, vr: bool = True
) -> float:
    """PrivSGP-VR Theorem 2, eq. (11): ``sigma_i = 3 c2 G sqrt(K log(1/delta)) / (J eps)``.

    ``vr=False`` (PrivSGP) drops the factor 3 (the paper gives no formula for it).  ``c2`` has no default:
    the paper never gives it (0.3724 reproduces its K* = 3120).
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    check_positive("c2", c2, hint="the paper never gives c2; 0.3724 reproduces its K* = 3120")
    num_iters, J = check_int("num_iters", num_iters, minimum=1), check_int("J", J, minimum=1)
    G = check_positive("G", G)
    factor = 3.0 if vr else 1.0
    return factor * c2 * G * math.sqrt(num_iters * math.log(1 / delta)) / (J * epsilon)


def k_star_privsgp_vr(
    epsilons, deltas, *, J: int, n_nodes: int, A: float, L: float, d: int, G: float, c2: float
) -> float:
    """PrivSGP-VR eq. (12): ``K* = A J^2 n / (216 L d c2^2 G^2 S)``, ``S = sum_i log(1/delta_i) / eps_i^2``.

    Real-valued; runs use ``round(K*)``.
    """
    n_nodes, J = check_int("n_nodes", n_nodes, minimum=1), check_int("J", J, minimum=1)
    for name, v in (("A", A), ("L", L), ("G", G), ("c2", c2)):
        check_positive(name, v)
    d = check_int("d", d, minimum=1)
    eps = np.broadcast_to(np.asarray(epsilons, dtype=float), (n_nodes,))
    dels = np.broadcast_to(np.asarray(deltas, dtype=float), (n_nodes,))
    for e in eps:
        check_epsilon(float(e))
    for dl in dels:
        check_delta(float(dl))
    S = float(np.sum(np.log(1 / dels) / eps**2))
    return A * J**2 * n_nodes / (216 * L * d * c2**2 * G**2 * S)


def paper_sigma_dp_csgp(epsilon: float, delta: float, *, num_iters: int, J: int, G: float, c2: float = 1.0) -> float:
    """DP-CSGP Prop. 2, eq. (10): ``sigma = c2 G sqrt(T ln(1/delta)) / (J eps)`` (std on the batch-mean gradient)."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    check_int("num_iters", num_iters, minimum=1)
    check_int("J", J, minimum=1)
    check_positive("G", G)
    check_positive("c2", c2)
    return c2 * G * math.sqrt(num_iters * math.log(1 / delta)) / (J * epsilon)


def paper_sigma_gau_lrq(epsilon: float, delta: float, *, S2: float, num_rounds: int, B: int, N: int) -> float:
    """Gau-LRQ Lemma 1 inverted: ``sigma = 2 S2 sqrt(K B ln(1/delta)) / (N eps)`` (per client, per coordinate)."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    check_positive("S2", S2)
    num_rounds, N = check_int("num_rounds", num_rounds, minimum=1), check_int("N", N, minimum=1)
    B = check_int("B", B, minimum=1, maximum=N)
    return 2 * S2 * math.sqrt(num_rounds * B * math.log(1 / delta)) / (N * epsilon)


def paper_eps_gau_lrq(noise_multipliers, delta: float, *, B: int, N: int) -> float:
    """Gau-LRQ's closed form (Lemma 4) in noise-multiplier terms: ``eps = 2 q sqrt(ln(1/delta) sum_k 1/z_k^2)``, q = B/N,
    z_k the ``noise_multipliers`` per round."""
    z = np.asarray(noise_multipliers, dtype=float)
    return float(2 * (B / N) * math.sqrt(math.log(1 / check_delta(delta)) * np.sum(1 / z**2)))


def gau_lrq_dynamic_noise_multipliers(epsilon: float, delta: float, *, num_rounds: int, B: int, N: int,
                                      tau: float) -> np.ndarray:
    """Dynamic Gau-LRQ (eq. 17/18) noise multipliers ``z_k = sqrt(C' G tau^(k/2))``.

    ``C' = 4 B^2 ln(1/delta) / (N^2 eps^2)``, ``G = sum_{i<K} tau^(-i/2)``; ``sigma_k = z_k S2 / sqrt(B)``.
    ``tau = 1`` gives the fixed scheme.
    """
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    tau = check_positive("tau", tau)
    if tau > 1:
        raise ValueError(f"tau must be in (0, 1] (loss decay rate; 1 = fixed scheme), got {tau}")
    K = check_int("num_rounds", num_rounds, minimum=1)
    N = check_int("N", N, minimum=1)
    B = check_int("B", B, minimum=1, maximum=N)
    Cp = 4 * B**2 * math.log(1 / delta) / (N**2 * epsilon**2)
    G = float(np.sum(tau ** (-np.arange(K) / 2)))
    return np.sqrt(Cp * G * tau ** (np.arange(K) / 2))



def dpps_round_epsilon(b: float, gamma_n: float) -> float:
    """DPPS Theorem 1: one round is ``b / gamma_n``-DP (pure, per node-message, estimated sensitivity)."""
    return check_positive("b", b) / check_positive("gamma_n", gamma_n)


def dpps_basic_composition(b: float, gamma_n_schedule) -> float:
    """Basic sequential composition ``sum_t b / gamma_n(t)`` (the paper composes nothing)."""
    g = np.asarray(gamma_n_schedule, dtype=float)
    return float(np.sum(check_positive("b", b) / g))


def gau_lrq_dynamic_sigmas(
    epsilon: float, delta: float, *, S2: float, num_rounds: int, B: int, N: int, tau: float
) -> np.ndarray:
    """Dynamic Gau-LRQ eq. (17/18): per-client per-coordinate ``sigma_k = sqrt(C G tau^(k/2))``.

    ``C = 4 S2^2 B ln(1/delta) / (N^2 eps^2)``, ``G = sum_{i<K} tau^(-i/2)``; shape (K,).
    Equals ``gau_lrq_dynamic_noise_multipliers(...) * S2 / sqrt(B)``; ``tau = 1`` gives :func:`paper_sigma_gau_lrq`.
    """
    z = gau_lrq_dynamic_noise_multipliers(epsilon, delta, num_rounds=num_rounds, B=B, N=N, tau=tau)
    return z * check_positive("S2", S2) / math.sqrt(B)


def gau_lrq_dynamic_round_epsilons(epsilon: float, *, num_rounds: int, tau: float) -> np.ndarray:
    """Per-round budgets of the dynamic scheme, ``eps_k = eps tau^(-k/4) / sqrt(G)`` (sum of squares = eps^2)."""
    epsilon = check_epsilon(epsilon)
    K = check_int("num_rounds", num_rounds, minimum=1)
    tau = check_positive("tau", tau)
    G = float(np.sum(tau ** (-np.arange(K) / 2)))
    return epsilon * tau ** (-np.arange(K) / 4) / math.sqrt(G)
