"""Privacy per party (flower_dp.privacy.parties): every eps names whom it protects against.

The network observer's eps is recomputed here independently: the binomial mixture of the analytic GDP delta summed
directly with scipy and inverted with brentq, not through flower_dp.privacy.table_bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from flower_dp.privacy import parties
from flower_dp.privacy.gau_lrq import client_level_epsilon, gau_lrq_schedule
from flower_dp.privacy.parties import (DEFAULT_PARTY, PARTIES, check_party, gau_lrq_eps_by_party,
                                       gau_lrq_party_epsilon, network_observer_epsilon, push_sum_eps_by_party)


def _independent_network_eps(z: float, K: int, B: int, N: int, delta: float) -> float:
    """eps with sum_n Binom(n; K, B/N) delta_G(eps; 2 sqrt(n) / z) = delta, summed term by term."""
    n = np.arange(K + 1)
    w = stats.binom.pmf(n, K, B / N)

    def mix(eps: float) -> float:
        total = 0.0
        for ni, wi in zip(n, w):
            if ni == 0:
                continue
            mu = 2.0 * math.sqrt(ni) / z
            total += wi * (stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))
        return total - delta

    return optimize.brentq(mix, 1e-6, 500.0, xtol=1e-12)


@pytest.mark.parametrize("z, K, B, N, at_least", [
    (1.6902480406355591, 30, 80, 1920, 11.50),  # table4-paper eps-3 runs (docs/results/gau-lrq-table4-paper)
    (1.4728553145773702, 30, 80, 5760, 9.83),   # table3-paper N = 5760
    (0.51624, 30, 80, 1920, 71.6),              # the paper's MNIST setting
])
def test_network_observer_eps_matches_an_independent_mixture_and_the_issue_numbers(z, K, B, N, at_least):
    ours = network_observer_epsilon(np.full(K, z), 1e-5, B=B, N=N)
    independent = _independent_network_eps(z, K, B, N, 1e-5)
    assert ours == pytest.approx(independent, rel=1e-6)
    assert ours >= independent * (1 - 1e-9)  # rounded up, never below
    assert round(ours, 2 if at_least < 50 else 1) >= at_least


def test_network_observer_is_charged_more_than_the_model_observer():
    z = np.full(30, 1.6902480406355591)
    model = gau_lrq_party_epsilon("model_observer", z, 1e-5, B=80, N=1920)
    assert model == pytest.approx(client_level_epsilon(z, 1e-5, B=80, N=1920), rel=1e-12)  # today's number
    assert network_observer_epsilon(z, 1e-5, B=80, N=1920) > 3 * model  # no amplification for it


def test_network_observer_with_every_client_sampled_is_the_plain_gaussian_composition():
    """B = N: every round samples the target, so the mixture is the K-fold Gaussian: mu = sqrt(K) 2/z."""
    from flower_dp.privacy.gdp import eps_from_mu_delta

    got = network_observer_epsilon(np.full(5, 2.0), 1e-5, B=4, N=4)
    assert got == pytest.approx(eps_from_mu_delta(math.sqrt(5) * 2 / 2.0, 1e-5), rel=1e-9)
    # the same sensitivity and noise as the code's own Gau-LRQ accounting: with nothing to amplify, its PLD agrees
    assert got == pytest.approx(gau_lrq_party_epsilon("model_observer", np.full(5, 2.0), 1e-5, B=4, N=4), rel=1e-6)


def test_dynamic_schedule_is_charged_at_its_smallest_z():
    z = np.array([3.0, 2.0, 1.5])
    assert network_observer_epsilon(z, 1e-5, B=2, N=10) == pytest.approx(
        _independent_network_eps(1.5, 3, 2, 10, 1e-5), rel=1e-6)


def test_another_client_is_charged_over_the_other_clients_with_its_own_noise_share_known():
    """q = B/(N-1) (it knows whether it was sampled) and z sqrt((B-1)/B) (it knows its own noise share)."""
    from flower_dp.privacy.accountant import GaussianStep, rigorous_epsilon

    z, B, N = np.full(10, 1.2), 5, 40
    got = gau_lrq_party_epsilon("client", z, 1e-5, B=B, N=N, per_client_keys=True)
    want = rigorous_epsilon([GaussianStep(B / (N - 1), 1.2 * math.sqrt((B - 1) / B), 10, "fixed_size", N - 1)], 1e-5,
                            adjacency="replace_one")
    assert got == pytest.approx(want, rel=1e-12)
    assert got > gau_lrq_party_epsilon("model_observer", z, 1e-5, B=B, N=N)
    # the two cases the client's own status leaves, each charged on its own, are both at or below the charge
    not_sampled = rigorous_epsilon([GaussianStep(B / (N - 1), 1.2, 10, "fixed_size", N - 1)], 1e-5,
                                   adjacency="replace_one")
    sampled = rigorous_epsilon([GaussianStep((B - 1) / (N - 1), 1.2 * math.sqrt((B - 1) / B), 10, "fixed_size",
                                             N - 1)], 1e-5, adjacency="replace_one")
    assert max(not_sampled, sampled) <= got * (1 + 1e-9)


def test_no_eps_for_the_server_nor_for_a_client_holding_the_run_secret():
    z = np.full(3, 1.0)
    out = gau_lrq_eps_by_party(z, 1e-5, B=2, N=6)
    assert set(out) == set(PARTIES["gau_lrq"]) == {"server", "client", "model_observer", "network_observer"}
    assert out["server"]["eps"] is None and "decodes" in out["server"]["reason"]
    assert out["client"]["eps"] is None and "run secret" in out["client"]["reason"]
    assert out["model_observer"]["bound"] in ("pld_symmetrised_pair", "rdp_without_replacement")
    assert out["network_observer"]["bound"] == "gdp_sample_known"
    with_keys = gau_lrq_eps_by_party(z, 1e-5, B=2, N=6, per_client_keys=True)
    assert with_keys["client"]["eps"] > with_keys["model_observer"]["eps"]
    heur = gau_lrq_eps_by_party(z, 1e-5, B=2, N=6, heuristic_note="no proof")
    assert heur["model_observer"]["eps"] is None and heur["model_observer"]["eps_heuristic"] > 0


@pytest.mark.parametrize("party", ["network_observer", "model_observer"])
def test_calibration_solves_the_noise_for_the_named_party(party):
    sch = gau_lrq_schedule(epsilon=8.0, delta=1e-5, num_rounds=10, B=4, N=40, party=party)
    assert sch.party == party
    eps = gau_lrq_party_epsilon(party, sch.noise_multiplier, 1e-5, B=4, N=40)
    assert eps <= 8.0 and eps == pytest.approx(8.0, rel=2e-3) and sch.eps_rigorous == eps
    smaller = gau_lrq_party_epsilon(party, sch.noise_multiplier * 0.995, 1e-5, B=4, N=40)
    assert smaller > 8.0  # no more noise than the target needs
    assert sch.eps_after(10, 1e-5, party="server") is None


def test_calibration_to_another_client_needs_per_client_keys():
    sch = gau_lrq_schedule(epsilon=8.0, delta=1e-5, num_rounds=10, B=4, N=40, party="client", per_client_keys=True)
    eps = gau_lrq_party_epsilon("client", sch.noise_multiplier, 1e-5, B=4, N=40, per_client_keys=True)
    assert eps <= 8.0 and eps == pytest.approx(8.0, rel=2e-3)
    with pytest.raises(ValueError, match="per-client keys"):
        gau_lrq_schedule(epsilon=8.0, delta=1e-5, num_rounds=10, B=4, N=40, party="client")
    with pytest.raises(ValueError, match="server"):
        gau_lrq_schedule(epsilon=8.0, delta=1e-5, num_rounds=10, B=4, N=40, party="server")


def test_unknown_party_names_the_valid_ones_of_its_family():
    assert check_party("gau_lrq", None) == "model_observer" == DEFAULT_PARTY["gau_lrq"]
    assert check_party("push_sum", None) == "out_neighbour"
    with pytest.raises(ValueError, match=r"\['client', 'model_observer', 'network_observer', 'server'\].*'relay'"):
        check_party("gau_lrq", "relay")
    with pytest.raises(ValueError, match=r"\['model_observer', 'out_neighbour', 'relay'\].*'server'"):
        check_party("push_sum", "server")


def test_push_sum_parties():
    out = push_sum_eps_by_party(2.5, 1e-5, "pld", transport="relay", checkpoint=False)
    assert list(out) == ["out_neighbour", "relay", "model_observer"]
    assert out["out_neighbour"]["eps"] == out["relay"]["eps"] == out["model_observer"]["eps"] == 2.5
    ck = push_sum_eps_by_party(2.5, 1e-5, "pld", transport="relay", checkpoint=True)
    assert ck["relay"]["eps"] is None and "checkpoint=True" in ck["relay"]["reason"]
    assert ck["out_neighbour"]["eps"] == 2.5
    off = push_sum_eps_by_party(math.inf, 1e-5, "none", transport="ray", checkpoint=False)
    assert all(v["eps"] is None for v in off.values())


def test_every_party_declares_its_view_and_its_bound_or_reason():
    for family, members in PARTIES.items():
        assert DEFAULT_PARTY[family] in members
        for name, p in members.items():
            assert p.name == name and p.sees
            assert (p.bound is None) == (p.reason is not None)
    assert parties.PARTIES["push_sum"]["relay"].bound is not None
