"""Shared push-sum invariants for every algorithm of ``flower_dp.clients``.

Also holds the small fixtures the other ``test_algorithms_*`` files import: a synthetic
logistic-regression problem split over nodes, node builders and a driver loop.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from flower_dp.clients import registry
from flower_dp.clients.base import PushSumNode
from flower_dp.errors import ConfigError, NonFiniteError
from flower_dp.gossip import run_iteration
from flower_dp.models import build_model
from flower_dp.topology import from_matrix, random_irregular

torch.set_num_threads(1)

# ---------------------------------------------------------------- fixtures (imported by sibling files)


def logreg_data(n_nodes: int = 8, J: int = 64, features: int = 5, seed: int = 0):
    """Synthetic 2-class logistic regression: per-node (x, y) tensors and the pooled set."""
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(features, generator=g) * 2
    x = torch.randn(n_nodes * J, features, generator=g)
    p = torch.sigmoid(x @ w_true)
    y = (torch.rand(n_nodes * J, generator=g) < p).long()
    parts = [(x[i * J:(i + 1) * J], y[i * J:(i + 1) * J]) for i in range(n_nodes)]
    return parts, (x, y)


def ce_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y)


def logreg_model(features: int = 5) -> nn.Module:
    return build_model("logreg", num_classes=2, in_features=features, seed=0)


_PLANS: dict = {}


def cached_plan(algorithm, params, *, n_nodes, samples_per_node, num_iters, dim, seed=0, reproducible=True):
    """``registry.prepare`` memoized per test session (calibration costs ~1-3 s per new config).

    ``reproducible=True`` by default: these tests check the algorithms' numbers (same seed -> same run,
    resume = uninterrupted run), so they use the seeded simulation mode; the default secret mode is
    tested in tests/test_secret_noise.py.
    """
    key = (algorithm, repr(sorted(params.items())), n_nodes, tuple(samples_per_node), num_iters, dim, seed,
           reproducible)
    if key not in _PLANS:
        _PLANS[key] = registry.prepare(algorithm, dict(params), n_nodes=n_nodes, samples_per_node=list(samples_per_node),
                                       num_iters=num_iters, dim=dim, seed=seed, reproducible=reproducible)
    return _PLANS[key]


def make_nodes(algorithm, params, topology, *, parts, num_iters, model_fn=None, seed=0, plan_hook=None):
    model_fn = model_fn or (lambda: logreg_model(parts[0][0].shape[1]))
    m = model_fn()
    dim = sum(p.numel() for p in m.parameters())
    plan = cached_plan(algorithm, params, n_nodes=topology.n, samples_per_node=[len(p[0]) for p in parts],
                       num_iters=num_iters, dim=dim, seed=seed)
    if plan_hook is not None:
        plan = plan_hook(plan)
    nodes = [registry.make_node(plan, node_id=i, topology=topology, model=model_fn(), loss_fn=ce_loss,
                                data_x=parts[i][0], data_y=parts[i][1]) for i in range(topology.n)]
    for nd in nodes:
        nd.setup()
    return plan, nodes


def run(nodes, topology, k0, k1, order=None, on_mix=None):
    for k in range(k0, k1):
        run_iteration(nodes, k, receivers=topology.out_neighbors, order=order)
        if on_mix is not None:
            on_mix(k, nodes)


def full_loss(flat: torch.Tensor, x, y, features=5) -> float:
    from flower_dp.mechanisms.flat import load_flat_params_

    m = logreg_model(features)
    load_flat_params_(m, flat)
    with torch.no_grad():
        return float(ce_loss(m(x), y))


def optimum_loss(x, y, features=5) -> float:
    m = logreg_model(features)
    opt = torch.optim.LBFGS(m.parameters(), max_iter=500, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = ce_loss(m(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(ce_loss(m(x), y))


def average_z(nodes) -> torch.Tensor:
    return torch.stack([n.eval_params().double() for n in nodes]).mean(0).float()


#: (algorithm, params) with noise on; used for the generic invariants.  Small budgets run fast.
DP = dict(epsilon=2.0, delta=1e-4)
PUSH_SUM_CASES = [
    ("sgp", dict(lr=0.1, batch_size=8)),
    ("dyn_d2p", dict(lr=0.1, batch_size=8, variant="dyn", accountant="rdp", **DP)),
    ("dyn_d2p", dict(lr=0.1, batch_size=8, variant="const", calibration="paper", **DP)),
    ("privsgp_vr", dict(lr=0.1, batch_size=4, G=1.0, epsilon=2.0, delta=1e-4)),
    ("privsgp", dict(lr=0.1, batch_size=4, G=1.0, epsilon=2.0, delta=1e-4)),
    ("dp_csgp", dict(lr=0.1, batch_size=8, G=1.0, compressor="rand_0.5", gamma_c=0.5, **DP)),
    ("dp_csgp", dict(lr=0.1, batch_size=8, G=1.0, compressor="gsgd_8", **DP)),
]


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("algorithm,params", PUSH_SUM_CASES)
def test_mass_conservation_on_irregular_graph(algorithm, params):
    """Mass conservation: sum_i w_i == n and sum_i x_i == sum_i x_half_i at every mix."""
    topo = random_irregular(6, seed=3)
    parts, _ = logreg_data(6, 32)
    _, nodes = make_nodes(algorithm, params, topo, parts=parts, num_iters=6)
    for k in range(6):
        reduced = None
        outs = {nd.node_id: nd.local_step(k, reduced) for nd in nodes}
        x_half_sum = sum(s.tensors.get("x", s.tensors.get("q")).double() for o in outs.values() for s in o)
        if algorithm == "dp_csgp":  # mass of x is sum x_half (1^T (P - I) = 0 for any Q)
            x_half_sum = sum(nd.x_half.double() for nd in nodes)
        from flower_dp.gossip import route_shares

        inbox = route_shares(outs, [nd.node_id for nd in nodes])
        for nd in nodes:
            nd.mix(inbox[nd.node_id])
        assert abs(sum(nd.w for nd in nodes) - 6) < 1e-12
        assert all(nd.w > 0 for nd in nodes)
        assert not all(abs(nd.w - 1) < 1e-9 for nd in nodes)  # de-biasing really exercised
        x_sum = sum(nd.x.double() for nd in nodes)
        torch.testing.assert_close(x_sum, x_half_sum, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm,params", PUSH_SUM_CASES)
def test_consensus_with_zero_step(algorithm, params):
    """Consensus: gamma = 0 -> z_i -> mean_i x_i^0 on an irregular digraph (noise is scaled by gamma too)."""
    topo = random_irregular(6, seed=1)
    parts, _ = logreg_data(6, 32)
    _, nodes = make_nodes(algorithm, {**params, "lr": 0.0}, topo, parts=parts, num_iters=400)
    g = torch.Generator().manual_seed(7)
    for nd in nodes:  # distinct starting points (DP-CSGP: before setup's prelude, see below)
        nd.x = torch.randn(nd.x.numel(), generator=g)
    if algorithm == "dp_csgp":
        for nd in nodes:
            nd.x_hat = nd.x.clone()
            nd.s = torch.zeros_like(nd.x)
        # rebuild s = sum_j P_c[i, j] x_hat_j from the new starting points (consistent replicas)
        P = topo.matrix(0)
        gc = params["gamma_c"] if "gamma_c" in params else 1.0
        Pc = (1 - gc) * np.eye(6) + gc * P
        for i, nd in enumerate(nodes):
            nd.s = sum(float(Pc[i, j]) * nodes[j].x_hat for j in range(6))
            nd.x = nd.s.clone()
            nd.w = float(Pc[i].sum())
    target = sum(nd.x.double() for nd in nodes) / 6
    run(nodes, topo, 0, 400)
    for nd in nodes:
        torch.testing.assert_close(nd.z().double(), target, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algorithm,params", PUSH_SUM_CASES)
def test_order_independence_bitwise(algorithm, params):
    """Order independence: a permuted stepping order gives bitwise-identical state."""
    topo = random_irregular(5, seed=2)
    parts, _ = logreg_data(5, 32)
    _, a = make_nodes(algorithm, params, topo, parts=parts, num_iters=5)
    _, b = make_nodes(algorithm, params, topo, parts=parts, num_iters=5)
    run(a, topo, 0, 5)
    run(b, topo, 0, 5, order=[3, 0, 4, 2, 1])
    for na, nb in zip(a, b):
        assert torch.equal(na.x, nb.x) and na.w == nb.w


@pytest.mark.parametrize("algorithm,params", PUSH_SUM_CASES)
def test_state_dict_resume_is_bit_exact(algorithm, params):
    topo = random_irregular(4, seed=0)
    parts, _ = logreg_data(4, 32)
    _, a = make_nodes(algorithm, params, topo, parts=parts, num_iters=6)
    run(a, topo, 0, 3)
    states = [nd.state_dict() for nd in a]
    run(a, topo, 3, 6)
    _, b = make_nodes(algorithm, params, topo, parts=parts, num_iters=6)
    for nd, st in zip(b, states):
        nd.load_state_dict(st)
    run(b, topo, 3, 6)
    for na, nb in zip(a, b):
        assert torch.equal(na.x, nb.x) and na.w == nb.w
        assert repr(na.privacy_report()) == repr(nb.privacy_report())


def test_one_charge_per_noisy_step_none_in_mix():
    """One accountant charge per local_step, none for mix/setup."""
    topo = random_irregular(4, seed=0)
    parts, _ = logreg_data(4, 32)
    _, nodes = make_nodes("dyn_d2p", dict(lr=0.1, batch_size=8, variant="const", **DP), topo, parts=parts,
                          num_iters=5)
    run(nodes, topo, 0, 5)
    for nd in nodes:
        rep = nd.privacy_report()
        assert rep["steps_charged"] == 5
        assert 0 < rep["eps_rigorous"] <= DP["epsilon"] * 1.001


def test_unknown_keys_listed_in_config_error():
    with pytest.raises(ConfigError, match="unknown parameter 'sigma'.*valid keys are") as exc:
        registry.prepare("sgp", {"sigma": 1, "lrr": 2}, n_nodes=2, samples_per_node=[4, 4], num_iters=2, dim=3, seed=0)
    assert len(exc.value.problems) == 2
    with pytest.raises(ConfigError, match="unknown algorithm 'nope'"):
        registry.prepare("nope", {}, n_nodes=2, samples_per_node=[4, 4], num_iters=2, dim=3, seed=0)
    with pytest.raises(ConfigError, match="variant must be one of"):
        registry.prepare("dyn_d2p", {"variant": "x"}, n_nodes=2, samples_per_node=[4, 4], num_iters=2, dim=3, seed=0)


def test_non_finite_loss_names_node_and_k():
    topo = random_irregular(3, seed=0)
    parts, _ = logreg_data(3, 16)
    parts[1] = (parts[1][0] * float("nan"), parts[1][1])
    _, nodes = make_nodes("sgp", dict(lr=0.1, batch_size=16), topo, parts=parts, num_iters=2)
    with pytest.raises(NonFiniteError, match="node 1 at k=0") as exc:
        run(nodes, topo, 0, 1)
    assert exc.value.node == 1 and exc.value.step == 0


def test_budget_hard_stop_truncates_k():
    """Budget hard stop: a paper-calibrated plan whose rigorous eps exceeds the budget is truncated pre-flight."""
    params = dict(lr=0.1, batch_size=8, variant="const", calibration="paper", epsilon=1.0, delta=1e-4)
    full = registry.prepare("dyn_d2p", params, n_nodes=2, samples_per_node=[64, 64], num_iters=200, dim=12, seed=0)
    budget = full.eps_rigorous[0] * 0.5
    cut = registry.prepare("dyn_d2p", {**params, "budget_epsilon": budget}, n_nodes=2, samples_per_node=[64, 64],
                           num_iters=200, dim=12, seed=0)
    assert 0 < cut.num_iters < 200 and cut.num_iters_requested == 200
    assert cut.eps_rigorous[0] <= budget
    assert any("budget hard stop" in w for w in cut.warnings)


def test_n_equals_one_is_single_node_sgd():
    """n = 1 -> only the self-share, x_{k+1} = x_k - gamma g."""
    topo = from_matrix(np.ones((1, 1)))
    parts, _ = logreg_data(1, 32)
    _, nodes = make_nodes("sgp", dict(lr=0.5, batch_size=32), topo, parts=parts, num_iters=3)
    nd = nodes[0]
    x0 = nd.x.clone()
    shares = nd.local_step(0)
    assert len(shares) == 1 and shares[0].receiver == 0 and shares[0].wire_bits == 0
    idx = nd.sample_poisson(0, 32)
    g, _ = nd.grad_mean(x0, idx, 32, math.inf, 0)
    nd.mix(shares)
    torch.testing.assert_close(nd.x, x0 - 0.5 * g)
    assert isinstance(nd, PushSumNode)
