"""Flower-on-Ray, server relay and in-process end with the same node parameters (n = 8).

Dyn-D2P, DP-CSGP (rand_a compressor) and PartPSP (reduce step every iteration) on
Fashion-MNIST, from one experiment config each.  One ``flwr run`` of :data:`SERVER` runs all
six strategies one after the other (each strategy run has its own nodes and out dir); the
final node states come from each run's last checkpoint, the bits and the privacy from what
the ServerApp saved of each strategy (:func:`flwr_run_helper.save_strategy`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.data import FASHION_MNIST_DIR

from flwr_run_helper import load_strategy, run_test_app, save_strategy, saving_errors

pytestmark = [
    pytest.mark.flower,
    pytest.mark.slow,
    pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="needs dataset-fashion-mnist"),
]

N, K, R = 8, 6, 3
DP = {"epsilon": 4.0, "delta": 1e-4, "accountant": "rdp"}
CASES = {
    "dyn_d2p": ({"variant": "dyn", "lr": 0.1, "batch_size": 8, **DP}, "logreg", "random_irregular"),
    "dp_csgp": ({"lr": 0.1, "batch_size": 8, "G": 1.0, "compressor": "rand_0.5", "gamma_c": 0.5, **DP}, "logreg",
                "random_irregular"),
    "partpsp": ({"lr": 0.1, "batch_size": 8, "gamma_n": 1e-3, "b": 5.0, "sync_period": 3}, "partpsp_mlp",
                "exp_one_peer"),
}


def _cfg(name):
    from flower_dp.experiments import config_from_dict

    params, model, topo = CASES[name]
    topology = {"name": topo, "n_nodes": N, **({"seed": 2} if topo == "random_irregular" else {})}
    return config_from_dict({
        "run": {"name": name, "seed": 5, "num_iters": K, "eval_every": R, "checkpoint": False, "progress": False,
                "reproducible": True},  # every backend == in-process: the seeded simulation mode
        "data": {"dataset": "fashion_mnist", "samples_per_node": 32, "test_samples": 100},
        "model": {"name": model},
        "topology": topology,
        "algorithm": {"name": name, "params": params},
    })


def _max_diff(a, b, path="state"):
    """Largest absolute difference over every tensor / number of two node states (inf on a structure mismatch)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape:
            return float("inf"), path
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0, path
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return float("inf"), path
        return max((_max_diff(a[k], b[k], f"{path}.{k}") for k in a), default=(0.0, path), key=lambda t: t[0])
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return float("inf"), path
        return max((_max_diff(u, v, f"{path}[{i}]") for i, (u, v) in enumerate(zip(a, b))), default=(0.0, path),
                   key=lambda t: t[0])
    if isinstance(a, float) and isinstance(b, (int, float)):
        return abs(a - b) if a == a or b == b else 0.0, path
    return (0.0 if a == b else float("inf")), path


#: the six strategy runs (every case of :data:`CASES` on both transports), each into ``out-dir/<case>-<transport>``,
#: where it leaves what its strategy saw, or its traceback, for the test
SERVER = ServerApp()


@SERVER.main()
def _main(grid: Grid, context: Context) -> None:
    from flower_dp.clients.push_sum_app import spec_from_config
    from flower_dp.strategies.push_sum import PushSumStrategy

    out = Path(str(context.run_config["out-dir"]))
    for name in CASES:
        spec = spec_from_config(_cfg(name))
        for transport in ("ray", "relay"):
            kw = {"backend_kwargs": {"num_hosts": 2}} if transport == "ray" else {}
            with saving_errors(out / f"{name}-{transport}" / "strategy"):
                strat = PushSumStrategy(N, spec, num_iters=spec["plan"].num_iters, iters_per_round=R,
                                        transport=transport, out_dir=out / f"{name}-{transport}", timeout_s=120,
                                        run_name=f"{name}-{transport}", **kw)
                strat.start(grid)
                save_strategy(out / f"{name}-{transport}" / "strategy", strat)


def test_three_backends_same_node_parameters(tmp_path):
    """Per algorithm: in-process runner == Flower-on-Ray == Flower relay, every state tensor to 1e-6."""
    from flower_dp.experiments import run_experiment
    from flower_dp.results import load_checkpoint

    torch.set_num_threads(1)
    ref = {name: run_experiment(_cfg(name), out_dir=None, progress=False) for name in CASES}
    run = run_test_app("test_flower_push_sum_algorithms:SERVER", tmp_path, num_supernodes=N,
                       run_config={"out-dir": str(tmp_path)}, timeout=900)
    problems = []
    for name in CASES:
        ref_states = [nd.state_dict() for nd in ref[name].nodes]
        for transport in ("ray", "relay"):
            strat = load_strategy(tmp_path / f"{name}-{transport}" / "strategy", run)
            states = load_checkpoint(tmp_path / f"{name}-{transport}")["nodes"]
            for i in range(N):
                diff, where = _max_diff(ref_states[i], states[i])
                if diff > 1e-6:
                    problems.append(f"{name}/{transport}: node {i} differs by {diff:g} at {where}")
            if strat.history[-1]["bits_total"] != ref[name].history[-1]["bits_total"]:
                problems.append(f"{name}/{transport}: bits {strat.history[-1]['bits_total']} != "
                                f"{ref[name].history[-1]['bits_total']}")
            key = ref[name].nodes[0].plan.eps_key  # DPPS family: eps_heuristic (eps_rigorous is None)
            eps = [p[key] for p in strat.privacy]
            ref_eps = [p[key] for p in ref[name].privacy["per_node"]]
            if eps != pytest.approx(ref_eps, rel=1e-9):
                problems.append(f"{name}/{transport}: eps {eps} != {ref_eps}")
    assert not problems, "\n".join(problems)
