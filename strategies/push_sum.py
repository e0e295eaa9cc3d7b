"""The push-sum coordinator for Flower (Message API): one Flower round = one gossip segment.

DESIGN.md "One algorithm, many backends", backends 2-4.  Flower's simulation runs at most
6 ClientApps at once here, so no design may need all n ClientApps inside one round at the
same time.  This strategy never does:

* ``transport="ray"`` (default): each round sends one ``register`` message per SuperNode;
  the ClientApp (:func:`flower_dp.clients.push_sum_app.make_client_app`) makes sure its node
  exists on its host actor (built from its own partition the first time) and replies at
  once.  The strategy then drives the host actors through the segment of ``iters_per_round``
  iterations (shares go host to host, :class:`flower_dp.gossip.ray_backend.RayGossipBackend`).
  It needs every ClientApp to reach the host actors: Flower's simulation (one Ray cluster), or the
  deployment engine with one Ray cluster that the ServerApp and every SuperNode join
  (``backend_kwargs={"address": ...}`` or ``RAY_ADDRESS``).  Without one, on the deployment engine, ``start``
  raises at once naming the fix (no silent fallback to the relay: a different cost and a different party
  seeing every share), and the ServerApp exits non-zero.
* ``transport="relay"``: for deployments where nodes cannot reach each other; the strategy
  routes every share through Flower messages: one message per node per iteration carrying all of
  that node's incoming shares (two with a reduce step), plus one per node at the end of each round
  (``flush``: evaluation, privacy report, checkpoint state) and one ``register`` at the start.
  Payloads are typed (a ``ConfigRecord`` JSON tree + an ``ArrayRecord``; :mod:`flower_dp.gossip.wire`,
  never a pickle).  It works anywhere, with the same numbers; on the deployment engine each message starts
  a fresh ClientApp process (Flower 1.41), which dominates its cost.

After each segment: the network-average model is evaluated (server-side ``evaluate_fn``),
the per-node metrics that may leave a node (bits, public schedule values, DPPS's broadcast
sensitivity; :mod:`flower_dp.releases`; training loss, clip fraction, gradient norms and batch sizes
only with ``debug_metrics=True``) and the eps are aggregated, a checksummed
checkpoint (every node's state, history, bits) and ``results.json`` are written atomically.
The privacy budget is a pre-flight truncation: pass ``num_iters = plan.num_iters`` of a plan
from :func:`flower_dp.clients.registry.prepare`.

Faults (issue 9): when a host actor dies mid-segment (its worker process is killed), the
strategy logs the round, the segment and the nodes lost, starts new host actors, has the
ClientApps register their nodes again, restores every node from the last checkpoint and
reruns the segment: with a reproducible plan (``prepare(..., reproducible=True)``) the run ends with the
numbers of an uninterrupted one; by default every restored node draws a fresh secret (its noise and
batches after the restore are fresh and independent; :mod:`flower_dp.rng`).  In secret mode the steps of
the failed segment may have gone out before the failure and are sent again with fresh noise, so the
restored accountants charge that whole segment once more (:func:`flower_dp.privacy.charge_replay`; a run
whose budget cannot cover it stops cleanly); reproducible mode resends identical messages.  After
``max_retries`` such restarts in one segment it stops cleanly (results so far saved) with a
:class:`~flower_dp.gossip.NodeFailureError`.  ``resume=True`` continues a stopped run from
``out_dir/checkpoint.pt``; a corrupted checkpoint is refused (checksum), never loaded.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_dp import results as rio
from flower_dp._checks import check_choice, check_int, check_positive
from flower_dp.errors import CheckpointError, ConfigError, GossipTimeoutError, NonFiniteError
from flower_dp.gossip import NodeFailureError
from flower_dp.gossip.relay import MESSAGE_KEYS as KEY
from flower_dp.models import resolve_device
from flower_dp.privacy.budget import charge_replay
from flower_dp.engine import completed_status
from flower_dp.recorder import (FAILED, RUNNING, SAMPLER_REFUSAL, RunRecorder, plan_summary,
                                sampler_identity)
from flower_dp.gossip.relay import ARRAYS_KEY, RelayGossipBackend, encode, from_records, to_records
from flower_dp.rng import noise_record
from flower_dp.releases import HEURISTIC_BROADCAST_METRICS, PUBLIC_NODE_METRICS, RELEASE_WARNING, release_fields

__all__ = ["PushSumStrategy"]

# Flower's own logger: its handlers print to the console of run_simulation and stream to `flwr run --stream` /
# `flwr log` from a ServerApp process, where a logger of flower-dp's own has no handler
log = logging.getLogger("flwr")

EvaluateFn = Callable[[int, torch.Tensor], dict[str, float] | None]


#: simulation: seconds the SuperNode count must hold before it is compared with n_nodes (Flower registers all at once)
_SETTLE_S = 0.5


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _is_simulation(grid: Any) -> bool:
    """Flower's simulation engine (its in-memory Grid), or a test's stand-in without the deployment Grid's calls."""
    return type(grid).__name__ == "InMemoryGrid" or not hasattr(grid, "push_messages")


