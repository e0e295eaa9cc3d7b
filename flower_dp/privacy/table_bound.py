"""The privacy bound of fixed blocks whose gradients a table carries forward (PrivSGP-VR).

A table step (``sampling="fixed_size_table"``) is one of ``1/q`` fixed blocks drawn per step, with the drawn
block's gradient kept in a table that later releases read.  Conditioned on the block draws the run is a
composition of Gaussian releases, so it is GDP with a parameter fixed by the draws; mixing over the binomial law
of the draws gives ``delta(eps)`` (:func:`table_history_epsilon` states the argument).
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedEventError
from .steps import TABLE_SAMPLING, GaussianStep, Step

__all__ = ["table_epsilon", "table_history_epsilon", "table_history_delta", "has_table_steps"]


def table_parts(merged: tuple[Step, ...], adjacency: str) -> tuple[float, float, int, float]:
    """(q, nu, count, mu_always^2) of a history with table-sampled steps (:func:`table_history_epsilon`)."""
    table = [s for s in merged if isinstance(s, GaussianStep) and s.sampling == TABLE_SAMPLING]
    other = [s for s in merged if s not in table]
    if adjacency != "replace_one":
        raise UnsupportedEventError(f"sampling={TABLE_SAMPLING!r} is accounted under adjacency='replace_one' only, got "
                                    f"adjacency={adjacency!r}")
    if any(not isinstance(s, GaussianStep) or s.q < 1 for s in other) or len({s.q for s in table}) != 1:
        raise UnsupportedEventError(f"a history with sampling={TABLE_SAMPLING!r} steps may hold only unsampled Gaussian "
                                    "steps beside them, all table steps at one q; got "
                                    f"{sorted({(type(s).__name__, getattr(s, 'q', None)) for s in merged})}")
    mu_always_sq = sum(s.count * (2.0 / s.noise_multiplier) ** 2 for s in other)
    return table[0].q, min(s.noise_multiplier for s in table), sum(s.count for s in table), mu_always_sq


def table_mixture(q: float, count: int, mu_hit_sq, mu_always_sq):
    """``delta(eps)`` of the table bound (:func:`table_history_epsilon`) as a function of an eps array of shape (m,), for
    the rows of ``mu_hit_sq`` / ``mu_always_sq`` (broadcast to (m, 1), or scalars):
    ``E_n[delta_G(eps; sqrt(n mu_hit^2 + mu_always^2))]``, n ~ Binomial(count, q).  Binomial weights below
    1e-300 are left out of the sum and their mass added whole (delta_G <= 1), so nothing is dropped."""
    from scipy import special, stats

    n = np.arange(count + 1, dtype=np.float64)
    w = stats.binom.pmf(n, count, q)
    keep = w > 1e-300
    dropped = float(w[~keep].sum())
    n, w = n[keep][None, :], w[keep][None, :]
    mu = np.sqrt(n * np.reshape(mu_hit_sq, (-1, 1)) + np.reshape(mu_always_sq, (-1, 1)))

    def delta(eps: np.ndarray) -> np.ndarray:
        e = np.reshape(eps, (-1, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            d = special.ndtr(mu / 2 - e / mu) - np.exp(e + special.log_ndtr(-mu / 2 - e / mu))
        d = np.where(mu > 0, np.clip(d, 0.0, 1.0), 0.0)
        return np.minimum(1.0, (w * d).sum(axis=1) + dropped)

    return delta


def table_epsilon(q: float, count: int, mu_hit_sq, mu_always_sq, delta: float) -> np.ndarray:
    """eps at ``delta`` of the table bound, vectorised over rows (:func:`table_mixture`): the smallest eps with
    ``delta(eps) <= delta``, by bisection to 2^-50 of the bracket, rounded up (0 when ``delta(0) <= delta``,
    ``inf`` above 1e6).  Shape (m,)."""
    mixture = table_mixture(q, count, mu_hit_sq, mu_always_sq)
    rows = np.broadcast_shapes(np.shape(np.reshape(mu_hit_sq, (-1, 1))), np.shape(np.reshape(mu_always_sq, (-1, 1))))[0]
    lo, hi = np.zeros(rows), np.ones(rows)
    while (grow := mixture(hi) > delta).any() and hi.max() <= 1e6:
        hi = np.where(grow, hi * 2.0, hi)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        over = mixture(mid) > delta
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
    return np.where(mixture(hi) > delta, np.inf, np.where(mixture(np.zeros(rows)) <= delta, 0.0, hi))


def table_history_epsilon(merged: tuple[Step, ...], adjacency: str, delta: float) -> float:
    """eps at ``delta`` of a history with table-sampled steps (PrivSGP-VR): :func:`table_epsilon` of
    ``E_n[delta_G(eps; mu(n))]``, n ~ Binomial(K, q).

    PrivSGP-VR releases ``h - T[blk] + avg(T)`` plus Gaussian noise; the table T holds each block's gradient
    from the step that last drew it, so every later release (through ``avg(T)`` and ``T[blk]``) depends on
    which earlier steps drew the target's block: the draws are hidden state shared between steps, and the
    composition of per-step subsampled pairs (which treats each step's draw as fresh and unseen) is not a
    proof for it.  Conditioned on the whole draw sequence s (independent of the data, equal in both
    neighbouring datasets), the run is an adaptive composition of Gaussian releases whose replace-one shifts
    are fixed by s: ``2/nu`` (in noise units) at each of the n(s) steps that draw the target's block, 0 at the
    others, and ``2/nu_a`` for the table average at every step, whatever step last refreshed it.  So it is
    ``mu(s)``-GDP, ``mu(s)^2 = n(s) (2/nu)^2 + sum (2/nu_a)^2`` (Dong, Roth & Su 2022, Cor. 3.3), and by joint
    convexity of the hockey-stick divergence over the common law of s, ``delta(eps) <= E_s[delta_G(eps;
    mu(s))]`` with ``n(s) ~ Binomial(K, q)`` (one of ``1/q`` blocks drawn uniformly per step).  Table steps at
    several noise levels are all charged at the smallest.
    """
    q, nu, count, mu_a2 = table_parts(merged, adjacency)
    return float(table_epsilon(q, count, (2.0 / nu) ** 2, mu_a2, delta)[0])


def table_history_delta(merged: tuple[Step, ...], adjacency: str, epsilon: float) -> float:
    """delta(eps) of a history with table-sampled steps (the bound of :func:`table_history_epsilon`)."""
    q, nu, count, mu_a2 = table_parts(merged, adjacency)
    return float(table_mixture(q, count, (2.0 / nu) ** 2, mu_a2)(np.array([epsilon]))[0])


def has_table_steps(merged: tuple[Step, ...]) -> bool:
    return any(isinstance(s, GaussianStep) and s.sampling == TABLE_SAMPLING for s in merged)
