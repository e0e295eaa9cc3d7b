"""Flower server-side strategies (Message API), imported as ``flower_dp.strategies``.

- :class:`GauLRQ` — Gau-LRQ / Dynamic Gau-LRQ and the baselines Gau-SGD, QG-SGD, BQ-SGD, Local SGD
  (``method=``), server-side LRQ decoding and client-level accounting.
- :class:`PushSumStrategy` — coordinates push-sum runs (one Flower round = one gossip segment).

Strategies import only the core (``flower_dp`` minus the application modules), never
``flower_dp.clients``: the Gau-LRQ wire format and codec both sides share live in
:mod:`flower_dp.mechanisms.gau_lrq_codec`.
"""

from flower_dp.privacy.gau_lrq import Schedule, client_level_epsilon, gau_lrq_schedule

from .gau_lrq import GauLRQ
from .push_sum import PushSumStrategy

__all__ = ["GauLRQ", "Schedule", "gau_lrq_schedule", "client_level_epsilon", "PushSumStrategy"]
