"""Application layer: configs, the in-process runner, reproductions.

Unlike the core, this package may import :mod:`flower_dp.clients` and
:mod:`flower_dp.strategies`.
"""

from .config import ExperimentConfig, config_from_dict, load_config
from .runner import RunResult, build_experiment, evaluate_params, run_experiment

__all__ = [
    "ExperimentConfig",
    "config_from_dict",
    "load_config",
    "RunResult",
    "build_experiment",
    "evaluate_params",
    "run_experiment",
]
