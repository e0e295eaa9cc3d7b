"""Server-relay transport, core half: the message protocol, the node-side handler and the coordinator's backend.

For deployments where nodes cannot reach each other, the coordinator (the Flower
strategy, :mod:`flower_dp.strategies.push_sum`) routes every share.  Nothing here
imports Flower at module level: payloads are typed values (:mod:`flower_dp.gossip.wire`, never a pickle)
that the glue puts into a ``ConfigRecord`` (the JSON tree) and an ``ArrayRecord`` (the arrays).

One gossip iteration ``k`` is one request/reply per node ("contribute", answered with the
node's contributions or, when it has none, directly with its shares) plus, only for
algorithms that contribute (DPPS family), a second one ("step", with the reduced values).
Each request also carries the node's inbox of ``k - 1``, which the node mixes first; a
segment ends with a "flush" request that mixes the last inbox and returns the node's
evaluation parameters and privacy report (and, when asked, its ``state_dict`` for the
coordinator's checkpoint; a "load" request puts such a state back, for resuming).  Metrics are those of the last ``local_step``
(the node contract), sent with the shares, filtered on the node by :func:`flower_dp.releases.release_metrics`: only public
ones leave it unless the request says ``"debug_metrics": True``.  Call order per node is exactly the in-process one, so
the numbers are identical: the coordinator runs each iteration through
:func:`flower_dp.gossip.protocol.run_protocol_iteration` (:class:`RelayPhases`, :class:`RelayGossipBackend`); the glue
only supplies ``send``, one request/reply round over Flower messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import wire
from .messages import Share
from .protocol import SegmentResult, run_protocol_iteration

__all__ = ["encode", "decode", "to_records", "from_records", "handle_relay_request", "MESSAGE_KEYS", "ARRAYS_KEY",
           "param_layout", "apply_initial_arrays", "RelayPhases", "RelayGossipBackend"]

#: ``send(action, k, {node_id: request}) -> {node_id: reply}``: one request/reply round with every node (the
#: coordinator's transport, e.g. Flower messages; it raises naming the nodes that did not answer)
Send = Callable[[str, int, dict[int, dict[str, Any]]], dict[int, dict[str, Any]]]

#: ConfigRecord keys of the push-sum protocol (both transports).
MESSAGE_KEYS = {
    "action": "pushsum.action",  # "register" | "contribute" | "step" | "flush" | "load"
    "k": "pushsum.k",
    "payload": "pushsum.payload",  # JSON tree (to_records) of the request / reply dict; arrays in ARRAYS_KEY
    "spec": "pushsum.spec",  # bytes (encode, typed, no pickle) of the node spec (first round)
    "transport": "pushsum.transport",  # "ray" | "relay"
    "ray": "pushsum.ray",  # JSON of where the Ray host actors live (register, transport "ray"); public
}
#: RecordDict key of the ArrayRecord that holds the payload's arrays
ARRAYS_KEY = "pushsum.arrays"
ACTIONS = ("register", "contribute", "step", "flush", "load")


def encode(obj: Any) -> bytes:
    """Serialize specs / node states to typed bytes (:func:`flower_dp.gossip.wire.to_bytes`; tensors bit-exact)."""
    return wire.to_bytes(obj)


def decode(data: bytes) -> Any:
    """Inverse of :func:`encode`: builds plain values, arrays, tensors and allow-listed dataclasses only."""
    return wire.from_bytes(data)


def to_records(obj: Any) -> tuple[str, list[Any]]:
    """``obj`` as (JSON tree for a ``ConfigRecord`` value, list of its arrays) for a Flower message; the glue wraps
    the list in ``ArrayRecord(arrays)`` (keys ``"0"``, ``"1"``, ...), so this core module never imports Flower."""
    return wire.pack(obj)


def from_records(tree: str, arrays: Any) -> Any:
    """Inverse of :func:`to_records` (``arrays`` an ``ArrayRecord`` or None when the value holds no array)."""
    if arrays is None:
        return wire.unpack(tree, [])
    return wire.unpack(tree, [arrays[str(i)].numpy() for i in range(len(arrays))])


def param_layout(node: Any) -> list[list[Any]] | None:
    """Where each trainable parameter of ``node.model`` lives in the node's flat vector: ``[[name, start, stop,
    shape], ...]`` (public: the architecture), or None for a node without a ``model`` (e.g. the toy node)."""
    model = getattr(node, "model", None)
    if model is None:
        return None
    from flower_dp.mechanisms.flat import param_slices

    shapes = dict(model.named_parameters())
    return [[name, int(sl.start), int(sl.stop), list(shapes[name].shape)] for name, sl in param_slices(model).items()]


def apply_initial_arrays(node: Any, arrays: dict[str, Any]) -> Any:
    """Start ``node`` (built, not yet ``setup()``) from ``arrays`` (``name -> ndarray``, e.g. Flower's ``initial_arrays``).

    A node with a ``model`` loads them as its ``state_dict`` (strict: every key, buffers too) and takes its flat
    vector from the loaded trainable parameters; a node without one (the toy node) takes the arrays concatenated
    in order as its flat vector.  Returns ``node``.
    """
    import torch

    tensors = {str(k): torch.as_tensor(v) for k, v in arrays.items()}
    model = getattr(node, "model", None)
    if model is not None:
        from flower_dp.mechanisms.flat import flatten_params

        try:
            model.load_state_dict(tensors, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"initial_arrays do not fit the nodes' model ({exc}); pass "
                             "ArrayRecord(model.state_dict()) of the same model the ClientApp builds") from exc
        flat = flatten_params(model)
    else:
        flat = torch.cat([t.reshape(-1) for t in tensors.values()]) if tensors else torch.zeros(0)
    if flat.numel() != node.x.numel():
        raise ValueError(f"initial_arrays hold {flat.numel()} trainable values, the node's model has d = "
                         f"{node.x.numel()}; pass the arrays of the same model")
    node.x = flat.detach().to(device=node.x.device, dtype=node.x.dtype).clone()
    return node


def handle_relay_request(node: Any, action: str, k: int, request: dict[str, Any],
                         snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one relay request on ``node`` and return the reply dict.

    Parameters
    ----------
    node : Node
        The node (its state already restored).
    action : str
        ``"contribute"`` (mix ``request["inbox"]`` if present, then ``contribute(k)``; if that is
        ``None``, ``local_step(k, None)`` at once), ``"step"`` (``local_step(k, request["reduced"])``)
        , ``"flush"`` (mix the inbox, then report) or ``"load"`` (``load_state_dict(request["state"])``).
    request : dict
        ``{"inbox": list[Share] | None, "reduced": dict | None, "state": bool | dict, "debug_metrics": bool}``;
        ``debug_metrics`` (default False) releases the node's uncharged training statistics with its metrics.
    snapshot : dict, optional
        On ``"contribute"``, receives ``snapshot["state"] = node.state_dict()`` taken after the
        mix and before ``contribute(k)``.  A node rebuilt from it in another process must replay
        ``contribute(k)`` before the ``"step"`` request (``contribute`` may leave transient values,
        e.g. DPPS's half step, that ``state_dict`` does not hold; it is deterministic in the state
        at the start of ``k``, since every random stream is keyed by ``k``).

    Returns
    -------
    dict
        ``{"contrib": ...}`` or ``{"shares": [...], "metrics": released last_metrics()}``, and, on
        flush, ``"eval_params"``, ``"privacy"`` and, with ``request["state"]`` true, ``"state"``.
    """
    if action not in ("contribute", "step", "flush", "load"):
        raise ValueError(f"relay action must be one of contribute/step/flush/load, got {action!r}")
    reply: dict[str, Any] = {}
    if action == "load":
        node.load_state_dict(request["state"])
        return reply
    inbox = request.get("inbox")
    if inbox is not None:
        node.mix(sorted(inbox, key=lambda s: s.sender))
    if action == "contribute":
        if snapshot is not None:
            snapshot["state"] = node.state_dict()
        c = node.contribute(int(k))
        if c is None:
            reply["shares"] = node.local_step(int(k), None)
        else:
            reply["contrib"] = c
    elif action == "step":
        reply["shares"] = node.local_step(int(k), request.get("reduced"))
    if "shares" in reply:  # metrics of the last local_step (node contract), read before the node may be rebuilt
        from flower_dp.releases import node_metrics

        reply["metrics"] = node_metrics(node, bool(request.get("debug_metrics", False)))
    if action == "flush":
        reply["eval_params"] = node.eval_params().detach().cpu()
        rep = getattr(node, "privacy_report", None)
        reply["privacy"] = dict(rep()) if callable(rep) else {}
        if request.get("state"):
            reply["state"] = node.state_dict()
    return reply


class RelayPhases:
    """The coordinator side of the relay: the phases of :func:`flower_dp.gossip.protocol.run_protocol_iteration` as
    request/reply rounds with the nodes (:func:`handle_relay_request` runs them on each node).

    ``contribute`` is one ``"contribute"`` round (a node with no contributions runs ``local_step(k, None)`` at once and
    replies with its shares), ``local_step`` a ``"step"`` round with the reduced values (none when the nodes already
    replied with their shares), ``exchange`` routes nothing (the coordinator holds every outbox).  ``mix`` is not a
    round of its own: each node's inbox rides on its next request (the ``"contribute"`` of ``k + 1``, or the
    ``"flush"`` at the end of a segment), which mixes it first, so every node still runs ``mix``, ``contribute(k + 1)``,
    ``local_step(k + 1)`` in that order.
    """

    def __init__(self, n_nodes: int, send: Send, debug_metrics: bool = False) -> None:
        self.node_ids = self.network_ids = list(range(int(n_nodes)))
        self.send, self.debug_metrics = send, bool(debug_metrics)
        self.inbox: dict[int, list[Share] | None] = {i: None for i in self.node_ids}
        self.metric_rows: dict[str, list[float]] = {}  # per metric: every reply's value, iteration by iteration
        self._replies: dict[int, dict[str, Any]] | None = None

    def contribute(self, k: int) -> dict[int, Any]:
        rep = self.send("contribute", k, {i: {"inbox": self.inbox[i], "debug_metrics": self.debug_metrics}
                                          for i in self.node_ids})
        self._replies = None if any("contrib" in r for r in rep.values()) else rep
        return {i: r.get("contrib") for i, r in rep.items()}

    def local_step(self, k: int, reduced: dict[str, Any] | None) -> dict[int, list[Share]]:
        rep, self._replies = self._replies, None
        if rep is None:
            rep = self.send("step", k, {i: {"reduced": reduced, "debug_metrics": self.debug_metrics}
                                        for i in self.node_ids})
        for i in sorted(rep):
            for key, v in rep[i].get("metrics", {}).items():
                self.metric_rows.setdefault(key, []).append(float(v))
        return {i: rep[i]["shares"] for i in self.node_ids}

    def exchange(self, k: int, outboxes: dict[int, list[Share]]) -> dict[int, list[Share]]:
        return outboxes

    def mix(self, k: int, inboxes: dict[int, list[Share]]) -> None:
        self.inbox = dict(inboxes)  # sent with the next request

    def flush(self, k: int, state: bool) -> dict[int, dict[str, Any]]:
        """The ``"flush"`` round: mix the last inboxes; replies hold eval params, privacy report (and state)."""
        rep = self.send("flush", k, {i: {"inbox": self.inbox[i], "state": state} for i in self.node_ids})
        self.inbox = {i: None for i in self.node_ids}
        return rep


class RelayGossipBackend:
    """The relay backend: the coordinator routes every share, with the interface of
    :class:`flower_dp.gossip.RayGossipBackend` that :class:`flower_dp.strategies.PushSumStrategy` drives.

    Parameters
    ----------
    n_nodes : int
    send : callable (action, k, {node_id: request}) -> {node_id: reply}
        The transport (the strategy's Flower messages).
    keep_states : bool
        Ask the nodes for their ``state_dict`` at the end of every segment (for checkpoints).

    The nodes live where ``send`` reaches them and are set up there when they register; a segment ends with a
    ``"flush"`` round whose replies answer :meth:`network_average`, :meth:`privacy_reports` and :meth:`state_dicts`.
    """

    #: the nodes live with their ClientApps between rounds: one ``register`` round starts them
    register_once = True
    #: no host process can die under the nodes (a failed ClientApp is an error of the run)
    restartable = False

    def __init__(self, n_nodes: int, send: Send, *, keep_states: bool = False) -> None:
        self.n_nodes, self.send, self.keep_states = int(n_nodes), send, bool(keep_states)
        self._flushed: dict[int, dict[str, Any]] = {}

    def setup(self) -> None:
        """Nothing to do: each node ran ``setup()`` when it registered."""

    def wait_registered(self, timeout_s: float | None = None) -> None:
        """Nothing to wait for: the ``register`` round's replies are the registration."""

    def load_state_dicts(self, states: dict[int, Any], k: int = 0) -> None:
        """A ``"load"`` round: every node loads its state (of iteration ``k``)."""
        self.send("load", int(k), {i: {"state": states[i]} for i in range(self.n_nodes)})

    def run_segment(self, k0: int, k1: int, debug_metrics: bool = False) -> SegmentResult:
        """Iterations ``k0 .. k1 - 1`` (:func:`run_protocol_iteration` over :class:`RelayPhases`), then the flush."""
        t0 = time.perf_counter()
        phases = RelayPhases(self.n_nodes, self.send, debug_metrics)
        bits = np.zeros(self.n_nodes, dtype=np.int64)
        reduced = []
        for k in range(k0, k1):
            log = run_protocol_iteration(phases, k)
            reduced.append(log.reduced)
            for i, b in log.bits_sent.items():
                bits[i] += b
        self._flushed = phases.flush(k1, self.keep_states)
        means = {key: float(np.nanmean(v)) for key, v in phases.metric_rows.items()}
        return SegmentResult(int(k0), int(k1), bits, {}, reduced, time.perf_counter() - t0, means=means)

    def network_average(self) -> Any:
        """Mean over nodes of their flushed ``eval_params()`` (float64 sum in node order, returned as float32)."""
        import torch

        flats = torch.stack([self._flushed[i]["eval_params"].to(torch.float64) for i in range(self.n_nodes)])
        return (flats.sum(0) / self.n_nodes).to(torch.float32)

    def privacy_reports(self) -> dict[int, dict[str, Any]]:
        """Every node's privacy report of the last flush."""
        return {i: self._flushed[i]["privacy"] for i in range(self.n_nodes)}

    def state_dicts(self) -> dict[int, Any]:
        """Every node's state of the last flush (``keep_states=True``)."""
        if not self.keep_states:
            raise ValueError("the relay nodes sent no state (keep_states=False); build the backend with keep_states=True")
        return {i: self._flushed[i]["state"] for i in range(self.n_nodes)}

    def param_layout(self) -> list[list[Any]] | None:
        """None: the relay's node 0 reports its layout with its ``register`` reply."""
        return None

    def shutdown(self) -> None:
        """Nothing to stop: the nodes live with their ClientApps."""
