"""The push-sum iteration protocol: one function that every backend runs.

One algorithm, many backends: the in-process loop (:mod:`.inprocess`), the Ray host actors
(:mod:`.ray_host`) and the server relay (:class:`flower_dp.gossip.relay.RelayPhases`, driven by the Flower strategy)
all run iteration ``k`` through :func:`run_protocol_iteration`.  It owns the order of the phases, the reduction, the
routing checks, the bit accounting and the routing::

    contribute (every node of the network) -> reduce_contributions -> local_step (the nodes held here)
    -> check_routing, bits -> exchange (shares cross to where their receivers live) -> route_shares -> mix

A backend is a :class:`Phases` object: it carries each phase out on the nodes it holds and moves what must cross to
other places (contributions, shares).  It adds no math and no ordering of its own; the call order per node is
``contribute(k)``, ``local_step(k, reduced)``, ``mix(inbox)`` on every backend, inboxes sorted by sender, and the
reduction runs in node-id order, so the numbers are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .messages import IterationLog, Share, reduce_contributions

__all__ = ["Phases", "run_protocol_iteration", "check_routing", "route_shares", "SegmentResult", "LocalNodes"]


class Phases(Protocol):
    """The phases of one iteration on the nodes a backend holds.

    Attributes
    ----------
    node_ids : sequence of int
        The nodes held here, in the order they are stepped.
    network_ids : sequence of int
        Every node of the network (a share to another id is refused).
    """

    node_ids: Sequence[int]
    network_ids: Sequence[int]

    def contribute(self, k: int) -> dict[int, Any]:
        """``contribute(k)`` on the nodes held here; returns the contributions of *every* node of the network
        (a backend holding only some nodes gathers the others')."""
        ...

    def local_step(self, k: int, reduced: dict[str, Any] | None) -> dict[int, list[Share]]:
        """``local_step(k, reduced)`` on the nodes held here; their outboxes by node id."""
        ...

    def exchange(self, k: int, outboxes: dict[int, list[Share]]) -> dict[int, list[Share]]:
        """Send the shares addressed to nodes held elsewhere, receive theirs; returns every share addressed to a node
        held here, grouped by sender (identity where every node is held here)."""
        ...

    def mix(self, k: int, inboxes: dict[int, list[Share]]) -> None:
        """``mix(inboxes[i])`` on every node ``i`` held here (a backend may defer the call, never reorder it)."""
        ...


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


def run_protocol_iteration(phases: Phases, k: int,
                           receivers: Callable[[int, int], Sequence[int]] | None = None) -> IterationLog:
    """Run push-sum iteration ``k`` through ``phases`` (the one implementation every backend calls).

    Parameters
    ----------
    phases : Phases
        The backend's phases on the nodes it holds.
    k : int
        Global iteration.
    receivers : callable (sender, k) -> out-neighbours, optional
        When given, each outbox is checked against it.

    Returns
    -------
    IterationLog
        The wire bits each node held here sent (self-shares cost 0) and the reduced values.
    """
    reduced = reduce_contributions(phases.contribute(k))
    outboxes = phases.local_step(k, reduced)
    network = set(phases.network_ids)
    bits: dict[int, int] = {}
    for i in phases.node_ids:
        shares = outboxes[i]
        check_routing(i, shares, receivers(i, k) if receivers else None, k)
        for s in shares:
            if s.receiver not in network:
                raise ValueError(f"node {i} sent a share to unknown node {s.receiver} at k={k}; nodes are "
                                 f"{sorted(network)}")
        bits[i] = sum(int(s.wire_bits) for s in shares if s.receiver != i)
    inboxes = route_shares(phases.exchange(k, outboxes), phases.node_ids)
    phases.mix(k, inboxes)
    return IterationLog(k=k, bits_sent=bits, reduced=reduced)


@dataclass
class SegmentResult:
    """What a segment ``k0 .. k1 - 1`` returns to the driver.

    Attributes
    ----------
    k0, k1 : int
        The iterations run.
    bits_sent : ndarray (n,) int64
        Wire bits each node sent during the segment (self-shares cost 0).
    metrics : dict[int, list[dict[str, float]]]
        Per node, one dict per iteration of the ``last_metrics()`` that may leave the node
        (:func:`flower_dp.releases.release_metrics`; all of them with ``debug_metrics``).
    reduced : list[dict | None]
        The reduced contributions of each iteration (identical on every host).
    wall_time_s : float
        Driver-side wall time of the segment.
    means : dict[str, float], optional
        The means :meth:`metric_means` returns, where a backend computed them itself (the relay: iteration by
        iteration, as its replies come).
    """

    k0: int
    k1: int
    bits_sent: np.ndarray
    metrics: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    reduced: list[Any] = field(default_factory=list)
    wall_time_s: float = 0.0
    means: dict[str, float] | None = None

    def metric_means(self) -> dict[str, float]:
        """Mean of each metric over all nodes and iterations (NaN ignored), as the in-process runner reports."""
        if self.means is not None:
            return dict(self.means)
        vals: dict[str, list[float]] = {}
        for i in sorted(self.metrics):
            for row in self.metrics[i]:
                for key, v in row.items():
                    vals.setdefault(key, []).append(float(v))
        return {k: float(np.nanmean(v)) if v else float("nan") for k, v in vals.items()}


class LocalNodes:
    """What a segment backend whose nodes all live in this process (``self.nodes``, in node order) answers the run
    engine between segments: the network average, the privacy reports and the node states."""

    nodes: list[Any]

    def network_average(self) -> Any:
        """Mean over nodes of ``eval_params()`` (float64 sum in node order, returned as float32)."""
        import torch

        flats = [n.eval_params().detach().to("cpu", torch.float64) for n in self.nodes]
        return (torch.stack(flats).sum(0) / len(flats)).to(torch.float32)

    def privacy_reports(self) -> dict[int, dict[str, Any]]:
        return {node.node_id: dict(node.privacy_report()) for node in self.nodes}

    def state_dicts(self) -> dict[int, Any]:
        return {i: node.state_dict() for i, node in enumerate(self.nodes)}
