"""Flower's own privacy-accounting API as flower-dp's strategies report to it (public Flower API only).

Flower (>= 1.41) exports from ``flwr.serverapp`` a ``PrivacyAccountant`` protocol, ``PrivacyConfig``,
``PrivacySpent``, ``GaussianPrivacyEvent(noise_multiplier, sample_size, population_size)`` and ``RdpAccountant``,
and raises ``PrivacyBudgetExhausted`` from ``configure_train`` when the next release would exceed the budget; its
DP wrappers compose after aggregation and answer ``privacy_spent()``.  This module builds Flower's events of a
flower-dp release (:func:`gaussian_event`), refuses an accountant configuration that gives no valid bound for the
mechanism (:func:`check_accountant`), composes and reports (:func:`compose`, :func:`spent`), and raises
:class:`BudgetExhausted`, which is both flower-dp's and Flower's budget error.  Without Flower's API,
:data:`FLOWER_PRIVACY_API` is False and strategies report their own eps only.

Noise-multiplier convention (the one thing to get right)
-------------------------------------------------------
flower-dp's ``noise_multiplier`` z (GauLRQ's ``z_k``) and Flower's DP wrappers' ``noise_multiplier`` are the same
number: the released SUM of the clipped updates carries ``N(0, (z C)^2 I)`` (Flower adds ``z C / m`` to the
mean of m updates, i.e. ``z C`` on the sum; GauLRQ's per-client std is ``z S2 / sqrt(B)``, i.e. ``z S2``
on the sum).  Flower's ``GaussianPrivacyEvent.noise_multiplier``, however, is dp-accounting's: the noise
std divided by the L2 *sensitivity of the sum under the configured neighbouring relation*.  Under
add/remove one client the sum moves by C, so the event's multiplier is ``z``; under replace-one (GauLRQ's
relation: exactly B of N clients are sampled, so a neighbour replaces a client) the sum moves by 2C and
the event's multiplier is ``z / 2``.  Feeding ``z`` to a replace-one accountant understates eps (20 of 5,
z = 1.5, 4 rounds: 3.38 against flower-dp's proven 6.97).  :func:`event_noise_multiplier` does the conversion.

Which of Flower's configurations compute a valid bound for GauLRQ (B of N without replacement,
replace-one), all fed ``z / 2``:

====================  ====================  =====================================================
sampling_method       neighboring_relation  what Flower's RdpAccountant computes
====================  ====================  =====================================================
poisson               add-or-remove-one     PoissonSampled(B/N, Gaussian(z/2)): the attained pair of
                                            fixed-size sampling, composed; no proof for it
                                            (:mod:`flower_dp.privacy.replace_one`): refused
without-replacement   replace-one           SampledWithoutReplacement(N, B, Gaussian(z/2)) (Wang,
                                            Balle, Kasiviswanathan 2019): valid, the tightest accepted
                                            (paper MNIST setting: 290.5; flower-dp's PLD 51.2)
no-amplification      add-or-remove-one     Gaussian(z/2), sampling ignored: valid, loosest
====================  ====================  =====================================================

flower-dp's own rigorous eps (``eps_rigorous``) is the smaller of its proven PLD and RDP bounds of the same
mechanism (the same RDP bound as the accepted configurations, so never above them); both are reported.  Flower's accountant uses RDP only.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO

from flwr.common import log

from flower_dp._checks import check_choice
from flower_dp.errors import BudgetExceededError

try:  # Flower >= 1.41
    from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacySpent, SamplingMethod
    from flwr.serverapp.exception import PrivacyBudgetExhausted

    FLOWER_PRIVACY_API = True
except ImportError:  # an older Flower: no accounting API
    GaussianPrivacyEvent = NeighboringRelation = SamplingMethod = PrivacyBudgetExhausted = None  # type: ignore
    FLOWER_PRIVACY_API = False

    @dataclass(frozen=True)
    class PrivacySpent:  # type: ignore[no-redef]
        """Stand-in with the fields of Flower's ``PrivacySpent`` (Flower without the accounting API)."""

        epsilon: float
        delta: float
        num_releases: int
        accounting_method: str
        optimal_order: float | None = None


__all__ = ["FLOWER_PRIVACY_API", "BudgetExhausted", "PrivacySpent", "event_noise_multiplier", "gaussian_event",
           "check_accountant", "check_budget", "compose", "spent", "spent_over_nodes", "ADJACENCIES"]

ADJACENCIES = ("replace_one", "add_remove")

if FLOWER_PRIVACY_API:
    class BudgetExhausted(BudgetExceededError, PrivacyBudgetExhausted):  # type: ignore[misc,valid-type]
        """The next release would exceed the budget: flower-dp's ``BudgetExceededError`` and Flower's
        ``PrivacyBudgetExhausted`` at once (``except`` either)."""

        def __init__(self, message: str, **fields) -> None:
            BudgetExceededError.__init__(self, message, **fields)
else:
    class BudgetExhausted(BudgetExceededError):  # type: ignore[no-redef]
        """The next release would exceed the budget (Flower without ``PrivacyBudgetExhausted``)."""


def event_noise_multiplier(noise_multiplier: float, *, adjacency: str) -> float:
    """Flower's ``GaussianPrivacyEvent.noise_multiplier`` of a release whose sum carries ``N(0, (z C)^2 I)``, where
    z is flower-dp's ``noise_multiplier``.

    ``adjacency="replace_one"`` (the sum moves by 2C): ``z / 2``; ``"add_remove"`` (by C): ``z``.
    """
    check_choice("adjacency", adjacency, ADJACENCIES)
    return float(noise_multiplier) / 2.0 if adjacency == "replace_one" else float(noise_multiplier)


