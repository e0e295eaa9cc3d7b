"""GauLRQ names the party of every eps: ``party=`` calibrates, ``results()["eps_by_party"]`` reports every party,
``privacy_spent(party=...)`` answers for any of them; plus the small truths of issue 36 (an explicit delta that is
not the accountant's target_delta is refused; the accountant label names the bound actually used; docstrings and
``--help`` name no refused configuration or removed flag).  In-process (no Ray)."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

from flower_dp.privacy.parties import gau_lrq_eps_by_party, gau_lrq_party_epsilon
from flower_dp.strategies import flower_privacy as fpv
from flower_dp.strategies.gau_lrq import GauLRQ

from test_gau_lrq_dropin import N, SECRET, Z, _gau, _start  # noqa: E402  (same user-style app, in-process)

B = 3


def test_results_carry_every_party_and_privacy_spent_answers_for_each(tmp_path):
    s = _gau(clients_per_round=B, out_dir=tmp_path)
    _start(s, num_rounds=2)
    doc = json.loads((tmp_path / "results.json").read_text())
    z = np.full(2, Z)
    want = gau_lrq_eps_by_party(z, s.delta, B=B, N=N, per_client_keys=True)
    assert doc["party"] == doc["config"]["party"] == doc["privacy"]["party"] == "model_observer"
    assert doc["eps_by_party"] == json.loads(json.dumps(want))
    assert doc["eps_by_party"]["model_observer"]["eps"] == pytest.approx(doc["eps_rigorous"], rel=1e-12)
    assert doc["eps_by_party"]["server"]["eps"] is None
    # each client holds only its own key: another client is charged, above the model observer (it knows whether it
    # was itself sampled, and then its own share of the noise)
    assert doc["eps_by_party"]["client"]["eps"] > doc["eps_rigorous"]
    assert doc["eps_by_party"]["network_observer"]["eps"] > doc["eps_rigorous"]
    # the accountant label is the bound that gave eps_rigorous, and the party it is charged to
    bound = doc["eps_by_party"]["model_observer"]["bound"]
    assert doc["privacy"]["accountant"].startswith(bound + ":") and "'model_observer'" in doc["privacy"]["accountant"]
    assert "PoissonSampled" not in doc["privacy"]["accountant"]
    spent = s.privacy_spent()
    assert spent.epsilon == pytest.approx(doc["eps_rigorous"], rel=1e-12)
    assert "party 'model_observer'" in spent.accounting_method
    net = s.privacy_spent(party="network_observer")
    assert net.epsilon == pytest.approx(gau_lrq_party_epsilon("network_observer", z, s.delta, B=B, N=N), rel=1e-12)
    assert "party 'network_observer'" in net.accounting_method and "Binomial" in net.accounting_method
    with pytest.raises(ValueError, match="server.*decodes"):
        s.privacy_spent(party="server")
    with pytest.raises(ValueError, match="party must be one of"):
        s.privacy_spent(party="relay")


def test_calibrating_to_the_network_observer_meets_its_bound_and_reports_the_others(tmp_path):
    s = _gau(clients_per_round=B, noise_multiplier=None, epsilon=40.0, num_rounds=3, party="network_observer")
    z = s.noise_multiplier
    eps = gau_lrq_party_epsilon("network_observer", z, s.delta, B=B, N=N)
    assert eps <= 40.0 and eps == pytest.approx(40.0, rel=2e-3)
    default = _gau(clients_per_round=B, noise_multiplier=None, epsilon=40.0, num_rounds=3)
    assert z[0] > default.noise_multiplier[0]  # no amplification: more noise for the same eps
    _start(s, num_rounds=3)
    res = s.results()
    assert res["eps_rigorous"] == pytest.approx(res["eps_by_party"]["network_observer"]["eps"], rel=1e-12)
    assert res["eps_by_party"]["model_observer"]["eps"] < res["eps_rigorous"]
    assert res["privacy"]["accountant"].startswith("gdp_sample_known:")


def test_unknown_or_uncalibratable_party_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"party must be one of \['client', 'model_observer', 'network_observer', "
                                         r"'server'\].*'out_neighbour'"):
        _gau(party="out_neighbour", num_rounds=2)
    # each client holds only its own key, so another client can be calibrated to: its bound meets the target
    s = _gau(clients_per_round=B, noise_multiplier=None, epsilon=40.0, num_rounds=2, party="client")
    assert gau_lrq_party_epsilon("client", s.noise_multiplier, s.delta, B=B, N=N,
                                 per_client_keys=True) == pytest.approx(40.0, rel=2e-3)
    with pytest.raises(ValueError, match="server"):
        _gau(party="server", num_rounds=2)


@pytest.mark.skipif(not fpv.FLOWER_PRIVACY_API, reason="this Flower has no privacy-accounting API")
def test_an_explicit_delta_other_than_the_accountants_target_delta_is_refused():
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod

    acc = RdpAccountant(PrivacyConfig(target_delta=1e-5, population_size=N, max_epsilon=1e3,
                                      neighboring_relation=NeighboringRelation.REPLACE_ONE,
                                      sampling_method=SamplingMethod.WITHOUT_REPLACEMENT))
    with pytest.raises(ValueError, match=r"delta = 0\.001 differs from .*target_delta = 1e-05.*drop delta"):
        _gau(clients_per_round=B, accountant=acc, delta=1e-3)
    assert _gau(clients_per_round=B, accountant=acc, delta=1e-5).delta == 1e-5  # equal: accepted
    assert _gau(clients_per_round=B, accountant=acc).delta == 1e-5  # default: the accountant's


def test_docstrings_do_not_call_a_refused_configuration_the_tightest():
    doc = inspect.getdoc(GauLRQ)
    accountant = doc[doc.index("accountant : "):doc.index("secret, secret_file")]
    assert "WITHOUT_REPLACEMENT + REPLACE_ONE is the tightest" in accountant
    assert "POISSON + ADD_OR_REMOVE_ONE is the tightest" not in doc and "refused" in accountant


def _parsers(parser, prefix="flower-dp"):
    """(name, parser) of ``parser`` and of every sub-command under it."""
    import argparse

    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prefix} {name}")


def test_cli_help_texts_name_only_flags_that_exist():
    """Every ``--flag`` a help text mentions is an option of that command (``--sigma`` and ``--nu`` are gone)."""
    import re

    from flower_dp.cli import build_parser

    for name, p in _parsers(build_parser()):
        flags = {s for a in p._actions for s in a.option_strings}
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", p.format_help()))
        assert named <= flags, f"{name} --help names {sorted(named - flags)}, which it does not take"
    assert "--sigma" not in dict(_parsers(build_parser()))["flower-dp accountant"].format_help()
