"""Flower server-side strategies (Message API), imported as ``flower_dp.strategies``.

- :class:`GauLRQ` — Gau-LRQ / Dynamic Gau-LRQ and the baselines Gau-SGD, QG-SGD, BQ-SGD, Local SGD
  (``method=``), server-side LRQ decoding and client-level accounting.
- :class:`PushSumStrategy` — coordinates push-sum runs (one Flower round = one gossip segment).

Strategies import only the core (``flower_dp`` minus the application modules), never
``flower_dp.clients``: the Gau-LRQ wire format and codec both sides share live in
:mod:`flower_dp.mechanisms.gau_lrq_codec`.  Each name loads on first use, so a ServerApp that runs push-sum
does not import Gau-LRQ's codec (and torch with it) to start.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
_WHERE = {
    "GauLRQ": ".gau_lrq",
    "PushSumStrategy": ".push_sum",
    "Schedule": "flower_dp.privacy.gau_lrq",
    "gau_lrq_schedule": "flower_dp.privacy.gau_lrq",
    "client_level_epsilon": "flower_dp.privacy.gau_lrq",
}

__all__ = ["GauLRQ", "Schedule", "gau_lrq_schedule", "client_level_epsilon", "PushSumStrategy"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:  # a submodule (``flower_dp.strategies.push_sum``), as after an eager import
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the submodule exists; something it imports is missing
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
