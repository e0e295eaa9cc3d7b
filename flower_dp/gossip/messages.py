"""What push-sum nodes exchange, and the node interface every backend drives.

A ``Share`` is *sender-scaled*: its tensors and weight are
already multiplied by ``P^k[receiver, sender]``.  The outbox of ``local_step`` includes
the self-share (receiver == sender, ``wire_bits == 0``).  Transports treat ``tensors``
as opaque payloads and never look inside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from . import wire

__all__ = ["Share", "Contribution", "Node", "reduce_contributions", "REDUCE_OPS"]

REDUCE_OPS = ("max", "sum", "max_pairwise_l1")


@wire.register
@dataclass(frozen=True)
class Share:
    """One push-sum message from ``sender`` to ``receiver`` at iteration ``k``.

    Parameters
    ----------
    sender, receiver : int
        Node ids, 0-based.  ``receiver == sender`` for the self-share.
    k : int
        Global iteration, 0-based.
    tensors : dict[str, Any]
        Named payloads (``torch.Tensor`` or ``ndarray``), already scaled by ``P^k[receiver, sender]``.
    weight : float or None
        Scaled push-sum weight; ``None`` for D-PSGD-type baselines that carry none.
    wire_bits : int
        Bits this share costs on the wire under the algorithm's cost model (0 for self-shares).
    """

    sender: int
    receiver: int
    k: int
    tensors: dict[str, Any]
    weight: float | None = None
    wire_bits: int = 0


@wire.register
@dataclass(frozen=True)
class Contribution:
    """A value a node contributes to a network-wide reduction before ``local_step``.

    ``op`` is ``"max"`` or ``"sum"`` over scalars/arrays, or ``"max_pairwise_l1"``:
    the value is a vector and the reduction is ``max_{i,j} ||v_i - v_j||_1`` (DPPS's
    real-sensitivity oracle).
    """

    value: Any
    op: Literal["max", "sum", "max_pairwise_l1"] = "max"


@runtime_checkable
class Node(Protocol):
    """The push-sum node interface.

    Backends call, for every iteration ``k``: ``contribute(k)`` on all nodes, reduce,
    ``local_step(k, reduced)`` on all nodes, then ``mix(inbox)`` with the inbox sorted
    by sender.  ``setup()`` runs once before ``k = 0``.
    """

    node_id: int

    def setup(self) -> None: ...

    def contribute(self, k: int) -> dict[str, Contribution] | None: ...

    def local_step(self, k: int, reduced: dict[str, Any] | None = None) -> list[Share]: ...

    def mix(self, inbox: list[Share]) -> None: ...


def _as_array(v: Any) -> np.ndarray:
    try:
        import torch

        if isinstance(v, torch.Tensor):
            return v.detach().to("cpu", dtype=torch.float64).numpy()
    except ImportError:  # pragma: no cover
        pass
    return np.asarray(v, dtype=np.float64)


def reduce_contributions(contribs: dict[int, dict[str, Contribution] | None]) -> dict[str, Any] | None:
    """Reduce every node's contributions into one dict handed to every node.

    Parameters
    ----------
    contribs : dict[int, dict[str, Contribution] | None]
        Node id -> that node's contributions.  Either every node returns ``None`` (no
        barrier, result ``None``) or every node returns the same keys with the same ops.

    Returns
    -------
    dict[str, float | ndarray] or None
        Reduced values, computed in node-id order (deterministic on every backend).
    """
    ids = sorted(contribs)
    present = [i for i in ids if contribs[i]]
    if not present:
        return None
    if len(present) != len(ids):
        missing = [i for i in ids if not contribs[i]]
        raise ValueError(f"every node must contribute the same keys; nodes {missing} contributed nothing")
    keys = set(contribs[present[0]])
    for i in present:
        if set(contribs[i]) != keys:
            raise ValueError(
                f"every node must contribute the same keys; node {i} gave {sorted(contribs[i])}, "
                f"node {present[0]} gave {sorted(keys)}"
            )
    out: dict[str, Any] = {}
    for key in sorted(keys):
        ops = {contribs[i][key].op for i in ids}
        if len(ops) != 1:
            raise ValueError(f"contribution {key!r} has mixed ops {sorted(ops)}; use one op for all nodes")
        op = ops.pop()
        vals = [_as_array(contribs[i][key].value) for i in ids]
        if op == "max":
            r = vals[0]
            for v in vals[1:]:
                r = np.maximum(r, v)
        elif op == "sum":
            r = vals[0].copy()
            for v in vals[1:]:
                r = r + v
        elif op == "max_pairwise_l1":
            r = 0.0
            for a in range(len(vals)):
                for b in range(a + 1, len(vals)):
                    r = max(r, float(np.abs(vals[a] - vals[b]).sum()))
            r = np.float64(r)
        else:
            raise ValueError(f"unknown reduction op {op!r}; valid choices are {list(REDUCE_OPS)}")
        out[key] = float(r) if np.ndim(r) == 0 else r
    return out


@dataclass
class IterationLog:
    """Per-iteration bookkeeping a backend returns (bits sent per node, reduced values)."""

    k: int
    bits_sent: dict[int, int] = field(default_factory=dict)
    reduced: dict[str, Any] | None = None
