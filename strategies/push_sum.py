"""The push-sum coordinator for Flower (Message API): one Flower round = one gossip segment.

:class:`PushSumStrategy` is the Flower glue of a push-sum run: it answers Flower's ``Strategy`` interface, turns the
run's progress into Flower's ``Result`` (the network average as an ``ArrayRecord``, per-round metrics, the privacy
spent) and logs each round, while the run engine (:func:`flower_dp.engine.run_segments`) drives the segments and
keeps the record (history, checkpoint, status, ``results.json``).  The nodes live with the SuperNodes and run on the
transport's backend (:mod:`flower_dp.strategies._push_sum_backend`): ``transport="ray"`` (shares go host to host
between Ray host actors; Flower's simulation, or the deployment engine with one shared Ray cluster) or
``transport="relay"`` (every share through Flower messages; works anywhere, with the same numbers).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_dp._checks import check_choice, check_int, check_positive
from flower_dp.engine import RunHeader, RunProgress, SegmentPlan, run_segments
from flower_dp.gossip.relay import ARRAYS_KEY, MESSAGE_KEYS as KEY, encode
from flower_dp.privacy.parties import check_push_sum_party
from flower_dp.recorder import SAMPLER_REFUSAL, RunRecorder, plan_summary, sampler_identity
from flower_dp.releases import HEURISTIC_BROADCAST_METRICS, PUBLIC_NODE_METRICS, RELEASE_WARNING, release_fields
from flower_dp.rng import noise_record

from ._push_sum_arrays import average_arrays
from ._push_sum_backend import FlowerSegments
from ._push_sum_spec import NodeSpec

__all__ = ["PushSumStrategy", "NodeSpec"]

# Flower's own logger: its handlers print to the console of a simulation and stream to `flwr run --stream` /
# `flwr log` from a ServerApp process, where a logger of flower-dp's own has no handler
log = logging.getLogger("flwr")

if TYPE_CHECKING:
    import torch

EvaluateFn = Callable[[int, "torch.Tensor"], dict[str, float] | None]


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class PushSumStrategy(Strategy):
    """Coordinate a push-sum run over Flower SuperNodes.

    Parameters
    ----------
    n_nodes : int
        Number of push-sum nodes = SuperNodes (node id = ``node_config["partition-id"]``).
    spec : dict or NodeSpec
        What each ClientApp's node builder needs (sent once per node; e.g. the registry plan, the data and model
        names): kept as a frozen :class:`~flower_dp.strategies._push_sum_spec.NodeSpec` in ``self.spec``.
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
    run_info : dict, optional
        What the results document says about the run's data and model (its ``"info"``).
    party : str, optional
        Whom the eps is stated for (:mod:`flower_dp.privacy.parties`): ``"out_neighbour"`` (default; also the
        spec's ``party``, as :func:`flower_dp.clients.push_sum_node.plan_spec` writes it, or its config's
        ``[privacy] party``), ``"model_observer"`` or ``"relay"`` (the orchestrator relaying every share; refused
        when the nodes' states come back to the server: ``checkpoint`` with ``out_dir``, or Ray's restarts).
        Every party's entry is in ``results.json["eps_by_party"]``.
    """

    #: the Flower side of a run (the registration rounds, the transport's backend); a subclass may instrument it
    segments_class = FlowerSegments

    def __init__(self, n_nodes: int, spec: NodeSpec | Mapping[str, Any], *, num_iters: int, iters_per_round: int,
                 transport: str = "ray", evaluate_fn: EvaluateFn | None = None, out_dir: str | Path | None = None,
                 timeout_s: float = 120.0, checkpoint: bool = True, run_name: str = "push_sum",
                 max_retries: int = 2, resume: bool = False, backend_kwargs: dict[str, Any] | None = None,
                 debug_metrics: bool = False, node_wait_s: float = 30.0,
                 run_info: Mapping[str, Any] | None = None, party: str | None = None) -> None:
        self.n_nodes = check_int("n_nodes", n_nodes, minimum=1)
        self.spec = NodeSpec.of(spec)
        self.num_iters = check_int("num_iters", num_iters, minimum=1)
        self.iters_per_round = check_int("iters_per_round", iters_per_round, minimum=1)
        self.num_rounds = -(-self.num_iters // self.iters_per_round)  # start(num_rounds=...) may set another
        self.transport = check_choice("transport", transport, ("ray", "relay"))
        self.evaluate_fn, self.timeout_s = evaluate_fn, check_positive("timeout_s", timeout_s)
        self.node_wait_s = check_positive("node_wait_s", node_wait_s)
        self.checkpoint, self.run_name = bool(checkpoint), run_name
        self.run_info = None if run_info is None else dict(run_info)
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
        self.session = f"{run_name}-{os.getpid()}-{id(self):x}-{time.time_ns()}"
        self.ray_placement: dict[str, Any] | None = None  # where the Ray host actors live, for the ClientApps
        self.backend_kwargs = dict(backend_kwargs or {})
        # the transport's backend (RayGossipBackend or RelayGossipBackend), made on the first register
        self.backend: Any = None
        self.node_of: dict[int, int] = {}  # Flower node id -> push-sum node id
        self._relay_devices: dict[int, str] = {}  # push-sum node id -> device, from the relay nodes' register replies
        if party is None:
            party = self.spec.extra.get("party") or ((self.spec.config or {}).get("privacy") or {}).get("party")
        self.party = check_push_sum_party(party, states_to_server=self.keep_states)
        self.progress = RunProgress(self.n_nodes)
        self.timings: dict[str, float] = {}
        self._gossip_s_logged = 0.0  # gossip_s at the last progress line
        self.failures: list[dict[str, Any]] = []  # one entry per dead host actor (round, segment, nodes)
        self.initial: ArrayRecord | None = None  # Flower's initial_arrays (start)
        self.train_config = ConfigRecord()
        self.layout: list | None = None  # [[name, start, stop, shape]] of the nodes' trainable parameters

    # -- the run's progress, as the engine records it ---------------------------------------
    @property
    def history(self) -> list[dict[str, Any]]:
        """One row per round: ``round``, ``k``, ``bits_total``, the public node metrics, ``eval``."""
        return self.progress.history

    @property
    def bits(self):
        return self.progress.bits

    @property
    def privacy(self) -> list[dict[str, Any]]:
        """Every node's privacy report after the last round (``node``: its id)."""
        return self.progress.privacy

    @property
    def last_average(self) -> torch.Tensor | None:
        return self.progress.last_average

    @property
    def keep_states(self) -> bool:
        """Whether the nodes' states come back after each segment: for the checkpoint, or in memory for restarts."""
        return self.recorder.checkpoint or (self.transport == "ray" and self.max_retries > 0)

    # -- Strategy ABC (Message API) -----------------------------------------------------
    def summary(self) -> None:
        print(f"PushSumStrategy: n={self.n_nodes}, K={self.num_iters}, R={self.iters_per_round}, transport={self.transport}")

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """One ``register`` message per SuperNode (cheap after round 1: the node already exists).

        ``arrays`` (non-empty only when the nodes are built: Flower's ``initial_arrays``) is the nodes' starting
        model; ``config`` (Flower's ``train_config``) reaches the node builder as ``spec["train_config"]``.
        """
        ray = self.ray_placement if self.transport == "ray" else None
        cfg = ConfigRecord({KEY["action"]: "register", KEY["transport"]: self.transport, "round": server_round,
                            KEY["spec"]: encode(self.spec.wire(session=self.session, ray=ray))})
        if ray is not None:  # read without decoding the spec: the ClientApp registers without importing torch
            cfg[KEY["ray"]] = json.dumps(ray)
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
                self.layout = json.loads(str(rec["param_layout"]))
        return None, None

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # -- the run ------------------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              should_stop: Callable[[int, Result], bool] | None = None) -> Result:
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
        should_stop : callable (round, Result) -> bool, optional
            Flower 1.43's early stop: called after each round; True ends the run there with the results and the
            checkpoint saved (status ``"stopped"``, ``stop_reason = "should_stop: round r"``; ``resume=True``
            continues it, charging nothing twice).

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
        t0 = self.progress.started = time.perf_counter()
        if timeout is not None:
            self.timeout_s = check_positive("timeout", timeout)
        self.initial = initial_arrays if initial_arrays is not None and len(initial_arrays) else None
        self.train_config = train_config if train_config is not None else ConfigRecord()
        rounds = -(-self.num_iters // self.iters_per_round) if num_rounds is None else int(num_rounds)
        self.num_rounds = rounds  # the R of the "[ROUND r/R]" lines
        log.info("Starting %s strategy:", type(self).__name__)
        log.info("\t├── Number of rounds: %d (%d iterations of %d, transport=%s)", rounds, self.num_iters,
                 self.iters_per_round, self.transport)
        result = Result()
        if evaluate_fn is not None and not self.resume and self.initial is not None:
            res = evaluate_fn(0, self.initial)
            log.info("Initial global evaluation results: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        plan = self.spec.plan
        segments = SegmentPlan(n_nodes=self.n_nodes, num_iters=self.num_iters, iters_per_segment=self.iters_per_round,
                               num_iters_requested=self._num_iters_requested(), num_segments=rounds,
                               replay_plan=plan if hasattr(plan, "steps") else None, flower_rows=True)
        try:
            run_segments(self.segments_class(self, grid, t0), segments, recorder=self.recorder, header=self._header,
                         evaluate=lambda rnd, avg: self._evaluate(rnd, avg, evaluate_fn, result), resume=self.resume,
                         should_stop=None if should_stop is None else (lambda rnd, _p: should_stop(rnd, result)),
                         debug_metrics=self.debug_metrics, keep_states=self.keep_states,
                         on_segment=lambda rnd, k0, k1, _p: self._round_done(result, rnd, rounds, k0, k1),
                         progress=self.progress)
        finally:
            if self.last_average is not None:
                result.arrays = self.average_arrays(self.last_average)
        self.timings["total_s"] = time.perf_counter() - t0
        log.info("Strategy execution finished in %.2fs", self.timings["total_s"])
        return result

    def _evaluate(self, rnd: int, avg: torch.Tensor, evaluate_fn, result: Result) -> dict[str, float]:
        """A round's evaluation of the network average: ``evaluate_fn`` of the strategy, then Flower's (whose
        MetricRecord goes into ``result``)."""
        out: dict[str, float] = {}
        if self.evaluate_fn is not None:
            out.update({key: float(v) for key, v in (self.evaluate_fn(rnd, avg) or {}).items()})
        if evaluate_fn is not None:
            res = evaluate_fn(rnd, self.average_arrays(avg))
            if res is not None:
                result.evaluate_metrics_serverapp[rnd] = res
                out.update({key: float(v) for key, v in res.items() if isinstance(v, (int, float))})
        return out

    def _round_done(self, result: Result, rnd: int, rounds: int, k0: int, k1: int) -> None:
        """A round's metrics into Flower's ``Result`` (the privacy spent beside the server-side evaluation, as in
        GauLRQ's), and its lines in the log."""
        row = self.history[-1]
        result.train_metrics_clientapp[rnd] = MetricRecord({k: float(v) for k, v in row.items() if k != "eval"})
        server = result.evaluate_metrics_serverapp.get(rnd)
        server = MetricRecord(dict(server) if server is not None else dict(row.get("eval") or {}))
        for key, v in self._eps_metrics().items():
            server[key] = v
        result.evaluate_metrics_serverapp[rnd] = server
        self._log_progress(rnd, rounds, k0, k1, row)

    def _header(self, prog: RunProgress) -> RunHeader:
        """The results document's description of this run (the runner's layout plus Flower's extras)."""
        plan, devices = self.spec.plan, self._node_devices()
        return RunHeader(name=self.run_name, backend=f"flower-{self.transport}", algorithm=self.spec.algorithm_name,
                         config=self.spec.config or {}, seed=getattr(plan, "seed", None),
                         # the toy node (no plan) draws seeded noise and claims no privacy
                         noise=noise_record(bool(getattr(plan, "reproducible", True)), device=devices,
                                            sampler=getattr(plan, "noise_sampler", "float")),
                         released=release_fields(self.debug_metrics, private=self._claims_privacy(plan)),
                         plan_summary=plan_summary(plan, devices), num_iters_requested=self._num_iters_requested(),
                         num_iters=self.num_iters, iters_per_round=self.iters_per_round, info=self.run_info,
                         extras={"failures": self.failures, "timings": self.timings}, party=self.party,
                         transport=self.transport, states_to_server=self.keep_states)

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

    def privacy_spent(self, party: str | None = None):
        """The privacy spent so far, as Flower's DP strategies and :meth:`GauLRQ.privacy_spent` answer it (a
        ``PrivacySpent``): the largest ``eps_rigorous`` over the nodes at their delta (the DPPS family: the
        heuristic composition, labelled so), for ``party`` (default :attr:`party`), named in ``accounting_method``;
        None for a non-private run or before the first segment."""
        from .flower_privacy import spent_over_nodes

        return spent_over_nodes(self.privacy, self.party if party is None else party, self.keep_states)

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
        ``model.load_state_dict(record.to_torch_state_dict())`` (:func:`average_arrays`)."""
        return average_arrays(flat, self.layout, self.initial)

    # -- the identity of a checkpoint --------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {"n_nodes": self.n_nodes, "num_iters": self.num_iters, "iters_per_round": self.iters_per_round,
                "algorithm": self.spec.algorithm_name}

    def _node_devices(self) -> list[str]:
        """Where the nodes draw their noise (its sampler: :func:`flower_dp.mechanisms.noise.gaussian_sampler`):
        the Ray hosts' devices (``backend.devices``) or the relay nodes' register replies once known; before that
        (a resume checks its checkpoint first) the device they will get: ``backend_kwargs["device"]``, or CUDA for
        Ray hosts with a GPU share where CUDA is visible / the relay spec's ``device`` resolved here, else the CPU.
        The engine checks the checkpoint again when it restores the nodes."""
        devices = getattr(self.backend, "devices", None) if self.backend is not None else None
        if devices:
            return [str(d) for d in devices]
        if self.transport == "relay" and self._relay_devices:
            return [self._relay_devices[i] for i in sorted(self._relay_devices)]
        if self.transport == "relay":  # as clients.push_sum_node._relay_device resolves it
            from flower_dp.models import resolve_device

            return [resolve_device(str(self.spec.device or "cpu"), log=False)]
        if self.backend_kwargs.get("device") is not None:
            return [str(self.backend_kwargs["device"])]
        if float(self.backend_kwargs.get("num_gpus_per_host", 0) or 0) <= 0:
            return ["cpu"]
        import torch

        return ["cuda" if torch.cuda.is_available() else "cpu"]

    def _claims_privacy(self, plan: Any) -> bool:
        """The plan's ``private`` flag; without a plan (toy or custom nodes), whether the nodes kept their
        statistics to themselves (a node that is not private releases them, :mod:`flower_dp.releases`)."""
        if plan is not None and hasattr(plan, "private"):
            return bool(plan.private)
        allowed = PUBLIC_NODE_METRICS | HEURISTIC_BROADCAST_METRICS | {"round", "k", "bits_total", "eval"}
        return self.debug_metrics or all(key in allowed for row in self.history for key in row)

    def _num_iters_requested(self) -> int:
        """K the config asked for (the plan's; without a plan, ``num_iters``)."""
        return int(getattr(self.spec.plan, "num_iters_requested", self.num_iters))
