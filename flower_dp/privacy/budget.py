"""Privacy budgets: an object, and a hard stop, enforced in one place.

Every algorithm knows each node's releases before k = 0 (its plan), so a budget is enforced up
front: :func:`max_steps` (bisection with the rigorous accountant) finds the longest prefix of the
planned iterations that fits, and the run is truncated to it (``flower_dp.clients.registry``,
``budget_epsilon``).  The nodes then charge exactly the planned steps, which fit by construction:
no per-step look-ahead is needed at run time.  The one charge off the plan, a secret-mode resume
charging possibly-sent steps twice, goes through :func:`charge_replay`, which raises
:class:`flower_dp.errors.BudgetExceededError` (naming the node, the step, the eps and the limit)
when the rest of the run no longer fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._checks import check_choice, check_delta, check_epsilon, check_int
from ..errors import BudgetExceededError, UnsupportedEventError
from .accountant import ACCOUNTANTS, ADJACENCIES, GaussianStep, LaplaceStep, NodeAccountant, rigorous_epsilon

__all__ = ["PrivacyBudget", "max_steps", "UNITS", "charge_replay", "REPLAY_MARGIN"]

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


def _iterations(steps: Sequence) -> list[list]:
    """One entry per iteration: a step of count c is c iterations of one release; a list or tuple of
    steps is one iteration releasing all of them (PrivSGP-VR: its sampled and its always-present part)."""
    out = []
    for s in steps:
        if isinstance(s, (list, tuple)):
            out.append(_expand(s))
        else:
            out.extend([one] for one in _expand([s]))
    return out


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
    steps : list of GaussianStep/LaplaceStep (or of lists of them), or a single step
        The per-iteration plan (counts are expanded; a list of steps is one iteration charging all
        of them, and the answer counts iterations), or one step repeated: then the answer is the
        largest count of that step that fits (searched up to ``limit``).
    budget : PrivacyBudget
    spent : steps already charged (a ledger)
    """
    check_choice("accountant", accountant, ACCOUNTANTS)
    spent = list(spent)
    single = isinstance(steps, (GaussianStep, LaplaceStep))

    def prefix(m: int) -> list:
        if single:
            return [type(steps)(**{**steps.__dict__, "count": m})]
        return [s for it in plan[:m] for s in it]

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
        plan = _iterations(steps)
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


def charge_replay(state: dict, plan, node_id: int, k0: int, k1: int) -> dict:
    """A push-sum node state (``PushSumNode.state_dict()``) of ``plan`` (a ``flower_dp.clients.plan.Plan``) restored at ``k0`` whose ledger also charges iterations ``[k0, k1)`` once more (secret mode).

    A run that stopped or lost a host mid-segment may already have sent some of the steps after its last
    checkpoint; restored in secret mode, the node draws fresh noise for them, so those steps go out twice with
    independent noise and must be charged twice.  Conservatively the whole segment ``[k0, k1)`` is charged
    again.  Reproducible mode resends identical messages: nothing to add.  Non-private and heuristic plans:
    unchanged.  In exact mode (``plan.noise_sampler == "exact"``) the node reports from its discrete Gaussian
    ledger, so the steps go there, each with the planned multiplier lowered by :data:`REPLAY_MARGIN` (the
    multiplier a release charges is the planned one up to float rounding; lower is the conservative side).
    Raises :class:`BudgetExceededError` when ``budget_epsilon`` can no longer cover the rest of the run.
    """
    if plan.reproducible or not plan.private or plan.heuristic or k1 <= k0:
        return state
    if getattr(plan, "noise_sampler", "float") == "exact":
        return _charge_exact_replay(state, plan, node_id, k0, k1)
    acc = NodeAccountant(plan.accountant, plan.adjacency)
    acc.load_state_dict(state["accountant"])
    for step in plan.charged_steps(node_id, k0, k1):  # what the node charged for them the first time
        acc.charge(step)
    budget = getattr(plan.params, "budget_epsilon", None)
    if budget is not None:
        rest = plan.charged_steps(node_id, k0)
        _check_replay_budget(acc.epsilon(plan.delta_of(node_id), extra=rest), budget, node_id, k0, k1)
    return {**state, "accountant": acc.state_dict()}


#: Relative margin by which a replayed exact step's multiplier is lowered below the plan's (float rounding of the
#: charged multiplier is ~1e-16 relative; 1e-12 covers it many times over and moves eps by ~1e-12 relative).
REPLAY_MARGIN = 1e-12


def _charge_exact_replay(state: dict, plan, node_id: int, k0: int, k1: int) -> dict:
    from .discrete_gaussian import exact_epsilon

    ledger: dict[tuple[float, float], int] = {(float(q), float(z)): int(c) for q, z, c in state.get("exact_ledger", [])}
    for q, z, c in plan.exact_steps(node_id, k0, k1):
        key = (float(q), float(z) * (1.0 - REPLAY_MARGIN))
        ledger[key] = ledger.get(key, 0) + int(c)
    budget = getattr(plan.params, "budget_epsilon", None)
    if budget is not None:
        history = [(q, z, c) for (q, z), c in ledger.items()] + list(plan.exact_steps(node_id, k0))
        _check_replay_budget(exact_epsilon(history, plan.delta_of(node_id)), budget, node_id, k0, k1)
    return {**state, "exact_ledger": [[q, z, c] for (q, z), c in ledger.items()]}


def _check_replay_budget(eps: float, budget: float, node_id: int, k0: int, k1: int) -> None:
    if eps > float(budget):
        raise BudgetExceededError(
            f"node {node_id}: restoring at k={k0} in secret mode charges the possibly sent steps k={k0}..{k1 - 1} "
            f"again, and the rest of the run would then spend eps = {eps:.4g} > budget_epsilon = {budget}; the run "
            "stops here with its results so far (resume with [run] reproducible = true to resend identical "
            "messages, or raise the budget)", node=node_id, step=k0, epsilon_spent=eps, epsilon_limit=float(budget))
