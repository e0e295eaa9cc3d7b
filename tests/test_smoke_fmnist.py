"""Fashion-MNIST smoke runs of every decentralized algorithm through the in-process runner (issue 4).

Each run: shallow CNN (PartPSP: its MLP), 4 nodes, a few iterations.  Asserts the loss goes down,
the results file is complete, and the per-node eps equals the privacy core's value for the
steps the node actually charged.
"""

from __future__ import annotations

import json
import math

import pytest

from flower_dp.data import FASHION_MNIST_DIR
from flower_dp.experiments import config_from_dict, run_experiment
from flower_dp.privacy import rigorous_epsilon

pytestmark = pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="needs dataset-fashion-mnist (scripts/test.sh installs it)")

DP = {"epsilon": 20.0, "delta": 1e-4, "accountant": "rdp"}
CASES = {
    "sgp": ("sgp", {"lr": 0.05}, "shallow_cnn", "exp_one_peer"),
    "dyn_d2p": ("dyn_d2p", {"lr": 0.05, "variant": "dyn", **DP}, "shallow_cnn", "exp_one_peer"),
    "const_d2p": ("dyn_d2p", {"lr": 0.05, "variant": "const", "clip_bar": 2.0, **DP}, "shallow_cnn", "exp_one_peer"),
    "privsgp_vr": ("privsgp_vr", {"lr": 0.02, "G": 2.0, **DP}, "shallow_cnn", "exp_one_peer"),  # blocks of B = 32
    "privsgp": ("privsgp", {"lr": 0.05, "G": 2.0, **DP}, "shallow_cnn", "exp_one_peer"),
    "dp2_sgd": ("dp2_sgd", {"lr": 0.05, "G": 2.0, **DP}, "shallow_cnn", "undirected_ring"),
    "adp2_sgd": ("adp2_sgd", {"lr": 0.05, "G": 2.0, **DP}, "shallow_cnn", "undirected_ring"),
    "dp_csgp": ("dp_csgp", {"lr": 0.05, "G": 2.0, "compressor": "rand_0.5", "gamma_c": 0.5, **DP}, "shallow_cnn", "exp_all_hops"),
    "partpsp": ("partpsp", {"lr": 0.1, "b": 1e6, "gamma_n": 1e-3, "sync_period": 5, "split": "partpsp2"}, "partpsp_mlp", "exp_one_peer"),
    "sgpdp": ("sgpdp", {"lr": 0.1, "b": 1e6, "gamma_n": 1e-3, "sync_period": 5}, "partpsp_mlp", "exp_one_peer"),
    "pedfl": ("pedfl", {"lr": 0.1, "b": 1e6, "gamma_n": 1e-3}, "partpsp_mlp", "exp_one_peer"),
}


#: over a minute on 2 shared cores (measured under load): marked slow, still run by the full suite
SLOW = {"privsgp_vr", "adp2_sgd", "dyn_d2p", "const_d2p"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in sorted(CASES)])
def test_fashion_mnist_smoke(case, tmp_path):
    algo, params, model, topo = CASES[case]
    cfg = config_from_dict({
        "run": {"name": case, "seed": 0, "num_iters": 16, "eval_every": 4, "progress": False},
        "data": {"dataset": "fashion_mnist", "samples_per_node": 512, "test_samples": 1000},
        "model": {"name": model},
        "topology": {"name": topo, "n_nodes": 4},
        "algorithm": {"name": algo, "params": {"batch_size": 32, **params}},
    })
    res = run_experiment(cfg, out_dir=tmp_path)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "finished" and len(doc["history"]) == 4
    losses = [row["test_loss_avg"] for row in doc["history"]]
    assert losses[-1] < losses[0], losses
    assert all(math.isfinite(v) for v in losses)
    assert set(doc["privacy"]["per_node"][0]) >= {"eps_rigorous", "eps_paper", "steps_charged"}
    assert len(doc["bits_sent_per_node"]) == 4 and all(b > 0 for b in doc["bits_sent_per_node"])
    for node, p in zip(res.nodes, res.privacy["per_node"]):
        plan, i = node.plan, node.node_id
        if plan.private:  # the reported eps is the privacy core's eps of the steps actually charged
            steps = plan.steps(i)  # the plan's one description of the releases (PrivSGP-VR: two per iteration)
            assert p["steps_charged"] == len(steps) == plan.num_iters * (2 if algo == "privsgp_vr" else 1)
            core = rigorous_epsilon(steps, plan.delta_of(i), accountant=plan.accountant, adjacency=plan.adjacency)
            key = plan.eps_key  # DPPS family: eps_heuristic, eps_rigorous None
            assert float(p[key]) == pytest.approx(core, rel=1e-6)
            assert float(p[f"{key}_planned"]) == pytest.approx(core, rel=1e-6)
        if algo == "sgp":
            assert p["eps_rigorous"] in (float("inf"), "inf") or math.isinf(float(p["eps_rigorous"]))
        elif plan.heuristic:
            assert p["eps_rigorous"] is None and float(p["eps_heuristic"]) > 0 and "privacy_note" in p
        else:
            assert float(p["eps_rigorous"]) > 0 and "eps_paper" in p
            if algo in ("dyn_d2p", "dp_csgp", "privsgp", "privsgp_vr", "dp2_sgd", "adp2_sgd"):
                assert float(p["eps_rigorous"]) <= DP["epsilon"] * 1.001  # calibrated to the target
    print(case, doc["history"][-1]["acc_avg"], res.privacy["per_node"][0].get("eps_heuristic",
                                                                               res.privacy["per_node"][0]["eps_rigorous"]))
