"""The privacy a run spent, read from its nodes' privacy reports.

Every push-sum node reports its own eps (:meth:`flower_dp.clients.base.PushSumNode.privacy_report`); a run has
spent the largest of them.  :func:`largest_node_spend` picks it and says which bound it is, for the
``privacy_spent()`` of a run result and of :class:`flower_dp.strategies.PushSumStrategy`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

__all__ = ["NodeSpend", "largest_node_spend"]


class NodeSpend(NamedTuple):
    """The eps spent at ``delta`` over ``num_releases`` releases, and the accounting that gave it."""

    epsilon: float
    delta: float
    num_releases: int
    accounting_method: str


def largest_node_spend(per_node: list[dict[str, Any]]) -> NodeSpend | None:
    """The largest rigorous eps over the nodes' reports at their delta (the DPPS family: the heuristic composition,
    labelled so); None when there is no report or no node is private (eps = inf)."""
    if not per_node:
        return None
    rep = max(per_node, key=lambda r: float(r.get("eps_rigorous") or r.get("eps_heuristic") or 0.0))
    heuristic = rep.get("eps_rigorous") is None
    eps = float(rep["eps_heuristic"] if heuristic else rep["eps_rigorous"])
    if math.isinf(eps):
        return None
    how = ("heuristic: composed Laplace releases of an estimated sensitivity, no DP proof" if heuristic else
           f"flower-dp: {rep.get('accountant', 'auto')} accountant, {rep.get('adjacency', '')} record-level, "
           "largest over the nodes")
    return NodeSpend(eps, float(rep["delta"]), int(rep.get("steps_charged", 0)), how)
