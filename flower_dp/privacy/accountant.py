"""Rigorous (eps, delta) of a node's whole privacy history with ``dp-accounting`` (PLD and RDP), and the node ledger.

:func:`rigorous_epsilon` (and :func:`epsilon_and_bound`, :func:`rigorous_delta`) compose a history of
:class:`~flower_dp.privacy.steps.GaussianStep` / :class:`~flower_dp.privacy.steps.LaplaceStep` under a neighbouring
relation (``adjacency``: ``"add_remove"`` or ``"replace_one"``) and report the smallest of the valid upper bounds
computed (:data:`BOUNDS` names each); :class:`NodeAccountant` is the ledger a node charges at the line that draws its
noise.  Which bound each (sampling, adjacency) gets, why the fast composition of many noise levels
(:mod:`.fast_compose`) is the same bound as dp-accounting's, and the measured differences are in
``docs/accountant.md``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable


from .._checks import check_choice, check_delta, check_epsilon
from ..errors import UnsupportedEventError
from . import fast_compose, replace_one
from .steps import (DEFAULT_BUCKET_REL, MAX_BUCKETS, SAMPLING_ALIASES, SAMPLINGS, TABLE_SAMPLING,
                    GaussianStep, LaplaceStep, Step, bucket_steps)
from .table_bound import has_table_steps, table_epsilon, table_history_delta, table_history_epsilon

__all__ = [
    "GaussianStep",
    "LaplaceStep",
    "ACCOUNTANTS",
    "ADJACENCIES",
    "SAMPLINGS",
    "TABLE_SAMPLING",
    "table_epsilon",
    "DEFAULT_ACCOUNTANT",
    "BOUNDS",
    "epsilon_and_bound",
    "rigorous_epsilon",
    "rigorous_delta",
    "bucket_steps",
    "NodeAccountant",
]

ACCOUNTANTS = ("auto", "pld", "rdp")
ADJACENCIES = ("add_remove", "replace_one")
DEFAULT_ACCOUNTANT = "auto"
#: PLD discretization (dp-accounting's default is 1e-4; 1e-3 is ~8x faster and still pessimistic:
#: 1.8289 vs 1.8282 for noise_multiplier=1, q=0.01, 1000 steps, delta=1e-5).  Histories with more than
#: ``FINE_LEVELS`` distinct levels use ``PLD_DISCRETIZATION_MANY`` (~2x faster, ~0.2% higher eps).
PLD_DISCRETIZATION = 1e-3
PLD_DISCRETIZATION_MANY = 2e-3
FINE_LEVELS = 16
#: histories of at least this many Poisson-subsampled Gaussian levels (add/remove) are composed by
#: :mod:`.fast_compose` (module doc); a single level goes through dp-accounting
FAST_MIN_LEVELS = 2
#: relative round-up of the fast path's eps, so that it is never below dp-accounting's level-by-level
#: composition of the same history (they differ by float round-off only: module doc)
FAST_ROUND_UP = 1e-5
#: ``accountant="auto"`` skips the PLD for histories with a Gaussian step below this multiplier (its
#: privacy-loss grid grows like 1/nu^2; at such noise eps is in the hundreds and RDP is as good)
PLD_MIN_NU = 0.02
#: Laplace steps with a per-release eps 1/nu above this are composed by basic (pure-DP) composition:
#: their PLD is numerically degenerate and the advanced bounds cannot beat the sum there.
LAPLACE_BASIC_ABOVE = 20.0


def _dpa():
    """dp-accounting, imported on first use: it pulls in scipy.stats / scipy.signal (~2 s of a cold start), and a
    Flower ClientApp process that only trains never accounts (its node reports eps at flush)."""
    import dp_accounting

    return dp_accounting


class _QuietFractionalOrders(logging.Filter):
    """dp-accounting's RDP logs a warning whenever a fractional order's series does not converge; it then
    excludes that order, and the bound from the remaining orders stays valid.  At small noise (where
    ``accountant="auto"`` takes the PLD anyway) it logs dozens per call: drop exactly that message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_QuietFractionalOrders())


def _subsampled_replace_one(merged: tuple[Step, ...], adjacency: str) -> bool:
    """Replace-one with a subsampled Gaussian step: the PLD is the symmetrised pair's (:mod:`.replace_one`)."""
    return adjacency == "replace_one" and any(isinstance(s, GaussianStep) and s.q < 1 for s in merged)


