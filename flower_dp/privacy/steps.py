"""The steps a privacy history is made of, and their merging into few noise levels.

A history is a sequence of frozen value objects: :class:`GaussianStep` (``count`` subsampled
Gaussian releases with a noise multiplier relative to the per-record clip bound) and :class:`LaplaceStep`
(``count`` Laplace releases).  :func:`bucket_steps` merges equal steps and, for long schedules, rounds the noise
multipliers DOWN onto a grid first (less noise can only raise eps, so the accounted eps stays an upper bound).
The accountant (:mod:`flower_dp.privacy.accountant`) composes what this module merges.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from .._checks import check_choice, check_int, check_positive, check_probability
from ..errors import UnsupportedEventError

__all__ = ["GaussianStep", "LaplaceStep", "Step", "SAMPLINGS", "TABLE_SAMPLING", "SAMPLING_ALIASES", "MAX_BUCKETS",
           "POWER_GRID", "DEFAULT_BUCKET_REL", "bucket_steps"]

SAMPLINGS = ("poisson", "fixed_size", "fixed_size_table")
#: one of fixed blocks whose gradient a table keeps for later releases (PrivSGP-VR):
#: :func:`flower_dp.privacy.table_bound.table_history_epsilon`
TABLE_SAMPLING = "fixed_size_table"
#: the older name of ``"fixed_size"``, still accepted
SAMPLING_ALIASES = {"without_replacement": "fixed_size"}
#: ``bucket_rel="auto"`` keeps at most this many distinct noise levels
MAX_BUCKETS = 72
#: ``"auto"`` bucketing rounds noise levels onto a grid uniform in ``noise_multiplier**-POWER_GRID`` (``_power_keys``)
POWER_GRID = 2.0
DEFAULT_BUCKET_REL = "auto"


@dataclass(frozen=True)
class GaussianStep:
    """``count`` subsampled Gaussian releases with noise multiplier ``noise_multiplier`` (std / per-record clip
    bound C).

    Parameters
    ----------
    q : float in (0, 1]
        Sampling rate (Poisson: inclusion probability; without replacement: B / dataset_size).
    noise_multiplier : float > 0
        Noise std divided by C (``inf`` = no release, costs nothing).
    count : int >= 0
    sampling : {"poisson", "fixed_size", "fixed_size_table"}  (``"without_replacement"`` is an alias of
        ``"fixed_size"``; ``"fixed_size_table"``: fixed blocks whose gradients a table carries into later
        releases, PrivSGP-VR, charged by :func:`flower_dp.privacy.table_bound.table_history_epsilon`)
    dataset_size : int or None
        Required for ``fixed_size``: the population the batch is drawn from (``q * dataset_size``
        must be an integer: the batch size, or 1 for one of ``dataset_size`` fixed blocks).
    """

    q: float
    noise_multiplier: float
    count: int = 1
    sampling: str = "poisson"
    dataset_size: int | None = None

    def __post_init__(self) -> None:
        check_probability("q", self.q, hint="q is the sampling rate B/J")
        check_positive("noise_multiplier", self.noise_multiplier, allow_inf=True,
                       hint="noise_multiplier is the noise std divided by the clip bound")
        check_int("count", self.count, minimum=0)
        object.__setattr__(self, "sampling", SAMPLING_ALIASES.get(self.sampling, self.sampling))
        check_choice("sampling", self.sampling, SAMPLINGS)
        if self.sampling in ("fixed_size", TABLE_SAMPLING):
            if self.dataset_size is None:
                raise ValueError(f"dataset_size is required for sampling={self.sampling!r} (the population B is drawn "
                                 "from), got None")
            n = check_int("dataset_size", self.dataset_size, minimum=1)
            b = self.q * n
            if abs(b - round(b)) > 1e-6 * max(1.0, b):
                raise ValueError(f"q * dataset_size must be an integer batch size, got {self.q} * {n} = {b}")


@dataclass(frozen=True)
class LaplaceStep:
    """``count`` Laplace releases with scale / L1-sensitivity = ``noise_multiplier`` (pure
    ``1/noise_multiplier``-DP each)."""

    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier, allow_inf=True,
                       hint="noise_multiplier is the Laplace scale divided by the L1 sensitivity")
        check_int("count", self.count, minimum=0)


Step = GaussianStep | LaplaceStep


def _round_down(nu: float, rel: float) -> float:
    if rel <= 0 or math.isinf(nu):
        return nu
    base = math.log1p(rel)
    # the tiny epsilon keeps exact grid points on themselves despite float error
    return math.exp(math.floor(math.log(nu) / base + 1e-9) * base)


def _merge(steps: Iterable[Step], rel: float) -> OrderedDict[tuple, int]:
    """Counts per (rounded-down) step key, in order of first appearance; zero counts dropped."""
    merged: OrderedDict[tuple, int] = OrderedDict()
    for s in steps:
        if isinstance(s, GaussianStep):
            key = ("g", float(s.q), _round_down(float(s.noise_multiplier), rel), s.sampling, s.dataset_size)
        elif isinstance(s, LaplaceStep):
            key = ("l", _round_down(float(s.noise_multiplier), rel))
        else:
            raise UnsupportedEventError(f"unsupported privacy step {s!r}; use GaussianStep or LaplaceStep")
        if s.count:
            merged[key] = merged.get(key, 0) + int(s.count)
    return merged


def _steps_of(merged: OrderedDict[tuple, int]) -> list[Step]:
    return [GaussianStep(k[1], k[2], c, k[3], k[4]) if k[0] == "g" else LaplaceStep(k[1], c) for k, c in merged.items()]


def _bucket_fixed(steps: list[Step], rel: float) -> list[Step]:
    return _steps_of(_merge(steps, rel))


def _power_keys(merged: OrderedDict[tuple, int], levels: int) -> OrderedDict[tuple, int]:
    """Round each finite ``nu`` DOWN onto ``levels`` points equally spaced in ``nu^-POWER_GRID`` (per step kind).

    A Gaussian step's privacy loss grows like ``1/nu^2`` (RDP ``~ q^2 alpha / nu^2`` for small q), so a
    grid uniform in ``nu^-2`` spreads the rounding error evenly over the levels; a geometric grid in
    ``nu`` spends most of its points where the noise is large and the loss small.  Measured on a
    Dyn-D2P schedule (300 distinct levels, 96 points): +0.66 % eps over the exact value against +1.1 %
    for the geometric grid, at the same cost.  Works on the keys of :func:`_merge` (no step objects:
    30,000 levels are merged in ~0.1 s).
    """
    grids: dict[str, tuple[float, float]] = {}
    for kind, pos in (("g", 2), ("l", 1)):
        us = [k[pos] ** -POWER_GRID for k in merged if k[0] == kind and math.isfinite(k[pos])]
        if us:
            grids[kind] = (min(us), (max(us) - min(us)) / max(1, levels - 1))

    def down(nu: float, kind: str) -> float:
        if not math.isfinite(nu):
            return nu
        u0, du = grids[kind]
        if du <= 0:
            return nu
        k = math.ceil((nu ** -POWER_GRID - u0) / du - 1e-9)  # the next grid point up in u: less noise
        return min(nu, (u0 + k * du) ** (-1 / POWER_GRID))

    out: OrderedDict[tuple, int] = OrderedDict()
    for k, c in merged.items():
        key = ("g", k[1], down(k[2], "g"), k[3], k[4]) if k[0] == "g" else ("l", down(k[1], "l"))
        out[key] = out.get(key, 0) + c
    return out


def bucket_steps(
    steps: Iterable[Step], bucket_rel: float | str = DEFAULT_BUCKET_REL, *, max_buckets: int = MAX_BUCKETS
) -> list[Step]:
    """Merge steps with equal (rounded-down) noise levels; order of first appearance kept, counts added.

    ``bucket_rel``: relative grid step of a geometric grid in ``nu`` (0 = exact merging only) or
    ``"auto"``: exact merging when that leaves at most ``max_buckets`` levels, else the finest grid
    uniform in ``nu^-2`` (:func:`_power_keys`) that does.  Rounding is always down (less noise),
    so the accounted eps is an upper bound on the exact one.
    """
    if bucket_rel != "auto":
        return _bucket_fixed(steps, float(bucket_rel))
    exact = _merge(steps, 0.0)
    if len(exact) <= max_buckets or not any(math.isfinite(k[2] if k[0] == "g" else k[1]) for k in exact):
        return _steps_of(exact)
    levels = max_buckets
    while True:  # several (q, sampling) groups share one grid: shrink it until the merged history fits
        merged = _power_keys(exact, levels)
        if len(merged) <= max_buckets or levels <= 2:
            return _steps_of(merged)
        levels = max(2, int(levels * 0.8))
