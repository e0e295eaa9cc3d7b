"""A paper's claims, checked on a reproduction's records: :class:`Claim` (the claim, our numbers, the verdict and
whether the compared cells differ by more than their seed spread) and the helpers that collect a claim's cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from .render import fmt

__all__ = ["DISCRIMINATION_FACTOR", "Claim", "seed_values", "pooled_seed_values", "seed_means", "cells_of"]

#: a claim discriminates when the range of its cells' means exceeds this many times the largest seed std of a cell
DISCRIMINATION_FACTOR = 2.0


@dataclass(frozen=True)
class Claim:
    """A paper's claim checked on our records.

    cells : the cells the claim compares, each ``(name, per-seed values)`` of the quantity compared (accuracy, bits,
            sensitivity...); empty when the claim compares no cells (a bound, a property of each run).  They decide
            whether the claim discriminates (:meth:`discriminates`): a comparison that holds while its cells are equal
            within the seed spread holds only because nothing differs.
    ordered : the claim orders its cells (A > B > C, in the order given): the gap that must exceed the spread is
            the smallest between neighbours, since every step of the ordering has to be resolved; otherwise the range
            of the cell means.
    """

    name: str
    passed: bool | None  # None = could not be checked at this scale
    detail: str
    cells: tuple[tuple[str, tuple[float, ...]], ...] = ()
    ordered: bool = False

    def _spread(self) -> tuple[float, float, int] | None:
        """(the gap between the cell means: their range, or for an ordered claim the smallest neighbour gap; the
        largest seed std of a cell (ddof 1); the fewest seeds of a cell); None: fewer than two cells with values."""
        vals = [[float(v) for v in vs if v is not None and math.isfinite(float(v))] for _, vs in self.cells]
        vals = [v for v in vals if v]
        if len(vals) < 2:
            return None
        means = [sum(v) / len(v) for v in vals]
        stds = [float(np.std(v, ddof=1)) for v in vals if len(v) > 1]
        gap = (min(abs(a - b) for a, b in zip(means, means[1:])) if self.ordered else max(means) - min(means))
        return gap, max(stds) if stds else float("nan"), min(len(v) for v in vals)

    def discriminates(self) -> bool | None:
        """Whether the cells differ beyond the seed spread: the range of their means exceeds
        :data:`DISCRIMINATION_FACTOR` x the largest seed std of a cell.  None when it cannot be told: fewer than two
        cells with values, or a cell with one seed (no spread measured)."""
        sp = self._spread()
        if sp is None or sp[2] < 2:
            return None
        gap, std, _ = sp
        return bool(gap > DISCRIMINATION_FACTOR * std)

    def discrimination(self) -> str:
        """The report's "discriminates?" entry: the verdict, the gap between the cells and the seed spread."""
        sp = self._spread()
        if sp is None:
            return "n/a (compares no cells)"
        gap, std, n_min = sp
        if n_min < 2:
            return f"n/a (one seed: no spread; gap between the cells {fmt(gap)})"
        ratio = gap / std if std > 0 else float("inf")
        what = "smallest step" if self.ordered and len(self.cells) > 2 else "gap"
        return (f"{'yes' if self.discriminates() else '**no**'}: {what} {fmt(gap)} = {fmt(ratio, 1)} x the largest "
                f"seed std {fmt(std)} (needs > {DISCRIMINATION_FACTOR:g})")

    def verdict(self) -> str:
        """The report's verdict; a claim that holds while its cells are equal within the seed spread is "holds, not
        discriminating", counted apart from the reproduced ones."""
        if self.passed and self.discriminates() is False:
            return "holds, not discriminating"
        return {True: "**reproduced**", False: "**not reproduced**", None: "not checkable at this scale"}[self.passed]


def seed_values(g: dict[str, Any] | None, key: str = "final_acc") -> tuple[float, ...]:
    """The per-seed values of ``key`` in a grouped row (:func:`group_records`): what a :class:`Claim`'s cell holds."""
    if g is None:
        return ()
    return tuple(float(r.get(key, float("nan"))) for r in g.get("records", []))


def pooled_seed_values(groups: Iterable[dict[str, Any] | None], key: str = "final_acc") -> tuple[float, ...]:
    """Per seed, the mean of ``key`` over several grouped rows (a claim about an average over cells): one value
    per seed present in every row."""
    per: dict[Any, list[float]] = {}
    rows = [g for g in groups if g is not None]
    for g in rows:
        for r in g.get("records", []):
            per.setdefault(r.get("seed"), []).append(float(r.get(key, float("nan"))))
    return tuple(sum(v) / len(v) for v in per.values() if len(v) == len(rows))


def seed_means(records: Iterable[dict[str, Any]], key: str = "final_acc") -> tuple[float, ...]:
    """Per seed, the mean of ``key`` over ``records`` (several configurations of one arm of a claim)."""
    per: dict[Any, list[float]] = {}
    for r in records:
        per.setdefault(r.get("seed"), []).append(float(r.get(key, float("nan"))))
    return tuple(sum(v) / len(v) for v in per.values())


def cells_of(*named: tuple[str, dict[str, Any] | None], key: str = "final_acc"
             ) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """:attr:`Claim.cells` from ``(name, grouped row)`` pairs: each row's per-seed ``key`` (missing rows left out)."""
    return tuple((name, seed_values(g, key)) for name, g in named if g is not None)
