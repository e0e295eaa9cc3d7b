"""Asynchronous push-sum over an emulated network, in virtual time: every node at its own pace, messages delayed,
lost, duplicated and reordered, mass conserved by running sums per edge.

:class:`AsyncPushSum` is a discrete-event simulation of push-sum nodes (the same node objects as the synchronous
loop, :class:`flower_dp.gossip.messages.Node`, unchanged).  Node ``i`` takes its steps at its own virtual times:
a step lasts ``step_time / speed_i`` virtual seconds, times a seeded jitter factor in ``[1 - jitter, 1 + jitter]``.
Step ``k`` of node ``i`` (``k`` counted by the node itself) consumes whatever has arrived since its last step,
``mix(inbox)`` (its own kept share plus what each in-neighbour sent, in sender order), then ``local_step(k)``: the
node's private gradient step, charged to its own ledger, and its new shares, for its out-neighbours at the
topology's phase ``k`` (``send_weights(i, k)``: the node's own count indexes the time-varying graph and its RNG
streams).  Its own share stays with it for the next step; every other share goes out on its edge.

Running sums (robust ratio consensus: Hadjicostis et al.; RASGP, Spiridonoff, Olshevsky and Paschalidis 2020): the
sender keeps, per out-edge, the cumulative sum of every tensor and weight it put on that edge and sends the
cumulative with a sequence number; the receiver keeps the latest cumulative it has seen (an older or duplicate
message is ignored) and, at its next step, credits the difference from the last cumulative it credited.  A lost
message's mass arrives with the next message on that edge, so ``sum of w`` over the nodes plus what is not yet
credited stays ``n`` (:meth:`AsyncPushSum.mass`), and ``x / w`` still averages.  The cumulative sums are float64.

Only a node whose ``mix`` is a linear sum of the incoming shares (``x`` and the push-sum weight ``w``) and that needs
no network-wide reduction can run so: a share without a weight (D-PSGD-type nodes) or a ``contribute`` that
returns a value (a barrier) is refused.  Privacy stays per node: each node's ledger is charged by its own
``local_step`` calls, a node stops after its ``max_steps`` (its plan's ``num_iters``, fixed before the run from its
budget) and sends nothing more, and a running-sum message re-sends values already released (post-processing,
free).  The network's randomness (step durations, delays, losses, duplicates) is public and keyed by the network
seed, so a seeded run is reproducible bit for bit; it never depends on the nodes' data.

:class:`NetworkModel` describes the emulated network and validates it; :class:`AsyncSegments` runs the simulation
as a :class:`flower_dp.engine.SegmentBackend` whose segments are virtual-time windows of ``eval_every`` nominal
steps (``step_time`` virtual seconds each).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..releases import node_metrics
from ..rng import numpy_rng
from .messages import Share
from .protocol import LocalNodes, SegmentResult

__all__ = ["NetworkModel", "AsyncPushSum", "AsyncSegments", "DELAY_DISTRIBUTIONS", "NETWORK_MODES",
           "COMPUTE_PURPOSE", "LINK_PURPOSE"]

#: The delay distributions of a message, each with mean ``delay_mean``: exponential, uniform on [0, 2 mean], constant.
DELAY_DISTRIBUTIONS = ("exponential", "uniform", "constant")
#: ``[network] mode``: every node at iteration k together (the run engine's loop) or the emulated asynchronous network.
NETWORK_MODES = ("sync", "async")
#: Integer purposes of the network's public streams (:func:`flower_dp.rng.numpy_rng`; above every named purpose):
#: node i's step durations (i, COMPUTE_PURPOSE, 0) and edge j -> i's losses and delays (j, LINK_PURPOSE, i).
COMPUTE_PURPOSE = 1001
LINK_PURPOSE = 1002

#: at equal times the steps go first: a message sent at time t with no delay is mixed at the receiver's next step,
#: as in the synchronous loop (equal speeds, no delay, no loss: the synchronous run)
_STEP, _ARRIVE = 0, 1


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class NetworkModel:
    """The emulated network of an asynchronous run (``[network]`` in a run config).

    Attributes
    ----------
    delay : str
        Distribution of a message's delay (:data:`DELAY_DISTRIBUTIONS`), drawn per message from the edge's stream.
    delay_mean : float
        Its mean in virtual seconds (>= 0; 0: every message arrives when it is sent).
    loss : float
        Probability that a message is lost, in [0, 1).
    duplicate : float
        Probability that a delivered message arrives a second time (its own delay), in [0, 1).
    step_time : float
        Virtual seconds of one step of a node of speed 1 (> 0); the unit of the run's segments.
    speeds : tuple of float
        Per node compute speed (> 0; a step lasts ``step_time / speed``); empty: every node 1.
    stragglers : mapping node -> float
        Slow-down factors (>= 1 times slower; node 7 at 5.0: its steps last five times longer).
    jitter : float
        Each step's duration is multiplied by a seeded factor uniform in [1 - jitter, 1 + jitter]; in [0, 1).
    horizon : float or None
        The run ends at this virtual time (> 0) even if nodes have steps left; None: when every node is done.
    """

    delay: str = "exponential"
    delay_mean: float = 0.0
    loss: float = 0.0
    duplicate: float = 0.0
    step_time: float = 1.0
    speeds: tuple = ()
    stragglers: Mapping[int, float] = field(default_factory=dict)
    jitter: float = 0.0
    horizon: float | None = None

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> NetworkModel:
        """The model of a config's ``[network]`` table (``mode`` is the caller's); raises ``ValueError`` listing
        every problem (:meth:`problems`)."""
        kw = {k: v for k, v in section.items() if k != "mode"}
        if isinstance(kw.get("speeds"), list):
            kw["speeds"] = tuple(kw["speeds"])
        if isinstance(kw.get("stragglers"), Mapping):
            kw["stragglers"] = {_node_key(k): v for k, v in kw["stragglers"].items()}
        return cls(**kw)

    def problems(self, n_nodes: int, prefix: str = "network.") -> list[str]:
        """Every invalid value, each naming the key, the value, the valid range and the fix."""
        out = []
        if self.delay not in DELAY_DISTRIBUTIONS:
            out.append(f"{prefix}delay must be one of {list(DELAY_DISTRIBUTIONS)}, got {self.delay!r}")
        if not (_number(self.delay_mean) and self.delay_mean >= 0):
            out.append(f"{prefix}delay_mean must be a finite number of virtual seconds >= 0, got {self.delay_mean!r}; "
                       "use 0 for messages that arrive when they are sent")
        for key in ("loss", "duplicate"):
            v = getattr(self, key)
            if not (_number(v) and 0 <= v < 1):
                out.append(f"{prefix}{key} must be a probability in [0, 1), got {v!r}; a value of 1 would "
                           f"{'never deliver a message' if key == 'loss' else 'duplicate every copy forever'}, "
                           "lower it below 1")
        if not (_number(self.step_time) and self.step_time > 0):
            out.append(f"{prefix}step_time must be a number of virtual seconds > 0, got {self.step_time!r}")
        if not (_number(self.jitter) and 0 <= self.jitter < 1):
            out.append(f"{prefix}jitter must be in [0, 1) (a step lasts its time times a factor in "
                       f"[1 - jitter, 1 + jitter]), got {self.jitter!r}")
        if self.horizon is not None and not (_number(self.horizon) and self.horizon > 0):
            out.append(f"{prefix}horizon must be a number of virtual seconds > 0 or absent (run until every node "
                       f"has taken its steps), got {self.horizon!r}")
        if not isinstance(self.speeds, (tuple, list)):
            out.append(f"{prefix}speeds must be a list of {n_nodes} numbers > 0, got {self.speeds!r}")
        else:
            if self.speeds and len(self.speeds) != n_nodes:
                out.append(f"{prefix}speeds must hold one speed per node ({n_nodes}), got {len(self.speeds)}; "
                           "give n_nodes values or leave it empty (every node at speed 1)")
            for i, v in enumerate(self.speeds):
                if not (_number(v) and v > 0):
                    out.append(f"{prefix}speeds[{i}] must be a number > 0 (a speed of 0 never steps: use "
                               f"stragglers for a slow node or a horizon), got {v!r}")
        if not isinstance(self.stragglers, Mapping):
            out.append(f"{prefix}stragglers must be a table node = slow-down factor, got {self.stragglers!r}")
        else:
            for i, v in self.stragglers.items():
                if not (isinstance(i, int) and 0 <= i < n_nodes):
                    out.append(f"{prefix}stragglers names node {i!r}, valid nodes are 0..{n_nodes - 1}")
                if not (_number(v) and v >= 1):
                    out.append(f"{prefix}stragglers[{i}] must be a slow-down factor >= 1 (times slower), got {v!r}; "
                               "a faster node is a speed > 1 in speeds")
        return out

    def check(self, n_nodes: int) -> NetworkModel:
        """``self`` if valid for ``n_nodes`` nodes, else ``ValueError`` listing every problem."""
        bad = self.problems(n_nodes)
        if bad:
            raise ValueError("invalid network model:\n  - " + "\n  - ".join(bad))
        return self

    def speed(self, i: int) -> float:
        """Node ``i``'s compute speed: its ``speeds`` entry (1 without one) over its straggler factor."""
        base = float(self.speeds[i]) if self.speeds else 1.0
        return base / float(self.stragglers.get(i, 1.0))

    def draw_delay(self, rng: np.random.Generator) -> float:
        """One message's delay (virtual seconds); draws one uniform whatever the distribution (aligned streams)."""
        u = float(rng.random())
        if self.delay == "exponential":
            return -self.delay_mean * math.log1p(-u)
        if self.delay == "uniform":
            return 2.0 * self.delay_mean * u
        return float(self.delay_mean)

    def record(self) -> dict[str, Any]:
        """The model as a results entry."""
        return {"delay": self.delay, "delay_mean": float(self.delay_mean), "loss": float(self.loss),
                "duplicate": float(self.duplicate), "step_time": float(self.step_time),
                "speeds": [float(s) for s in self.speeds], "stragglers": {str(i): float(v) for i, v in
                                                                          sorted(self.stragglers.items())},
                "jitter": float(self.jitter), "horizon": None if self.horizon is None else float(self.horizon)}