class PushSumStrategy(Strategy):
    """Coordinate a push-sum run over Flower SuperNodes.

    Parameters
    ----------
    n_nodes : int
        Number of push-sum nodes = SuperNodes (node id = ``node_config["partition-id"]``).
    spec : dict
        What each ClientApp's node builder needs (sent once per node, picklable; e.g. the
        registry plan, the data and model names).
    num_iters : int
        Total gossip iterations K (after the budget's pre-flight truncation).
    iters_per_round : int
        Iterations per Flower round (one segment; e.g. one local epoch).
    transport : {"ray", "relay"}
    evaluate_fn : callable (round, network-average flat params (d,) float32) -> dict, optional
    out_dir : path, optional
        ``results.json`` and ``checkpoint.pt`` go here after every round.
    timeout_s : float
        Longest wait for ClientApp replies and for shares between hosts (and, in simulation, for Flower to
        start its SuperNodes and Ray).
    node_wait_s : float
        Deployment engine: how long the first round waits for ``n_nodes`` SuperNodes to connect before it fails
        (logged when it starts waiting).  In simulation the SuperNode count is known as soon as Flower starts
        them, and a mismatch fails at once.
    checkpoint : bool
        Write ``checkpoint.pt`` (every node's state) after each round (needs ``out_dir``).
    max_retries : int
        Ray transport: automatic restarts from the last checkpoint when a host actor dies in a
        segment (0: stop at the first death).  Without ``out_dir`` the states are kept in memory.
    resume : bool
        Continue from ``out_dir/checkpoint.pt`` (same n_nodes, num_iters, iters_per_round, algorithm).
    backend_kwargs : dict
        Passed to :class:`RayGossipBackend` (``num_hosts``, ``nodes_per_host``, ``num_gpus_per_host``,
        ``address``, ...).
    debug_metrics : bool
        Default False: per-node statistics of private data (training loss, clip fraction, gradient
        norms, realised batch sizes) stay on the nodes.  True releases them into the history (not
        charged by the accountant); ``results.json`` then says ``"uncharged_statistics_released": true``.
    """

    def __init__(self, n_nodes: int, spec: dict[str, Any], *, num_iters: int, iters_per_round: int,
                 transport: str = "ray", evaluate_fn: EvaluateFn | None = None, out_dir: str | Path | None = None,
                 timeout_s: float = 120.0, checkpoint: bool = True, run_name: str = "push_sum",
                 max_retries: int = 2, resume: bool = False, backend_kwargs: dict[str, Any] | None = None,
                 debug_metrics: bool = False, node_wait_s: float = 30.0) -> None:
        self.n_nodes = check_int("n_nodes", n_nodes, minimum=1)
        self.spec = dict(spec)
        self.num_iters = check_int("num_iters", num_iters, minimum=1)
        self.iters_per_round = check_int("iters_per_round", iters_per_round, minimum=1)
        self.transport = check_choice("transport", transport, ("ray", "relay"))
        self.evaluate_fn, self.timeout_s = evaluate_fn, check_positive("timeout_s", timeout_s)
        self.node_wait_s = check_positive("node_wait_s", node_wait_s)
        self.checkpoint, self.run_name = bool(checkpoint), run_name
        # results.json, history.csv and checkpoint.pt (stamped with _meta: a resume of other settings is refused)
        # and with the sampler of the nodes' devices (numpy on the CPU, torch's float64 normal on CUDA; _node_devices)
        self.recorder = RunRecorder(out_dir,
                                    identity=lambda: {"meta": self._meta(), **sampler_identity(self._node_devices())},
                                    checkpoint=self.checkpoint, refusals=SAMPLER_REFUSAL)
        self.out_path = self.recorder.out_dir
        self.max_retries = check_int("max_retries", max_retries, minimum=0)
        self.resume = bool(resume)
        self.debug_metrics = bool(debug_metrics)
        if self.debug_metrics:
            log.warning("PushSumStrategy: %s", RELEASE_WARNING)
        if self.resume and self.out_path is None:
            raise ValueError("resume=True needs the out_dir holding checkpoint.pt; got out_dir=None")
        # tells this run's relay nodes apart from those of an earlier strategy in the same Flower run
        self.spec["_session"] = f"{run_name}-{os.getpid()}-{id(self):x}-{time.time_ns()}"
        self.backend_kwargs = dict(backend_kwargs or {})
        # the backend that runs the segments (RayGossipBackend or RelayGossipBackend), made on the first register
        self.backend: Any = None
        self.node_of: dict[int, int] = {}  # Flower node id -> push-sum node id
        self._relay_devices: dict[int, str] = {}  # push-sum node id -> device, from the relay nodes' register replies
        self.history: list[dict[str, Any]] = []
        self.bits = np.zeros(self.n_nodes, dtype=np.int64)
        self.privacy: list[dict[str, Any]] = []
        self.last_average: torch.Tensor | None = None
        self.timings: dict[str, float] = {}
        self._gossip_s_logged = 0.0  # gossip_s at the last progress line
        self.failures: list[dict[str, Any]] = []  # one entry per dead host actor (round, segment, nodes)
        self._snapshot: dict[str, Any] | None = None  # last checkpoint, kept in memory
        self.poll_s = 0.05  # relay: how often replies are pulled from the Grid
        self._initial: ArrayRecord | None = None  # Flower's initial_arrays (start)
        self._train_config = ConfigRecord()
        self._flower_evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
        self._result = Result()
        self._layout: list | None = None  # [[name, start, stop, shape]] of the nodes' trainable parameters

    # -- Strategy ABC (Message API) -----------------------------------------------------
    def summary(self) -> None:
        print(f"PushSumStrategy: n={self.n_nodes}, K={self.num_iters}, R={self.iters_per_round}, transport={self.transport}")

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """One ``register`` message per SuperNode (cheap after round 1: the node already exists).

        ``arrays`` (non-empty only when the nodes are built: Flower's ``initial_arrays``) is the nodes' starting
        model; ``config`` (Flower's ``train_config``) reaches the node builder as ``spec["train_config"]``.
        """
        cfg = ConfigRecord({KEY["action"]: "register", KEY["transport"]: self.transport, "round": server_round,
                            KEY["spec"]: encode(self.spec)})
        content = {"pushsum": cfg}
        if arrays is not None and len(arrays):
            content[ARRAYS_KEY] = arrays
        if config is not None and len(config):
            content["config"] = config
        return [Message(RecordDict(content), dst_node_id=nid, message_type="train") for nid in grid.get_node_ids()]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Map Flower node ids to push-sum ids; fail loudly on ClientApp errors."""
        for msg in replies:
            if msg.has_error():
                raise RuntimeError(f"ClientApp on Flower node {msg.metadata.src_node_id} failed in round {server_round}: "
                                   f"{msg.error.reason}")
            rec = msg.content["pushsum"]
            self.node_of[msg.metadata.src_node_id] = int(rec["partition_id"])
            if self.transport == "relay" and "device" in rec:  # where this relay node runs (its noise sampler)
                self._relay_devices[int(rec["partition_id"])] = str(rec["device"])
            if "param_layout" in rec:
                self._layout = json.loads(str(rec["param_layout"]))
        return None, None

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # -- the run ------------------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Run the push-sum segments; FedAvg's signature (:meth:`flwr.serverapp.strategy.Strategy.start`).

        Parameters
        ----------
        grid : Grid
        initial_arrays : ArrayRecord, optional
            The nodes' starting model, e.g. ``ArrayRecord(model.state_dict())`` of the model the ClientApp builds
            (every node starts from it; default: the model the node builder makes).  Also the template of
            ``Result.arrays`` (its buffers are kept, its trainable parameters replaced by the network average).
        num_rounds : int, optional
            Flower rounds = segments of ``iters_per_round`` iterations; default ``ceil(num_iters / iters_per_round)``
            (never more iterations than ``num_iters``).
        timeout : float, optional
            Replaces ``timeout_s`` (the longest wait for ClientApp replies and for shares between hosts).
        train_config : ConfigRecord, optional
            Sent with the ``register`` messages; the node builder sees it as ``spec["train_config"]``.
        evaluate_config : ConfigRecord, optional
            Unused: push-sum has no client-side evaluation round (the nodes' models are evaluated by
            ``evaluate_fn`` on the network average).
        evaluate_fn : callable (round, ArrayRecord) -> MetricRecord or None, optional
            Flower's centralized evaluation, called with the network-average model as an ArrayRecord at round 0
            and after every round.

        Returns
        -------
        Result
            ``arrays``: the network-average model; it loads with
            ``model.load_state_dict(result.arrays.to_torch_state_dict())`` (given ``initial_arrays``, or a model
            without buffers).  ``train_metrics_clientapp[r]``: the round's public node metrics.
            ``evaluate_metrics_serverapp[r]``: ``evaluate_fn``'s metrics and the privacy spent (``eps_rigorous``
            and ``eps_paper``: the largest over the nodes; ``eps_heuristic`` for the DPPS family), where GauLRQ
            puts them too; :meth:`privacy_spent` answers the same as a ``PrivacySpent``.
        """
        t0 = time.perf_counter()
        if timeout is not None:
            self.timeout_s = check_positive("timeout", timeout)
        self._initial = initial_arrays if initial_arrays is not None and len(initial_arrays) else None
        self._train_config = train_config if train_config is not None else ConfigRecord()
        self._flower_evaluate_fn = evaluate_fn
        rounds = -(-self.num_iters // self.iters_per_round) if num_rounds is None else int(num_rounds)
        log.info("Starting %s strategy:", type(self).__name__)
        log.info("\t├── Number of rounds: %d (%d iterations of %d, transport=%s)", rounds, self.num_iters,
                 self.iters_per_round, self.transport)
        result = Result()
        self._result = result
        status, error = RUNNING, None
        k_done = 0
        if self.resume:
            self._snapshot = self.recorder.load_checkpoint()
            k_done = int(self._snapshot["k"])
            self.history, self.bits = list(self._snapshot["history"]), np.asarray(self._snapshot["bits"], dtype=np.int64)
        if evaluate_fn is not None and k_done == 0 and self._initial is not None:
            res = evaluate_fn(0, self._initial)
            log.info("Initial global evaluation results: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        try:
            for rnd in range(1, rounds + 1):
                k0 = (rnd - 1) * self.iters_per_round
                k1 = min(self.num_iters, k0 + self.iters_per_round)
                if k0 >= k1:
                    break
                if k1 <= k_done:
                    continue  # finished before the resume
                log.info("")
                log.info("[ROUND %d/%d]", rnd, rounds)
                self._register(grid, rnd, k0)
                self.timings.setdefault("first_segment_start_s", time.perf_counter() - t0)
                self._segment_with_retries(grid, rnd, k0, k1)
                row = self.history[-1]
                result.train_metrics_clientapp[rnd] = MetricRecord(
                    {k: float(v) for k, v in row.items() if k != "eval"})
                # the privacy spent sits beside the server-side evaluation, as in GauLRQ's Result
                server = result.evaluate_metrics_serverapp.get(rnd)
                server = MetricRecord(dict(server) if server is not None else dict(row.get("eval") or {}))
                for key, v in self._eps_metrics().items():
                    server[key] = v
                result.evaluate_metrics_serverapp[rnd] = server
                self._log_progress(rnd, rounds, k0, k1, row)
                self._write(RUNNING, t0, error)
            # the plan's iterations ran: finished, or cut short by the budget (the recorder's one rule)
            status = completed_status(self.num_iters, self._num_iters_requested())
        except Exception as exc:
            status, error = FAILED, f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if self.history or status != FAILED:  # a run refused before its first segment leaves no file
                self._write(status, t0, error)
            if self.last_average is not None:
                result.arrays = self.average_arrays(self.last_average)
            if self.backend is not None:
                self.backend.shutdown()
                self.backend = None
        self.timings["total_s"] = time.perf_counter() - t0
        log.info("Strategy execution finished in %.2fs", self.timings["total_s"])
        return result

    def _log_progress(self, rnd: int, rounds: int, k0: int, k1: int, row: dict[str, Any]) -> None:
        """The round's lines in Flower's log: iterations done, the network average's evaluation, the eps spent."""
        seg_s = self.timings.get("gossip_s", 0.0) - self._gossip_s_logged
        self._gossip_s_logged = self.timings.get("gossip_s", 0.0)
        log.info("\t├──> iterations %d/%d done (segment k=%d..%d, %.1f s of gossip)", k1, self.num_iters, k0, k1 - 1,
                 seg_s)
        if row.get("eval"):
            log.info("\t├──> network average: %s", ", ".join(f"{key} {_fmt(v)}" for key, v in row["eval"].items()))
        eps = self._eps_metrics()
        delta = max((float(r["delta"]) for r in self.privacy if r.get("delta") is not None), default=None)
        if not eps:
            log.info("\t└──> privacy spent: not reported by the nodes")
            return
        at = f" at delta {delta:g}" if delta is not None else ""
        log.info("\t└──> privacy spent (largest over %d nodes%s): %s", self.n_nodes, at,
                 ", ".join(f"{key} {_fmt(v)}" for key, v in eps.items()))

    def privacy_spent(self):
        """The privacy spent so far, as Flower's DP strategies and :meth:`GauLRQ.privacy_spent` answer it (a
        ``PrivacySpent``): the largest ``eps_rigorous`` over the nodes at their delta (the DPPS family: the
        heuristic composition, labelled so); None for a non-private run or before the first segment."""
        from .flower_privacy import spent

        if not self.privacy:
            return None
        rep = max(self.privacy, key=lambda r: float(r.get("eps_rigorous") or r.get("eps_heuristic") or 0.0))
        heuristic = rep.get("eps_rigorous") is None
        eps = float(rep["eps_heuristic"] if heuristic else rep["eps_rigorous"])
        if eps == float("inf"):
            return None
        how = ("heuristic: composed Laplace releases of an estimated sensitivity, no DP proof" if heuristic else
               f"flower-dp: {rep.get('accountant', 'auto')} accountant, {rep.get('adjacency', '')} record-level, "
               f"largest over the nodes")
        return spent(eps, float(rep["delta"]), int(rep.get("steps_charged", 0)), how)

    def _eps_metrics(self) -> dict[str, float]:
        """The privacy spent so far: the largest ``eps_rigorous`` / ``eps_paper`` (/ ``eps_heuristic``) over nodes."""
        out: dict[str, float] = {}
        for key in ("eps_rigorous", "eps_paper", "eps_heuristic"):
            vals = [float(r[key]) for r in self.privacy if r.get(key) is not None]
            if vals:
                out[key] = max(vals)
        return out

    def average_arrays(self, flat: torch.Tensor) -> ArrayRecord:
        """The network-average flat vector as the user's model: an ArrayRecord that loads with
        ``model.load_state_dict(record.to_torch_state_dict())``.

        Names and shapes come from the nodes' model (reported by node 0 on ``register``) and the buffers from
        ``initial_arrays``; a node without a model (the toy node) gives ``{"x": flat}``, or ``initial_arrays``'
        shapes when their sizes add up to d.
        """
        flat = flat.detach().cpu()
        template = self._initial
        layout = self._layout
        if layout is not None:
            params = {name: flat[a:b].reshape(shape) for name, a, b, shape in layout}
            if template is None:
                return ArrayRecord({name: Array(np.ascontiguousarray(t.numpy())) for name, t in params.items()})
            out = {}
            for name, arr in template.items():
                ref = arr.numpy()
                out[name] = Array(np.ascontiguousarray(params[name].numpy().astype(ref.dtype).reshape(ref.shape))
                                  if name in params else ref)
            return ArrayRecord(out)
        if template is not None and sum(int(np.prod(a.shape)) for a in template.values()) == flat.numel():
            out, pos = {}, 0
            for name, arr in template.items():
                ref = arr.numpy()
                out[name] = Array(np.ascontiguousarray(flat[pos:pos + ref.size].numpy().astype(ref.dtype).reshape(ref.shape)))
                pos += ref.size
            return ArrayRecord(out)
        return ArrayRecord({"x": Array(flat.numpy().copy())})

    def _register(self, grid: Grid, rnd: int, k0: int) -> None:
        """Send this round's ``register`` messages; on a fresh start, set the nodes up or restore them at ``k0``.

        Relay: only while the nodes are not set up (a round after the first costs no message round trip).
        """
        fresh = self.backend is None
        if not fresh and self.backend.register_once:
            return
        if fresh and self.transport == "ray":
            self._check_ray_reachable(grid)  # a deployment without a shared Ray fails before any wait
        t = time.perf_counter()
        self._wait_for_supernodes(grid, rnd)  # before the backend: a mismatch fails before any Ray work
        if fresh:
            self.backend = self._new_backend(grid)
            t = time.perf_counter()
        initial = self._initial if fresh and k0 == 0 and self._initial is not None else ArrayRecord()
        replies = list(grid.send_and_receive(self.configure_train(rnd, initial, self._train_config, grid),
                                             timeout=self.timeout_s))
        self.aggregate_train(rnd, replies)
        if len(replies) < self.n_nodes or len(set(self.node_of.values())) < self.n_nodes:
            have = sorted(set(self.node_of.values()))
            raise GossipTimeoutError(
                f"round {rnd}: only {len(replies)} of {self.n_nodes} ClientApps replied within {self.timeout_s:.0f} s "
                f"(nodes registered: {have}); set num-supernodes = {self.n_nodes}, give every SuperNode a distinct "
                "partition-id, or raise timeout_s")
        if fresh:
            if k0 == 0:
                self.backend.setup()
            else:
                states = self._restore(k0)
                self.backend.wait_registered()
                self.backend.load_state_dicts(states, k=k0)
            self.timings.setdefault("register_first_round_s", time.perf_counter() - t)

    def _wait_for_supernodes(self, grid: Grid, rnd: int) -> None:
        """Return once exactly ``n_nodes`` SuperNodes are connected; fail fast otherwise.

        Simulation: Flower registers all its SuperNodes at once, a moment after ``main()`` starts; once any are
        there (and the count held for ``_SETTLE_S``), a count other than ``n_nodes`` fails at once.  Deployment:
        SuperNodes connect at their own pace; wait up to ``node_wait_s`` (logged), then fail.  More SuperNodes
        than nodes fail at once on both engines (each would build a node that no other node gossips with).
        """
        simulation = _is_simulation(grid)
        fix = (f"set num-supernodes = {self.n_nodes} (`flwr run --federation-config 'num-supernodes={self.n_nodes}'`"
               f", or one flower-supernode per push-sum node with partition-id 0..{self.n_nodes - 1}), or make "
               f"n_nodes equal to the number of SuperNodes")
        live = len(list(grid.get_node_ids()))
        if live == self.n_nodes:
            return
        if simulation:
            deadline = time.monotonic() + self.timeout_s
            seen, since = live, time.monotonic()
            while time.monotonic() < deadline and (seen == 0 or time.monotonic() - since < _SETTLE_S):
                time.sleep(0.05)
                now = len(list(grid.get_node_ids()))
                if now != seen:
                    seen, since = now, time.monotonic()
            if seen == 0:
                raise GossipTimeoutError(f"round {rnd}: Flower's simulation started no SuperNode within "
                                         f"{self.timeout_s:.0f} s (n_nodes = {self.n_nodes}); {fix}, or raise "
                                         "timeout_s on a loaded machine")
            if seen != self.n_nodes:
                raise ConfigError(f"round {rnd}: the simulation runs {seen} SuperNodes, n_nodes = {self.n_nodes} "
                                  f"(one SuperNode per push-sum node is needed); {fix}")
            return
        if live > self.n_nodes:
            raise ConfigError(f"round {rnd}: {live} SuperNodes are connected, n_nodes = {self.n_nodes} (one "
                              f"SuperNode per push-sum node is needed); {fix}")
        log.info("PushSum: %d of %d SuperNodes connected; waiting up to %.0f s (node_wait_s) for the others",
                 live, self.n_nodes, self.node_wait_s)
        deadline = time.monotonic() + self.node_wait_s
        while live < self.n_nodes and time.monotonic() < deadline:
            time.sleep(0.2)
            live = len(list(grid.get_node_ids()))
        if live != self.n_nodes:
            raise GossipTimeoutError(
                f"round {rnd}: {live} Flower SuperNodes connected within node_wait_s = {self.node_wait_s:.0f} s, "
                f"n_nodes = {self.n_nodes} (one SuperNode per push-sum node is needed); {fix}, or raise node_wait_s "
                "when SuperNodes are still starting")

    def _new_backend(self, grid: Grid) -> Any:
        """The backend of ``transport``: Ray host actors, or the relay over this strategy's Flower messages."""
        if self.transport == "relay":
            return RelayGossipBackend(self.n_nodes, functools.partial(self._send, grid),
                                      keep_states=self._keep_states(restartable=False))
        from flower_dp.gossip.ray_backend import RayGossipBackend

        t = time.perf_counter()
        address = self.backend_kwargs.get("address") or os.environ.get("RAY_ADDRESS") or None
        # In simulation Flower initialises Ray itself (2-4 s after main() on an idle machine, 30 s when loaded;
        # joining RAY_ADDRESS when set); a second ray.init from here would crash Flower's, so wait for it.  On the
        # deployment engine nobody else starts Ray here: connect to the named cluster at once.
        wait = self.timeout_s if _is_simulation(grid) else 0.0
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
            self.timings.setdefault("wait_for_ray_s", time.perf_counter() - t)  # Flower starting Ray
        else:
            log.info("PushSum: connecting to the Ray cluster at %r", address)
        kw = {"timeout_s": self.timeout_s, **self.backend_kwargs}
        backend = RayGossipBackend(self.n_nodes, **kw)
        self.spec["_ray"] = {"name": backend.name, "namespace": backend.namespace,
                             "num_hosts": backend.num_hosts, "n_nodes": self.n_nodes,
                             "address": None if wait else address}
        self.timings["backend_start_s"] = time.perf_counter() - t
        return backend

    def _keep_states(self, restartable: bool) -> bool:
        """Whether the nodes' states come back after each segment: for the checkpoint, or in memory for restarts."""
        return self.recorder.checkpoint or (restartable and self.max_retries > 0)

    def _check_ray_reachable(self, grid: Grid) -> None:
        """Fail in seconds where ``transport="ray"`` cannot work: Flower's deployment engine without a shared Ray.

        Peer-to-peer push-sum needs every ClientApp to reach the host actors.  Flower's simulation runs the
        ServerApp and the ClientApps in one Ray cluster (its Grid is the in-memory one); on the deployment
        engine each ClientApp runs in its own process and would start a private Ray, where the host actors do
        not exist (Ray's "Failed to look up actor" after minutes).  Without ``backend_kwargs["address"]`` or
        ``RAY_ADDRESS`` naming a cluster that the SuperNodes also join, that is an error here, before any work.
        We do not fall back to the relay silently: it moves every share through the SuperLink (a different
        cost and a different party seeing the messages), which the user should choose.
        """
        if self.backend_kwargs.get("address") or os.environ.get("RAY_ADDRESS"):
            return
        if _is_simulation(grid):
            return  # one Ray cluster for ServerApp and ClientApps
        raise ValueError(
            f"transport='ray' cannot work on Flower's deployment engine without a shared Ray cluster (got a "
            f"{type(grid).__name__}: each ClientApp runs in its own process and cannot reach the host actors); "
            "use transport='relay' (the SuperLink routes every share), or start one Ray cluster that the ServerApp "
            "and every SuperNode join (ray start --head / --address) and pass backend_kwargs={'address': "
            "'<head>:<port>'} or set RAY_ADDRESS on all of them")

    # -- checkpoints and faults -------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {"n_nodes": self.n_nodes, "num_iters": self.num_iters, "iters_per_round": self.iters_per_round,
                "algorithm": self.spec.get("algorithm", "custom")}

    def _node_devices(self) -> list[str]:
        """Where the nodes draw their noise (its sampler: :func:`flower_dp.mechanisms.noise.gaussian_sampler`):
        the Ray hosts' devices (``backend.devices``) or the relay nodes' register replies once known; before that
        (a resume checks its checkpoint first) the device they will get: ``backend_kwargs["device"]``, or CUDA for
        Ray hosts with a GPU share where CUDA is visible / the relay spec's ``device`` resolved here, else the CPU.
        Re-checked against the checkpoint when the nodes are restored (:meth:`_restore`)."""
        devices = getattr(self.backend, "devices", None) if self.backend is not None else None
        if devices:
            return [str(d) for d in devices]
        if self.transport == "relay" and self._relay_devices:
            return [self._relay_devices[i] for i in sorted(self._relay_devices)]
        if self.transport == "relay":  # as clients.push_sum_node._relay_device resolves it
            return [resolve_device(str(self.spec.get("device", "cpu")), log=False)]
        if self.backend_kwargs.get("device") is not None:
            return [str(self.backend_kwargs["device"])]
        gpu = float(self.backend_kwargs.get("num_gpus_per_host", 0) or 0) > 0
        return ["cuda" if gpu and torch.cuda.is_available() else "cpu"]

    def _restore(self, k0: int) -> dict[int, Any]:
        """Node states (and history, bits) of the checkpoint at iteration ``k0``."""
        ck = self._snapshot
        if ck is None or int(ck["k"]) != k0:
            if not self.recorder.checkpoint:
                raise CheckpointError(f"no checkpoint at k={k0} to restore the nodes from, got none; run with an "
                                      "out_dir and checkpoint=True")
            ck = self.recorder.load_checkpoint()  # refuses a corrupted file (checksum) or another run's
        if int(ck["k"]) != k0:
            raise CheckpointError(f"the checkpoint in {str(self.out_path)!r} is at k={ck['k']}, the nodes must be "
                                  f"restored at k={k0}; got a stale file, start a new out_dir")
        want = sampler_identity(self._node_devices())["gaussian_sampler"]
        if self.recorder.checkpoint and ck.get("gaussian_sampler") != want:  # the nodes came up on other devices
            raise CheckpointError(SAMPLER_REFUSAL["gaussian_sampler"](repr(str(self.out_path)),
                                                                      ck.get("gaussian_sampler"), want))
        self.history = list(ck["history"])
        self.bits = np.asarray(ck["bits"], dtype=np.int64)
        states = {i: st for i, st in enumerate(ck["nodes"])}
        plan = self.spec.get("plan")
        if plan is not None and hasattr(plan, "steps"):  # secret mode: the lost segment's steps are charged again
            k1 = min(self.num_iters, k0 + self.iters_per_round)
            states = {i: charge_replay(st, plan, i, k0, k1) for i, st in states.items()}
        return states

    def _segment_with_retries(self, grid: Grid, rnd: int, k0: int, k1: int) -> None:
        for attempt in range(self.max_retries + 1):
            try:
                self._segment(rnd, k0, k1)
                return
            except NodeFailureError as exc:
                self.failures.append({"round": rnd, "k0": k0, "k1": k1, "host": exc.host, "nodes": exc.nodes,
                                      "attempt": attempt + 1, "error": str(exc)})
                self.backend.shutdown()
                self.backend = None
                if attempt == self.max_retries:
                    raise NodeFailureError(
                        f"round {rnd} (segment k={k0}..{k1 - 1}): nodes {exc.nodes} died with their host actor "
                        f"{exc.host}; stopped after {attempt} automatic restart(s) from the last checkpoint "
                        f"(max_retries={self.max_retries}); the results so far and the checkpoint at k={k0} are kept: "
                        "rerun with resume=True or raise max_retries", host=exc.host, nodes=exc.nodes, k0=k0, k1=k1,
                    ) from exc
                log.warning("round %d (segment k=%d..%d): nodes %s died with host actor %d; restarting the host "
                            "actors from the checkpoint at k=%d (attempt %d of %d)", rnd, k0, k1 - 1, exc.nodes,
                            exc.host, k0, attempt + 1, self.max_retries)
                if k0 == 0:
                    self._snapshot = None
                self._register(grid, rnd, k0)

    def _segment(self, rnd: int, k0: int, k1: int) -> None:
        be = self.backend
        seg = be.run_segment(k0, k1, debug_metrics=self.debug_metrics)
        self.timings["gossip_s"] = self.timings.get("gossip_s", 0.0) + seg.wall_time_s
        self.bits += seg.bits_sent
        avg = be.network_average()
        if self._layout is None:  # names and shapes of the nodes' model (public), for Result.arrays
            self._layout = be.param_layout()
        # the eps spent so far goes into the Result's metrics every round
        self.privacy = [dict(r, node=i) for i, r in be.privacy_reports().items()]
        states = be.state_dicts() if self._keep_states(be.restartable) else None
        self._finish_segment(rnd, k1, seg.metric_means(), avg, states)

    def _send(self, grid: Grid, action: str, k: int, per_node: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        flower_of = {v: f for f, v in self.node_of.items()}
        msgs = []
        for i in range(self.n_nodes):
            tree, arrays = to_records(per_node[i])
            cfg = ConfigRecord({KEY["action"]: action, KEY["k"]: k, KEY["transport"]: "relay", KEY["payload"]: tree})
            msgs.append(Message(RecordDict({"pushsum": cfg, ARRAYS_KEY: ArrayRecord(arrays)}), dst_node_id=flower_of[i],
                                message_type="train"))
        out = {}
        for msg in self._exchange(grid, msgs):
            if msg.has_error():
                raise RuntimeError(f"ClientApp on Flower node {msg.metadata.src_node_id} failed at k={k}: {msg.error.reason}")
            arrays = msg.content.array_records.get(ARRAYS_KEY)
            out[self.node_of[msg.metadata.src_node_id]] = from_records(msg.content["pushsum"][KEY["payload"]], arrays)
        if len(out) < self.n_nodes:
            missing = sorted(set(range(self.n_nodes)) - set(out))
            raise GossipTimeoutError(f"relay: no reply from nodes {missing} at k={k} ({action}) within "
                                     f"{self.timeout_s:.0f} s; check those SuperNodes or raise timeout_s")
        return out

    def _exchange(self, grid: Grid, msgs: list[Message]) -> list[Message]:
        """``grid.send_and_receive`` with a short poll: Flower's deployment Grid sleeps 3 s between pulls, a
        relay iteration is one or two such exchanges; here the replies are pulled every ``poll_s`` seconds."""
        if not (hasattr(grid, "push_messages") and hasattr(grid, "pull_messages")):
            return list(grid.send_and_receive(msgs, timeout=self.timeout_s))
        ids = set(grid.push_messages(msgs))
        deadline = time.monotonic() + self.timeout_s
        out: list[Message] = []
        while ids:
            got = list(grid.pull_messages(ids))
            out += got
            ids -= {m.metadata.reply_to_message_id for m in got}
            if not ids or time.monotonic() >= deadline:
                break
            if not got:
                time.sleep(self.poll_s)
        return out

    def _finish_segment(self, rnd: int, k: int, means: dict[str, float], avg: torch.Tensor, states: Any) -> None:
        if not bool(torch.isfinite(avg).all()):
            raise NonFiniteError(f"the network-average model became non-finite by iteration {k - 1}", step=k - 1)
        self.last_average = avg
        row: dict[str, Any] = {"round": rnd, "k": k, "bits_total": int(self.bits.sum()), **means}
        if self.evaluate_fn is not None:
            ev = self.evaluate_fn(rnd, avg)
            if ev:
                row["eval"] = {key: float(v) for key, v in ev.items()}
        if self._flower_evaluate_fn is not None:
            res = self._flower_evaluate_fn(rnd, self.average_arrays(avg))
            if res is not None:
                self._result.evaluate_metrics_serverapp[rnd] = res
                row.setdefault("eval", {}).update({key: float(v) for key, v in res.items()
                                                   if isinstance(v, (int, float))})
        self.history.append(row)
        if states is not None:
            snap = {"k": k, "nodes": [states[i] for i in range(self.n_nodes)],
                    "history": list(self.history), "bits": self.bits.tolist(), "privacy": self.privacy}
            if self.recorder.checkpoint:
                self.recorder.save_checkpoint(snap)
                self._snapshot = None  # restore from the checksummed file
            else:
                self._snapshot = snap

    def _claims_privacy(self, plan: Any) -> bool:
        """The plan's ``private`` flag; without a plan (toy or custom nodes), whether the nodes kept their
        statistics to themselves (a node that is not private releases them, :mod:`flower_dp.releases`)."""
        if plan is not None and hasattr(plan, "private"):
            return bool(plan.private)
        allowed = PUBLIC_NODE_METRICS | HEURISTIC_BROADCAST_METRICS | {"round", "k", "bits_total", "eval"}
        return self.debug_metrics or all(key in allowed for row in self.history for key in row)

    def _num_iters_requested(self) -> int:
        """K the config asked for (the plan's; without a plan, ``num_iters``)."""
        return int(getattr(self.spec.get("plan"), "num_iters_requested", self.num_iters))

    def _write(self, status: str, t0: float, error: str | None) -> None:
        """``results.json`` and ``history.csv`` in the in-process runner's layout (plus Flower's extras)."""
        if self.out_path is None:
            return
        plan = self.spec.get("plan")
        rows = [{**{key: v for key, v in row.items() if key != "eval"}, **row.get("eval", {})} for row in self.history]
        doc = {"name": self.run_name, "status": status, "error": error,
               "config": (self.spec.get("config") or {}), "seed": getattr(plan, "seed", None),
               # the toy node (no plan) draws seeded noise and claims no privacy
               "noise": noise_record(bool(getattr(plan, "reproducible", True)), device=self._node_devices()),
               "algorithm": self.spec.get("algorithm", "custom"), "backend": f"flower-{self.transport}",
               "num_iters_requested": self._num_iters_requested(),
               "num_iters": self.num_iters, "iters_per_round": self.iters_per_round, "history": rows,
               **release_fields(self.debug_metrics, private=self._claims_privacy(plan)),
               "privacy": {"per_node": self.privacy, "plan": plan_summary(plan, self._node_devices())},
               "bits_sent_per_node": self.bits.tolist(), "failures": self.failures,
               "wall_time_s": time.perf_counter() - t0, "timings": self.timings, "versions": rio.versions()}
        self.recorder.write(doc, rows)
