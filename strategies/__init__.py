"""Flower server-side strategies (Message API), imported as ``flower_dp.strategies``."""

__all__: list[str] = []