def _plan_events(merged: tuple[Step, ...], accountant: str, adjacency: str, native_swor: bool = False):
    """(relation, [(event, count)]) of dp-accounting events for a merged history (module doc: the table).

    ``native_swor``: RDP of sampling without replacement, dp-accounting's SampledWithoutReplacement under
    REPLACE_ONE (valid only without Poisson-subsampled steps).  Replace-one histories with a subsampled
    step are charged, in RDP, each Gaussian step unsampled (``nu / 2``; valid by joint quasi-convexity); their
    PLD is not built from events (:func:`_compose`).
    """
    dpa = _dpa()
    _R = dpa.NeighboringRelation
    fixed = any(isinstance(s, GaussianStep) and s.sampling == "fixed_size" for s in merged)
    has_laplace = any(isinstance(s, LaplaceStep) for s in merged)
    if fixed and adjacency != "replace_one":
        raise UnsupportedEventError(
            f"sampling='fixed_size' (a fixed-size batch, B of N, or one of fixed blocks) is accounted under "
            f"adjacency='replace_one' only, got adjacency={adjacency!r}; set adjacency='replace_one' (removing a "
            "record would change the batch size) or sample Poisson in the code"
        )
    unsampled = False
    if native_swor:
        relation, half = _R.REPLACE_ONE, 2.0
    elif _subsampled_replace_one(merged, adjacency):
        relation, half, unsampled = _R.ADD_OR_REMOVE_ONE, 2.0, True
    else:
        native_replace = adjacency == "replace_one" and accountant == "pld" and not has_laplace
        relation = _R.REPLACE_ONE if native_replace else _R.ADD_OR_REMOVE_ONE
        half = 2.0 if adjacency == "replace_one" and not native_replace else 1.0
    events = []
    for s in merged:
        if math.isinf(s.noise_multiplier):
            continue
        if isinstance(s, LaplaceStep):
            ev: dpa.DpEvent = dpa.LaplaceDpEvent(s.noise_multiplier / half)
        else:
            ev = dpa.GaussianDpEvent(s.noise_multiplier / half)
            if s.q < 1 and native_swor:
                ev = dpa.SampledWithoutReplacementDpEvent(int(s.dataset_size), int(round(s.q * s.dataset_size)), ev)
            elif s.q < 1 and not unsampled:
                ev = dpa.PoissonSampledDpEvent(s.q, ev)
        events.append((ev, s.count))
    return relation, events


def _native_swor_applies(merged: tuple[Step, ...]) -> bool:
    """RDP's SampledWithoutReplacement bound applies: fixed-size steps and no Poisson-subsampled ones."""
    gs = [s for s in merged if isinstance(s, GaussianStep) and s.q < 1]
    return bool(gs) and all(s.sampling == "fixed_size" for s in gs)


def _fast_levels(relation, events) -> tuple[list[float], list[float], list[int]] | None:
    """(q, nu, count) per level when :mod:`.fast_compose` computes this history: at least ``FAST_MIN_LEVELS``
    levels, every one a PoissonSampled(0 < q < 1, Gaussian(nu > 0)) event under add/remove; else None."""
    dpa = _dpa()
    if relation != dpa.NeighboringRelation.ADD_OR_REMOVE_ONE or len(events) < FAST_MIN_LEVELS:
        return None
    qs, nus, counts = [], [], []
    for ev, count in events:
        if not (isinstance(ev, dpa.PoissonSampledDpEvent) and isinstance(ev.event, dpa.GaussianDpEvent)
                and 0 < ev.sampling_probability < 1 and ev.event.noise_multiplier > 0):
            return None
        qs.append(float(ev.sampling_probability))
        nus.append(float(ev.event.noise_multiplier))
        counts.append(int(count))
    return qs, nus, counts


class _RoundedUp:
    """A fast-path result whose eps is rounded up by ``FAST_ROUND_UP`` (module doc); delta to match."""

    def __init__(self, acc) -> None:
        self.acc = acc

    def get_epsilon(self, delta: float) -> float:
        return float(self.acc.get_epsilon(delta)) * (1.0 + FAST_ROUND_UP)

    def get_delta(self, epsilon: float) -> float:
        return float(self.acc.get_delta(epsilon / (1.0 + FAST_ROUND_UP)))