def _node_key(k: Any) -> Any:
    """A TOML table key ("7") as the node id it names (7); anything else unchanged (refused by the check)."""
    if isinstance(k, str) and k.strip().isdigit():
        return int(k)
    return k


@dataclass
class _OutEdge:
    """Sender side of one edge: the cumulative tensors and weight put on it, and the messages sent."""

    seq: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    weight: float = 0.0


@dataclass
class _InEdge:
    """Receiver side of one edge: the latest cumulative seen (``seq``) and the last one credited."""

    seq: int = 0
    tensors: dict[str, torch.Tensor] | None = None
    weight: float = 0.0
    credited_seq: int = 0
    credited_tensors: dict[str, torch.Tensor] | None = None
    credited_weight: float = 0.0


def _algorithm(node: Any) -> str:
    plan = getattr(node, "plan", None)
    return str(getattr(plan, "algorithm", type(node).__name__))


class AsyncPushSum:
    """The virtual-time discrete-event simulation of push-sum ``nodes`` over ``network`` (see the module docstring).

    Parameters
    ----------
    nodes : sequence of Node
        ``nodes[i].node_id == i``; set up (``setup()``) by the caller.
    network : NetworkModel
    seed : int
        Key of the network's public streams (step durations, delays, losses, duplicates).
    max_steps : int or sequence of int, optional
        Steps each node may take (default: each node's ``plan.num_iters``).
    receivers : callable (sender, k) -> out-neighbours, optional
        When given, every outbox is checked against it.
    debug_metrics : bool
        Keep every metric of a step, not only what may leave a node (:func:`flower_dp.releases.node_metrics`).
    """

    def __init__(self, nodes: Sequence[Any], network: NetworkModel, *, seed: int,
                 max_steps: int | Sequence[int] | None = None,
                 receivers: Callable[[int, int], Sequence[int]] | None = None, debug_metrics: bool = False) -> None:
        self.nodes = list(nodes)
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            if node.node_id != i:
                raise ValueError(f"nodes[{i}] has node_id {node.node_id}, got a list out of order; pass the nodes "
                                 "sorted by id")
        self.network = network.check(n)
        self.seed = int(seed)
        if max_steps is None:
            steps = [int(nd.plan.num_iters) for nd in self.nodes]
        elif isinstance(max_steps, int):
            steps = [int(max_steps)] * n
        else:
            steps = [int(s) for s in max_steps]
        if len(steps) != n or any(s < 0 for s in steps):
            raise ValueError(f"max_steps must be one count >= 0 per node ({n}), got {steps}")
        self.max_steps = steps
        self.receivers = receivers
        self.debug_metrics = bool(debug_metrics)
        self.t = 0.0
        self.steps = [0] * n
        self.stop_reason: list[str | None] = [None] * n
        self.last_step_time = [0.0] * n
        self.bits_sent = np.zeros(n, dtype=np.int64)
        self.messages = {"sent": 0, "lost": 0, "delivered": 0, "duplicated": 0, "ignored_stale": 0}
        self.finished = False
        self._own: list[Share | None] = [None] * n  # the node's own share, kept for its next mix
        self._out: dict[tuple[int, int], _OutEdge] = {}
        self._in: list[dict[int, _InEdge]] = [{} for _ in range(n)]
        self._links: dict[tuple[int, int], np.random.Generator] = {}
        self._queue: list[tuple[float, int, int, tuple]] = []
        self._order = 0
        self._metrics: list[dict[str, float]] = []
        # each node's step times, public and data-independent: known before the run
        self._times = []
        for i in range(n):
            u = numpy_rng(self.seed, i, COMPUTE_PURPOSE, 0).random(steps[i])
            dur = (network.step_time / network.speed(i)) * (1.0 + network.jitter * (2.0 * u - 1.0))
            self._times.append(np.cumsum(dur))
        done = [float(t[-1]) for t in self._times if len(t)]
        last = max(done) if done else 0.0
        self.end_time = last if network.horizon is None else min(float(network.horizon), last)
        for i in range(n):
            if steps[i]:
                self._push(float(self._times[i][0]), _STEP, (i,))
            else:
                self.stop_reason[i] = "num_iters"

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, payload: tuple) -> None:
        heapq.heappush(self._queue, (t, kind, self._order, payload))
        self._order += 1

    def advance(self, until: float) -> None:
        """Process every event at a virtual time <= ``min(until, end_time)``."""
        if self.finished:
            return
        stop = min(float(until), self.end_time)
        while self._queue and self._queue[0][0] <= stop:
            t, kind, _, payload = heapq.heappop(self._queue)
            self.t = t
            if kind == _ARRIVE:
                self._arrive(*payload)
            else:
                self._step(payload[0])
        self.t = max(self.t, stop)

    def run(self) -> None:
        """Run to the end (:attr:`end_time`) and settle every node (:meth:`finish`)."""
        self.finish()

    def finish(self) -> None:
        """End the run: every node mixes what it kept and what has arrived (no step, nothing released).  When every
        node has taken all its steps the network drains first (every message still in flight arrives); when the
        horizon ended the run, a node with steps left is stopped by it and what is in flight stays uncredited
        (:meth:`mass`), as does the mass of an edge's last message if it was lost."""
        if self.finished:
            return
        self.advance(self.end_time)
        if all(why == "num_iters" for why in self.stop_reason):
            while self._queue:
                t, kind, _, payload = heapq.heappop(self._queue)
                self.t = t
                self._arrive(*payload)  # no step is left: only arrivals
        for i in range(len(self.nodes)):
            if self.stop_reason[i] is None:
                self.stop_reason[i] = "horizon"
            self.nodes[i].mix(self._inbox(i, self.steps[i]))
            self._own[i] = None
        self.finished = True

    def _arrive(self, sender: int, receiver: int, seq: int, tensors: dict[str, torch.Tensor], weight: float) -> None:
        edge = self._in[receiver].setdefault(sender, _InEdge())
        if seq <= edge.seq:
            self.messages["ignored_stale"] += 1
            return
        edge.seq, edge.tensors, edge.weight = seq, tensors, weight
        self.messages["delivered"] += 1

    def _inbox(self, i: int, k: int) -> list[Share]:
        """What node ``i`` mixes at its step ``k``: its own share (or, before its first step, its state) and the
        difference of each in-edge's latest cumulative from the last one credited, in sender order (float64)."""
        node, own = self.nodes[i], self._own[i]
        if own is None:
            mine = Share(sender=i, receiver=i, k=k, tensors={"x": node.x.to(torch.float64)}, weight=float(node.w))
        else:
            mine = Share(sender=i, receiver=i, k=k, tensors={name: t.to(torch.float64) for name, t in
                                                             own.tensors.items()}, weight=own.weight)
        inbox = [mine]
        for j in sorted(self._in[i]):
            edge = self._in[i][j]
            if edge.seq == edge.credited_seq:
                continue
            old = edge.credited_tensors
            delta = {name: (t - old[name]) if old is not None else t.clone() for name, t in edge.tensors.items()}
            inbox.append(Share(sender=j, receiver=i, k=k, tensors=delta, weight=edge.weight - edge.credited_weight))
            edge.credited_seq, edge.credited_tensors, edge.credited_weight = edge.seq, edge.tensors, edge.weight
        inbox.sort(key=lambda s: s.sender)
        return inbox

    def _step(self, i: int) -> None:
        node, k = self.nodes[i], self.steps[i]
        node.mix(self._inbox(i, k))
        if node.contribute(k) is not None:
            raise ValueError(f"{_algorithm(node)!r} node {i} asks for a network-wide reduction at k={k} "
                             "(contribute), got one in an asynchronous run, which has no barrier; run it with "
                             "network.mode = 'sync'")
        shares = node.local_step(k, None)
        if self.receivers is not None:
            want = sorted(set(self.receivers(i, k)) | {i})
            got = sorted(s.receiver for s in shares)
            if got != want:
                raise ValueError(f"node {i} at its step {k} sent to {got} but its out-neighbours plus itself are "
                                 f"{want}; the node's topology disagrees with the network's")
        own = None
        for s in shares:
            if s.weight is None:
                raise ValueError(f"{_algorithm(node)!r} node {i} sends shares without a push-sum weight, got "
                                 "weight=None; running sums need x and w to de-bias (x / w), so this algorithm "
                                 "runs with network.mode = 'sync' only")
            if s.receiver == i:
                own = s
            else:
                self._send(i, s)
        if own is None:
            raise ValueError(f"node {i} at its step {k} kept no share of its own, got receivers "
                             f"{sorted(s.receiver for s in shares)}; a push-sum node keeps a positive part")
        self._own[i] = own
        self._metrics.append(node_metrics(node, self.debug_metrics))
        self.steps[i] = k + 1
        self.last_step_time[i] = self.t
        if k + 1 < self.max_steps[i]:
            self._push(float(self._times[i][k + 1]), _STEP, (i,))
        else:
            self.stop_reason[i] = "num_iters"

    def _send(self, i: int, share: Share) -> None:
        r = share.receiver
        out = self._out.setdefault((i, r), _OutEdge())
        out.seq += 1
        out.tensors = {name: (out.tensors[name] + t.to(torch.float64)) if name in out.tensors
                       else t.to(torch.float64).clone() for name, t in share.tensors.items()}
        out.weight = out.weight + float(share.weight)
        self.bits_sent[i] += int(share.wire_bits)
        self.messages["sent"] += 1
        rng = self._links.get((i, r))
        if rng is None:
            rng = self._links[(i, r)] = numpy_rng(self.seed, i, LINK_PURPOSE, r)
        lost, dup = float(rng.random()), float(rng.random())  # drawn for every message: aligned streams
        d1, d2 = self.network.draw_delay(rng), self.network.draw_delay(rng)
        if lost < self.network.loss:
            self.messages["lost"] += 1
            return
        payload = (i, r, out.seq, out.tensors, out.weight)  # the cumulative: a new tensor, never changed after
        self._push(self.t + d1, _ARRIVE, payload)
        if dup < self.network.duplicate:
            self.messages["duplicated"] += 1
            self._push(self.t + d1 + d2, _ARRIVE, payload)

    # ------------------------------------------------------------------ views
    def take_metrics(self) -> list[dict[str, float]]:
        """The metrics of the steps since the last call (:func:`flower_dp.releases.node_metrics` of each)."""
        out, self._metrics = self._metrics, []
        return out

    def mass(self) -> dict[str, float]:
        """The push-sum weight where it is: held by the nodes (their kept share, or their state), and on the edges
        not yet credited (in flight, lost and not yet re-sent by a later cumulative, or arrived and not yet
        mixed).  Their sum is ``n`` up to float64 rounding at every event."""
        held = 0.0
        for i, node in enumerate(self.nodes):
            held += float(node.w) if self._own[i] is None else float(self._own[i].weight)
        edges = 0.0
        for (j, i), out in sorted(self._out.items()):
            edge = self._in[i].get(j)
            edges += out.weight - (edge.credited_weight if edge is not None else 0.0)
        return {"held": held, "uncredited": edges, "total": held + edges}

    def mass_x(self) -> torch.Tensor:
        """The sum of every node's ``x`` held and every edge's uncredited ``x`` (float64), as :meth:`mass`."""
        total = None
        for i, node in enumerate(self.nodes):
            x = node.x if self._own[i] is None else self._own[i].tensors["x"]
            total = x.to(torch.float64).clone() if total is None else total + x.to(torch.float64)
        for (j, i), out in sorted(self._out.items()):
            edge = self._in[i].get(j)
            total = total + out.tensors["x"]
            if edge is not None and edge.credited_tensors is not None:
                total = total - edge.credited_tensors["x"]
        return total

    def in_flight(self) -> int:
        """Messages sent and not yet arrived (a duplicate counts once more)."""
        return sum(1 for ev in self._queue if ev[1] == _ARRIVE)

    def node_records(self) -> list[dict[str, Any]]:
        """Per node: its steps, its plan's maximum, its speed, when it last stepped, and why it stopped (None while
        it runs)."""
        out = []
        for i in range(len(self.nodes)):
            why = self.stop_reason[i]
            if why == "num_iters":
                reason = (f"reached its maximum of {self.max_steps[i]} steps (its plan's num_iters, fixed from its "
                          "privacy budget before the run); sends nothing more")
            elif why == "horizon":
                reason = (f"the horizon at virtual time {self.end_time:g} s ended the run after {self.steps[i]} of "
                          f"its {self.max_steps[i]} steps")
            else:
                reason = None
            out.append({"node": i, "steps": int(self.steps[i]), "max_steps": int(self.max_steps[i]),
                        "speed": float(self.network.speed(i)), "last_step_time": float(self.last_step_time[i]),
                        "stopped": why, "reason": reason})
        return out

    def record(self) -> dict[str, Any]:
        """The run's network entry for a results document."""
        mass = self.mass()
        return {"mode": "async", "clock": "virtual", "seed": self.seed, **self.network.record(),
                "end_time": float(self.end_time), "time": float(self.t), "finished": self.finished,
                "messages": {**self.messages, "in_flight": self.in_flight()},
                "mass_w": mass, "per_node": self.node_records()}


