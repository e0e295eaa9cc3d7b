"""GauLRQ reports to Flower's own privacy-accounting API (flwr.serverapp, Flower >= 1.41), in-process (no Ray).

Flower's ``GaussianPrivacyEvent.noise_multiplier`` is the noise std over the sum's sensitivity under the
configured neighbouring relation; GauLRQ's z is the std over S2, and replace-one moves the sum by 2 S2, so the
event carries z / 2 (strategies/flower_privacy.py).  Checked here: the numbers Flower's accountant then gives
(equal to flower-dp's RDP bound of the same mechanism, never below flower-dp's rigorous eps), that feeding z
instead would understate eps, ``privacy_spent()``, and Flower's ``PrivacyBudgetExhausted``.
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr.app import ArrayRecord, Array, ConfigRecord

from flower_dp.errors import BudgetExceededError
from flower_dp.privacy.accountant import rigorous_epsilon
from flower_dp.privacy.gau_lrq import client_level_epsilon, client_level_steps
from flower_dp.strategies import flower_privacy as fpv

pytestmark = pytest.mark.skipif(not fpv.FLOWER_PRIVACY_API, reason="this Flower has no privacy-accounting API")

if fpv.FLOWER_PRIVACY_API:
    from flwr.serverapp import (GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, RdpAccountant,
                                SamplingMethod)
    from flwr.serverapp.exception import PrivacyBudgetExhausted

from test_gau_lrq_dropin import N, SECRET, Z, _gau, _start  # noqa: E402  (same user-style app, in-process)

B, DELTA = 3, 1e-5


def _accountant(sampling="without-replacement", max_epsilon=None, population=N):
    rel = (NeighboringRelation.REPLACE_ONE if sampling == "without-replacement" else
           NeighboringRelation.ADD_OR_REMOVE_ONE)
    return RdpAccountant(PrivacyConfig(target_delta=DELTA, population_size=population, neighboring_relation=rel,
                                       sampling_method=SamplingMethod(sampling), max_epsilon=max_epsilon))


def test_event_carries_half_the_noise_multiplier_and_z_would_understate():
    """20 clients, 5 per round, z = 1.5, 4 rounds: flower-dp's rigorous eps 6.97 (PLD of the symmetrised pair);
    Flower's accountant fed z / 2 gives 7.96 (POISSON) or 9.34 (WITHOUT_REPLACEMENT = flower-dp's RDP bound for
    sampling without replacement); fed z it would say 2.48 / 3.38, below the true eps."""
    ours = client_level_epsilon(np.full(4, 1.5), DELTA, B=5, N=20)
    ours_rdp = rigorous_epsilon(client_level_steps(np.full(4, 1.5), B=5, N=20), DELTA, accountant="rdp",
                                adjacency="replace_one")
    assert fpv.event_noise_multiplier(1.5, adjacency="replace_one") == 0.75
    assert fpv.event_noise_multiplier(1.5, adjacency="add_remove") == 1.5
    got = {}
    for sampling in ("poisson", "without-replacement", "no-amplification"):
        for mult in (0.75, 1.5):
            acc = _accountant(sampling, population=20)
            acc.compose(GaussianPrivacyEvent(noise_multiplier=mult, sample_size=5, population_size=20), 4)
            got[sampling, mult] = acc.get_privacy_spent().epsilon
    assert ours == pytest.approx(6.972, abs=2e-3)
    assert got["poisson", 0.75] >= ours
    assert got["without-replacement", 0.75] == pytest.approx(9.344, abs=2e-3)
    assert got["without-replacement", 0.75] == pytest.approx(ours_rdp, rel=1e-6)
    assert got["no-amplification", 0.75] > got["without-replacement", 0.75] > got["poisson", 0.75]
    assert got["poisson", 1.5] < ours and got["without-replacement", 1.5] < ours  # z itself: understated


@pytest.mark.parametrize("sampling", ["without-replacement", "no-amplification"])
def test_gau_lrq_composes_into_flowers_accountant_and_privacy_spent_answers(sampling):
    acc = _accountant(sampling)
    s = _gau(clients_per_round=B, accountant=acc)
    assert s.epsilon == 1e3 and s.delta == DELTA  # epsilon given; delta from the accountant's target_delta
    result = _start(s, num_rounds=2)
    spent = s.privacy_spent()  # GauLRQ's own eps (what it calibrates to and stops on), Flower's named beside it
    assert spent.num_releases == 2 and spent.delta == DELTA
    assert spent.epsilon == pytest.approx(client_level_epsilon(np.full(2, Z), DELTA, B=B, N=N), rel=1e-9)
    ref = _accountant(sampling)
    ref.compose(GaussianPrivacyEvent(noise_multiplier=Z / 2, sample_size=B, population_size=N), 2)
    flower = ref.get_privacy_spent().epsilon
    assert f"eps_flower = {flower:.6g}" in spent.accounting_method and flower >= spent.epsilon
    for r in (1, 2):
        m = result.evaluate_metrics_serverapp[r]
        assert m["eps_rigorous"] == pytest.approx(client_level_epsilon(np.full(r, Z), DELTA, B=B, N=N), rel=1e-9)
        assert m["eps_flower"] >= m["eps_rigorous"]  # flower-dp's min(PLD, RDP) is never above Flower's RDP
    assert result.evaluate_metrics_serverapp[2]["eps_flower"] == pytest.approx(flower, rel=1e-12)


def test_spent_budget_raises_flowers_privacy_budget_exhausted_and_start_stops_cleanly(tmp_path):
    """Flower's max_epsilon between GauLRQ's eps of 2 and 3 rounds (the number it reports, not Flower's looser
    RDP): configure_train of round 3 raises Flower's exception (also a flower-dp BudgetExceededError); start()
    stops there with 2 rounds done and the results saved."""
    eps = [client_level_epsilon(np.full(r, Z), DELTA, B=B, N=N) for r in (2, 3)]
    cap = (eps[0] + eps[1]) / 2
    s = _gau(clients_per_round=B, accountant=_accountant(max_epsilon=cap), out_dir=tmp_path)  # own budget: 1e3
    result = _start(s, num_rounds=4)
    assert s.stop_reason.startswith("budget") and "max_epsilon" in s.stop_reason, s.stop_reason
    assert len(s.rounds) == 2 and sorted(result.evaluate_metrics_serverapp) == [1, 2]
    assert s.privacy_spent().epsilon == pytest.approx(eps[0]) and eps[0] <= cap
    with pytest.raises(PrivacyBudgetExhausted) as err:
        s.configure_train(3, ArrayRecord({"w": Array(np.zeros(3, np.float32))}), ConfigRecord(), None)
    assert isinstance(err.value, BudgetExceededError) and "max_epsilon" in str(err.value)
    assert (tmp_path / "results.json").is_file()


def test_accountant_defaults_and_refusals():
    s = _gau(num_clients=None, epsilon=None, accountant=_accountant(max_epsilon=5.0), clients_per_round=2)
    assert (s.N, s.epsilon, s.delta) == (N, 5.0, DELTA)
    with pytest.raises(ValueError, match="population_size must equal the number of clients 6, got 7"):
        _gau(accountant=_accountant(population=7))
    with pytest.raises(ValueError, match="method with a DP proof"):
        _gau(method="bq", accountant=_accountant())
    bad = RdpAccountant(PrivacyConfig(target_delta=DELTA, population_size=N, sampling_method=SamplingMethod.POISSON,
                                      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE))
    with pytest.raises(ValueError, match="SamplingMethod.WITHOUT_REPLACEMENT"):  # the attained pair: no proof
        fpv.check_accountant(bad, population_size=N, fixed_size=True)
    fpv.check_accountant(_accountant("without-replacement"), population_size=N, fixed_size=True)
    with pytest.raises(ValueError, match="without-replacement"):
        fpv.check_accountant(_accountant("without-replacement"), population_size=N, fixed_size=False,
                             adjacency="add_remove")


def test_privacy_spent_without_flower_accountant_is_flower_dps_own():
    s = _gau(clients_per_round=B)
    assert s.privacy_spent() is None or s.privacy_spent().epsilon == 0.0
    _start(s, num_rounds=2)
    spent = s.privacy_spent()
    assert isinstance(spent, fpv.PrivacySpent) and spent.num_releases == 2
    assert spent.epsilon == pytest.approx(client_level_epsilon(np.full(2, Z), s.delta, B=B, N=N), rel=1e-12)
    assert "min(PLD, RDP)" in spent.accounting_method
    assert SECRET  # the same secret as the drop-in tests (imported helpers)
