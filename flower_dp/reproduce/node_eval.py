"""Per-node evaluation of a finished push-sum run, as the PartPSP authors evaluate: the exact network average of
the shared part (the mean of the nodes' de-biased shared parameters ``z``) with each node's own local head, one
accuracy per node, and their mean.

The runner evaluates one model, the network average of every coordinate (heads included); a run whose
:class:`~flower_dp.reproduce.core.RunSpec` sets ``node_eval`` gets this evaluation too, once, on its final nodes,
stored beside its ``results.json`` in ``node_eval.json`` (``acc_node_eval``, ``acc_node_eval_per_node``), which
the run's record then carries.  A node without a local part (a fully shared algorithm) is evaluated on the network average.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["NODE_EVAL_NAME", "shared_average", "node_eval_accuracies", "node_eval_record"]

#: the file, in a run's folder, that holds its per-node evaluation
NODE_EVAL_NAME = "node_eval.json"


def shared_average(nodes: list[Any]) -> torch.Tensor:
    """The mean of the nodes' shared parameters ``z`` (float64 sum, float32 result)."""
    flats = [n.z().detach().to("cpu", torch.float64) for n in nodes]
    return (torch.stack(flats).sum(0) / len(flats)).to(torch.float32)


def node_eval_accuracies(nodes: list[Any], evaluate) -> list[float]:
    """Each node's accuracy, ``evaluate(flat) -> accuracy``, on the shared average with its own head
    (``params_with_shared``); nodes without one are evaluated on the network average of ``eval_params``."""
    if all(hasattr(n, "params_with_shared") for n in nodes):
        shared = shared_average(nodes)
        return [float(evaluate(n.params_with_shared(shared))) for n in nodes]
    flats = [n.eval_params().detach().to("cpu", torch.float64) for n in nodes]
    avg = (torch.stack(flats).sum(0) / len(flats)).to(torch.float32)
    return [float(evaluate(avg))] * len(nodes)


def node_eval_record(cfg: Any, nodes: list[Any]) -> dict[str, Any]:
    """``extra_record`` entries of a run's per-node evaluation on the run's test set (``cfg``: its config)."""
    from ..clients.builder import build_parts
    from ..experiments.runner import evaluate_params

    parts = build_parts(cfg)
    eval_model, (x_test, y_test) = parts.new_model(), parts.test_data()
    accs = node_eval_accuracies(nodes, lambda flat: evaluate_params(eval_model, flat.cpu(), x_test, y_test)[0])
    return {"acc_node_eval": float(np.mean(accs)), "acc_node_eval_per_node": accs}
