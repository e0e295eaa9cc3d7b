"""flower-dp: differentially private decentralized and federated learning for Flower.

The front door: :func:`train_private` (private push-sum training of your own model on your own data),
:class:`PushSumStrategy` and :class:`GauLRQ` (Flower strategies), :data:`gau_lrq_mod` (Gau-LRQ's client mod),
:func:`rigorous_epsilon` and :func:`calibrate_noise_multiplier` (the accountant) with the steps a history is
made of, :class:`GaussianStep` and :class:`LaplaceStep`.  A run's and a strategy's
``privacy_spent()`` is the one way to read the eps spent.

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

#: the names ``import flower_dp`` offers, each loaded from its module on first use (``import flower_dp`` alone
#: imports neither torch nor Flower)
_LAZY = {
    "train_private": "flower_dp.experiments.private_training",
    "PrivateRun": "flower_dp.experiments.private_training",
    "PushSumStrategy": "flower_dp.strategies",
    "GauLRQ": "flower_dp.strategies",
    "gau_lrq_mod": "flower_dp.clients.lrq_mod",
    "rigorous_epsilon": "flower_dp.privacy",
    "calibrate_noise_multiplier": "flower_dp.privacy",
    "GaussianStep": "flower_dp.privacy",
    "LaplaceStep": "flower_dp.privacy",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    """Load a name of :data:`_LAZY` from its module (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'flower_dp' has no attribute {name!r}; its names are {sorted(__all__)}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
