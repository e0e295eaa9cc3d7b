"""Budgets as a hard stop: the pre-flight prefix search (max_steps) that the registry truncates K with."""

from __future__ import annotations

import pytest

from flower_dp.clients import registry
from flower_dp.privacy import GaussianStep, LaplaceStep, PrivacyBudget, max_steps, rigorous_epsilon


def test_max_steps_single_step_matches_plan_and_is_tight():
    budget = PrivacyBudget(2.0, 1e-5)
    m = max_steps(GaussianStep(0.05, 1.0), budget, accountant="rdp")
    assert rigorous_epsilon([GaussianStep(0.05, 1.0, m)], 1e-5, accountant="rdp") <= 2.0
    assert rigorous_epsilon([GaussianStep(0.05, 1.0, m + 1)], 1e-5, accountant="rdp") > 2.0
    assert max_steps([GaussianStep(0.05, 1.0)] * (m + 10), budget, accountant="rdp") == m
    assert max_steps([GaussianStep(0.05, 1.0, m + 10)], budget, accountant="rdp") == m  # counts are expanded


def test_max_steps_counts_iterations_that_charge_several_releases():
    """A list of steps is one iteration (PrivSGP-VR: sampled part + always-present part): the answer counts
    whole iterations, the largest prefix that fits, and a falling-noise Laplace plan is searched in order."""
    it = [GaussianStep(0.1, 4.0, 1, "fixed_size", 10), GaussianStep(1.0, 40.0)]
    budget = PrivacyBudget(2.0, 1e-5, "replace_one")
    m = max_steps([it] * 400, budget, accountant="rdp")
    flat = lambda n: [s for _ in range(n) for s in it]  # noqa: E731
    assert 0 < m < 400
    assert rigorous_epsilon(flat(m), 1e-5, accountant="rdp", adjacency="replace_one") <= 2.0
    assert rigorous_epsilon(flat(m + 1), 1e-5, accountant="rdp", adjacency="replace_one") > 2.0
    lap = [LaplaceStep(nu) for nu in (4.0, 2.0, 1.0, 0.5)]
    assert max_steps(lap, PrivacyBudget(0.8, 1e-5), accountant="pld") == 2  # 0.25 + 0.5 fits, + 1.0 does not


@pytest.mark.parametrize("algorithm, params", [
    ("privsgp_vr", {"noise_std": 1.5, "delta": 1e-4, "batch_size": 4, "G": 1.0, "budget_epsilon": 2.0,
                    "accountant": "rdp"}),  # two steps per iteration
    ("dp2_sgd", {"noise_std": 0.2, "delta": 1e-4, "batch_size": 8, "G": 1.0, "budget_epsilon": 2.0,
                 "accountant": "rdp"}),
])
def test_registry_budget_truncation_is_max_steps_over_the_plans_iterations(algorithm, params):
    """The registry truncates K with max_steps (one budget path); the kept K fits, one more iteration does not."""
    plan = registry.prepare(algorithm, params, n_nodes=2, samples_per_node=[64, 64], num_iters=60, dim=10, seed=0)
    full = registry.prepare(algorithm, {k: v for k, v in params.items() if k != "budget_epsilon"}, n_nodes=2,
                            samples_per_node=[64, 64], num_iters=60, dim=10, seed=0)
    K, budget = plan.num_iters, params["budget_epsilon"]
    assert 0 < K < full.num_iters and any("budget hard stop" in w for w in plan.warnings)
    eps = lambda m: rigorous_epsilon(full.steps(0, 0, m), full.delta_of(0), accountant=full.accountant,  # noqa: E731
                                     adjacency=full.adjacency)
    assert eps(K) <= budget < eps(K + 1)
    assert plan.eps_rigorous[0] == eps(K)
