"""Server-relay transport, core half: the message protocol and the node-side handler.

For deployments where nodes cannot reach each other, the coordinator (the Flower
strategy, :mod:`flower_dp.strategies.push_sum`) routes every share.  Nothing here
imports Flower: payloads are plain dicts of bytes/ints that the glue puts into
``ConfigRecord`` values.

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

import io
from typing import Any

__all__ = ["encode", "decode", "handle_relay_request", "MESSAGE_KEYS"]

#: ConfigRecord keys of the push-sum protocol (both transports).
MESSAGE_KEYS = {
    "action": "pushsum.action",  # "register" | "contribute" | "step" | "flush" | "load"
    "k": "pushsum.k",
    "payload": "pushsum.payload",  # bytes (encode) of the request / reply dict
    "spec": "pushsum.spec",  # bytes (encode) of the node spec (first round)
    "transport": "pushsum.transport",  # "ray" | "relay"
}
ACTIONS = ("register", "contribute", "step", "flush", "load")


def encode(obj: Any) -> bytes:
    """Serialize shares / contributions / states (tensors kept bit-exact) to bytes."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def decode(data: bytes) -> Any:
    """Inverse of :func:`encode` (trusted peers only: this unpickles)."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


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
