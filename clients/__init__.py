"""Flower client logic, imported as ``flower_dp.clients``.

One module per algorithm holding the per-node update rule (a :class:`flower_dp.gossip.Node`):
:mod:`.sgp`, :mod:`.dyn_d2p`, :mod:`.privsgp_vr`, :mod:`.dp_csgp`, :mod:`.dpps`; the registry
that plans and builds them (:mod:`.registry`); and the Flower glue, which imports ``flwr``
and is therefore not imported here: :mod:`.push_sum_app` (ClientApp builder for push-sum),
:mod:`.push_sum_node` (its message handler and node builders) and :mod:`.lrq_mod` (the Gau-LRQ client mod).  The
ClientApp module imports neither torch nor the algorithms; on the deployment engine it keeps each SuperNode's node
in a persistent process.

The names below (among them :mod:`.push_sum_app`'s :func:`make_client_app`, :func:`model_builder`,
:func:`plan_spec` and :func:`spec_from_config`) load on first use (PEP 562), so that importing a light submodule
(:mod:`.push_sum_app`, which a ``flwr-clientapp`` process imports for every message) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> (submodule, attribute or None for the submodule itself)
_LAZY = {
    "registry": ("registry", None),
    "Plan": ("base", "Plan"),
    "PushSumNode": ("base", "PushSumNode"),
    "adp2_matching": ("privsgp_vr", "adp2_matching"),
    "ALGORITHMS": ("registry", "ALGORITHMS"),
    "ablate": ("registry", "ablate"),
    "make_node": ("registry", "make_node"),
    "param_names": ("registry", "param_names"),
    "prepare": ("registry", "prepare"),
    "topology_for": ("registry", "topology_for"),
    "make_client_app": ("push_sum_app", "make_client_app"),
    "model_builder": ("push_sum_app", "model_builder"),
    "plan_spec": ("push_sum_app", "plan_spec"),
    "spec_from_config": ("push_sum_app", "spec_from_config"),
}

__all__ = ["registry", "Plan", "PushSumNode", "ALGORITHMS", "prepare", "make_node", "ablate", "topology_for",
           "param_names", "adp2_matching", "make_client_app", "model_builder", "plan_spec", "spec_from_config"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    mod = importlib.import_module(f"{__name__}.{module}")
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
