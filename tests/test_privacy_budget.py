"""Budgets as a hard stop: look-ahead before composing, plan certificates, per-node trackers."""

from __future__ import annotations

import json

import pytest

from flower_dp.errors import BudgetExceededError
from flower_dp.privacy import BudgetTracker, GaussianStep, LaplaceStep, PrivacyBudget, max_steps, rigorous_epsilon


def test_max_steps_single_step_matches_plan_and_is_tight():
    budget = PrivacyBudget(2.0, 1e-5)
    m = max_steps(GaussianStep(0.05, 1.0), budget, accountant="rdp")
    assert rigorous_epsilon([GaussianStep(0.05, 1.0, m)], 1e-5, accountant="rdp") <= 2.0
    assert rigorous_epsilon([GaussianStep(0.05, 1.0, m + 1)], 1e-5, accountant="rdp") > 2.0
    assert max_steps([GaussianStep(0.05, 1.0)] * (m + 10), budget, accountant="rdp") == m
    assert max_steps([GaussianStep(0.05, 1.0, m + 10)], budget, accountant="rdp") == m  # counts are expanded


def test_reserved_plan_charges_without_accountant_calls_and_stops_at_the_end(monkeypatch):
    """A falling-noise plan: the pre-flight certifies a prefix; charges on (or dominated by) it are free."""
    budget = PrivacyBudget(1.5, 1e-5)
    plan = [GaussianStep(0.05, nu, 20) for nu in (2.0, 1.8, 1.6, 1.4, 1.2, 1.0)]
    flat = [GaussianStep(0.05, s.nu) for s in plan for _ in range(s.count)]
    tracker = BudgetTracker(budget, accountant="rdp", node=7)
    m = tracker.reserve(plan)
    assert 20 < m < 120
    import flower_dp.privacy.budget as budget_mod

    calls = []
    orig = budget_mod.rigorous_epsilon
    monkeypatch.setattr(budget_mod.NodeAccountant, "epsilon",
                        lambda self, delta, extra=(): calls.append(1) or orig(self.ledger + list(extra), delta,
                                                                               accountant=self.accountant))
    for k in range(m):
        tracker.charge_gaussian(q=0.05, nu=flat[k].nu, step=k)
    assert not calls and tracker.accountant.steps_charged == m
    with pytest.raises(BudgetExceededError, match="node 7 step 999") as info:
        tracker.charge_gaussian(q=0.05, nu=flat[m].nu, step=999)
    assert calls  # off the certified plan: full look-ahead
    assert info.value.epsilon_limit == 1.5 and info.value.epsilon_spent <= 1.5
    assert tracker.accountant.steps_charged == m  # nothing charged on refusal
    # more noise than planned is dominated by the plan: free as well
    other = BudgetTracker(budget, accountant="rdp")
    other.reserve(plan)
    calls.clear()
    other.charge_gaussian(q=0.05, nu=3.0)
    assert not calls
    other.charge_gaussian(q=0.05, nu=1.5)  # less noise than planned (2.0): checked in full
    assert calls


def test_heterogeneous_budgets_one_tracker_per_node_and_laplace():
    trackers = {i: BudgetTracker(PrivacyBudget(eps, 1e-5), accountant="rdp", node=i) for i, eps in enumerate([1, 3])}
    counts = {}
    for i, t in trackers.items():
        n = 0
        try:
            while True:
                t.charge_gaussian(q=0.3, nu=2.0, step=n)
                n += 1
        except BudgetExceededError:
            counts[i] = n
    assert counts[0] < counts[1]
    lap = BudgetTracker(PrivacyBudget(5.0, 1e-5), accountant="pld")
    lap.charge_laplace(nu=1.0, count=4)
    with pytest.raises(BudgetExceededError):
        lap.charge_laplace(nu=1.0, count=2)  # pure DP: 6 > 5 even at delta > 0 for so few releases


def test_tracker_state_round_trip_json():
    t = BudgetTracker(PrivacyBudget(3.0, 1e-5), accountant="rdp", node=1)
    t.charge_gaussian(q=0.1, nu=2.0, count=5)
    t.charge(LaplaceStep(10.0))
    state = json.loads(json.dumps(t.state_dict()))
    u = BudgetTracker(PrivacyBudget(3.0, 1e-5), accountant="rdp", node=1)
    u.load_state_dict(state)
    assert u.epsilon_spent == t.epsilon_spent and u.accountant.ledger == t.accountant.ledger
    with pytest.raises(ValueError, match="cannot load a state for budget"):
        BudgetTracker(PrivacyBudget(2.0, 1e-5), accountant="rdp").load_state_dict(state)
    with pytest.raises(ValueError, match="accountant='rdp'.*accountant='pld'"):
        BudgetTracker(PrivacyBudget(3.0, 1e-5), accountant="pld").load_state_dict(state)
