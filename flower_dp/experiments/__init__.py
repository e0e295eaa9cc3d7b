"""Application layer: configs, the in-process runner, reproductions.

Unlike the core, this package may import :mod:`flower_dp.clients` and
:mod:`flower_dp.strategies`.
"""

__all__: list[str] = []
