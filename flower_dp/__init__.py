"""flower-dp: differentially private decentralized and federated learning for Flower.

Core packages (never import Flower, nor ``flower_dp.clients``/``flower_dp.strategies``):

- :mod:`flower_dp.privacy` — accountants (GDP, RDP, PLD), calibration, budgets, paper formulas.
- :mod:`flower_dp.mechanisms` — per-sample clipping, noise, compressors, the LRQ quantizer.
- :mod:`flower_dp.topology` — directed (time-varying) graphs and mixing matrices.
- :mod:`flower_dp.gossip` — push-sum messages and the backends that move them.
- :mod:`flower_dp.data`, :mod:`flower_dp.models` — datasets (offline first) and the papers' models.

Application layer (may import everything): :mod:`flower_dp.experiments` and :mod:`flower_dp.cli`.
Flower glue: :mod:`flower_dp.clients` (node update rules, ClientApps, mods) and
:mod:`flower_dp.strategies` (server-side strategies).
"""

from ._requirements import check_requirements as _check_requirements

__version__ = "0.1.0"

_check_requirements()  # installed versions outside flower-dp's requirements (e.g. an app's torch pin) fail here

__all__ = ["__version__"]