def gaussian_event(noise_multiplier: float, *, sample_size: int, population_size: int, adjacency: str = "replace_one"):
    """Flower's event for one release: ``sample_size`` of ``population_size`` clients, noise ``z C`` on the sum
    (z = ``noise_multiplier``)."""
    _require_api()
    return GaussianPrivacyEvent(noise_multiplier=event_noise_multiplier(noise_multiplier, adjacency=adjacency),
                                sample_size=int(sample_size), population_size=int(population_size))


def check_accountant(accountant, *, population_size: int, fixed_size: bool, adjacency: str = "replace_one") -> None:
    """Refuse a Flower accountant whose configuration would not give a valid bound for our mechanism.

    ``fixed_size``: exactly ``sample_size`` of ``population_size`` clients per release (GauLRQ).  See the
    module docstring's table for what each accepted configuration computes.
    """
    _require_api()
    check_choice("adjacency", adjacency, ADJACENCIES)
    cfg = accountant.config
    if cfg.population_size != population_size:
        raise ValueError(f"the Flower accountant's PrivacyConfig.population_size must equal the number of clients "
                         f"{population_size}, got {cfg.population_size}; build PrivacyConfig(population_size="
                         f"{population_size}, ...)")
    pair = (cfg.sampling_method, cfg.neighboring_relation)
    valid = {(SamplingMethod.NO_AMPLIFICATION, NeighboringRelation.ADD_OR_REMOVE_ONE)}
    if fixed_size and adjacency == "replace_one":
        valid |= {(SamplingMethod.WITHOUT_REPLACEMENT, NeighboringRelation.REPLACE_ONE)}
        best = "sampling_method=SamplingMethod.WITHOUT_REPLACEMENT, neighboring_relation=NeighboringRelation.REPLACE_ONE"
    else:
        if not fixed_size and adjacency == "add_remove":
            valid |= {(SamplingMethod.POISSON, NeighboringRelation.ADD_OR_REMOVE_ONE)}
        best = "sampling_method=SamplingMethod.POISSON, neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE"
    if pair not in valid:
        raise ValueError(f"the Flower accountant's (sampling_method, neighboring_relation) must be one of "
                         f"{sorted((s.value, r.value) for s, r in valid)} for this mechanism (the configurations "
                         f"whose bound is proven for it), got ({cfg.sampling_method.value}, "
                         f"{cfg.neighboring_relation.value}); use PrivacyConfig({best}, ...) (the tightest of them)")


def check_budget(accountant, event, *, where: str) -> None:
    """Raise :class:`BudgetExhausted` (Flower's ``PrivacyBudgetExhausted``) if ``event`` would exceed the
    accountant's ``max_epsilon``; nothing is composed.  No ``max_epsilon``: no check."""
    if accountant is None or accountant.config.max_epsilon is None:
        return
    if accountant.would_exceed(event):
        now = accountant.get_privacy_spent()
        raise BudgetExhausted(f"{where}: the next release would bring Flower's accountant ({now.accounting_method}) "
                              f"above max_epsilon = {accountant.config.max_epsilon} at delta = {now.delta}, got "
                              f"epsilon = {now.epsilon:.6g} after {now.num_releases} releases; raise max_epsilon or "
                              "the noise multiplier to train longer", epsilon_spent=now.epsilon,
                              epsilon_limit=accountant.config.max_epsilon)


def compose(accountant, event):
    """Compose one release into Flower's accountant and log Flower's "Privacy spent" line; its ``PrivacySpent``."""
    accountant.compose(event)
    now = accountant.get_privacy_spent()
    log(INFO, "Privacy spent: epsilon=%.6f at delta=%g after %d releases", now.epsilon, now.delta, now.num_releases)
    return now


def spent(epsilon: float, delta: float, num_releases: int, method: str) -> PrivacySpent:
    """A ``PrivacySpent`` (Flower's type where it exists) holding flower-dp's own accounting."""
    return PrivacySpent(epsilon=float(epsilon), delta=float(delta), num_releases=int(num_releases),
                        accounting_method=str(method))


def _require_api() -> None:
    if not FLOWER_PRIVACY_API:
        import flwr

        raise ValueError(f"Flower's privacy-accounting API (flwr.serverapp.PrivacyAccountant) needs flwr >= 1.41, "
                         f"got flwr {flwr.__version__}; upgrade flwr or drop accountant=")


def spent_over_nodes(per_node: list[dict], party: str = "out_neighbour",
                     states_to_server: bool = False) -> PrivacySpent | None:
    """A ``PrivacySpent`` of the largest eps over the nodes' privacy reports
    (:func:`flower_dp.privacy.reports.largest_node_spend`), for the push-sum ``party`` it names in
    ``accounting_method`` (:mod:`flower_dp.privacy.parties`: every push-sum party with an eps is charged the
    per-node eps; ``"relay"`` while the nodes' states come back to the server has none: ``ValueError``); None when
    no node is private or none reported."""
    from flower_dp.privacy.parties import check_push_sum_party, party_label
    from flower_dp.privacy.reports import largest_node_spend

    party = check_push_sum_party(party, states_to_server=states_to_server)
    found = largest_node_spend(per_node)
    if found is None:
        return None
    eps, delta, releases, how = found
    return spent(eps, delta, releases, f"{party_label('push_sum', party)}: {how}")
