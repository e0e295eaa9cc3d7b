"""Each noise release is described once (issue 13): the plan gives the std a node draws and the steps it is
charged from its entry for (node, k); the node draws and charges in one call."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from flower_dp.clients import registry
from flower_dp.clients.base import NoiseRelease
from flower_dp.models import build_model
from flower_dp.privacy import LaplaceStep, NodeAccountant
from flower_dp.topology import make_topology

N, J = 4, 32


def _node(plan, topology="exp_one_peer", model="logreg"):
    g = torch.Generator().manual_seed(0)
    topo = registry.topology_for(plan, make_topology(topology, N))
    return registry.make_node(plan, node_id=1, topology=topo, model=build_model(model, num_classes=2, in_features=3),
                              loss_fn=torch.nn.functional.cross_entropy,
                              data_x=torch.randn(J, 3, generator=g), data_y=torch.randint(0, 2, (J,), generator=g))


def _prepare(algorithm, **params):
    return registry.prepare(algorithm, params, n_nodes=N, samples_per_node=[J] * N, num_iters=5, dim=8, seed=3,
                            reproducible=True)


@pytest.mark.parametrize("algorithm, params, per_iter", [
    ("dyn_d2p", {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4, "batch_size": 8, "accountant": "rdp"}, 1),
    ("privsgp_vr", {"noise_std": 0.3, "delta": 1e-4, "batch_size": 4, "G": 1.0, "accountant": "rdp"}, 2),
])
def test_release_gaussian_draws_the_plans_std_and_charges_the_plans_steps(algorithm, params, per_iter):
    plan = _prepare(algorithm, **params)
    node = _node(plan)
    for k in (0, 3):
        rel = plan.release(1, k)
        assert isinstance(rel, NoiseRelease) and rel.std == float(plan.noise_std[1][k]) > 0
        assert list(rel.steps) == plan.steps(1, k, k + 1) and len(rel.steps) == per_iter
        before = node.accountant.steps_charged
        noise, std = node.release_gaussian(k, 50)
        assert std == rel.std and torch.equal(noise, node.gaussian(k, rel.std, 50))  # the same private stream
        assert node.accountant.steps_charged == before + per_iter
    expected = NodeAccountant(plan.accountant, plan.adjacency)
    for k in (0, 3):
        for s in plan.steps(1, k, k + 1):
            expected.charge(s)
    assert node.accountant.ledger == expected.ledger
    if per_iter == 2:  # PrivSGP-VR: one draw, charged as its sampled and its always-present part
        sampled, always = plan.release(1, 0).steps
        assert sampled.sampling == "fixed_size_table" and always.q == 1.0 and math.isfinite(always.noise_multiplier)


def test_a_plan_without_noise_draws_and_charges_nothing():
    plan = _prepare("sgp", batch_size=8)
    assert plan.release(1, 0) == NoiseRelease(0.0, ())
    noise, std = _node(plan).release_gaussian(0, 7)
    assert std == 0.0 and torch.equal(noise, torch.zeros(7))


def test_laplace_release_draws_the_given_scale_and_charges_the_plans_laplace_step():
    """DPPS: the scale (estimated sensitivity / b) is known only at run time; the plan gives gamma_n / b."""
    plan = _prepare("partpsp", gamma_n=0.1, b=2.0, batch_size=8)
    node = _node(plan, model="partpsp_mlp")
    assert plan.release(1, 2) == NoiseRelease(0.0, (LaplaceStep(0.1 / 2.0),))
    n = node.release_laplace(2, 40, 0.7)
    assert n.shape == (40,) and node.accountant.ledger == [LaplaceStep(0.05)]
    assert torch.equal(n, node.release_laplace(2, 40, 0.7))  # the node's noise stream at k (charged again)
    with pytest.raises(ValueError, match="use release_laplace"):
        node.release_gaussian(2, 40)
    gauss = _node(_prepare("dyn_d2p", variant="dyn", epsilon=4.0, delta=1e-4, batch_size=8, accountant="rdp"))
    with pytest.raises(ValueError, match="use release_gaussian"):
        gauss.release_laplace(0, 4, 1.0)


def test_a_plan_whose_std_and_multiplier_disagree_is_refused():
    plan = _prepare("dyn_d2p", variant="dyn", epsilon=4.0, delta=1e-4, batch_size=8, accountant="rdp")
    std = list(plan.noise_std)
    std[2] = std[2].copy()
    std[2][4] = 0.0  # would be charged but never drawn
    with pytest.raises(ValueError, match="node 2 iteration 4: noise_std = 0.0 but noise_multiplier = .*drawn but not charged"):
        dataclasses.replace(plan, noise_std=tuple(std))
    nu = tuple(np.full(plan.num_iters, np.inf) for _ in plan.noise_multiplier)  # drawn but never charged
    with pytest.raises(ValueError, match="node 0 iteration 0"):
        dataclasses.replace(plan, noise_multiplier=nu)
    with pytest.raises(ValueError, match="private=False draws noise"):
        dataclasses.replace(plan, private=False)
    ablated = registry.ablate(plan)  # noise off: std 0 and nu inf together
    assert ablated.release(0, 0) == NoiseRelease(0.0, ())  # nothing drawn, nothing charged
