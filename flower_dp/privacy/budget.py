"""Privacy budgets: an object, and a hard stop (STYLE.md 2.6).

A :class:`BudgetTracker` is charged step by step.  Before a step is composed, a look-ahead
checks that the ledger *with* it stays within the budget; if not, it raises
:class:`flower_dp.errors.BudgetExceededError` naming the node, the step, the eps spent and
the limit, and nothing is charged (the caller must not draw the noise).

Speed: a full look-ahead runs the rigorous accountant (~0.05-2 s).  Every algorithm knows its
per-step costs before k = 0, so a run calls :meth:`BudgetTracker.reserve` once with its plan:
this pre-flight (bisection, :func:`max_steps`) certifies the longest prefix that fits, and
later charges that are *dominated* by the certified plan (same kind and sampling, same q,
noise multiplier >= the planned one) are accepted without calling the accountant: a
dominated history can only have a smaller eps.  Charges off the plan fall back to the full
look-ahead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .._checks import check_choice, check_delta, check_epsilon, check_int
from ..errors import BudgetExceededError, UnsupportedEventError
from .accountant import ACCOUNTANTS, ADJACENCIES, GaussianStep, LaplaceStep, NodeAccountant, rigorous_epsilon

__all__ = ["PrivacyBudget", "BudgetTracker", "max_steps", "UNITS", "charge_replay"]

UNITS = ("record", "client", "node_round")


@dataclass(frozen=True)
class PrivacyBudget:
    """(epsilon, delta) for a whole run, with the neighbouring relation and the privacy unit.

    Attributes
    ----------
    epsilon : float > 0
    delta : float in (0, 1)
    adjacency : {"add_remove", "replace_one"}
    unit : {"record", "client", "node_round"}
        ``record``: one training example of one node; ``client``: a whole client (Gau-LRQ);
        ``node_round``: one node's message in one round (DPPS, not comparable to the others).
    """

    epsilon: float
    delta: float
    adjacency: str = "add_remove"
    unit: str = "record"

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)
        check_choice("adjacency", self.adjacency, ADJACENCIES)
        check_choice("unit", self.unit, UNITS)


def _expand(steps: Sequence) -> list:
    """One entry per release (count 1), so prefixes and positions are per iteration."""
    out = []
    for s in steps:
        if not isinstance(s, (GaussianStep, LaplaceStep)):
            raise UnsupportedEventError(f"unsupported privacy step {s!r}; use GaussianStep or LaplaceStep")
        one = type(s)(**{**s.__dict__, "count": 1})
        out.extend([one] * s.count)
    return out


def _dominated(step, planned) -> bool:
    """True when ``step`` (count 1) is at most as private-costly as ``planned``."""
    if type(step) is not type(planned):
        return False
    if isinstance(step, GaussianStep):
        same = (step.q, step.sampling, step.dataset_size) == (planned.q, planned.sampling, planned.dataset_size)
        return same and step.nu >= planned.nu
    return step.nu >= planned.nu


def max_steps(
    steps,
    budget: PrivacyBudget,
    *,
    accountant: str = "auto",
    spent: Sequence = (),
    limit: int = 1_000_000,
) -> int:
    """Largest ``m`` such that ``spent`` plus the first ``m`` planned releases fit the budget (bisection).

    Parameters
    ----------
    steps : list of GaussianStep/LaplaceStep, or a single step
        The per-iteration plan (counts are expanded), or one step repeated: then the answer is
        the largest count of that step that fits (searched up to ``limit``).
    budget : PrivacyBudget
    spent : steps already charged (a ledger)
    """
    check_choice("accountant", accountant, ACCOUNTANTS)
    spent = list(spent)
    single = isinstance(steps, (GaussianStep, LaplaceStep))

    def prefix(m: int) -> list:
        if single:
            return [type(steps)(**{**steps.__dict__, "count": m})]
        return plan[:m]

    def fits(m: int) -> bool:
        return m == 0 or rigorous_epsilon(spent + prefix(m), budget.delta, accountant=accountant,
                                          adjacency=budget.adjacency) <= budget.epsilon

    if single:
        hi = 1
        while fits(hi):
            if hi >= limit:
                return limit
            hi = min(2 * hi, limit)
        lo = hi // 2
    else:
        plan = _expand(steps)
        lo, hi = 0, len(plan)
        if fits(hi):
            return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return check_int("max_steps", lo, minimum=0)


class BudgetTracker:
    """Charges one node's steps against its :class:`PrivacyBudget` (heterogeneous budgets: one tracker per node).

    Parameters
    ----------
    budget : PrivacyBudget
    accountant : {"pld", "rdp"}
    node : int or None  named in errors
    """

    def __init__(self, budget: PrivacyBudget, *, accountant: str = "auto", node: int | None = None) -> None:
        if not isinstance(budget, PrivacyBudget):
            raise TypeError(f"budget must be a PrivacyBudget, got {type(budget).__name__}")
        self.budget = budget
        self.node = node
        self.accountant = NodeAccountant(accountant, budget.adjacency)
        self._plan: list = []
        self._pos = 0

    @property
    def epsilon_spent(self) -> float:
        """Rigorous eps of everything charged so far, at the budget's delta."""
        return self.accountant.epsilon(self.budget.delta)

    def reserve(self, plan: Sequence) -> int:
        """Pre-flight: certify the longest prefix of ``plan`` that fits after what was spent; returns its length.

        Later charges dominated by the certified plan, in order, skip the accountant.
        """
        full = _expand(plan)
        m = max_steps(full, self.budget, accountant=self.accountant.accountant, spent=self.accountant.ledger)
        self._plan, self._pos = full[:m], 0
        return m

    def max_steps(self, step) -> int:
        """Largest count of ``step`` (or prefix of a plan) that still fits after what was spent."""
        return max_steps(step, self.budget, accountant=self.accountant.accountant, spent=self.accountant.ledger)

    def _covered(self, step) -> bool:
        ones = _expand([step])
        if self._pos + len(ones) > len(self._plan):
            return False
        return all(_dominated(s, self._plan[self._pos + i]) for i, s in enumerate(ones))

    def charge(self, step, *, step_index: int | None = None) -> None:
        """Charge ``step`` (GaussianStep/LaplaceStep) after the look-ahead; raises BudgetExceededError instead."""
        if self._covered(step):
            self._pos += step.count
            self.accountant.charge(step)
            return
        self._plan, self._pos = [], 0  # off the plan: the certificate no longer applies
        eps_after = self.accountant.epsilon(self.budget.delta, extra=[step])
        if eps_after > self.budget.epsilon:
            spent = self.epsilon_spent
            raise BudgetExceededError(
                f"node {self.node} step {step_index}: charging {step} would bring eps to {eps_after:.4g} "
                f"(spent so far {spent:.4g}), above the budget eps = {self.budget.epsilon} at "
                f"delta = {self.budget.delta}; stop the run here (its results so far stay valid) or raise the budget",
                node=self.node,
                step=step_index,
                epsilon_spent=spent,
                epsilon_limit=self.budget.epsilon,
            )
        self.accountant.charge(step)

    def charge_gaussian(self, *, q: float, nu: float, count: int = 1, step: int | None = None, **kw) -> None:
        """Charge ``count`` subsampled Gaussian releases (see :class:`GaussianStep`)."""
        self.charge(GaussianStep(q, nu, count, **kw), step_index=step)

    def charge_laplace(self, *, nu: float, count: int = 1, step: int | None = None) -> None:
        """Charge ``count`` Laplace releases (see :class:`LaplaceStep`)."""
        self.charge(LaplaceStep(nu, count), step_index=step)

    def state_dict(self) -> dict:
        """JSON-serialisable state (the budget and the ledger; the plan certificate is recomputed on resume)."""
        b = self.budget
        return {"type": "BudgetTracker", "node": self.node,
                "budget": {"epsilon": b.epsilon, "delta": b.delta, "adjacency": b.adjacency, "unit": b.unit},
                "accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`; refuses a state with another budget."""
        if not isinstance(state, dict) or state.get("type") != "BudgetTracker":
            raise ValueError(f"expected a BudgetTracker state dict, got {state.get('type') if isinstance(state, dict) else state!r}")
        if PrivacyBudget(**state["budget"]) != self.budget:
            raise ValueError(f"cannot load a state for budget {state['budget']} into a tracker with {self.budget}")
        self.accountant.load_state_dict(state["accountant"])
        self._plan, self._pos = [], 0


def charge_replay(state: dict, plan, node_id: int, k0: int, k1: int) -> dict:
    """A push-sum node state (``PushSumNode.state_dict()``) of ``plan`` (a ``flower_dp.clients.base.Plan``) restored at ``k0`` whose ledger also charges iterations ``[k0, k1)`` once more (secret mode).

    A run that stopped or lost a host mid-segment may already have sent some of the steps after its last
    checkpoint; restored in secret mode, the node draws fresh noise for them, so those steps go out twice with
    independent noise and must be charged twice.  Conservatively the whole segment ``[k0, k1)`` is charged
    again.  Reproducible mode resends identical messages: nothing to add.  Non-private and heuristic plans:
    unchanged.  Raises :class:`BudgetExceededError` when ``budget_epsilon`` can no longer cover the rest of the run.
    """
    if plan.reproducible or not plan.private or plan.heuristic or k1 <= k0:
        return state
    acc = NodeAccountant(plan.accountant, plan.adjacency)
    acc.load_state_dict(state["accountant"])
    for step in plan.steps(node_id, k0, k1):
        if step.nu > 0 and math.isfinite(step.nu):
            acc.charge(step)
    budget = getattr(plan.params, "budget_epsilon", None)
    if budget is not None:
        rest = [s for s in plan.steps(node_id, k0) if s.nu > 0 and math.isfinite(s.nu)]
        eps = acc.epsilon(plan.delta_of(node_id), extra=rest)
        if eps > float(budget):
            raise BudgetExceededError(
                f"node {node_id}: restoring at k={k0} in secret mode charges the possibly sent steps k={k0}..{k1 - 1} "
                f"again, and the rest of the run would then spend eps = {eps:.4g} > budget_epsilon = {budget}; the run "
                "stops here with its results so far (resume with [run] reproducible = true to resend identical "
                "messages, or raise the budget)", node=node_id, step=k0, epsilon_spent=eps, epsilon_limit=float(budget))
    return {**state, "accountant": acc.state_dict()}
