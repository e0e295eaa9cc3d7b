"""Flower server-side strategies (Message API), imported as ``flower_dp.strategies``.

- :class:`GauLRQ` — Gau-LRQ / Dynamic Gau-LRQ and the baselines Gau-SGD, QG-SGD, BQ-SGD, Local SGD
  (``method=``), server-side LRQ decoding and client-level accounting.
- :class:`PushSumStrategy` — coordinates push-sum runs (one Flower round = one gossip segment).

Names are resolved lazily (``flower_dp.clients.lrq_mod`` imports ``strategies.baselines``, and
``strategies.gau_lrq`` imports the mod: an eager import here would be circular).
"""

from importlib import import_module

__all__ = ["GauLRQ", "Schedule", "gau_lrq_schedule", "client_level_epsilon", "PushSumStrategy"]

_WHERE = {"PushSumStrategy": ".push_sum"} | {n: ".gau_lrq" for n in __all__ if n != "PushSumStrategy"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
