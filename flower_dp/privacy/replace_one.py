"""The proven PLD of subsampled releases under replace-one adjacency: the symmetrised dominating pair.

A step releases the sum of the clipped values (L2 <= C) of a sample of records plus ``N(0, (nu C)^2 I)``;
under replace-one one record's value ``u`` becomes ``u'`` (``|u - u'| <= 2C``).  With the sample drawn
without replacement (B of N, or one of ``1/q`` fixed blocks; the same record indices in both datasets),
the output is ``(1 - q) M + q P1`` against ``(1 - q) M' + q Q1``, where ``M``, ``M'`` mix over the samples
without the target (equal under Poisson sampling, unequal without replacement) and the target's share
moves by at most 2C.  In units of C, write

    A = ((1 - q) N(0, nu^2) + q N(2, nu^2),  N(0, nu^2))

(the target at +C in D and -C in D', every other record at -C realises it exactly).

**Theorem used.** Zhu, Dong & Wang (2022, "Optimal accounting of differential privacy via characteristic
function", AISTATS), for subsampling without replacement under substitution: the pair ``A`` dominates
the step's hockey-stick divergence ``H_alpha`` for every ``alpha >= 1``, and its reverse ``A^R`` (the two
distributions swapped) dominates it for every ``alpha < 1``.  ``A`` alone is not a dominating pair: with
every other record at 0 the realisable pair ``((1-q) N(0) + q N(1), (1-q) N(0) + q N(-1))`` has a positive
``H_alpha`` at ``alpha < 1`` where ``A``'s is 0, and composing dominating pairs needs domination at every
``alpha >= 0`` (Zhu-Dong-Wang's composition theorem).  The pair ``S`` whose privacy profile is

    delta_S(eps) = delta_A(eps)  for eps >= 0,      delta_S(eps) = delta_{A^R}(eps)  for eps < 0

dominates the step at every ``alpha``.  ``S`` is the symmetrisation of ``A`` (Dong, Roth & Su 2022, "Gaussian
differential privacy", JRSS-B, Section 4: the trade-off function ``min(f, f^-1)**``), and it is a real pair:
its privacy-loss distribution (the law of ``log dP_S/dQ_S`` under ``P_S``) is

- on losses ``l > 0``: ``A``'s privacy-loss distribution restricted to ``l > 0``;
- on ``-l < 0``: ``e^{-l}`` times ``A``'s mass at ``l`` (the mirror image: ``S`` is symmetric);
- at 0: the rest, ``P_A(L <= 0) - Q_A(L > 0) >= 0``.

For ``eps >= 0``, ``delta(eps) = E[(1 - e^{eps - L})_+] + P(L = inf)`` reads only the losses above ``eps``,
so ``delta_S = delta_A`` there; by the symmetry ``delta_S(-eps) = 1 - e^{-eps} + e^{-eps} delta_S(eps)``,
which is ``delta_{A^R}(-eps)`` (the duality ``H_alpha(P||Q) = 1 - alpha + alpha H_{1/alpha}(Q||P)``).  ``S`` also
dominates ``A``'s own reverse order, so ``S`` is never below dp-accounting's two-order composition of ``A``;
and ``S^K`` (all steps composed) bounds the whole run.  The same construction covers Poisson sampling under
replace-one (``M = M'``; the same pair dominates) and unsampled steps (``q = 1``: ``A`` is the Gaussian pair,
symmetric already, and ``S`` equals it).

**Discretisation.** ``A``'s loss distribution is dp-accounting's pessimistic connect-the-dots PMF (Doroshenko
et al. 2022): a pair dominating ``A`` at every ``eps``, whose positive part therefore gives ``delta`` no lower than
``A``'s for ``eps >= 0``; symmetrising it keeps the mirror argument, so the result dominates ``S``.  Each step's
symmetrised PMF is checked to have a non-negative mass at 0, and (for ``q < 1``) that ``A``'s remove order
dominates its add order at every ``eps >= 0`` on the grid, so ``S`` is exactly the symmetrised trade-off
``min(f, f^-1)**``; a failed check raises instead of reporting.  The composition is
:func:`.fast_compose.compose_pmfs` (one FFT product, tail mass charged to infinity).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import fast_compose

__all__ = ["symmetrised_pmf", "step_pmf", "compose_symmetrised", "profile_on_grid"]

#: slack of the two checks (absolute, in delta / mass): float round-off of the PMFs, far below any reported delta
CHECK_TOL = 1e-12


def profile_on_grid(lower: int, probs: np.ndarray, inf_mass: float, h: float, js: np.ndarray) -> np.ndarray:
    """``delta(j h)`` of a discrete PLD (mass ``probs[i]`` at loss ``(lower + i) h``) for grid indices ``js``."""
    k = lower + np.arange(probs.size)
    # delta(j h) = sum_{k > j} p_k (1 - e^{(j - k) h}) + inf; suffix sums of p and of p e^{-(k - k_top) h}
    top = int(k[-1])
    w = probs * np.exp(-(k - top) * h)
    s_p = np.append(np.cumsum(probs[::-1])[::-1], 0.0)
    s_w = np.append(np.cumsum(w[::-1])[::-1], 0.0)
    i = np.clip(np.asarray(js) - lower + 1, 0, probs.size)   # first index with k > j
    with np.errstate(over="ignore"):
        return s_p[i] - np.exp((np.asarray(js) - top) * h) * s_w[i] + inf_mass


def symmetrised_pmf(lower: int, probs: np.ndarray, inf_mass: float, h: float) -> tuple[int, np.ndarray, float]:
    """The symmetric PLD (module doc) whose positive part is that of the given one; ``(lower, probs, inf_mass)``."""
    k = lower + np.arange(probs.size)
    pos = k > 0
    kp, mp = k[pos], probs[pos]
    if kp.size == 0:
        return 0, np.array([1.0 - inf_mass]), inf_mass
    top = int(kp.max())
    mirror = mp * np.exp(-kp * h)
    zero = 1.0 - inf_mass - float(mp.sum()) - float(mirror.sum())
    if zero < -CHECK_TOL:
        raise ArithmeticError(f"the symmetrised pair would put mass {zero:.3g} < 0 at loss 0; this step has no "
                              "symmetrisation on this grid (use a finer discretization)")
    out = np.zeros(2 * top + 1)
    out[top + kp] = mp
    out[top - kp] += mirror
    out[top] += max(zero, 0.0)
    return -top, out, inf_mass


def _dense(pmf) -> tuple[int, np.ndarray, float]:
    d = pmf.to_dense_pmf()
    return int(d._lower_loss), np.asarray(d._probs, dtype=np.float64), float(d._infinity_mass)


def step_pmf(kind: str, q: float, noise_multiplier: float, h: float) -> tuple[int, np.ndarray, float]:
    """The symmetrised PMF of one replace-one step (``kind`` ``"gaussian"`` or ``"laplace"``; ``noise_multiplier``
    per record, so the replace-one sensitivity 2 gives the unit-sensitivity multiplier ``noise_multiplier / 2``)."""
    nu = noise_multiplier
    from dp_accounting.pld import privacy_loss_distribution as pld

    if kind == "laplace":
        base = _dense(pld.from_laplace_mechanism(nu / 2.0, value_discretization_interval=h)._pmf_remove)
    elif q >= 1.0:
        base = _dense(pld.from_gaussian_mechanism(nu / 2.0, value_discretization_interval=h)._pmf_remove)
    else:
        base = fast_compose.subsampled_gaussian_pmf(q, nu / 2.0, h, add=False)
        add = fast_compose.subsampled_gaussian_pmf(q, nu / 2.0, h, add=True)
        hi = max(base[0] + base[1].size, add[0] + add[1].size)
        js = np.arange(0, hi + 1)
        gap = profile_on_grid(*add, h, js) - profile_on_grid(*base, h, js)
        if np.max(gap) > CHECK_TOL:
            j = int(js[np.argmax(gap)])
            raise ArithmeticError(f"q={q}, noise_multiplier={nu}: the add order's delta exceeds the remove order's at eps={j * h:.4g} "
                                  f"by {np.max(gap):.3g}; the symmetrised pair of the remove order is not the "
                                  "symmetrisation min(f, f^-1)** here")
    return symmetrised_pmf(*base, h)


def compose_symmetrised(steps: Sequence[tuple[str, float, float, int]], h: float,
                        tail: float = fast_compose.TAIL_MASS) -> fast_compose.FastPLD:
    """The composed symmetrised PLD of ``(kind, q, nu, count)`` steps; answers ``get_epsilon`` / ``get_delta``."""
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    pmfs = [step_pmf(kind, float(q), float(nu), h) for kind, q, nu, _ in steps]
    counts = np.asarray([int(c) for *_, c in steps], dtype=np.int64)
    composed = fast_compose.compose_pmfs(pmfs, counts, h, tail)
    return fast_compose.FastPLD(PrivacyLossDistribution(composed))