@functools.lru_cache(maxsize=64)
def _compose(merged: tuple[Step, ...], accountant: str, adjacency: str, discretization: float,
             native_swor: bool = False):
    if accountant == "pld" and _subsampled_replace_one(merged, adjacency):  # the symmetrised pair (module doc)
        steps = [("laplace", 1.0, s.noise_multiplier, s.count) if isinstance(s, LaplaceStep) else ("gaussian", s.q, s.noise_multiplier, s.count)
                 for s in merged if not math.isinf(s.noise_multiplier) and s.count]
        return _RoundedUp(replace_one.compose_symmetrised(steps, discretization)), bool(steps)
    relation, events = _plan_events(merged, accountant, adjacency, native_swor)
    fast = _fast_levels(relation, events)
    if fast is not None:  # the same bounds as dp-accounting's accountants, all levels at once (module doc)
        if accountant == "pld":
            return _RoundedUp(fast_compose.compose_pld(*fast, discretization)), True
        return _RoundedUp(fast_compose.FastRDP(*fast)), True
    dpa = _dpa()
    if accountant == "pld":
        acc = dpa.pld.PLDAccountant(relation, value_discretization_interval=discretization)
    else:
        acc = dpa.rdp.RdpAccountant(neighboring_relation=relation)
    for ev, count in events:
        composed = dpa.SelfComposedDpEvent(ev, count)
        if not acc.supports(composed):  # dry run before any state changes (dp_accounting's _maybe_compose)
            raise UnsupportedEventError(
                f"the {accountant} accountant with adjacency {adjacency!r} cannot account for {ev}; "
                "use the other accountant or adjacency"
            )
        acc.compose(ev, count)
    return acc, bool(events)


def _prepare(steps, accountant, adjacency, bucket_rel, max_buckets) -> tuple[Step, ...]:
    check_choice("accountant", accountant, ACCOUNTANTS)
    check_choice("adjacency", adjacency, ADJACENCIES)
    return tuple(s for s in bucket_steps(steps, bucket_rel, max_buckets=max_buckets) if not math.isinf(s.noise_multiplier))


def _split_pure(merged: tuple[Step, ...], adjacency: str) -> tuple[tuple[Step, ...], float]:
    """Take out Laplace steps with huge per-release eps; return (rest, their basic-composition eps)."""
    factor = 2.0 if adjacency == "replace_one" else 1.0
    pure = [s for s in merged if isinstance(s, LaplaceStep) and factor / s.noise_multiplier > LAPLACE_BASIC_ABOVE]
    rest = tuple(s for s in merged if s not in pure)
    return rest, float(sum(s.count * factor / s.noise_multiplier for s in pure))


#: the bounds :func:`epsilon_and_bound` names, and what each one is
BOUNDS = {
    "pld": "PLD of the Poisson-subsampled Gaussian (dp-accounting, pessimistic connect-the-dots)",
    "rdp": "RDP of the Poisson-subsampled Gaussian (dp-accounting; Mironov, Talwar & Zhang 2019)",
    "pld_symmetrised_pair": "PLD of the symmetrised dominating pair, replace-one (Zhu, Dong & Wang 2022; "
                            "Dong, Roth & Su 2022)",
    "rdp_without_replacement": "RDP of sampling without replacement, replace-one (Wang, Balle & Kasiviswanathan "
                               "2019)",
    "rdp_unsampled": "RDP of the unsampled Gaussian, replace-one (joint quasi-convexity; loose)",
    "gdp_table_draws": "GDP conditioned on the hidden block draws, mixed over their binomial law (PrivSGP-VR's "
                       "table; joint convexity, Dong, Roth & Su 2022)",
    "gdp_sample_known": "GDP conditioned on a known, data-independent sample, mixed over the binomial law of the "
                        "target's rounds (a network observer of Gau-LRQ, no amplification; joint convexity)",
    "pure_dp": "basic composition of pure-DP Laplace releases",
    "none": "no release charged",
}


def _variants(merged: tuple[Step, ...], accountant: str, adjacency: str) -> list[tuple[str, bool]]:
    """The (accountant, native_swor) computations whose minimum is reported (each a valid upper bound)."""
    kinds = ("pld", "rdp") if accountant == "auto" else (accountant,)
    if accountant == "auto" and min((s.noise_multiplier for s in merged if isinstance(s, GaussianStep)), default=1.0) < PLD_MIN_NU:
        kinds = ("rdp",)  # the PLD grid of a nearly noiseless step would not fit in memory; eps is huge anyway
    native = "rdp" in kinds and adjacency == "replace_one" and _native_swor_applies(merged)
    out = [(k, False) for k in kinds if not (k == "rdp" and native)]
    if native:  # proven for this sampler, and never looser than the unsampled Gaussian
        out.append(("rdp", True))
    return out


