"""The Ray backend: a few long-lived *host actors*, each holding several push-sum nodes.

One algorithm, many backends (measured here): one Ray process per node
oversubscribes the cores; a few host actors (one per core or per GPU) that step their
nodes and exchange shares *directly with each other* are the fast way.  Per iteration
``k`` every host

1. calls ``contribute(k)`` on its nodes and sends them to every other host
   (all-gather; each host then runs :func:`reduce_contributions` over all nodes, so every
   host computes the same ``reduced`` in node-id order, no reducer actor needed; a host whose
   nodes contribute nothing does not wait: then none does, and ``reduced`` is None);
2. calls ``local_step(k, reduced)`` on its nodes, keeps the shares addressed to its own
   nodes and sends the others, grouped per destination host, to those hosts (one actor
   call per host pair, the tensors as numpy arrays; Ray moves payloads over 100 KiB through
   the object store, never via the driver);
3. waits for the shares of ``k`` from every other host, builds each node's inbox sorted by
   sender and calls ``mix``.

Each host runs these steps as the phases of :func:`flower_dp.gossip.protocol.run_protocol_iteration`
(the one iteration of every backend), so the result is bit-identical to
:func:`flower_dp.gossip.run_iteration` on CPU (same calls per node, same inbox order, RNG keyed by
(node, purpose, k)).  Node state stays on its
host between segments; only metrics and bit counts come back unless states are asked for.

Every wait has a timeout that raises :class:`flower_dp.errors.GossipTimeoutError`
naming the missing senders, ``k`` and the likely cause.  Ray is imported lazily.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import check_int, check_nonnegative, check_positive
from .._ray_local import use_loopback
from ..errors import FlowerDPError, GossipTimeoutError
from .protocol import SegmentResult
from .ray_host import NodeFactory, remote_host_class

__all__ = ["RayGossipBackend", "SegmentResult", "NodeFailureError", "ResourceError", "PLACEMENTS", "default_num_hosts",
           "host_of", "host_actor_name", "register_node",
           "ensure_ray", "check_ray_address"]

log = logging.getLogger(__name__)


class ResourceError(FlowerDPError, RuntimeError):
    """The Ray cluster lacks the CPUs, GPUs or nodes a run asks for (the message names what it has and the fix)."""


class NodeFailureError(FlowerDPError, RuntimeError):
    """A host actor (the worker process holding some nodes) died during a segment.

    Attributes
    ----------
    host : int
        The dead host.
    nodes : list of int
        The push-sum nodes that lived on it (their state is lost; other hosts' nodes are
        mid-segment, so the whole network must be restored from a checkpoint).
    k0, k1 : int
        The segment ``k0 .. k1 - 1`` that was running.
    """

    def __init__(self, message: str, *, host: int, nodes: list[int], k0: int, k1: int) -> None:
        super().__init__(message)
        self.host, self.nodes, self.k0, self.k1 = int(host), list(nodes), int(k0), int(k1)


def check_ray_address(address: str, *, timeout_s: float = 3.0) -> None:
    """Fail fast, with the fix, when ``address`` (``"host:port"``) does not accept connections.

    ``"auto"`` and ``"ray://..."`` addresses are left to Ray.  Without this check ``ray.init``
    retries for a minute or more before it gives up.
    """
    if address in ("auto", "local") or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"Ray address must be 'auto', 'ray://host:port' or 'host:port', got {address!r}; "
                         "pass the address `ray start --head` printed, or unset RAY_ADDRESS to start a local Ray")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConnectionError(
            f"the Ray address {address!r} does not answer ({exc.strerror or exc}); valid: the GCS address of a running "
            f"head. Start one with `ray start --head --node-ip-address={host} --port={port} --include-dashboard=false`, "
            "fix RAY_ADDRESS / backend_kwargs['address'], or unset it to start a local Ray on 127.0.0.1"
        ) from exc


#: the placement-group strategies a run may ask for (Ray's names)
PLACEMENTS = ("SPREAD", "STRICT_SPREAD")


def default_num_hosts(resources: dict[str, float], num_cpus_per_host: float, num_gpus_per_host: float) -> int:
    """Hosts a cluster with ``resources`` (``ray.cluster_resources()``) holds: one per ``num_gpus_per_host`` GPUs
    when GPUs are asked, else one per ``num_cpus_per_host`` CPUs (one per CPU when that is 0); at least 1."""
    if num_gpus_per_host > 0 and resources.get("GPU", 0):
        return max(1, int(float(resources["GPU"]) // float(num_gpus_per_host) + 1e-9))
    return max(1, int(float(resources.get("CPU", 1)) // (float(num_cpus_per_host) or 1.0) + 1e-9))


def _reserve(num_hosts: int, cpus: float, gpus: float, strategy: str, wait_s: float) -> Any:
    """A ready placement group of ``num_hosts`` bundles (``cpus`` CPUs, ``gpus`` GPUs each) with ``strategy``, or a
    clear error naming what the cluster has."""
    import ray
    from ray.util.placement_group import placement_group

    res = ray.cluster_resources()
    alive = [nd for nd in ray.nodes() if nd.get("Alive")]
    bundle = {"CPU": float(cpus) or 0.001}  # Ray refuses an empty bundle; 0.001 CPU keeps a host's bundle alive
    if gpus > 0:
        bundle["GPU"] = float(gpus)
    have = f"the cluster has {res.get('CPU', 0):g} CPUs and {res.get('GPU', 0):g} GPUs on {len(alive)} node(s)"
    for key, per in bundle.items():
        if per * num_hosts > float(res.get(key, 0)) + 1e-9:
            raise ResourceError(
                f"{num_hosts} hosts x {per:g} {key} = {per * num_hosts:g} {key} asked, {have}; valid: at most "
                f"{float(res.get(key, 0)):g} {key} in all; fix: fewer hosts (num_hosts / nodes_per_host), fewer "
                f"{key}s per host, or add a node with `ray start --address=HEAD:PORT`")
    if strategy == "STRICT_SPREAD" and num_hosts > len(alive):
        raise ResourceError(f"STRICT_SPREAD puts each of the {num_hosts} hosts on a node of its own, {have}; fix: "
                            f"at most {len(alive)} hosts, placement SPREAD, or more nodes")
    pg = placement_group([dict(bundle) for _ in range(num_hosts)], strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=wait_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise ResourceError(
            f"Ray could not place {num_hosts} hosts of {bundle} with {strategy} within {wait_s:g} s ({have}; per "
            f"node: {[nd.get('Resources', {}) for nd in alive]}); fix: fewer hosts or resources per host, placement "
            "SPREAD, or more nodes") from None
    return pg


def host_of(node_id: int, n_nodes: int, num_hosts: int) -> int:
    """Host index of ``node_id``: contiguous blocks, sizes differing by at most one."""
    return int(node_id) * int(num_hosts) // int(n_nodes)


def host_actor_name(prefix: str, host: int) -> str:
    """Ray actor name of host ``host`` (looked up by ClientApps with :func:`register_node`)."""
    return f"{prefix}-host-{int(host)}"


def ensure_ray(address: str | None = None, *, wait_s: float = 0.0, num_cpus: int | None = None) -> None:
    """Make sure Ray is up in this process.

    Parameters
    ----------
    address : str, optional
        ``"auto"`` or ``"ray://..."``/``"host:port"`` of an existing cluster; ``None`` uses
        ``RAY_ADDRESS`` when set, else starts a local instance bound to 127.0.0.1.
    wait_s : float
        First wait this long for someone else (Flower's simulation engine, which starts Ray
        2-4 s after ``ServerApp.main`` starts) to initialise Ray in this process.
    num_cpus : int, optional
        CPUs of a newly started local instance.
    """
    import ray

    deadline = time.monotonic() + float(wait_s)
    while not ray.is_initialized() and time.monotonic() < deadline:
        time.sleep(0.1)
    if ray.is_initialized():
        return
    addr = address or os.environ.get("RAY_ADDRESS")
    # Ray workers inherit environment variables, not this process's sys.path (Flower does the same)
    pythonpath = os.pathsep.join([p for p in sys.path if p] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    os.environ["PYTHONPATH"] = pythonpath
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                          "runtime_env": {"env_vars": {"PYTHONPATH": pythonpath}}}
    if not addr:
        use_loopback()  # Ray turns _node_ip_address="127.0.0.1" into the routable address otherwise
        kw.update(num_cpus=num_cpus, _node_ip_address="127.0.0.1")
    else:
        check_ray_address(addr)
    try:
        # "local": a new instance even when another Ray instance runs on this machine (address=None would join the
        # latest cluster `ray start` or ray.cluster_utils left in /tmp/ray, e.g. another user's or test's)
        ray.init(address=addr or "local", **kw)
    except RuntimeError:
        if not ray.is_initialized():  # lost a race with another thread (Flower) that initialised Ray
            raise


def register_node(prefix: str, namespace: str, node_id: int, n_nodes: int, num_hosts: int, factory: NodeFactory,
                  *, timeout_s: float = 60.0) -> str:
    """From a ClientApp (or anywhere in the Ray job): build ``node_id`` on its named host actor.

    Returns the device the node runs on.  Does not wait for other nodes (no deadlock however
    few ClientApps run at once).
    """
    import ray

    name = host_actor_name(prefix, host_of(node_id, n_nodes, num_hosts))
    actor = ray.get_actor(name, namespace=namespace)
    return ray.get(actor.add_node.remote(int(node_id), factory), timeout=timeout_s)


class RayGossipBackend:
    """Run push-sum nodes on a few host actors that exchange shares peer to peer.

    Parameters
    ----------
    n_nodes : int
        Number of nodes; node ``i`` lives on host ``host_of(i, n_nodes, num_hosts)``.
    node_factory : callable (node_id, device) -> Node, optional
        Builds a node on its host (picklable).  Without it, nodes are registered later
        (:meth:`register`, or :func:`register_node` from ClientApps).
    nodes_per_host, num_hosts : int, optional
        Give one.  Default: one host per CPU core Ray reports, at most ``n_nodes``.
    num_gpus_per_host : float
        GPU fraction each host asks Ray for (e.g. 0.25: four hosts share a GPU); node tensors
        are moved to it.  When the Ray cluster has no GPU, the request is dropped with a log
        line and the hosts use the CPU (Ray would otherwise never schedule them).
    device : str, optional
        Device of every host's nodes.  Default: ``"cuda"`` on a host with a GPU share where CUDA
        is available, else ``"cpu"`` (an assigned GPU id alone never moves nodes to CUDA).
        ``"cpu"`` keeps the nodes on the CPU even with a GPU share (the share then only places
        the hosts, one per GPU node, and the results stay bit-identical to in-process).
    num_cpus_per_host : float
        CPUs each host reserves (default 0, so hosts always fit beside Flower's ClientApp pool).
    threads_per_host : int
        ``torch.set_num_threads`` inside each host.
    address : str, optional
        Existing cluster (``"auto"`` or an address; default ``RAY_ADDRESS``, else a local Ray on 127.0.0.1).
    namespace, name : str
        Host actors are named ``f"{name}-host-{h}"`` in ``namespace`` (found by ClientApps).
    detached : bool
        Make hosts outlive the driver (then call :meth:`shutdown`).
    timeout_s : float
        Longest wait for another host's contributions or shares at one iteration.
    wait_for_ray_s : float
        Wait this long for someone else (Flower) to start Ray in this process before starting it.
    placement : str, optional
        ``"SPREAD"`` or ``"STRICT_SPREAD"``: reserve one placement-group bundle per host (its CPUs and GPUs) with
        that Ray strategy, so the hosts spread over the cluster's nodes (``STRICT_SPREAD``: every host on a
        different node); ``None`` (default) lets Ray place each host where it fits.  With a placement, a cluster
        without the CPUs or GPUs asked is an error naming what it has (no CPU fallback), raised within
        ``placement_wait_s`` seconds.
    """

    #: ClientApps register their nodes every round (a restarted host needs them built again)
    register_once = False
    #: a dead host actor is restarted from the last checkpoint (:class:`NodeFailureError`)
    restartable = True

    def __init__(
        self,
        n_nodes: int,
        node_factory: NodeFactory | None = None,
        *,
        nodes_per_host: int | None = None,
        num_hosts: int | None = None,
        num_gpus_per_host: float = 0.0,
        num_cpus_per_host: float = 0.0,
        device: str | None = None,
        threads_per_host: int = 1,
        address: str | None = None,
        namespace: str = "flower_dp",
        name: str | None = None,
        detached: bool = False,
        timeout_s: float = 60.0,
        wait_for_ray_s: float = 0.0,
        placement: str | None = None,
        placement_wait_s: float = 30.0,
    ) -> None:
        self.n_nodes = check_int("n_nodes", n_nodes, minimum=1)
        if nodes_per_host is not None and num_hosts is not None:
            raise ValueError(f"give nodes_per_host or num_hosts, not both; got {nodes_per_host} and {num_hosts}")
        self.num_gpus_per_host = check_nonnegative("num_gpus_per_host", num_gpus_per_host)
        self.num_cpus_per_host = check_nonnegative("num_cpus_per_host", num_cpus_per_host)
        self.timeout_s = check_positive("timeout_s", timeout_s)
        self.namespace = namespace
        self.name = name or f"flowerdp-{os.getpid()}-{id(self):x}"
        self.detached = bool(detached)
        self.threads_per_host = check_int("threads_per_host", threads_per_host, minimum=1)
        ensure_ray(address, wait_s=wait_for_ray_s)
        import ray

        if placement is not None and placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {list(PLACEMENTS)} or None, got {placement!r}; SPREAD spreads "
                             "the hosts over the cluster's nodes, STRICT_SPREAD puts each on a node of its own")
        self.placement_strategy = placement
        if num_hosts is None:
            if nodes_per_host is not None:
                per = check_int("nodes_per_host", nodes_per_host, minimum=1)
                num_hosts = -(-self.n_nodes // per)
            else:
                num_hosts = default_num_hosts(ray.cluster_resources(), self.num_cpus_per_host, self.num_gpus_per_host)
        self.num_hosts = min(check_int("num_hosts", num_hosts, minimum=1), self.n_nodes)
        self.placement_group = None
        if placement is not None:
            self.placement_group = _reserve(self.num_hosts, self.num_cpus_per_host, self.num_gpus_per_host,
                                            placement, placement_wait_s)
        elif self.num_gpus_per_host > 0 and not ray.cluster_resources().get("GPU", 0):
            log.warning("num_gpus_per_host=%s but the Ray cluster has no GPU; falling back to CPU for all %d host actors",
                        self.num_gpus_per_host, self.num_hosts)
            self.num_gpus_per_host = 0.0
        self.placement = {h: [] for h in range(self.num_hosts)}
        for i in range(self.n_nodes):
            self.placement[host_of(i, self.n_nodes, self.num_hosts)].append(i)
        cls = remote_host_class(4 + 2 * self.num_hosts)
        opts: dict[str, Any] = {"num_cpus": self.num_cpus_per_host, "namespace": namespace}
        if self.num_gpus_per_host > 0:
            opts["num_gpus"] = self.num_gpus_per_host
        if self.detached:
            opts["lifetime"] = "detached"

        def where(h: int) -> dict[str, Any]:
            if self.placement_group is None:
                return {}
            from ray.util import scheduling_strategies as ss

            return {"scheduling_strategy": ss.PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=h)}

        self.hosts = [
            cls.options(name=host_actor_name(self.name, h), **opts, **where(h)).remote(
                h, self.placement, self.timeout_s, self.threads_per_host, self.num_gpus_per_host > 0, device
            )
            for h in range(self.num_hosts)
        ]
        # the host processes start in the background: nodes can be registered meanwhile (add_node queues until
        # its host is up); the hosts are connected to each other before the first step (_connect)
        self._devices: list[str] | None = None
        if node_factory is not None:
            self.register_all(node_factory)

    @property
    def devices(self) -> list[str]:
        """The device of each host's nodes, in host order (waits for the hosts to be up)."""
        self._connect()
        return list(self._devices or [])

    def _connect(self) -> None:
        """Wait for the host actors and give each the others' handles (once)."""
        if self._devices is not None:
            return
        import ray

        handles = dict(enumerate(self.hosts))
        ray.get([a.connect.remote(handles) for a in self.hosts], timeout=max(120.0, self.timeout_s))
        self._devices = ray.get([a.get_device.remote() for a in self.hosts], timeout=max(120.0, self.timeout_s))

    def host_info(self) -> list[dict[str, Any]]:
        """Per host (in order): its Ray node id, the GPU ids Ray assigned it, its nodes' device, pid, node ids."""
        import ray

        return ray.get([a.info.remote() for a in self.hosts], timeout=max(120.0, self.timeout_s))

    # -- nodes ---------------------------------------------------------------------------
    def register(self, node_id: int, factory: NodeFactory, *, replace: bool = False) -> str:
        """Build node ``node_id`` on its host; returns its device."""
        import ray

        h = host_of(check_int("node_id", node_id, minimum=0, maximum=self.n_nodes - 1), self.n_nodes, self.num_hosts)
        # building a node (imports, data, model) is not a gossip wait: give it register_all's allowance
        return ray.get(self.hosts[h].add_node.remote(int(node_id), factory, replace), timeout=max(120.0, self.timeout_s))

    def register_all(self, factory: NodeFactory) -> None:
        """Build every node with ``factory`` (all hosts in parallel)."""
        import ray

        refs = [self.hosts[host_of(i, self.n_nodes, self.num_hosts)].add_node.remote(i, factory) for i in range(self.n_nodes)]
        ray.get(refs, timeout=max(120.0, self.timeout_s))

    def registered(self) -> list[int]:
        """Ids of the nodes that exist on their hosts."""
        import ray

        return sorted(i for ids in ray.get([a.registered.remote() for a in self.hosts]) for i in ids)

    def wait_registered(self, timeout_s: float | None = None) -> None:
        """Wait until every node is registered; raise :class:`GossipTimeoutError` naming the missing ones."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else float(timeout_s))
        while True:
            have = self.registered()
            if len(have) == self.n_nodes:
                return
            if time.monotonic() >= deadline:
                missing = sorted(set(range(self.n_nodes)) - set(have))
                raise GossipTimeoutError(
                    f"nodes {missing} were not registered on their host actors after {timeout_s or self.timeout_s:.1f} s "
                    f"(got {len(have)} of {self.n_nodes}); likely cause: their ClientApps did not run (fewer SuperNodes "
                    "than n_nodes, or ClientApps failing); set num-supernodes = n_nodes and check the ClientApp logs"
                )
            time.sleep(0.05)

    def call(self, method: str, node_ids: Sequence[int] | None = None, *args: Any) -> dict[int, Any]:
        """Call ``node.method(*args)`` on the nodes (default all) where they live; results by node id (CPU)."""
        import ray

        out: dict[int, Any] = {}
        for part in ray.get([a.call.remote(method, node_ids, tuple(args)) for a in self.hosts], timeout=max(120.0, self.timeout_s)):
            out.update(part)
        return dict(sorted(out.items()))

    def apply(self, fn: Any, node_ids: Sequence[int] | None = None) -> dict[int, Any]:
        """``fn(node)`` (a picklable module-level function) on the nodes (default all) where they live."""
        import ray

        out: dict[int, Any] = {}
        for part in ray.get([a.apply.remote(fn, node_ids) for a in self.hosts], timeout=max(120.0, self.timeout_s)):
            out.update(part)
        return dict(sorted(out.items()))

    def setup(self) -> None:
        """``setup()`` on every node (once, before ``k = 0``)."""
        self._connect()
        self.wait_registered()
        self.call("setup")

    def state_dicts(self) -> dict[int, Any]:
        """Every node's ``state_dict()`` (moves the full state: use for checkpoints, not per iteration)."""
        return self.call("state_dict")

    def load_state_dicts(self, states: dict[int, Any], k: int | None = None) -> None:
        """Load ``{node_id: state}`` into the nodes where they live (``k``, the states' iteration, is not needed)."""
        import ray

        self._connect()
        per_host: dict[int, dict[int, Any]] = {}
        for i, st in states.items():
            per_host.setdefault(host_of(int(i), self.n_nodes, self.num_hosts), {})[int(i)] = st
        ray.get([self.hosts[h].load_states.remote(p) for h, p in per_host.items()], timeout=max(120.0, self.timeout_s))

    # -- gossip --------------------------------------------------------------------------
    def run_segment(self, k0: int, k1: int, debug_metrics: bool = False) -> SegmentResult:
        """Run iterations ``k0 .. k1 - 1`` on all hosts (shares go host to host).

        ``debug_metrics=True`` also returns the nodes' uncharged training statistics (loss, clip fraction,
        gradient norms, batch sizes); by default only public metrics leave the hosts."""
        import ray

        check_int("k0", k0, minimum=0)
        check_int("k1", k1, minimum=k0)
        self._connect()
        t0 = time.perf_counter()
        refs = {a.run_segment.remote(int(k0), int(k1), bool(debug_metrics)): h for h, a in enumerate(self.hosts)}
        results: dict[int, Any] = {}
        errors: list[tuple[int, BaseException]] = []
        pending = list(refs)
        deadline = None
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                stuck = sorted(refs[r] for r in pending)
                errors.append((stuck[0], GossipTimeoutError(
                    f"hosts {stuck} did not finish the segment k={k0}..{k1 - 1} within {self.timeout_s + 10:.0f} s of "
                    "another host failing; one of their local steps is stuck")))
                break
            for r in done:
                try:
                    results[refs[r]] = ray.get(r)
                except ray.exceptions.RayActorError as exc:
                    h = refs[r]
                    errors.append((h, NodeFailureError(
                        f"host actor {h} (nodes {self.placement[h]}) died during the segment k={k0}..{k1 - 1}: "
                        f"{type(exc).__name__}; their state is lost; restore every node from the last checkpoint "
                        "(PushSumStrategy does this by itself, max_retries) or rerun", host=h, nodes=self.placement[h],
                        k0=k0, k1=k1)))
                    self._abort_others(h, f"host {h} died", refs, pending)
                    if deadline is None:
                        deadline = time.monotonic() + self.timeout_s + 10.0
                except Exception as exc:  # noqa: BLE001 - re-raised below with the most useful first
                    errors.append((refs[r], exc))
                    if deadline is None:
                        deadline = time.monotonic() + self.timeout_s + 10.0
        if errors:
            # a root cause (a node's own error, a dead actor) beats the timeouts it caused;
            # a timeout naming the missing senders beats an "aborted" echo of it
            def rank(e: tuple[int, BaseException]) -> int:
                if isinstance(e[1], NodeFailureError):
                    return -1
                if not isinstance(e[1], GossipTimeoutError):
                    return 0
                return 2 if "aborted the segment" in str(e[1]) else 1

            raise min(errors, key=rank)[1]
        bits = np.zeros(self.n_nodes, dtype=np.int64)
        metrics: dict[int, list[dict[str, float]]] = {}
        for h in sorted(results):
            for i, b in results[h]["bits"].items():
                bits[int(i)] = b
            metrics.update({int(i): m for i, m in results[h]["metrics"].items()})
        return SegmentResult(int(k0), int(k1), bits, dict(sorted(metrics.items())), results[0]["reduced"],
                             time.perf_counter() - t0)

    def _abort_others(self, dead: int, why: str, refs: dict, pending: list) -> None:
        """Tell the hosts still running the segment to stop waiting for the dead one."""
        for r in pending:
            try:
                self.hosts[refs[r]].deliver.remote("abort", -1, dead, why)
            except Exception:  # noqa: BLE001 - that host is gone as well
                pass

    def privacy_reports(self) -> dict[int, dict[str, Any]]:
        """Every node's ``privacy_report()``."""
        return self.call("privacy_report")

    def param_layout(self) -> list[list[Any]] | None:
        """Names and shapes of node 0's trainable parameters (:func:`flower_dp.gossip.relay.param_layout`)."""
        from .relay import param_layout

        return self.apply(param_layout, [0]).get(0)

    def network_average(self, method: str = "eval_params") -> Any:
        """Mean over nodes of ``node.eval_params()`` (float64 sum in node order, returned as float32)."""
        import torch

        flats = self.call(method)
        stack = torch.stack([flats[i].detach().to("cpu", torch.float64) for i in range(self.n_nodes)])
        return (stack.sum(0) / self.n_nodes).to(torch.float32)

    def shutdown(self) -> None:
        """Kill the host actors (their nodes are lost)."""
        import ray

        for a in self.hosts:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.hosts = []
        if self.placement_group is not None:
            try:
                ray.util.remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001 - the cluster is gone
                pass
            self.placement_group = None