class AsyncSegments(LocalNodes):
    """:class:`AsyncPushSum` as a :class:`flower_dp.engine.SegmentBackend`: the nodes in this process, a segment
    ``k0 .. k1`` the virtual-time window ``(k0 step_time, k1 step_time]`` (``k`` counts nominal steps of a speed-1
    node); the segment that reaches :attr:`num_ticks` ends the run (:meth:`AsyncPushSum.finish`).  No checkpoint:
    ``start`` refuses a restore.  The network average is over each node's model at its last mix."""

    def __init__(self, nodes: Sequence[Any], network: NetworkModel, *, seed: int,
                 max_steps: int | Sequence[int] | None = None,
                 receivers: Callable[[int, int], Sequence[int]] | None = None, debug_metrics: bool = False) -> None:
        self.nodes = list(nodes)
        self.sim = AsyncPushSum(self.nodes, network, seed=seed, max_steps=max_steps, receivers=receivers,
                                debug_metrics=debug_metrics)
        self.step_time = float(network.step_time)
        self.num_ticks = max(1, math.ceil(self.sim.end_time / self.step_time - 1e-9))

    def start(self, k: int, restore) -> None:
        if k != 0:
            raise ValueError(f"an asynchronous run starts at k=0, got a restore at k={k}; it keeps no checkpoint "
                             "(its in-flight messages are not saved), start it again in a new out_dir")
        for node in self.nodes:
            node.setup()

    def run_segment(self, k0: int, k1: int, *, debug_metrics: bool = False, restore=None) -> SegmentResult:
        t0 = time.perf_counter()
        bits0 = self.sim.bits_sent.copy()
        self.sim.advance(k1 * self.step_time)
        if k1 >= self.num_ticks:
            self.sim.finish()
        steps = np.asarray(self.sim.steps, dtype=float)
        seg: dict[str, list[float]] = {}
        for row in self.sim.take_metrics():
            for key, v in row.items():
                seg.setdefault(key, []).append(float(v))
        means = {key: float(np.nanmean(vals)) if vals else float("nan") for key, vals in seg.items()}
        means.update(t_virtual=float(self.sim.t), steps_min=float(steps.min()), steps_max=float(steps.max()),
                     steps_mean=float(steps.mean()))
        return SegmentResult(int(k0), int(k1), self.sim.bits_sent - bits0, wall_time_s=time.perf_counter() - t0,
                             means=means)

    def record(self) -> dict[str, Any]:
        return {**self.sim.record(), "checkpoints": False}

    def shutdown(self) -> None:
        """Nothing to release: the nodes stay with the caller."""