def _bound_name(merged: tuple[Step, ...], accountant: str, adjacency: str, native: bool) -> str:
    if accountant == "pld":
        return "pld_symmetrised_pair" if _subsampled_replace_one(merged, adjacency) else "pld"
    if native:
        return "rdp_without_replacement"
    return "rdp_unsampled" if _subsampled_replace_one(merged, adjacency) else "rdp"


def _bound(merged, accountant, adjacency, discretization, native, query) -> float:
    try:
        acc, nonempty = _compose(merged, accountant, adjacency, float(discretization), native)
    except UnsupportedEventError:
        if native:  # the alternative bound does not cover this history; the pair bound does
            return math.inf
        raise
    return query(acc) if nonempty else 0.0


def epsilon_and_bound(
    steps: Iterable[Step],
    delta: float,
    *,
    accountant: str = DEFAULT_ACCOUNTANT,
    adjacency: str = "add_remove",
    bucket_rel: float | str = DEFAULT_BUCKET_REL,
    max_buckets: int = MAX_BUCKETS,
    discretization: float | None = None,
) -> tuple[float, str]:
    """:func:`rigorous_epsilon` and the name of the bound that gave it (a key of :data:`BOUNDS`)."""
    delta = check_delta(delta)
    merged, eps_pure = _split_pure(_prepare(steps, accountant, adjacency, bucket_rel, max_buckets), adjacency)
    if not merged:
        return eps_pure, "pure_dp" if eps_pure > 0 else "none"
    if has_table_steps(merged):
        return table_history_epsilon(merged, adjacency, delta) + eps_pure, "gdp_table_draws"
    if discretization is None:
        discretization = PLD_DISCRETIZATION if len(merged) <= FINE_LEVELS else PLD_DISCRETIZATION_MANY

    def query(acc) -> float:
        return float(acc.get_epsilon(delta))

    eps, name = min((_bound(merged, a, adjacency, discretization, native, query), _bound_name(merged, a, adjacency, native))
                    for a, native in _variants(merged, accountant, adjacency))
    eps += eps_pure
    return (eps if math.isfinite(eps) else float("inf")), name


def rigorous_epsilon(
    steps: Iterable[Step],
    delta: float,
    *,
    accountant: str = DEFAULT_ACCOUNTANT,
    adjacency: str = "add_remove",
    bucket_rel: float | str = DEFAULT_BUCKET_REL,
    max_buckets: int = MAX_BUCKETS,
    discretization: float | None = None,
) -> float:
    """The (eps, delta)-DP epsilon of a whole history: the smallest of the valid upper bounds computed.

    Parameters
    ----------
    steps : iterable of GaussianStep / LaplaceStep
        The history (order does not change the result).
    delta : float in (0, 1)
    accountant : {"auto", "pld", "rdp"}
        ``"pld"``: PLD (pessimistic discretization ``discretization``); ``"rdp"``: RDP (dp-accounting's
        default orders); ``"auto"`` (default): the smaller of the two.
    adjacency : {"add_remove", "replace_one"}
        See the module docstring for the bounds each sampling gets under each relation.
    bucket_rel : float or "auto"
        Relative grid step for rounding noise levels down before merging (0: exact).
    max_buckets : int
        For ``bucket_rel="auto"``: at most this many distinct levels (PLD: ~20-50 ms each).
    discretization : float or None
        PLD value discretization; None: ``PLD_DISCRETIZATION``, or ``PLD_DISCRETIZATION_MANY``
        for histories with more than ``FINE_LEVELS`` distinct levels.

    Returns
    -------
    float
        eps (0.0 for an empty history; ``inf`` when no finite eps exists).
    """
    return epsilon_and_bound(steps, delta, accountant=accountant, adjacency=adjacency, bucket_rel=bucket_rel,
                             max_buckets=max_buckets, discretization=discretization)[0]


def rigorous_delta(
    steps: Iterable[Step],
    epsilon: float,
    *,
    accountant: str = DEFAULT_ACCOUNTANT,
    adjacency: str = "add_remove",
    bucket_rel: float | str = DEFAULT_BUCKET_REL,
    max_buckets: int = MAX_BUCKETS,
) -> float:
    """The delta of a whole history at ``epsilon`` (same accountants and conventions as :func:`rigorous_epsilon`)."""
    epsilon = check_epsilon(epsilon, "epsilon")
    merged, eps_pure = _split_pure(_prepare(steps, accountant, adjacency, bucket_rel, max_buckets), adjacency)
    if eps_pure >= epsilon:
        return 1.0
    epsilon -= eps_pure
    if not merged:
        return 0.0
    if has_table_steps(merged):
        return table_history_delta(merged, adjacency, epsilon)

    def query(acc) -> float:
        return float(acc.get_delta(epsilon))

    return min(_bound(merged, a, adjacency, PLD_DISCRETIZATION, native, query)
               for a, native in _variants(merged, accountant, adjacency))


