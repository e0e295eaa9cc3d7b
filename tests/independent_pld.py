"""An independent two-sided numeric privacy-loss-distribution (PLD) accountant, for tests only.

Written from scratch with numpy/scipy (no dp-accounting, no prv-accountant), so that the project's
accountant can be checked against a second, unrelated path.

Mechanism: one release of a sum with L2 sensitivity ``s`` plus ``N(0, sigma^2)`` noise, optionally
with sampling rate ``q``.  Its dominating pair (both orders are composed separately, and the larger
eps is reported)::

    P = (1 - q) N(0, sigma^2) + q N(s, sigma^2),   Q = N(0, sigma^2)

- order ``"remove"``: the loss ``L(x) = log P(x)/Q(x)`` with ``x ~ P`` (``L >= log(1 - q)``);
- order ``"add"``: the loss ``-L(x)`` with ``x ~ Q`` (``<= -log(1 - q)``).

``q = 1`` is the plain Gaussian mechanism (both orders coincide).  Under replace-one with a fixed-size
sample the pair ``Pair(q, sigma=nu, s=2)`` is attained (a lower bound); :func:`symmetrised_bracket` brackets
its symmetrisation, the proven bound.

Discretization on a grid of width ``h``: the loss distribution's CDF is computed in closed form
(``x(t) = L^{-1}(t)`` and the normal CDF), and the mass of each interval is put on its upper end
(pessimistic: the loss is rounded UP) or its lower end (optimistic: rounded DOWN).  For
``delta(eps) = E[(1 - e^{eps - Y})_+] + P(Y = inf)``, increasing in ``Y`` for the usual stochastic
order, and sums of independent losses preserve that order, so the pessimistic composition's delta
upper-bounds the true one and the optimistic one's lower-bounds it.  Tails are truncated
conservatively in each direction: pessimistic sends the upper tail to ``+inf`` (it counts fully in
delta) and the lower tail onto the lowest kept point (rounding up); optimistic drops the lower tail
(``-inf``, counts zero) and puts the upper tail on the highest kept point (rounding down).
Composition: FFT convolution (equal steps by repeated squaring), with the same truncation after
each convolution.  The eps bracket width is at most ``(number of steps) * h``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, signal, special

__all__ = ["Pair", "DiscretePLD", "single_pld", "compose", "self_compose", "delta_at", "epsilon_at",
           "eps_bracket", "symmetrised", "symmetrised_bracket", "gaussian_delta", "gaussian_epsilon"]

ORDERS = ("remove", "add")


@dataclass(frozen=True)
class Pair:
    """The dominating pair ``((1-q) N(0, sigma^2) + q N(s, sigma^2), N(0, sigma^2))``."""

    q: float
    sigma: float
    s: float = 1.0

    def __post_init__(self):
        if not (0.0 < self.q <= 1.0) or not self.sigma > 0 or not self.s > 0:
            raise ValueError(f"need 0 < q <= 1, sigma > 0, s > 0, got {self}")


@dataclass
class DiscretePLD:
    """Mass ``probs[j]`` at loss ``(offset + j) * h``, plus ``inf_mass`` at ``+inf``."""

    h: float
    offset: int
    probs: np.ndarray
    inf_mass: float
    pessimistic: bool

    @property
    def losses(self) -> np.ndarray:
        return (self.offset + np.arange(self.probs.size)) * self.h


def _loss(pair: Pair, x):
    """``L(x) = log((1 - q) + q exp((2 x s - s^2) / (2 sigma^2)))``."""
    a = (2.0 * x * pair.s - pair.s ** 2) / (2.0 * pair.sigma ** 2)
    if pair.q == 1.0:
        return a
    return np.logaddexp(math.log1p(-pair.q), math.log(pair.q) + a)


def _x_of_loss(pair: Pair, t):
    """``L^{-1}(t)`` (``-inf`` for ``t <= log(1 - q)``)."""
    t = np.asarray(t, dtype=float)
    if pair.q == 1.0:
        lg = t
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = -(1.0 - pair.q) * np.exp(-t)
            lg = np.where(inner > -1.0, t + np.log1p(np.maximum(inner, -1.0)), -np.inf) - math.log(pair.q)
    return pair.sigma ** 2 / pair.s * lg + pair.s / 2.0


def _cdf_sf(pair: Pair, order: str, t):
    """(P(loss <= t), P(loss > t)) of the given order, each computed directly (no 1 - x cancellation)."""
    t = np.asarray(t, dtype=float)
    sg, s, q = pair.sigma, pair.s, pair.q
    if order == "remove":  # x ~ P, loss = L(x) increasing in x
        x = _x_of_loss(pair, t)
        cdf = (1 - q) * special.ndtr(x / sg) + q * special.ndtr((x - s) / sg)
        sf = (1 - q) * special.ndtr(-x / sg) + q * special.ndtr(-(x - s) / sg)
    else:  # x ~ Q, loss = -L(x):  loss <= t  <=>  x >= L^{-1}(-t)
        x = _x_of_loss(pair, -t)
        cdf = special.ndtr(-x / sg)
        sf = special.ndtr(x / sg)
    return cdf, sf


def single_pld(pair: Pair, h: float, *, order: str = "remove", pessimistic: bool = True,
               tail: float = 1e-13) -> DiscretePLD:
    """The discretized PLD of one release (see the module docstring for the rounding)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    z = -special.ndtri(tail)  # Phi(-z) = tail
    sg, s = pair.sigma, pair.s
    if order == "remove":
        t_lo, t_hi = float(_loss(pair, -z * sg)), float(_loss(pair, s + z * sg))
    else:
        t_lo, t_hi = float(-_loss(pair, z * sg)), float(-_loss(pair, -z * sg))
    k_lo, k_hi = math.floor(t_lo / h) - 1, math.ceil(t_hi / h) + 1
    edges = np.arange(k_lo - 1, k_hi + 1) * h  # e_{k_lo - 1} .. e_{k_hi}
    cdf, sf = _cdf_sf(pair, order, edges)
    # mass of (e_{k-1}, e_k] for k = k_lo .. k_hi, from whichever of cdf / sf is small (precision)
    mass = np.where(cdf[1:] < 0.5, cdf[1:] - cdf[:-1], sf[:-1] - sf[1:])
    mass = np.maximum(mass, 0.0)
    below, above = float(cdf[0]), float(sf[-1])
    if pessimistic:  # interval (e_{k-1}, e_k] -> e_k; below -> lowest point; above -> +inf
        mass[0] += below
        return DiscretePLD(h, k_lo, mass, above, True)
    # optimistic: interval (e_{k-1}, e_k] -> e_{k-1}; below dropped (-inf); above -> highest point
    mass[-1] += above
    return DiscretePLD(h, k_lo - 1, mass, 0.0, False)


