"""Budgets (issue 9): no run spends more than its declared (eps, delta) under the rigorous accountant.

For every private algorithm of the registry: ask for more iterations than ``budget_epsilon``
allows (the budget is half the rigorous eps of the requested K).  The plan is truncated before
anything runs, the in-process run stops at the truncated K with status ``stopped_by_budget``,
every node's ledger (the noise actually charged) gives a rigorous eps <= the budget, and a node
asked for one more iteration refuses before it draws any noise.
"""

from __future__ import annotations

import pytest

from flower_dp.clients import registry
from flower_dp.experiments import config_from_dict, run_experiment

DP = {"epsilon": 4.0, "delta": 1e-4, "accountant": "rdp"}
DPPS = {"b": 5.0, "gamma_n": 0.5}
CASES = {
    "dyn_d2p": ({"variant": "dyn", **DP}, "logreg", "exp_one_peer"),
    "const_d2p": ({"variant": "const", "clip_bar": 2.0, **DP}, "logreg", "exp_one_peer"),
    "privsgp_vr": ({"G": 2.0, **DP}, "logreg", "exp_one_peer"),
    "privsgp": ({"G": 2.0, **DP}, "logreg", "exp_one_peer"),
    "dp2_sgd": ({"G": 2.0, **DP}, "logreg", "undirected_ring"),
    "adp2_sgd": ({"G": 2.0, **DP}, "logreg", "undirected_ring"),
    "dp_csgp": ({"G": 2.0, "compressor": "rand_0.5", "gamma_c": 0.5, **DP}, "logreg", "exp_all_hops"),
    "partpsp": ({**DPPS, "sync_period": 5, "accountant": "rdp"}, "partpsp_mlp", "exp_one_peer"),
    "sgpdp": ({**DPPS, "sync_period": 5, "accountant": "rdp"}, "partpsp_mlp", "exp_one_peer"),
    "pedfl": ({**DPPS, "accountant": "rdp"}, "partpsp_mlp", "exp_one_peer"),
}
K, N = 40, 4


def _algorithm(case):
    return "dyn_d2p" if case == "const_d2p" else case


def test_every_private_algorithm_is_covered():
    """The table lists every registry algorithm that charges an accountant (SGP adds no noise)."""
    assert {_algorithm(c) for c in CASES} == set(registry.ALGORITHMS) - {"sgp"}


def _cfg(case, extra):
    params, model, topo = CASES[case]
    return config_from_dict({
        "run": {"name": case, "seed": 0, "num_iters": K, "eval_every": 10, "progress": False},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 64, "test_samples": 100},
        "model": {"name": model},
        "topology": {"name": topo, "n_nodes": N},
        "algorithm": {"name": _algorithm(case), "params": {"lr": 0.05, "batch_size": 8, **params, **extra}},
    })


@pytest.mark.parametrize("case", sorted(CASES))
def test_asking_for_more_iterations_than_the_budget_allows(case, tmp_path):
    from flower_dp.experiments.runner import build_experiment

    _, full, *_ = build_experiment(_cfg(case, {}))
    assert full.private and full.num_iters == K
    key = full.eps_key  # DPPS family: eps_heuristic (truncated on it, and named so); others: eps_rigorous
    budget = 0.5 * max(full.eps_planned(i) for i in range(full.n_nodes))
    cfg = _cfg(case, {"budget_epsilon": budget})
    res = run_experiment(cfg, out_dir=tmp_path)
    _, plan, *_ = build_experiment(cfg)
    assert 0 < plan.num_iters < K and plan.num_iters_requested == K
    assert res.status == "stopped_by_budget" and res.history[-1]["k"] == plan.num_iters
    for p in res.privacy["per_node"]:
        assert p["steps_charged"] > 0
        assert p[key] <= budget * (1 + 1e-9), f"{case}: node {p['node']} spent {p[key]} > {budget}"
        assert (p["eps_rigorous"] is None) == full.heuristic
        assert p["delta"] <= DP["delta"]
    # one more iteration than the plan holds: refused before any noise is drawn or charged
    node = res.nodes[0]
    charged = node.accountant.steps_charged
    with pytest.raises(ValueError, match=r"iteration k must be in \[0, \d+\)"):
        node.contribute(plan.num_iters)  # DPPS family: refuses here already
        node.local_step(plan.num_iters, None)
    assert node.accountant.steps_charged == charged
