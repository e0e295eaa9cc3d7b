"""The in-process backend: every node in one Python process, stepped in a fixed order.

This is the reference semantics (one algorithm, many backends): the Ray
and relay backends must reproduce its numbers bit for bit on CPU.  All three run the one
iteration protocol, :func:`flower_dp.gossip.protocol.run_protocol_iteration`; here its phases
are plain calls on the nodes (:class:`InProcessPhases`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .messages import IterationLog, Node, Share
from .protocol import check_routing, route_shares, run_protocol_iteration

__all__ = ["run_iteration", "run_iterations", "route_shares", "check_routing", "InProcessPhases"]


class InProcessPhases:
    """The phases of :func:`flower_dp.gossip.protocol.run_protocol_iteration` on nodes in this process."""

    def __init__(self, nodes: Sequence[Node], order: Sequence[int] | None = None) -> None:
        self.network_ids = [n.node_id for n in nodes]
        self.by_id = {n.node_id: n for n in nodes}
        self.node_ids = list(order) if order is not None else self.network_ids

    def contribute(self, k: int) -> dict[int, Any]:
        return {i: self.by_id[i].contribute(k) for i in self.node_ids}

    def local_step(self, k: int, reduced: dict[str, Any] | None) -> dict[int, list[Share]]:
        return {i: self.by_id[i].local_step(k, reduced) for i in self.node_ids}

    def exchange(self, k: int, outboxes: dict[int, list[Share]]) -> dict[int, list[Share]]:
        return outboxes

    def mix(self, k: int, inboxes: dict[int, list[Share]]) -> None:
        for i in self.node_ids:
            self.by_id[i].mix(inboxes[i])


def run_iteration(
    nodes: Sequence[Node],
    k: int,
    receivers: Callable[[int, int], Sequence[int]] | None = None,
    order: Sequence[int] | None = None,
) -> IterationLog:
    """Run iteration ``k`` on all ``nodes`` (contribute -> reduce -> local_step -> mix).

    Parameters
    ----------
    nodes : sequence of Node
        All nodes of the network; ``nodes[i].node_id`` must equal ``i``.
    k : int
        Global iteration.
    receivers : callable (sender, k) -> out-neighbours, optional
        When given, each outbox is checked against it.
    order : sequence of int, optional
        Order in which nodes are stepped (default: node id); results must not depend on it.
    """
    return run_protocol_iteration(InProcessPhases(nodes, order), k, receivers)


def run_iterations(
    nodes: Sequence[Node],
    k_start: int,
    k_stop: int,
    receivers: Callable[[int, int], Sequence[int]] | None = None,
    on_iteration: Callable[[IterationLog], None] | None = None,
) -> list[IterationLog]:
    """Run iterations ``k_start .. k_stop - 1``; returns one log per iteration."""
    logs = []
    for k in range(k_start, k_stop):
        log = run_iteration(nodes, k, receivers)
        logs.append(log)
        if on_iteration is not None:
            on_iteration(log)
    return logs
