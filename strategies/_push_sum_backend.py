"""The Flower side of a push-sum run as a :class:`flower_dp.engine.SegmentBackend`: SuperNodes, Ray or the relay.

:class:`FlowerSegments` is what :class:`flower_dp.strategies.PushSumStrategy` hands the run engine.  It brings the
nodes up through Flower (``register`` messages to every SuperNode, after checking that exactly ``n_nodes`` are
connected), then runs each segment on the transport's backend: the Ray host actors
(:class:`flower_dp.gossip.ray_backend.RayGossipBackend`, shares go host to host; the ``register`` is repeated every
round) or the relay (:class:`flower_dp.gossip.relay.RelayGossipBackend` over this module's Flower messages, sent
and polled every ``poll_s`` seconds).  A host actor that dies mid-segment is replaced: the failure is recorded, new
host actors start, the ClientApps register again and the nodes are restored from the engine's last checkpoint,
``max_retries`` times per segment; then a :class:`~flower_dp.gossip.NodeFailureError` ends the run.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from flower_dp.errors import ConfigError, GossipTimeoutError
from flower_dp.gossip import NodeFailureError
from flower_dp.gossip.relay import ARRAYS_KEY, MESSAGE_KEYS as KEY, RelayGossipBackend, from_records, to_records

from ._grid import POLL_S, exchange

__all__ = ["FlowerSegments", "is_simulation"]

log = logging.getLogger("flwr")

#: simulation: seconds the SuperNode count must hold before it is compared with n_nodes (Flower registers all at once)
_SETTLE_S = 0.5


def is_simulation(grid: Any) -> bool:
    """Flower's simulation engine (its in-memory Grid), or a test's stand-in without the deployment Grid's calls."""
    return type(grid).__name__ == "InMemoryGrid" or not hasattr(grid, "push_messages")


