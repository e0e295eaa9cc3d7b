"""Flower client logic, imported as ``flower_dp.clients``.

One module per algorithm holding the per-node update rule (a :class:`flower_dp.gossip.Node`),
plus the ClientApp builders and mods.
"""

__all__: list[str] = []