def _truncate(p: DiscretePLD, tail: float) -> DiscretePLD:
    probs = np.maximum(p.probs, 0.0)  # FFT round-off
    lo_cum = np.cumsum(probs)
    hi_cum = np.cumsum(probs[::-1])[::-1]
    i0 = int(np.searchsorted(lo_cum, tail, side="right"))  # probs[:i0] sum <= tail
    i1 = int(np.searchsorted(-hi_cum, -tail, side="left"))  # probs[i1:] sum <= tail (first i1 with hi_cum <= tail)
    i0 = min(i0, probs.size - 1)
    i1 = max(i1, i0 + 1)
    below = float(lo_cum[i0 - 1]) if i0 > 0 else 0.0
    above = float(hi_cum[i1]) if i1 < probs.size else 0.0
    kept = probs[i0:i1].copy()
    inf_mass = p.inf_mass
    if p.pessimistic:
        kept[0] += below
        inf_mass += above
    else:
        kept[-1] += above
    return DiscretePLD(p.h, p.offset + i0, kept, inf_mass, p.pessimistic)


def compose(a: DiscretePLD, b: DiscretePLD, *, tail: float = 1e-13) -> DiscretePLD:
    """The PLD of the composition (sum of independent losses), by FFT convolution."""
    if a.h != b.h or a.pessimistic != b.pessimistic:
        raise ValueError("compose PLDs on the same grid and with the same rounding")
    probs = signal.fftconvolve(a.probs, b.probs)
    inf_mass = 1.0 - (1.0 - a.inf_mass) * (1.0 - b.inf_mass)
    return _truncate(DiscretePLD(a.h, a.offset + b.offset, probs, inf_mass, a.pessimistic), tail)