class FlowerSegments:
    """The engine's backend for a push-sum run over Flower SuperNodes (see the module docstring).

    ``strategy`` (the :class:`~flower_dp.strategies.PushSumStrategy`) holds the settings and receives what the Flower side learns: ``node_of`` (Flower node id ->
    push-sum id), ``backend`` (the transport's backend, for the nodes' devices), ``timings`` and ``failures``.
    """

    def __init__(self, strategy: Any, grid: Grid, t0: float) -> None:
        self.s, self.grid, self.t0 = strategy, grid, t0
        self.poll_s = 0.05  # relay: how often replies are pulled from the Grid
        self._fresh_round: int | None = None  # the round whose register brought the nodes up

    # -- SegmentBackend ------------------------------------------------------------------
    def start(self, k: int, restore) -> None:
        """Register every node (building it where it lives) and set it up (``k == 0``) or load ``restore()``."""
        self._bring_up(k // self.s.iters_per_round + 1, k, restore)

    def run_segment(self, k0: int, k1: int, *, debug_metrics: bool = False, restore=None) -> Any:
        """Iterations ``k0 .. k1 - 1`` on the transport's backend, restarting dead host actors ``max_retries`` times."""
        rnd = k0 // self.s.iters_per_round + 1
        log.info("")
        log.info("[ROUND %d/%d]", rnd, self.s.num_rounds)  # Flower's round line, as FedAvg logs it
        if self._fresh_round != rnd and not self.s.backend.register_once:
            self._register(rnd, fresh=False)
        self._fresh_round = None
        self.s.timings.setdefault("first_segment_start_s", time.perf_counter() - self.t0)
        for attempt in range(self.s.max_retries + 1):
            try:
                seg = self.s.backend.run_segment(k0, k1, debug_metrics=debug_metrics)
                break
            except NodeFailureError as exc:
                self._lost(exc, rnd, k0, k1, attempt)
                self._bring_up(rnd, k0, restore)
        self.s.timings["gossip_s"] = self.s.timings.get("gossip_s", 0.0) + seg.wall_time_s
        if self.s.layout is None:  # names and shapes of the nodes' model (public), for Result.arrays
            self.s.layout = self.s.backend.param_layout()
        return seg

    def network_average(self) -> Any:
        return self.s.backend.network_average()

    def privacy_reports(self) -> dict[int, dict[str, Any]]:
        return self.s.backend.privacy_reports()

    def state_dicts(self) -> dict[int, Any]:
        return self.s.backend.state_dicts()

    def shutdown(self) -> None:
        if self.s.backend is not None:
            self.s.backend.shutdown()
            self.s.backend = None

    # -- bringing the nodes up -------------------------------------------------------------
    def _bring_up(self, rnd: int, k: int, restore) -> None:
        t = self._register(rnd, fresh=True, initial=k == 0)
        if k == 0:
            self.s.backend.setup()
        else:
            states = restore()
            self.s.backend.wait_registered()
            self.s.backend.load_state_dicts(states, k=k)
        self.s.timings.setdefault("register_first_round_s", time.perf_counter() - t)
        self._fresh_round = rnd

    def _lost(self, exc: NodeFailureError, rnd: int, k0: int, k1: int, attempt: int) -> None:
        s = self.s
        s.failures.append({"round": rnd, "k0": k0, "k1": k1, "host": exc.host, "nodes": exc.nodes,
                           "attempt": attempt + 1, "error": str(exc)})
        self.shutdown()
        if attempt == s.max_retries:
            raise NodeFailureError(
                f"round {rnd} (segment k={k0}..{k1 - 1}): nodes {exc.nodes} died with their host actor "
                f"{exc.host}; stopped after {attempt} automatic restart(s) from the last checkpoint "
                f"(max_retries={s.max_retries}); the results so far and the checkpoint at k={k0} are kept: "
                "rerun with resume=True or raise max_retries", host=exc.host, nodes=exc.nodes, k0=k0, k1=k1,
            ) from exc
        log.warning("round %d (segment k=%d..%d): nodes %s died with host actor %d; restarting the host "
                    "actors from the checkpoint at k=%d (attempt %d of %d)", rnd, k0, k1 - 1, exc.nodes,
                    exc.host, k0, attempt + 1, s.max_retries)

    def _register(self, rnd: int, *, fresh: bool, initial: bool = False) -> float:
        """Send this round's ``register`` messages (a fresh start first makes the transport's backend); return
        the time the registration round began."""
        s, grid = self.s, self.grid
        if fresh and s.transport == "ray":
            self._check_ray_reachable()  # a deployment without a shared Ray fails before any wait
        t = time.perf_counter()
        self._wait_for_supernodes(rnd)  # before the backend: a mismatch fails before any Ray work
        if fresh:
            s.backend = self._new_backend()
            t = time.perf_counter()
        arrays = s.initial if fresh and initial and s.initial is not None else ArrayRecord()
        replies = self._exchange(s.configure_train(rnd, arrays, s.train_config, grid), poll_s=POLL_S)
        s.aggregate_train(rnd, replies)
        if len(replies) < s.n_nodes or len(set(s.node_of.values())) < s.n_nodes:
            have = sorted(set(s.node_of.values()))
            raise GossipTimeoutError(
                f"round {rnd}: only {len(replies)} of {s.n_nodes} ClientApps replied within {s.timeout_s:.0f} s "
                f"(nodes registered: {have}); set num-supernodes = {s.n_nodes}, give every SuperNode a distinct "
                "partition-id, or raise timeout_s")
        return t

    def _wait_for_supernodes(self, rnd: int) -> None:
        """Return once exactly ``n_nodes`` SuperNodes are connected; fail fast otherwise.

        Simulation: Flower registers all its SuperNodes at once, a moment after ``main()`` starts; once any are
        there (and the count held for ``_SETTLE_S``), a count other than ``n_nodes`` fails at once.  Deployment:
        SuperNodes connect at their own pace; wait up to ``node_wait_s`` (logged), then fail.  More SuperNodes
        than nodes fail at once on both engines (each would build a node that no other node gossips with).
        """
        s, grid, n = self.s, self.grid, self.s.n_nodes
        fix = (f"set num-supernodes = {n} (`flwr run --federation-config 'num-supernodes={n}'`, or one "
               f"flower-supernode per push-sum node with partition-id 0..{n - 1}), or make n_nodes equal to the "
               "number of SuperNodes")
        live = len(list(grid.get_node_ids()))
        if live == n:
            return
        if is_simulation(grid):
            deadline = time.monotonic() + s.timeout_s
            seen, since = live, time.monotonic()
            while time.monotonic() < deadline and (seen == 0 or time.monotonic() - since < _SETTLE_S):
                time.sleep(0.05)
                now = len(list(grid.get_node_ids()))
                if now != seen:
                    seen, since = now, time.monotonic()
            if seen == 0:
                raise GossipTimeoutError(f"round {rnd}: Flower's simulation started no SuperNode within "
                                         f"{s.timeout_s:.0f} s (n_nodes = {n}); {fix}, or raise timeout_s on a "
                                         "loaded machine")
            if seen != n:
                raise ConfigError(f"round {rnd}: the simulation runs {seen} SuperNodes, n_nodes = {n} (one "
                                  f"SuperNode per push-sum node is needed); {fix}")
            return
        if live > n:
            raise ConfigError(f"round {rnd}: {live} SuperNodes are connected, n_nodes = {n} (one SuperNode per "
                              f"push-sum node is needed); {fix}")
        log.info("PushSum: %d of %d SuperNodes connected; waiting up to %.0f s (node_wait_s) for the others",
                 live, n, s.node_wait_s)
        deadline = time.monotonic() + s.node_wait_s
        while live < n and time.monotonic() < deadline:
            time.sleep(0.2)
            live = len(list(grid.get_node_ids()))
        if live != n:
            raise GossipTimeoutError(
                f"round {rnd}: {live} Flower SuperNodes connected within node_wait_s = {s.node_wait_s:.0f} s, "
                f"n_nodes = {n} (one SuperNode per push-sum node is needed); {fix}, or raise node_wait_s when "
                "SuperNodes are still starting")

    def _new_backend(self) -> Any:
        """The backend of the transport: Ray host actors, or the relay over this strategy's Flower messages."""
        s = self.s
        if s.transport == "relay":
            return RelayGossipBackend(s.n_nodes, self._send, keep_states=s.keep_states)
        from flower_dp.gossip.ray_backend import RayGossipBackend

        t = time.perf_counter()
        address = s.backend_kwargs.get("address") or os.environ.get("RAY_ADDRESS") or None
        # In simulation Flower initialises Ray itself (2-4 s after main() on an idle machine, 30 s when loaded;
        # joining RAY_ADDRESS when set); a second ray.init from here would crash Flower's, so wait for it.  On the
        # deployment engine nobody else starts Ray here: connect to the named cluster at once.
        wait = s.timeout_s if is_simulation(self.grid) else 0.0
        if wait:
            import ray

            if not ray.is_initialized():
                log.info("PushSum: waiting up to %.0f s (timeout_s) for Flower's simulation to start Ray", wait)
            deadline = time.monotonic() + wait
            while not ray.is_initialized() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not ray.is_initialized():
                raise GossipTimeoutError(f"Flower's simulation did not start Ray within timeout_s = {wait:.0f} s; "
                                         "raise timeout_s on a loaded machine")
            s.timings.setdefault("wait_for_ray_s", time.perf_counter() - t)  # Flower starting Ray
        else:
            log.info("PushSum: connecting to the Ray cluster at %r", address)
        backend = RayGossipBackend(s.n_nodes, **{"timeout_s": s.timeout_s, **s.backend_kwargs})
        s.ray_placement = {"name": backend.name, "namespace": backend.namespace, "num_hosts": backend.num_hosts,
                           "n_nodes": s.n_nodes, "address": None if wait else address}
        s.timings["backend_start_s"] = time.perf_counter() - t
        return backend

    def _check_ray_reachable(self) -> None:
        """Fail in seconds where ``transport="ray"`` cannot work: Flower's deployment engine without a shared Ray.

        Peer-to-peer push-sum needs every ClientApp to reach the host actors.  Flower's simulation runs the
        ServerApp and the ClientApps in one Ray cluster (its Grid is the in-memory one); on the deployment
        engine each ClientApp runs in its own process and would start a private Ray, where the host actors do
        not exist.  Without ``backend_kwargs["address"]`` or ``RAY_ADDRESS`` naming a cluster that the SuperNodes
        also join, that is an error here, before any work; the relay (every share through the SuperLink: another
        cost, another party seeing the messages) is the user's choice, never a silent fallback.
        """
        if self.s.backend_kwargs.get("address") or os.environ.get("RAY_ADDRESS") or is_simulation(self.grid):
            return
        raise ValueError(
            f"transport='ray' cannot work on Flower's deployment engine without a shared Ray cluster (got a "
            f"{type(self.grid).__name__}: each ClientApp runs in its own process and cannot reach the host actors); "
            "use transport='relay' (the SuperLink routes every share), or start one Ray cluster that the ServerApp "
            "and every SuperNode join (ray start --head / --address) and pass backend_kwargs={'address': "
            "'<head>:<port>'} or set RAY_ADDRESS on all of them")

    # -- the relay's messages --------------------------------------------------------------
    def _send(self, action: str, k: int, per_node: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        s = self.s
        flower_of = {v: f for f, v in s.node_of.items()}
        msgs = []
        for i in range(s.n_nodes):
            tree, arrays = to_records(per_node[i])
            cfg = ConfigRecord({KEY["action"]: action, KEY["k"]: k, KEY["transport"]: "relay", KEY["payload"]: tree})
            msgs.append(Message(RecordDict({"pushsum": cfg, ARRAYS_KEY: ArrayRecord(arrays)}), dst_node_id=flower_of[i],
                                message_type="train"))
        out = {}
        for msg in self._exchange(msgs):
            if msg.has_error():
                raise RuntimeError(f"ClientApp on Flower node {msg.metadata.src_node_id} failed at k={k}: {msg.error.reason}")
            arrays = msg.content.array_records.get(ARRAYS_KEY)
            out[s.node_of[msg.metadata.src_node_id]] = from_records(msg.content["pushsum"][KEY["payload"]], arrays)
        if len(out) < s.n_nodes:
            missing = sorted(set(range(s.n_nodes)) - set(out))
            raise GossipTimeoutError(f"relay: no reply from nodes {missing} at k={k} ({action}) within "
                                     f"{s.timeout_s:.0f} s; check those SuperNodes or raise timeout_s")
        return out

    def _exchange(self, msgs: list[Message], poll_s: float | None = None) -> list[Message]:
        """Send ``msgs`` and collect the replies within ``timeout_s``, pulled every ``poll_s`` seconds (default
        ``self.poll_s``; :func:`flower_dp.strategies._grid.exchange`)."""
        return exchange(self.grid, msgs, self.s.timeout_s, self.poll_s if poll_s is None else poll_s)


