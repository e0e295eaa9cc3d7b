"""Flower server-side strategies (Message API), imported as ``flower_dp.strategies``.

- :class:`GauLRQ` — Gau-LRQ / Dynamic Gau-LRQ and the baselines Gau-SGD, QG-SGD, BQ-SGD, Local SGD
  (``method=``), server-side LRQ decoding and client-level accounting.
- :class:`PushSumStrategy` — coordinates push-sum runs (one Flower round = one gossip segment).
"""

from .gau_lrq import GauLRQ, Schedule, client_level_epsilon, gau_lrq_schedule
from .push_sum import PushSumStrategy

__all__ = ["GauLRQ", "Schedule", "gau_lrq_schedule", "client_level_epsilon", "PushSumStrategy"]
