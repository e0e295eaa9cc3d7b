"""The host actor of the Ray backend (:mod:`flower_dp.gossip.ray_backend`).

A host holds several push-sum nodes, steps them through
:func:`flower_dp.gossip.protocol.run_protocol_iteration` (:class:`_HostPhases`), and exchanges
contributions and shares directly with the other hosts (threaded actor: ``deliver`` runs while ``run_segment`` waits
on its mailbox).  Every wait has a timeout that raises
:class:`flower_dp.errors.GossipTimeoutError` naming the missing senders, ``k`` and the
likely cause.  Ray is imported lazily.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import GossipTimeoutError
from .messages import Share
from .protocol import run_protocol_iteration

__all__ = ["NodeFactory", "remote_host_class"]

log = logging.getLogger(__name__)

#: ``factory(node_id, device) -> Node``; must be picklable (cloudpickle: closures are fine).
NodeFactory = Callable[[int, str], Any]


def _to_device(obj: Any, device: str) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


class _HostArray:
    """A share's torch tensor crossing to another host as its numpy view (:func:`_pack`)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self):
        return _HostArray, (self.array,)


def _pack(s: Share) -> Share:
    """``s`` for another host: its CPU tensors as numpy views.

    Ray writes a numpy array into its object store once and the receiver reads it in place, where a torch tensor
    goes through ``torch.save`` into a bytes object on both sides (two copies and two 0.4 MB allocations per
    MLP share in the receiving thread; on a host of 512 nodes the heap then grew by ~0.3 MB per node and
    iteration, freed but never returned).  Values, dtype and shape are unchanged (:func:`_unpack`).
    """
    import torch

    out = {}
    for name, t in s.tensors.items():
        if isinstance(t, torch.Tensor):
            t = t.detach().to("cpu")
            try:
                t = _HostArray(t.numpy())
            except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): the tensor itself
                pass
        out[name] = t
    return Share(s.sender, s.receiver, s.k, out, s.weight, s.wire_bits)


def _unpack(s: Share, device: str) -> Share:
    """A :func:`_pack`-ed share as a share of tensors on ``device``, copied out of Ray's read-only buffer (in the
    thread that mixes, so the node owns its memory)."""
    import numpy as np
    import torch

    out = {}
    for name, t in s.tensors.items():
        if isinstance(t, _HostArray):
            t = torch.from_numpy(np.array(t.array, copy=True))
        out[name] = t.to(device) if isinstance(t, torch.Tensor) and device != "cpu" else t
    return Share(s.sender, s.receiver, s.k, out, s.weight, s.wire_bits)


class _HostPhases:
    """The phases of :func:`flower_dp.gossip.protocol.run_protocol_iteration` on one host's nodes: contributions are
    all-gathered between the hosts (each host reduces over every node), shares for another host's nodes go to it."""

    def __init__(self, host: _Host, mine: list[int]) -> None:
        self.host, self.node_ids = host, mine
        self.where = {i: h for h, ids in host.placement.items() for i in ids}
        self.network_ids = sorted(self.where)

    def contribute(self, k: int) -> dict[int, Any]:
        host = self.host
        contribs = {i: host.nodes[i].contribute(k) for i in self.node_ids}
        if host.peers:
            cpu_c = _to_device(contribs, "cpu") if host.device != "cpu" else contribs
            host._broadcast("c", k, {h: cpu_c for h in host.peers})
            if not any(contribs.values()):
                # reduce_contributions' contract: every node contributes or none does, so none does and the
                # reduction is None without waiting (no barrier: SGP-type algorithms exchange only shares).  The
                # message still goes out: a host whose nodes do contribute waits for it and refuses the mix-up.
                host._drop("c", k)
                return {i: None for i in self.network_ids}
            for part in host._gather("c", k).values():
                contribs.update(part)
        return {i: _to_device(c, "cpu") if c else c for i, c in contribs.items()}

    def local_step(self, k: int, reduced: dict[str, Any] | None) -> dict[int, list[Share]]:
        return {i: self.host.nodes[i].local_step(k, reduced) for i in self.node_ids}

    def exchange(self, k: int, outboxes: dict[int, list[Share]]) -> dict[int, list[Share]]:
        host = self.host
        local: dict[int, list[Share]] = {}
        remote: dict[int, list[Share]] = {h: [] for h in host.peers}
        for i in self.node_ids:
            for s in outboxes[i]:
                h = self.where[s.receiver]
                if h == host.host_id:
                    local.setdefault(i, []).append(s)
                else:
                    remote[h].append(_pack(s))
        if host.peers:
            host._broadcast("s", k, remote)  # one message per peer host: all its nodes' shares
            for _h, shares in sorted(host._gather("s", k).items()):
                for s in shares:
                    local.setdefault(s.sender, []).append(_unpack(s, host.device))
        return local

    def mix(self, k: int, inboxes: dict[int, list[Share]]) -> None:
        for i in self.node_ids:
            self.host.nodes[i].mix(inboxes[i])


