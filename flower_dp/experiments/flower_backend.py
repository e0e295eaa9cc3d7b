"""Run an experiment config as a Flower simulation on Ray (DESIGN.md backend 2), same results file.

:func:`run_flower_experiment` is the Flower twin of :func:`flower_dp.experiments.run_experiment`: one SuperNode per
push-sum node, one Flower round per segment of ``run.eval_every`` iterations, shares exchanged peer to peer between
Ray host actors, the network-average model evaluated by the server after every round.  The strategy's run engine
writes ``results.json`` in the runner's layout (history rows with ``k``, ``bits_total``, the evaluation; per-node
privacy; ``config``; ``info``), so reports and sweeps treat both backends alike.  Same seed and config with
``[run] reproducible = true`` -> the same numbers on CPU (by default every node's noise comes from its own secret).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .. import results as rio
from .._ray_local import use_loopback
from .config import ExperimentConfig

__all__ = ["run_flower_experiment"]


def run_flower_experiment(cfg: ExperimentConfig, *, out_dir: str | Path, num_hosts: int = 2,
                          num_gpus_per_host: float = 0.0, timeout_s: float = 600.0,
                          resume: bool | None = None) -> dict[str, Any]:
    """Run ``cfg`` under ``flwr.simulation.run_simulation``; return the results document it wrote.

    ``resume=None`` resumes when ``out_dir`` already holds a checkpoint of this config.
    """
    import torch
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from ..clients.builder import build_parts
    from ..clients.push_sum_app import make_client_app, spec_from_parts
    from ..strategies.push_sum import PushSumStrategy
    from .runner import evaluate_params

    out = rio.ensure_writable_dir(out_dir)
    prev = rio.read_json(out / "results.json")
    if resume is None:
        resume = (out / rio.CHECKPOINT_NAME).is_file() and bool(prev) and prev.get("config") == cfg.to_dict()
    # the one node builder, as the in-process runner builds its run: the plan the SuperNodes get, the test split and
    # the evaluation model (the SuperNodes build their nodes from the same config and plan)
    parts = build_parts(cfg.to_dict())
    spec = spec_from_parts(parts)
    plan = parts.plan
    x_test, y_test = parts.test_data()
    model = parts.new_model()

    info = {"dataset": parts.test.name, "synthetic_data": bool(getattr(parts.test, "synthetic", False)),
            "test_samples": len(x_test), "dim": int(plan.dim), "topology": cfg.topology["name"], "device": "cpu"}

    def evaluate(rnd: int, avg: torch.Tensor) -> dict[str, float]:
        acc, loss = evaluate_params(model, avg, x_test, y_test)
        return {"acc_avg": acc, "test_loss_avg": loss}

    seen: dict[str, Any] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = PushSumStrategy(cfg.n_nodes, spec, num_iters=int(plan.num_iters),
                                   iters_per_round=int(cfg.run["eval_every"]), transport="ray", evaluate_fn=evaluate,
                                   out_dir=out, timeout_s=timeout_s, checkpoint=bool(cfg.run.get("checkpoint", True)),
                                   run_name=str(cfg.run["name"]), resume=bool(resume),
                                   debug_metrics=bool(cfg.run.get("debug_metrics", False)), run_info=info,
                                   backend_kwargs={"num_hosts": num_hosts, "num_gpus_per_host": num_gpus_per_host})
        strategy.timings["startup_s"] = time.perf_counter() - t0  # run_simulation starting Flower and this app
        strategy.start(grid)
        seen["strategy"] = strategy

    t0 = time.perf_counter()
    use_loopback()  # the simulation's Ray binds 127.0.0.1 (Ray ignores _node_ip_address="127.0.0.1" alone)
    run_simulation(server_app=server, client_app=make_client_app(), num_supernodes=cfg.n_nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"include_dashboard": False, "_node_ip_address": "127.0.0.1"}})
    doc = rio.read_json(out / "results.json")
    if doc is None or "strategy" not in seen:
        raise RuntimeError(f"the Flower simulation of {cfg.run['name']!r} ended without results in {str(out)!r}; "
                           "see the Flower log above")
    return doc
