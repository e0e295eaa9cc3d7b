"""Privacy budgets: an object, and a hard stop (STYLE.md 2.6).

A :class:`BudgetTracker` is charged step by step.  Before a step is composed, a
look-ahead computes the eps the ledger would have *with* it; if that exceeds the budget
it raises :class:`flower_dp.errors.BudgetExceededError` naming the node, the step, the
eps spent and the limit, and nothing is charged (the caller must not draw the noise).
Every algorithm's per-step cost is known before k = 0, so runs use :func:`max_steps` for a
pre-flight truncation and never reach the error in normal operation.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_choice, check_delta, check_epsilon, check_int
from ..errors import BudgetExceededError
from .accountant import ADJACENCIES, GaussianStep, LaplaceStep, NodeAccountant, rigorous_epsilon

__all__ = ["PrivacyBudget", "BudgetTracker", "max_steps", "UNITS"]

UNITS = ("record", "client", "node_round")


@dataclass(frozen=True)
class PrivacyBudget:
    """(epsilon, delta) for a whole run, with the neighbouring relation and the privacy unit.

    ``unit``: ``record`` (one training example of one node), ``client`` (a whole client, Gau-LRQ)
    or ``node_round`` (one node's message in one round, DPPS).
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


class BudgetTracker:
    """Charges one node's steps against its :class:`PrivacyBudget` (heterogeneous budgets: one tracker per node)."""

    def __init__(self, budget: PrivacyBudget, *, accountant: str = "pld", node: int | None = None) -> None:
        self.budget = budget
        self.node = node
        self.accountant = NodeAccountant(accountant, budget.adjacency)

    @property
    def epsilon_spent(self) -> float:
        return self.accountant.epsilon(self.budget.delta)

    def _charge(self, step, *, step_index: int | None) -> None:
        eps_after = self.accountant.epsilon(self.budget.delta, extra=[step])
        if eps_after > self.budget.epsilon:
            raise BudgetExceededError(
                f"node {self.node} step {step_index}: charging {step} would bring eps to {eps_after:.4g} "
                f"(spent so far {self.epsilon_spent:.4g}), above the budget eps = {self.budget.epsilon} at "
                f"delta = {self.budget.delta}; stop the run here (its results so far stay valid) or raise the budget",
                node=self.node,
                step=step_index,
                epsilon_spent=self.epsilon_spent,
                epsilon_limit=self.budget.epsilon,
            )
        if isinstance(step, GaussianStep):
            self.accountant.charge_gaussian(q=step.q, nu=step.nu, count=step.count)
        else:
            self.accountant.charge_laplace(nu=step.nu, count=step.count)

    def charge_gaussian(self, *, q: float, nu: float, count: int = 1, step: int | None = None) -> None:
        self._charge(GaussianStep(q, nu, count), step_index=step)

    def charge_laplace(self, *, nu: float, count: int = 1, step: int | None = None) -> None:
        self._charge(LaplaceStep(nu, count), step_index=step)


def max_steps(
    steps: list,
    budget: PrivacyBudget,
    *,
    accountant: str = "pld",
) -> int:
    """Largest ``m`` such that the first ``m`` steps of a planned history fit the budget (bisection).

    ``steps`` is the per-iteration plan (one ``GaussianStep``/``LaplaceStep`` per iteration).
    """
    def fits(m: int) -> bool:
        return m == 0 or rigorous_epsilon(steps[:m], budget.delta, accountant=accountant,
                                          adjacency=budget.adjacency) <= budget.epsilon

    lo, hi = 0, len(steps)
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return check_int("max_steps", lo, minimum=0)