class _Host:
    """Body of a host actor (wrapped with ``ray.remote`` lazily).  Threaded: ``deliver``
    runs while ``run_segment`` waits."""

    def __init__(self, host_id: int, placement: dict[int, list[int]], timeout_s: float, threads: int, want_gpu: bool,
                 device: str | None = None):
        import torch

        torch.set_num_threads(max(1, int(threads)))
        self.host_id = host_id
        self.placement = {int(h): list(v) for h, v in placement.items()}
        self.timeout_s = float(timeout_s)
        self.nodes: dict[int, Any] = {}
        self.peers: dict[int, Any] = {}
        self.box: dict[tuple[str, int], dict[int, Any]] = {}
        self.cv = threading.Condition()
        # every call that touches nodes runs under this lock: model builders and torch's global
        # RNG are not thread-safe, and only ``deliver`` may run beside ``run_segment``
        self.node_lock = threading.RLock()
        # ... and on this one thread: Ray runs each call on any thread of the actor's pool, and glibc gives every
        # thread its own heap (arena), so nodes stepped by a new thread each segment grew a new heap of the size of
        # their working set each time (512 MLP nodes per host: +0.3 GB per segment, freed but never returned)
        self._node_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"flowerdp-host{host_id}-nodes")
        self.device = "cpu"
        if device is not None:  # the caller's choice (e.g. "cpu" on a GPU share used for placement only)
            self.device = str(device)
        elif want_gpu:
            if torch.cuda.is_available():
                self.device = "cuda"
            else:
                log.warning("host %d asked for a GPU share but CUDA is not available here; nodes run on CPU", host_id)

    # -- wiring --------------------------------------------------------------------------
    def connect(self, handles: dict[int, Any]) -> bool:
        self.peers = {int(h): a for h, a in handles.items() if int(h) != self.host_id}
        return True

    def get_device(self) -> str:
        return self.device

    def info(self) -> dict[str, Any]:
        """Where this host runs: Ray node id, the GPU ids Ray assigned it, its nodes' device, pid."""
        import os

        import ray

        return {"host": self.host_id, "ray_node_id": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "device": self.device, "pid": os.getpid(),
                "nodes": list(self.placement[self.host_id])}

    def _on_nodes(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the node thread (see ``__init__``), under the node lock."""
        def run() -> Any:
            with self.node_lock:
                return fn(*args)

        return self._node_thread.submit(run).result()

    def add_node(self, node_id: int, factory: NodeFactory, replace: bool = False) -> str:
        """Build node ``node_id`` here (no-op if it exists and not ``replace``); returns the device."""
        return self._on_nodes(self._add_node, node_id, factory, replace)

    def _add_node(self, node_id: int, factory: NodeFactory, replace: bool) -> str:
        if node_id not in self.placement[self.host_id]:
            raise ValueError(
                f"node {node_id} does not belong on host {self.host_id} (nodes {self.placement[self.host_id]}); "
                "compute its host with host_of(node_id, n_nodes, num_hosts)"
            )
        if replace or node_id not in self.nodes:
            node = factory(int(node_id), self.device)
            if getattr(node, "node_id", None) != node_id:
                raise ValueError(f"the factory built a node with node_id={getattr(node, 'node_id', None)!r}, got asked for {node_id}")
            self.nodes[int(node_id)] = node
        return self.device

    def registered(self) -> list[int]:
        return sorted(self.nodes)

    def call(self, method: str, node_ids: Sequence[int] | None, args: tuple = ()) -> dict[int, Any]:
        return self._on_nodes(self._call, method, node_ids, args)

    def _call(self, method: str, node_ids: Sequence[int] | None, args: tuple) -> dict[int, Any]:
        ids = sorted(self.nodes) if node_ids is None else [i for i in node_ids if i in self.nodes]
        out = {}
        for i in ids:
            r = getattr(self.nodes[i], method)(*args)
            out[i] = _to_device(r, "cpu") if self.device != "cpu" else r
        return out

    def apply(self, fn: Callable[[Any], Any], node_ids: Sequence[int] | None) -> dict[int, Any]:
        """``fn(node)`` on the nodes held here (default all); results by node id."""
        return self._on_nodes(lambda: self._apply(fn, node_ids))

    def _apply(self, fn: Callable[[Any], Any], node_ids: Sequence[int] | None) -> dict[int, Any]:
        ids = sorted(self.nodes) if node_ids is None else [i for i in node_ids if i in self.nodes]
        return {i: fn(self.nodes[i]) for i in ids}

    def load_states(self, states: dict[int, Any]) -> bool:
        return self._on_nodes(self._load_states, states)

    def _load_states(self, states: dict[int, Any]) -> bool:
        for i, st in states.items():
            self.nodes[int(i)].load_state_dict(_to_device(st, self.device))
        return True

    # -- messaging ----------------------------------------------------------------------
    def deliver(self, kind: str, k: int, sender_host: int, payload: Any) -> bool:
        with self.cv:
            self.box.setdefault((kind, int(k)), {})[int(sender_host)] = payload
            self.cv.notify_all()
        return True

    def _broadcast(self, kind: str, k: int, payloads: dict[int, Any]) -> None:
        for h, actor in self.peers.items():
            actor.deliver.remote(kind, k, self.host_id, payloads[h])

    def _drop(self, kind: str, k: int) -> None:
        """Forget messages ``(kind, <= k)`` nobody waits for (the others of this segment are dropped at its start)."""
        with self.cv:
            for key in [key for key in self.box if key[0] == kind and key[1] <= k]:
                del self.box[key]

    def _gather(self, kind: str, k: int) -> dict[int, Any]:
        want = set(self.peers)
        deadline = time.monotonic() + self.timeout_s
        with self.cv:
            while True:
                aborted = self.box.get(("abort", -1))
                if aborted:
                    h, why = next(iter(aborted.items()))
                    raise GossipTimeoutError(f"host {h} aborted the segment at k={k}: {why}")
                got = self.box.get((kind, k), {})
                if want <= set(got):
                    return self.box.pop((kind, k))
                left = deadline - time.monotonic()
                if left <= 0:
                    missing_hosts = sorted(want - set(got))
                    missing = [i for h in missing_hosts for i in self.placement[h]]
                    what = "contributions" if kind == "c" else "shares"
                    raise GossipTimeoutError(
                        f"host {self.host_id} (nodes {self.placement[self.host_id]}) waited {self.timeout_s:.1f} s at k={k} "
                        f"for {what} from nodes {missing} (hosts {missing_hosts}) and got none; likely cause: those nodes "
                        "were never registered (fewer ClientApps ran than nodes), their host actor died, or one of their "
                        "local steps takes longer than the timeout; register every node before the segment, check the "
                        "host's log, or raise timeout_s"
                    )
                self.cv.wait(min(left, 1.0))

    def run_segment(self, k0: int, k1: int, debug_metrics: bool = False) -> dict[str, Any]:
        return self._on_nodes(self._run_segment, k0, k1, debug_metrics)

    def _run_segment(self, k0: int, k1: int, debug_metrics: bool) -> dict[str, Any]:
        from ..releases import node_metrics

        with self.cv:  # drop stale messages of an earlier, failed segment
            for key in [key for key in self.box if key[0] == "abort" or key[1] < k0]:
                del self.box[key]
        mine = sorted(self.nodes)
        if mine != self.placement[self.host_id]:
            missing = sorted(set(self.placement[self.host_id]) - set(mine))
            raise GossipTimeoutError(
                f"host {self.host_id} cannot run k={k0}: nodes {missing} were never registered; "
                "every ClientApp must register its node before the segment starts"
            )
        phases = _HostPhases(self, mine)
        bits = {i: 0 for i in mine}
        metrics: dict[int, list[dict[str, float]]] = {i: [] for i in mine}
        reduced_log = []
        try:
            for k in range(k0, k1):
                log_k = run_protocol_iteration(phases, k)
                reduced_log.append(log_k.reduced)
                for i in mine:
                    bits[i] += log_k.bits_sent[i]
                    # only what may leave the node (flower_dp.releases), unless the run opted in to debug_metrics
                    metrics[i].append(node_metrics(self.nodes[i], debug_metrics))
        except BaseException as exc:
            for actor in self.peers.values():
                actor.deliver.remote("abort", -1, self.host_id, f"{type(exc).__name__}: {exc}")
            raise
        return {"bits": bits, "metrics": metrics, "reduced": reduced_log}


_REMOTE_CLS: dict[int, Any] = {}


def remote_host_class(max_concurrency: int):
    import ray

    if max_concurrency not in _REMOTE_CLS:
        _REMOTE_CLS[max_concurrency] = ray.remote(max_concurrency=max_concurrency)(_Host)
    return _REMOTE_CLS[max_concurrency]