def _multiplier(entry: dict) -> float:
    """A ledger entry's noise multiplier (stored as ``"nu"`` by earlier checkpoints)."""
    return entry["noise_multiplier"] if "noise_multiplier" in entry else entry["nu"]


class NodeAccountant:
    """One node's privacy ledger, charged at the line that draws noise.

    The ledger is run-length encoded (equal consecutive steps merged, like dp_accounting's
    ``DpEventBuilder``); :meth:`epsilon` runs the rigorous accountant on it (memoised).
    """

    def __init__(self, accountant: str = DEFAULT_ACCOUNTANT, adjacency: str = "add_remove") -> None:
        self.accountant = check_choice("accountant", accountant, ACCOUNTANTS)
        self.adjacency = check_choice("adjacency", adjacency, ADJACENCIES)
        self._ledger: list[Step] = []

    @property
    def ledger(self) -> list[Step]:
        """A copy of the charged steps (run-length encoded)."""
        return list(self._ledger)

    @property
    def steps_charged(self) -> int:
        """Total number of releases charged."""
        return sum(s.count for s in self._ledger)

    def charge(self, step: Step) -> "NodeAccountant":
        """Record a step; returns ``self`` so calls chain."""
        if not isinstance(step, (GaussianStep, LaplaceStep)):
            raise UnsupportedEventError(f"unsupported privacy step {step!r}; use GaussianStep or LaplaceStep")
        # equal steps are merged wherever they are (composition does not depend on order): a PrivSGP-VR
        # node charges two alternating steps per iteration, and its ledger stays two entries long
        for j in range(len(self._ledger) - 1, max(-1, len(self._ledger) - 9), -1):
            last = self._ledger[j]
            if type(last) is type(step) and {**last.__dict__, "count": 0} == {**step.__dict__, "count": 0}:
                self._ledger[j] = type(step)(**{**last.__dict__, "count": last.count + step.count})
                return self
        self._ledger.append(step)
        return self

    def charge_gaussian(self, *, q: float, noise_multiplier: float, count: int = 1, sampling: str = "poisson",
                        dataset_size: int | None = None) -> "NodeAccountant":
        """Record ``count`` subsampled Gaussian releases (see :class:`GaussianStep`)."""
        return self.charge(GaussianStep(q, noise_multiplier, count, sampling, dataset_size))

    def charge_laplace(self, *, noise_multiplier: float, count: int = 1) -> "NodeAccountant":
        """Record ``count`` Laplace releases (see :class:`LaplaceStep`)."""
        return self.charge(LaplaceStep(noise_multiplier, count))

    def epsilon(self, delta: float, extra: Iterable[Step] = ()) -> float:
        """eps of the ledger (plus ``extra`` hypothetical steps, for look-ahead) at ``delta``."""
        return rigorous_epsilon(self._ledger + list(extra), delta, accountant=self.accountant, adjacency=self.adjacency)

    def state_dict(self) -> dict:
        """JSON-serialisable state."""
        return {
            "type": "NodeAccountant",
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "ledger": [
                {"kind": "gaussian", "q": s.q, "noise_multiplier": s.noise_multiplier, "count": s.count, "sampling": s.sampling,
                 "dataset_size": s.dataset_size}
                if isinstance(s, GaussianStep)
                else {"kind": "laplace", "noise_multiplier": s.noise_multiplier, "count": s.count}
                for s in self._ledger
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state from :meth:`state_dict`; refuses one from another accountant or relation."""
        if not isinstance(state, dict) or state.get("type") != "NodeAccountant":
            got = state.get("type") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"expected a NodeAccountant state dict, got type {got!r}")
        for key in ("accountant", "adjacency"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot load a state with {key}={state[key]!r} into an accountant with {key}={getattr(self, key)!r}; "
                    "build the accountant with the same settings"
                )
        ledger: list[Step] = []
        for e in state["ledger"]:
            if e["kind"] == "gaussian":
                ledger.append(GaussianStep(e["q"], _multiplier(e), e["count"], e.get("sampling", "poisson"),
                                           e.get("dataset_size")))
            else:
                ledger.append(LaplaceStep(_multiplier(e), e["count"]))
        self._ledger = ledger
