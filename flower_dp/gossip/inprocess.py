"""The in-process backend: every node in one Python process, stepped in a fixed order.

This is the reference semantics (DESIGN.md "One algorithm, many backends"): the Ray
and relay backends must reproduce its numbers bit for bit on CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .messages import IterationLog, Node, Share, reduce_contributions

__all__ = ["run_iteration", "run_iterations", "route_shares", "check_routing"]


def check_routing(sender: int, shares: Sequence[Share], expected_receivers: Sequence[int] | None, k: int) -> None:
    """Check that a node's outbox goes exactly to its out-neighbours plus itself."""
    got = sorted(s.receiver for s in shares)
    if len(set(got)) != len(got):
        raise ValueError(f"node {sender} sent two shares to the same receiver at k={k}: receivers {got}")
    for s in shares:
        if s.sender != sender or s.k != k:
            raise ValueError(f"node {sender} produced a share labelled sender={s.sender}, k={s.k} at k={k}")
    if expected_receivers is not None:
        want = sorted(set(expected_receivers) | {sender})
        if got != want:
            raise ValueError(
                f"node {sender} at k={k} sent to {got} but its out-neighbours plus itself are {want}; "
                "the node's topology disagrees with the backend's"
            )


def route_shares(outboxes: dict[int, list[Share]], node_ids: Sequence[int]) -> dict[int, list[Share]]:
    """Group shares by receiver, each inbox sorted by sender (canonical summation order)."""
    inboxes: dict[int, list[Share]] = {i: [] for i in node_ids}
    for sender in sorted(outboxes):
        for s in outboxes[sender]:
            if s.receiver not in inboxes:
                raise ValueError(f"node {sender} sent a share to unknown node {s.receiver}; nodes are {sorted(inboxes)}")
            inboxes[s.receiver].append(s)
    for i in inboxes:
        inboxes[i].sort(key=lambda s: s.sender)
    return inboxes


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
    ids = [n.node_id for n in nodes]
    by_id = {n.node_id: n for n in nodes}
    seq = list(order) if order is not None else ids
    contribs: dict[int, Any] = {i: by_id[i].contribute(k) for i in seq}
    reduced = reduce_contributions(contribs)
    outboxes: dict[int, list[Share]] = {}
    for i in seq:
        shares = by_id[i].local_step(k, reduced)
        check_routing(i, shares, receivers(i, k) if receivers else None, k)
        outboxes[i] = shares
    inboxes = route_shares(outboxes, ids)
    for i in seq:
        by_id[i].mix(inboxes[i])
    bits = {i: int(sum(s.wire_bits for s in outboxes[i] if s.receiver != i)) for i in ids}
    return IterationLog(k=k, bits_sent=bits, reduced=reduced)


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
