"""Server-relay transport, core half: the message protocol and the node-side handler.

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
the numbers are identical.
"""

from __future__ import annotations

from typing import Any

from . import wire

__all__ = ["encode", "decode", "to_records", "from_records", "handle_relay_request", "MESSAGE_KEYS", "ARRAYS_KEY",
           "param_layout", "apply_initial_arrays"]

#: ConfigRecord keys of the push-sum protocol (both transports).
MESSAGE_KEYS = {
    "action": "pushsum.action",  # "register" | "contribute" | "step" | "flush" | "load"
    "k": "pushsum.k",
    "payload": "pushsum.payload",  # JSON tree (to_records) of the request / reply dict; arrays in ARRAYS_KEY
    "spec": "pushsum.spec",  # bytes (encode, typed, no pickle) of the node spec (first round)
    "transport": "pushsum.transport",  # "ray" | "relay"
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
