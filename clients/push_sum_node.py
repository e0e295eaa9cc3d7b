"""The node side of the push-sum ClientApp (its message handler and node builders), and a small demo node (noisy
push-sum SGD on a quadratic).  The ClientApp itself is :mod:`flower_dp.clients.push_sum_app`.

One SuperNode = one push-sum node; ``context.node_config["partition-id"]`` is its node id.
The ClientApp is driven by :class:`flower_dp.strategies.push_sum.PushSumStrategy`
(message keys in :mod:`flower_dp.gossip.relay`):

* transport ``"ray"``: on a ``"register"`` message the ClientApp builds its node factory
  from its own partition and sends it to its host actor (found by name and namespace),
  then replies at once.  It never waits for other nodes, so however few ClientApps
  Flower runs at once (6 here), nothing can deadlock.  The gossip itself runs between the
  host actors (:mod:`flower_dp.gossip.ray_backend`).
* transport ``"relay"``: the node lives in the ClientApp; its state travels in
  ``context.state`` between rounds; each message carries the node's inbox and the reduced
  values, and the reply carries its outgoing shares (the server routes them).

Nodes come from a *node builder* ``builder(node_id, spec, context) -> factory`` where
``factory(node_id, device) -> Node`` is picklable.  :func:`toy_builder` builds the demo
node below; :func:`registry_builder` builds the algorithm nodes of
:mod:`flower_dp.clients.registry` from the plan the server sends, through the in-process runner's node
builder (:mod:`flower_dp.clients.builder`).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch

from flower_dp import sources
from flower_dp.gossip import Contribution, Share
from flower_dp.gossip import relay as keys
from flower_dp.rng import NodeKey, numpy_rng

from .builder import ExperimentParts, base_topology, build_parts, make_run_node, model_dim, run_topology

__all__ = ["ToyQuadraticNode", "build_toy_node", "build_plan_node", "build_registry_node", "toy_builder",
           "registry_builder", "spec_from_config", "spec_from_parts", "plan_spec", "model_builder",
           "handle_message", "handle_content", "BUILDERS"]



def _gen(seed: int, node: int, purpose: str, k: int) -> torch.Generator:
    """torch generator for the stream (seed, node, purpose, k), seeded through ``numpy_rng``."""
    g = torch.Generator()
    g.manual_seed(int(numpy_rng(seed, node, purpose, k).integers(2**63 - 1)))
    return g


NodeBuilder = Callable[[int, dict, Any], Callable[[int, str], Any]]


class ToyQuadraticNode:
    """Push-sum SGD on ``f_i(z) = ||z - t_i||^2 / 2`` with seeded Gaussian gradient noise.

    A demo/test node with the full node interface (contribute -> reduce -> local_step -> mix).

    Parameters
    ----------
    node_id : int
    topology : flower_dp.topology.Topology
        Gives the send weights ``P^k[r, i]``.
    dim : int
        Model size d.
    lr : float
        Step size gamma.
    noise_std : float
        Noise std per coordinate is ``noise_std * (1 + G_k)``, with ``G_k`` the network max of
        the gradient norms (the reduce step; ``use_reduce=False`` skips it and uses ``noise_std``).
    seed : int
        Targets ``t_i`` and ``x_i^0`` come from streams (seed, i, "init", 0/1); noise from (seed, i, "noise", k).
    stall_at, stall_s : int, float
        Sleep ``stall_s`` seconds in ``local_step`` at iteration ``stall_at`` (to test timeouts).
    crash_at, crash_marker : int, str
        At iteration ``crash_at``, the first node to create the file ``crash_marker`` SIGKILLs the
        process holding it (to test a worker dying mid-segment, once per marker).
    device : str

    The node makes no privacy claim (its noise is not accounted, its reduce step sends the clean
    gradient norm): ``private = False``, so its metrics are released (:mod:`flower_dp.releases`).
    """

    #: no privacy claim: nothing is charged, eps = inf (flower_dp.releases.node_is_private)
    private = False

    def __init__(self, node_id: int, topology: Any, *, dim: int = 16, lr: float = 0.2, noise_std: float = 0.05,
                 seed: int = 0, use_reduce: bool = True, stall_at: int = -1, stall_s: float = 0.0, crash_at: int = -1,
                 crash_marker: str = "", device: str = "cpu"):
        self.node_id, self.topology, self.dim, self.lr = int(node_id), topology, int(dim), float(lr)
        self.noise_std, self.seed, self.use_reduce = float(noise_std), int(seed), bool(use_reduce)
        self.stall_at, self.stall_s, self.device = int(stall_at), float(stall_s), device
        self.crash_at, self.crash_marker = int(crash_at), str(crash_marker)
        self.target = torch.randn(self.dim, generator=_gen(seed, node_id, "init", 0)).to(device)
        self.x = torch.randn(self.dim, generator=_gen(seed, node_id, "init", 1)).to(device)
        self.w = 1.0
        self._metrics: dict[str, float] = {}

    def setup(self) -> None:
        pass

    def z(self) -> torch.Tensor:
        return self.x / self.w

    def contribute(self, k: int) -> dict[str, Contribution] | None:
        if not self.use_reduce:
            return None
        return {"G": Contribution(float(torch.linalg.vector_norm(self.z() - self.target)), "max")}

    def local_step(self, k: int, reduced: dict[str, Any] | None = None) -> list[Share]:
        if k == self.stall_at:
            time.sleep(self.stall_s)
        if k == self.crash_at and self.crash_marker:
            try:  # O_EXCL: exactly one node of the whole network crashes, once
                os.close(os.open(self.crash_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        g = self.z() - self.target
        std = self.noise_std * (1.0 + float(reduced["G"])) if reduced else self.noise_std
        noise = torch.randn(self.dim, generator=_gen(self.seed, self.node_id, "noise", k)).to(self.device)
        self._metrics = {"loss": 0.5 * float(g.square().sum()), "noise_std": std}
        x_half = self.x - self.lr * (g + std * noise)
        return [
            Share(self.node_id, r, k, {"x": x_half * p}, weight=self.w * p, wire_bits=0 if r == self.node_id else 32 * (self.dim + 1))
            for r, p in sorted(self.topology.send_weights(self.node_id, k).items())
        ]

    def mix(self, inbox: list[Share]) -> None:
        x = torch.zeros_like(self.x)
        w = 0.0
        for s in inbox:
            x = x + s.tensors["x"]
            w = w + s.weight
        self.x, self.w = x, w

    def last_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def eval_params(self) -> torch.Tensor:
        return self.z()

    def privacy_report(self) -> dict[str, Any]:
        return {"eps_rigorous": float("inf"), "eps_paper": float("inf"), "note": "toy node adds unaccounted noise"}

    def state_dict(self) -> dict[str, Any]:
        return {"x": self.x.detach().cpu().clone(), "w": self.w}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.x, self.w = state["x"].to(self.device).clone(), float(state["w"])


def build_toy_node(node_id: int, device: str = "cpu", *, topology: Any = None, topology_name: str = "random_irregular",
                   n_nodes: int | None = None, topology_kwargs: dict | None = None, **kw: Any) -> ToyQuadraticNode:
    """``factory(node_id, device)`` for :class:`ToyQuadraticNode` (bind the rest with ``functools.partial``)."""
    if topology is None:
        from flower_dp.topology import make_topology

        if n_nodes is None:
            raise ValueError("build_toy_node needs topology= or n_nodes=; got neither")
        topology = make_topology(topology_name, int(n_nodes), **(topology_kwargs or {}))
    return ToyQuadraticNode(node_id, topology, device=device, **kw)


def toy_builder(node_id: int, spec: dict, context: Any = None) -> Callable[[int, str], ToyQuadraticNode]:
    """Node builder for :class:`ToyQuadraticNode`; ``spec = {"n_nodes", "topology", "topology_kwargs", "node_kwargs"}``."""
    return functools.partial(build_toy_node, n_nodes=int(spec["n_nodes"]), topology_name=spec.get("topology", "random_irregular"),
                             topology_kwargs=dict(spec.get("topology_kwargs", {})), **dict(spec.get("node_kwargs", {})))


def spec_from_config(config: Any) -> dict[str, Any]:
    """Server side: the node spec (config + calibrated plan) of an experiment config, as the in-process runner plans it
    (:func:`flower_dp.clients.builder.build_parts`).

    ``spec["plan"].num_iters`` is K after the budget's pre-flight truncation.
    """
    return spec_from_parts(build_parts(config, test=False))


def spec_from_parts(parts: ExperimentParts) -> dict[str, Any]:
    """The node spec of an experiment already built by :func:`flower_dp.clients.builder.build_parts` (its config and
    plan): what the server sends every SuperNode.  The Flower backend builds its parts once, with the test split it
    evaluates on (:func:`flower_dp.experiments.flower_backend.run_flower_experiment`)."""
    return {"builder": "registry", "algorithm": parts.config["algorithm"]["name"], "config": parts.config,
            "plan": parts.plan}


def build_registry_node(node_id: int, device: str = "cpu", *, config: dict, plan: Any,
                        own: dict[str, Any] | None = None) -> Any:
    """Build node ``node_id`` of an experiment config exactly as the in-process runner does.

    Runs where the node will live (host actor or ClientApp), through the runner's node builder
    (:func:`flower_dp.clients.builder.build_parts` with the server's plan): loads the dataset (cached per
    process), takes this node's partition, builds the topology and the model, calls ``make_node``.  ``own``: the
    caller's own model and data the config names (:mod:`flower_dp.sources`), registered here first.
    """
    if own:
        sources.install(own)
    return build_parts(config, plan=plan, test=False).build_node(node_id, device)


def build_plan_node(node_id: int, device: str = "cpu", *, plan: Any, topology: Any, model_fn: Callable[[], Any],
                    data: Any, loss_fn: Callable | None = None) -> Any:
    """``factory(node_id, device)`` for a registry plan with in-memory data ``data[node_id] = (x, y)``.

    ``model_fn`` and ``loss_fn`` must be picklable (e.g. ``functools.partial(build_model, ...)``);
    the loss defaults to cross-entropy, as in the in-process runner.
    """
    x, y = data[node_id]
    return make_run_node(plan, node_id, topology=topology, model=model_fn(), data_x=x, data_y=y, device=device,
                         loss_fn=loss_fn)


def registry_builder(node_id: int, spec: dict, context: Any = None) -> Callable[[int, str], Any]:
    """Node builder for the registry algorithms; ``spec = {"config": cfg.to_dict(), "plan": plan}``.

    The returned factory is small (data is loaded where the node is built, from its partition id).
    """
    config = spec["config"]
    names = {config["data"]["dataset"], config["model"]["name"]}
    own = {name: sources.lookup(name) for name in names if sources.is_own(name)}
    return functools.partial(build_registry_node, config=config, plan=spec["plan"], own=own or None)


def plan_spec(algorithm: str, params: dict[str, Any], *, n_nodes: int, model_fn: Callable[[], Any],
              samples_per_node: int | list[int], num_iters: int, topology: str = "exp_one_peer",
              topology_kwargs: dict[str, Any] | None = None, seed: int = 0,
              reproducible: bool = False, party: str | None = None,
              noise_sampler: str = "float") -> dict[str, Any]:
    """Server side of a drop-in run with your own model: the node spec for :class:`PushSumStrategy`.

    Parameters
    ----------
    algorithm, params : registry name and its parameters (``flower_dp.clients.registry``)
    n_nodes : int
        Number of SuperNodes = push-sum nodes.
    model_fn : callable () -> torch.nn.Module
        Your model (called once here for its size d).
    samples_per_node : int or list of int
        Local dataset size J_i of each node (what your ``load_data`` returns), for the sampling rates.
    num_iters : int
        K requested; ``spec["plan"].num_iters`` is K after any budget truncation.
    topology, topology_kwargs : a :func:`flower_dp.topology.make_topology` name and arguments.
    seed : int
        Public randomness (topology, model init); and, only with ``reproducible=True``, the noise.
    reproducible : bool
        False (default): each node draws its privacy noise and batches from its own secret (OS
        entropy).  True: the simulation mode keyed by ``seed`` (same numbers on every backend; the
        guarantee holds only against parties that do not know the seed).
    party : str, optional
        Whom the eps is stated for (:mod:`flower_dp.privacy.parties`): ``"out_neighbour"`` (default),
        ``"model_observer"`` or ``"relay"``; all three are charged the per-node eps the noise is calibrated to, so
        the plan is the same; :class:`PushSumStrategy` reads it from the spec (and refuses ``"relay"`` when the
        nodes' states come back to the server).
    noise_sampler : {"float", "exact"}
        As ``[run] noise_sampler``: ``"exact"`` releases integers plus the exact discrete Gaussian
        (:func:`flower_dp.clients.plan.exact_plan`).
    """
    from flower_dp.privacy.parties import check_party

    from .registry import prepare

    party = check_party("push_sum", party)

    J = [int(samples_per_node)] * int(n_nodes) if isinstance(samples_per_node, int) else list(samples_per_node)
    dim = model_dim(model_fn())
    plan = prepare(algorithm, dict(params), n_nodes=int(n_nodes), samples_per_node=J, num_iters=int(num_iters),
                   dim=dim, seed=int(seed), reproducible=bool(reproducible), noise_sampler=noise_sampler)
    return {"builder": "model", "algorithm": algorithm, "plan": plan, "topology": topology,
            "topology_kwargs": dict(topology_kwargs or {}), "party": party}


def model_builder(model_fn: Callable[[], Any], load_data: Callable[[int, int], tuple[Any, Any]],
                  loss_fn: Callable | None = None) -> NodeBuilder:
    """Client side of a drop-in run: a node builder from your model and data loader.

    ``load_data(partition_id, num_partitions)`` returns that node's J_i training samples: ``(x, y)`` tensors, a
    ``DataLoader`` (batches ``(x, y)`` or dicts such as ``{"img": ..., "label": ...}``), a dataset (torch, or a
    flwr-datasets partition with a tensor transform) or a ``(trainloader, testloader)`` pair as Flower's PyTorch
    template returns it (:func:`flower_dp.data.as_tensors`; read once, in full: the node draws its own private
    batches).  J_i must equal the plan's ``samples_per_node`` (its sampling rate is charged).  ``model_fn`` and
    ``loss_fn`` (default cross-entropy) must be importable where the nodes run (module-level functions or
    classes).  Use with ``make_client_app(model_builder(...))`` and a strategy built from :func:`plan_spec`.
    """

    def builder(node_id: int, spec: dict, context: Any = None) -> Callable[[int, str], Any]:
        from flower_dp.data import as_tensors

        plan = spec["plan"]
        x, y = as_tensors(load_data(int(node_id), int(plan.n_nodes)))
        want = int(plan.samples_per_node[int(node_id)])
        if len(x) != want:
            raise ValueError(f"node {node_id}: load_data gave {len(x)} training samples, the plan was made for "
                             f"samples_per_node = {want} (its sampling rate B/J is what the accountant charges); "
                             f"pass samples_per_node={len(x)} (or the list of every node's count) to plan_spec")
        topology = run_topology(plan, base_topology(spec["topology"], int(plan.n_nodes), spec["topology_kwargs"]))
        return functools.partial(build_plan_node, plan=plan, topology=topology, model_fn=model_fn,
                                 data={int(node_id): (x, y)}, loss_fn=loss_fn)

    return builder


BUILDERS: dict[str, NodeBuilder] = {"toy": toy_builder, "registry": registry_builder}


def _register_wire_types() -> None:
    """Allow the registry's plan and parameter dataclasses in typed specs (:func:`flower_dp.gossip.wire.register`)."""
    from flower_dp.gossip import wire

    from .plan import Plan
    from .registry import ALGORITHMS

    wire.register(Plan)
    for params_cls, _, _ in ALGORITHMS.values():
        wire.register(params_cls)

# (run id, node id, session) -> (version, node); the session tells apart strategies run one after another
_RELAY_CACHE: dict[tuple[int, int, str], tuple[int, Any]] = {}


def _relay_device(spec: dict) -> str:
    """Where a relay node runs: ``spec["device"]`` (default ``"cpu"``); ``"auto"``/``"cuda"`` fall back to CPU with a log line."""
    want = str(spec.get("device", "cpu"))
    if want == "cpu":
        return want
    from flower_dp.models import resolve_device

    return resolve_device(want)


def _relay_node(context: Any, run_id: int, node_id: int, builder: NodeBuilder | None, action: str,
                k: int) -> tuple[Any, int]:
    """This node, from the process cache when current, else rebuilt from ``context.state``.

    Flower may run a node's next message in another ClientApp process.  A node rebuilt
    between its ``contribute`` and ``step`` requests starts from the state saved *before*
    ``contribute(k)`` and replays it (deterministic: streams are keyed by ``k`` and the node's
    private key, which :func:`_save_relay_node` keeps in ``context.state`` - node-local storage of
    the SuperNode, never sent to the server - so a rebuilt node keeps its secret).
    """
    rec = context.state["pushsum"]
    version, session = int(rec["version"]), str(rec["session"])
    hit = _RELAY_CACHE.get((run_id, node_id, session))
    if hit is not None and hit[0] == version:
        return hit[1], version
    spec = keys.decode(rec["spec"])
    node = (builder or BUILDERS[spec.get("builder", "toy")])(node_id, spec, context)(node_id, _relay_device(spec))
    if "initial" in rec:  # the model's buffers (and x, replaced by the state below) of Flower's initial_arrays
        keys.apply_initial_arrays(node, keys.decode(rec["initial"]))
    node.load_state_dict(keys.decode(rec["state"]))
    if "private_key" in rec and hasattr(node, "_private_key"):  # the same secret as before the rebuild
        node._private_key = NodeKey.from_bytes(rec["private_key"])
    if action == "step" and int(rec["pending_k"]) == k:
        node.contribute(k)
    return node, version


def _save_relay_node(context: Any, run_id: int, node_id: int, node: Any, version: int,
                     state: dict | None = None, pending_k: int = -1) -> None:
    """Store ``state`` (default: the node's state now) in ``context.state`` and cache the node object."""
    rec = context.state["pushsum"]
    rec["state"] = keys.encode(node.state_dict() if state is None else state)
    if getattr(node, "_private_key", None) is not None:  # node-local only (context.state stays on the SuperNode)
        rec["private_key"] = node._private_key.to_bytes()
    rec["pending_k"] = int(pending_k)
    rec["version"] = version + 1
    context.state["pushsum"] = rec
    key = (run_id, node_id, str(rec["session"]))
    for stale in [c for c in _RELAY_CACHE if c[1] == node_id and c != key]:  # this node of an earlier run/session
        del _RELAY_CACHE[stale]  # (a long-lived process, e.g. a node worker, serves many runs)
    _RELAY_CACHE[key] = (version + 1, node)


def _initialised_node(factory: Callable[[int, str], Any], initial: dict[str, Any], node_id: int, device: str) -> Any:
    """``factory(node_id, device)`` started from Flower's ``initial_arrays`` (before ``setup()``)."""
    return keys.apply_initial_arrays(factory(node_id, device), initial)


def handle_message(cfg: Any, context: Any, run_id: int, builder: NodeBuilder | None = None,
                   arrays: Any = None, config: Any = None) -> tuple[Any, Any]:
    """The ClientApp's work for one push-sum message: ``cfg`` is its ``"pushsum"`` ConfigRecord, ``arrays`` the
    message's ``ArrayRecord`` under :data:`flower_dp.gossip.relay.ARRAYS_KEY` (None when it has none: on
    ``register``, Flower's ``initial_arrays``, the nodes' starting model), ``config`` its ``"config"`` ConfigRecord
    (Flower's ``train_config``, handed to the node builder as ``spec["train_config"]``).

    Returns the reply ``ConfigRecord`` (``partition_id``, and ``device`` or the payload's JSON tree) and the reply's
    ``ArrayRecord`` (None when it carries no arrays).  Everything is typed (:mod:`flower_dp.gossip.wire`): no pickle.
    """
    from flwr.app import ArrayRecord, ConfigRecord

    _register_wire_types()
    reply_arrays = None
    K = keys.MESSAGE_KEYS
    action, transport = str(cfg[K["action"]]), str(cfg[K["transport"]])
    node_id = int(context.node_config["partition-id"])
    reply = ConfigRecord({"partition_id": node_id})
    if action == "register":
        spec = keys.decode(cfg[K["spec"]])
        if config is not None and len(config):  # Flower's train_config, for the node builder
            spec["train_config"] = dict(config)
        initial = {name: arrays[name].numpy() for name in arrays} if arrays is not None and len(arrays) else None
        b = builder or BUILDERS[spec.get("builder", "toy")]
        if transport == "ray":
            from flower_dp.gossip.ray_backend import ensure_ray, register_node

            r = spec["_ray"]
            if r.get("address"):  # deployment engine: join the cluster the ServerApp named (no-op once joined)
                ensure_ray(r["address"])
            factory = b(node_id, spec, context)
            if initial is not None:
                factory = functools.partial(_initialised_node, factory, initial)
            reply["device"] = register_node(r["name"], r["namespace"], node_id, r["n_nodes"], r["num_hosts"], factory)
        else:
            session = str(spec.get("_session", ""))
            rec = context.state["pushsum"] if "pushsum" in context.state else None
            if rec is None or str(rec["session"]) != session:  # first round of this strategy run
                device = _relay_device(spec)
                node = b(node_id, spec, context)(node_id, device)
                if initial is not None:
                    keys.apply_initial_arrays(node, initial)
                node.setup()
                rec = ConfigRecord({"spec": keys.encode(spec) if "train_config" in spec else cfg[K["spec"]],
                                    "version": 0, "session": session})
                if initial is not None:
                    rec["initial"] = keys.encode(initial)
                context.state["pushsum"] = rec
                _save_relay_node(context, run_id, node_id, node, 0)
                reply["device"] = device
                layout = keys.param_layout(node)
                if layout is not None and node_id == 0:  # names and shapes of the model (public), for the Result
                    import json

                    reply["param_layout"] = json.dumps(layout)
    else:
        k = int(cfg[K["k"]])
        node, version = _relay_node(context, run_id, node_id, builder, action, k)
        snap: dict[str, Any] = {}
        out = keys.handle_relay_request(node, action, k, keys.from_records(cfg[K["payload"]], arrays), snapshot=snap)
        if "contrib" in out:  # between contribute(k) and local_step(k): keep the state from before contribute
            _save_relay_node(context, run_id, node_id, node, version, state=snap["state"], pending_k=k)
        else:
            _save_relay_node(context, run_id, node_id, node, version)
        reply[K["payload"]], out_arrays = keys.to_records(out)
        reply_arrays = ArrayRecord(out_arrays)
    return reply, reply_arrays


def build_from_wire(node_id: int, device: str = "cpu", *, spec: bytes, train_config: dict[str, Any] | None = None,
                    initial: dict[str, Any] | None = None) -> Any:
    """Node ``node_id`` of a built-in builder (:data:`BUILDERS`) from a ``register`` message's typed spec bytes,
    Flower's ``train_config`` and ``initial_arrays``: the same node :func:`handle_message` builds from them.  It
    runs where the node lives (its Ray host actor), so the ClientApp that registers the node
    (:func:`flower_dp.clients.push_sum_app.register_on_ray`) imports neither torch nor the algorithms."""
    _register_wire_types()
    decoded = keys.decode(spec)
    if train_config:
        decoded["train_config"] = dict(train_config)
    node = BUILDERS[decoded.get("builder", "toy")](node_id, decoded, None)(node_id, device)
    return node if initial is None else keys.apply_initial_arrays(node, initial)


def handle_content(content: Any, context: Any, run_id: int, builder: NodeBuilder | None = None) -> Any:
    """:func:`handle_message` on a whole message body: ``RecordDict`` in (``"pushsum"`` ConfigRecord and the
    optional payload ``ArrayRecord``), reply ``RecordDict`` out."""
    from flwr.app import RecordDict

    reply, arrays = handle_message(content["pushsum"], context, run_id, builder,
                                   content.array_records.get(keys.ARRAYS_KEY), content.config_records.get("config"))
    out = RecordDict({"pushsum": reply})
    if arrays is not None:
        out[keys.ARRAYS_KEY] = arrays
    return out
