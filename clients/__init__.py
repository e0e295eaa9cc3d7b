"""Flower client logic, imported as ``flower_dp.clients``.

One module per algorithm holding the per-node update rule (a :class:`flower_dp.gossip.Node`):
:mod:`.sgp`, :mod:`.dyn_d2p`, :mod:`.privsgp_vr`, :mod:`.dp_csgp`, :mod:`.dpps`; the registry
that plans and builds them (:mod:`.registry`); and the Flower glue, which imports ``flwr``
and is therefore not imported here: :mod:`.push_sum_app` (ClientApp builder for push-sum) and
:mod:`.lrq_mod` (the Gau-LRQ client mod).
"""

from . import registry
from .base import Plan, PushSumNode
from .privsgp_vr import adp2_matching
from .registry import ALGORITHMS, ablate, make_node, param_names, prepare, topology_for

__all__ = [
    "registry",
    "Plan",
    "PushSumNode",
    "ALGORITHMS",
    "prepare",
    "make_node",
    "ablate",
    "topology_for",
    "param_names",
    "adp2_matching",
]