def self_compose(a: DiscretePLD, n: int, *, tail: float = 1e-13) -> DiscretePLD | None:
    """``n``-fold composition of ``a`` with itself by repeated squaring (None for n = 0)."""
    out, base = None, a
    while n > 0:
        if n & 1:
            out = base if out is None else compose(out, base, tail=tail)
        n >>= 1
        if n:
            base = compose(base, base, tail=tail)
    return out


def _suffix(p: DiscretePLD):
    y = p.losses
    with np.errstate(over="ignore"):
        w = p.probs * np.exp(-y)
    A = np.cumsum(p.probs[::-1])[::-1]  # sum_{k >= j} p_k
    B = np.cumsum(w[::-1])[::-1]  # sum_{k >= j} p_k e^{-y_k}
    return y, A, B


def delta_at(p: DiscretePLD, eps: float) -> float:
    """``E[(1 - e^{eps - Y})_+] + P(Y = inf)``."""
    y = p.losses
    m = y > eps
    return float(np.sum(p.probs[m] * -np.expm1(eps - y[m])) + p.inf_mass)


def epsilon_at(p: DiscretePLD, delta: float) -> float:
    """The eps >= 0 with ``delta_at(p, eps) = delta`` (0 if delta_at(0) <= delta; inf if inf_mass >= delta).

    Exact for the discrete distribution: between consecutive support points delta(eps) = A - e^eps B.
    """
    if p.inf_mass >= delta:
        return math.inf
    if delta_at(p, 0.0) <= delta:
        return 0.0
    y, A, B = _suffix(p)
    # delta at eps = y_j (support points): sum over k > j
    with np.errstate(divide="ignore", over="ignore"):
        d_at = np.append(A[1:], 0.0) - np.exp(y + np.log(np.append(B[1:], 0.0))) + p.inf_mass
    # delta is decreasing in eps: find the first support point y_j >= 0 with delta(y_j) <= delta
    ok = (d_at <= delta) & (y >= 0)
    j = int(np.argmax(ok))
    if not ok[j]:
        return math.inf
    # on (y_{j-1}, y_j] the losses counted are k >= j: delta = A_j - e^eps B_j + inf
    target = A[j] + p.inf_mass - delta
    eps = math.log(target / B[j]) if target > 0 and B[j] > 0 else float(y[j])
    return float(min(max(eps, 0.0), y[j]))


def _steps_by_pair(steps):
    merged: dict[Pair, int] = {}
    for pair, count in steps:
        if count:
            merged[pair] = merged.get(pair, 0) + int(count)
    return merged


def composed_pld(steps, h: float, *, order: str, pessimistic: bool, tail: float = 1e-13) -> DiscretePLD | None:
    """Composition of ``steps`` (iterable of ``(Pair, count)``) in one order."""
    out = None
    for pair, count in sorted(_steps_by_pair(steps).items(), key=lambda kv: (kv[0].q, kv[0].sigma, kv[0].s)):
        one = self_compose(single_pld(pair, h, order=order, pessimistic=pessimistic, tail=tail), count, tail=tail)
        out = one if out is None else compose(out, one, tail=tail)
    return out


