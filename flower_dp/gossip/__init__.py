"""Moving push-sum shares between nodes: the messages, and the backends that move them.

The transport knows nothing about algorithms: topology says *who*,
mixing weights say *how much*, this package says *how messages move*.  One iteration is
:func:`run_protocol_iteration` on every backend (in-process, Ray host actors, server relay);
a backend only carries its phases out.  Ray is imported lazily, only by the Ray backend.
"""

from .inprocess import check_routing, route_shares, run_iteration, run_iterations
from .messages import REDUCE_OPS, Contribution, IterationLog, Node, Share, reduce_contributions
from .protocol import Phases, run_protocol_iteration
from .ray_backend import (
    NodeFailureError,
    RayGossipBackend,
    SegmentResult,
    ensure_ray,
    host_actor_name,
    host_of,
    register_node,
)
from .relay import RelayGossipBackend

__all__ = [
    "Share",
    "Contribution",
    "Node",
    "IterationLog",
    "REDUCE_OPS",
    "reduce_contributions",
    "run_protocol_iteration",
    "Phases",
    "run_iteration",
    "run_iterations",
    "route_shares",
    "check_routing",
    "RayGossipBackend",
    "RelayGossipBackend",
    "NodeFailureError",
    "SegmentResult",
    "ensure_ray",
    "register_node",
    "host_of",
    "host_actor_name",
]
