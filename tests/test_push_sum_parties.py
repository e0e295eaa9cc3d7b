"""Push-sum names the party of every eps (flower_dp.privacy.parties): results.json carries ``eps_by_party``
(out-neighbour = the per-node eps; the relay the same, or none when the nodes' states come back to the server; the
model observer: post-processing), one ``party`` argument on the config, the CLI, ``train_private`` and
``plan_spec``, and ``privacy_spent(party=...)`` names it.  In process, tiny runs."""

from __future__ import annotations

import json

import pytest
import torch

from flower_dp.errors import ConfigError


def _data(n: int = 300, seed: int = 1):
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
    return x, (x[:, 0] > 0).long()


def _model():
    return torch.nn.Linear(8, 2)


def _private(**kw):
    from flower_dp import train_private

    x, y = _data()
    args = {"n_nodes": 3, "num_iters": 4, "eval_every": 4, "batch_size": 16, "lr": 0.1, "seed": 2,
            "noise_multiplier": 1.3, "clip": 0.5, **kw}
    return train_private(_model, (x[:240], y[:240]), (x[240:], y[240:]), **args)


def test_results_name_every_party_and_privacy_spent_answers_for_the_named_one(tmp_path):
    run = _private(out_dir=tmp_path, party="model_observer")
    doc = json.loads((tmp_path / "results.json").read_text())
    eps = max(p["eps_rigorous"] for p in doc["privacy"]["per_node"])
    assert doc["party"] == "model_observer" == doc["config"]["privacy"]["party"]
    by = doc["eps_by_party"]
    assert list(by) == ["out_neighbour", "relay", "model_observer"]
    assert by["out_neighbour"]["eps"] == by["model_observer"]["eps"] == pytest.approx(eps, rel=1e-12)
    assert by["out_neighbour"]["delta"] == 1e-5 and "node accountant" in by["out_neighbour"]["bound"]
    assert by["relay"]["eps"] is None and "checkpoint=True" in by["relay"]["reason"]  # out_dir: states checkpointed
    spent = run.privacy_spent()
    assert spent.epsilon == pytest.approx(eps, rel=1e-12) and "party 'model_observer'" in spent.accounting_method
    assert "party 'out_neighbour'" in run.privacy_spent(party="out_neighbour").accounting_method
    with pytest.raises(ValueError, match="party='relay' has no eps"):
        run.privacy_spent(party="relay")
    with pytest.raises(ValueError, match=r"party must be one of \['model_observer', 'out_neighbour', 'relay'\]"):
        run.privacy_spent(party="network_observer")


def test_relay_without_checkpoint_is_charged_the_per_node_eps():
    run = _private(party="relay")  # in process, no out_dir: no state leaves the nodes
    spent = run.privacy_spent()
    assert "party 'relay'" in spent.accounting_method
    assert spent.epsilon == pytest.approx(max(p["eps_rigorous"] for p in run.privacy["per_node"]), rel=1e-12)


def test_relay_with_checkpoint_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="party='relay' has no eps.*checkpoint"):
        _private(party="relay", out_dir=tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_config_privacy_party_is_checked_with_the_other_keys():
    from flower_dp.experiments import config_from_dict

    assert config_from_dict({}).privacy == {"party": "out_neighbour"}
    with pytest.raises(ConfigError, match=r"privacy.party must be one of \['model_observer', 'out_neighbour', "
                                          r"'relay'\], got 'server'"):
        config_from_dict({"privacy": {"party": "server"}})
    with pytest.raises(ConfigError, match="needs run.checkpoint = false"):
        config_from_dict({"privacy": {"party": "relay"}})
    assert config_from_dict({"privacy": {"party": "relay"}, "run": {"checkpoint": False}}).privacy["party"] == "relay"


def test_cli_party_reaches_the_config_and_the_summary(tmp_path, capsys):
    from flower_dp.cli import main

    rc = main(["quickstart", "--out", str(tmp_path), "--party", "model_observer", "--set", "run.num_iters=2",
               "--set", "run.eval_every=2", "--set", "topology.n_nodes=3", "--set", "data.samples_per_node=16",
               "--set", "data.test_samples=50", "--set", "data.dataset=synthetic_fashion_mnist",
               "--set", "run.progress=false"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "privacy calibrated to party 'model_observer'" in out and "relay none (checkpoint=True" in out
    assert json.loads((tmp_path / "results.json").read_text())["party"] == "model_observer"
    assert main(["quickstart", "--out", str(tmp_path / "x"), "--party", "server"]) == 2
    assert "privacy.party must be one of" in capsys.readouterr().err


def test_plan_spec_carries_the_party_and_refuses_an_unknown_one():
    from flower_dp.clients.push_sum_node import plan_spec

    kw = dict(n_nodes=3, model_fn=_model, samples_per_node=32, num_iters=2)
    params = {"lr": 0.1, "batch_size": 8, "G": 1.0, "epsilon": 5.0, "delta": 1e-5}
    assert plan_spec("dp2_sgd", params, **kw)["party"] == "out_neighbour"
    assert plan_spec("dp2_sgd", params, party="relay", **kw)["party"] == "relay"
    with pytest.raises(ValueError, match="party must be one of"):
        plan_spec("dp2_sgd", params, party="client", **kw)


def test_push_sum_strategy_reads_the_party_and_refuses_relay_with_states_at_the_server(tmp_path):
    from flower_dp.clients.push_sum_node import plan_spec
    from flower_dp.strategies import PushSumStrategy

    spec = plan_spec("dp2_sgd", {"lr": 0.1, "batch_size": 8, "G": 1.0, "epsilon": 5.0, "delta": 1e-5}, n_nodes=3,
                     model_fn=_model, samples_per_node=32, num_iters=2, party="relay")
    s = PushSumStrategy(3, spec, num_iters=2, iters_per_round=1, transport="relay", checkpoint=False)
    assert s.party == "relay" and not s.keep_states
    with pytest.raises(ValueError, match="party='relay' has no eps"):
        PushSumStrategy(3, spec, num_iters=2, iters_per_round=1, transport="relay", out_dir=tmp_path)
    assert PushSumStrategy(3, spec, num_iters=2, iters_per_round=1, transport="relay", out_dir=tmp_path,
                           party="out_neighbour").party == "out_neighbour"