def eps_bracket(steps, delta: float, *, h: float = 1e-3, tail: float = 1e-13,
                orders=ORDERS) -> tuple[float, float]:
    """``(eps_lower, eps_upper)`` at ``delta`` of the composition of ``steps`` (``(Pair, count)`` pairs).

    The max over the two orders (add and remove), each composed over all steps.  The true eps of the
    pair's composition lies in the bracket (up to float and FFT round-off, ~1e-12 in delta).
    """
    steps = list(steps)
    if all(p.q == 1.0 for p, _ in steps):
        orders = ("remove",)  # a plain Gaussian: both orders give the same loss distribution
    lo = hi = 0.0
    for order in orders:
        pess = composed_pld(steps, h, order=order, pessimistic=True, tail=tail)
        opt = composed_pld(steps, h, order=order, pessimistic=False, tail=tail)
        if pess is None:
            continue
        hi = max(hi, epsilon_at(pess, delta))
        lo = max(lo, epsilon_at(opt, delta))
    return lo, hi


# ------------------------------------------------------------------ the symmetrised pair (replace-one subsampling)
def symmetrised(p: DiscretePLD) -> DiscretePLD:
    """The symmetric pair whose losses above 0 are those of ``p``: mass ``m`` at ``l > 0``, ``e^{-l} m`` at ``-l``,
    the rest at 0 (Dong, Roth & Su 2022's symmetrisation ``min(f, f^-1)**`` of a pair whose remove order dominates).

    Its ``delta(eps)`` for ``eps >= 0`` reads only the losses above ``eps``, so it is ``p``'s there; a symmetric pair
    is fixed by that half of its profile.  With ``p`` rounded up (pessimistic) the result dominates the exact
    symmetrised pair, rounded down (optimistic) it is dominated by it, and composition keeps both orders.
    """
    y = p.losses
    pos = y > 0
    yp, mp = y[pos], p.probs[pos]
    if yp.size == 0:
        return DiscretePLD(p.h, 0, np.array([1.0 - p.inf_mass]), p.inf_mass, p.pessimistic)
    kp = np.rint(yp / p.h).astype(np.int64)
    top = int(kp.max())
    mirror = mp * np.exp(-yp)
    zero = 1.0 - p.inf_mass - mp.sum() - mirror.sum()
    if zero < -1e-12:
        raise ValueError(f"no symmetrisation on this grid (mass {zero:.3g} at loss 0); use a finer h")
    probs = np.zeros(2 * top + 1)
    probs[top + kp] = mp
    probs[top - kp] += mirror
    probs[top] += max(zero, 0.0)
    return DiscretePLD(p.h, -top, probs, p.inf_mass, p.pessimistic)


def symmetrised_bracket(steps, delta: float, *, h: float = 1e-3, tail: float = 1e-13) -> tuple[float, float]:
    """``(eps_lower, eps_upper)`` of the composition of the steps' symmetrised pairs (``(Pair, count)`` pairs)."""
    out = {}
    for pessimistic in (True, False):
        comp = None
        for pair, count in sorted(_steps_by_pair(steps).items(), key=lambda kv: (kv[0].q, kv[0].sigma, kv[0].s)):
            one = symmetrised(single_pld(pair, h, order="remove", pessimistic=pessimistic, tail=tail))
            one = self_compose(one, count, tail=tail)
            comp = one if comp is None else compose(comp, one, tail=tail)
        out[pessimistic] = 0.0 if comp is None else epsilon_at(comp, delta)
    return out[False], out[True]


# ------------------------------------------------------------------ closed form (Balle & Wang 2018)
def gaussian_delta(eps: float, sigma: float, s: float = 1.0) -> float:
    """Exact delta(eps) of the Gaussian mechanism (sensitivity s, std sigma); Balle & Wang 2018, Thm 8."""
    a, b = s / (2 * sigma), eps * sigma / s
    return float(special.ndtr(a - b) - math.exp(eps) * special.ndtr(-a - b))


def gaussian_epsilon(delta: float, sigma: float, s: float = 1.0) -> float:
    """The exact eps of the Gaussian mechanism at ``delta`` (bisection on :func:`gaussian_delta`)."""
    if gaussian_delta(0.0, sigma, s) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(hi, sigma, s) > delta:
        hi *= 2
    return float(optimize.brentq(lambda e: gaussian_delta(e, sigma, s) - delta, 0.0, hi, xtol=1e-13, rtol=1e-13))
