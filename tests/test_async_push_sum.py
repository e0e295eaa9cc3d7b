"""The asynchronous push-sum engine (flower_dp.gossip.asynchronous): consensus and mass under loss, delays and a
straggler, bit-for-bit reproducibility, per-node privacy and stops, the synchronous run as its special case, the
``[network]`` config and ``run_experiment`` in mode ``"async"``.  No Ray, no Flower."""

from __future__ import annotations

import json

import pytest
import torch

from flower_dp.errors import ConfigError
from flower_dp.experiments.config import config_from_dict
from flower_dp.gossip import run_iteration
from flower_dp.gossip.asynchronous import AsyncPushSum, NetworkModel
from flower_dp.privacy.accountant import NodeAccountant, rigorous_epsilon
from flower_dp.topology import exp_one_peer, random_irregular

from test_algorithms_common import logreg_data, make_nodes

#: a lossy, slow, jittery network with duplicates (so that reordered and duplicate messages are ignored) and node 2
#: five times slower than the others
LOSSY = dict(delay="exponential", delay_mean=0.7, loss=0.2, duplicate=0.05, jitter=0.2, stragglers={2: 5.0})
PRIVATE = dict(lr=0.05, batch_size=8, variant="const", epsilon=2.0, delta=1e-4, accountant="rdp")
#: every private test runs 4 nodes planned for K = 40 (one calibration, cached for the session)
N, K = 4, 40


def _nodes(algorithm, params, topo, num_iters):
    parts, _ = logreg_data(topo.n, 32)
    return make_nodes(algorithm, params, topo, parts=parts, num_iters=num_iters)


def _spread_nodes(topo, num_iters):
    """Gradient-free SGP nodes (lr 0) with distinct starting points; the target average and the initial spread."""
    _, nodes = _nodes("sgp", {"lr": 0.0, "batch_size": 8}, topo, num_iters)
    g = torch.Generator().manual_seed(7)
    for nd in nodes:
        nd.x = torch.randn(nd.x.numel(), generator=g)
    target = sum(nd.x.double() for nd in nodes) / topo.n
    spread = max(float((nd.x.double() - target).norm()) for nd in nodes)
    return nodes, target, spread


def test_gradient_free_consensus_with_loss_delays_and_a_straggler():
    """z_i = x_i / w_i of every node reaches the mean of the initial x within 1e-6 of the initial spread, with 20 %
    of the messages lost, exponential delays (mean 0.7 steps), duplicates, jitter and node 2 five times slower."""
    topo = random_irregular(6, seed=1)
    nodes, target, spread = _spread_nodes(topo, 600)
    sim = AsyncPushSum(nodes, NetworkModel(horizon=150.0, **LOSSY), seed=3, receivers=topo.out_neighbors)
    sim.run()
    err = max(float((nd.z().double() - target).norm()) for nd in nodes)
    assert err < 1e-6 * spread, err / spread
    assert sim.steps[2] < sim.steps[0] / 4 and min(sim.steps) > 20
    m = sim.messages
    assert m["lost"] > 0.15 * m["sent"] and m["duplicated"] > 0 and m["ignored_stale"] > 0


def test_total_weight_is_conserved_at_every_event():
    """sum of w held by the nodes plus w on the edges not yet credited (in flight, lost and not yet re-sent, arrived
    and not yet mixed) is n at every event, up to float64 rounding; x's mass up to float32 rounding."""
    topo = random_irregular(5, seed=2)
    nodes, target, spread = _spread_nodes(topo, 200)
    sim = AsyncPushSum(nodes, NetworkModel(horizon=40.0, **LOSSY), seed=4, receivers=topo.out_neighbors)
    t, seen_uncredited = 0.0, 0.0
    while t < sim.end_time:
        t += 0.125
        sim.advance(t)
        mass = sim.mass()
        assert abs(mass["total"] - 5.0) <= 1e-12, (t, mass)
        seen_uncredited = max(seen_uncredited, mass["uncredited"])
    sim.finish()
    assert abs(sim.mass()["total"] - 5.0) <= 1e-12
    assert seen_uncredited > 0.5  # the edges really held mass
    assert float((sim.mass_x() - 5 * target).norm()) < 1e-5 * spread


def _history(seed: int):
    topo = random_irregular(N, seed=2)
    _, nodes = _nodes("dyn_d2p", PRIVATE, topo, K)
    sim = AsyncPushSum(nodes, NetworkModel(horizon=25.0, **LOSSY), seed=seed, receivers=topo.out_neighbors)
    rows = []
    for t in range(1, int(sim.end_time) + 2):
        sim.advance(float(t))
        rows.append([nd.z().clone() for nd in nodes])
    sim.finish()
    return sim, nodes, rows


def test_seeded_runs_are_identical_bit_for_bit():
    a, na, ha = _history(5)
    b, nb, hb = _history(5)
    assert len(ha) == len(hb)
    for ra, rb in zip(ha, hb):
        assert all(torch.equal(x, y) for x, y in zip(ra, rb))
    for x, y in zip(na, nb):
        sa, sb = x.state_dict(), y.state_dict()
        assert torch.equal(sa["x"], sb["x"]) and sa["w"] == sb["w"] and sa["accountant"] == sb["accountant"]
    assert a.record() == b.record()
    c, nc, _ = _history(6)  # another network seed: another schedule
    assert c.messages != a.messages or any(not torch.equal(x.x, y.x) for x, y in zip(na, nc))


def test_straggler_takes_fewer_steps_and_its_eps_is_its_own():
    """Every node's ledger holds its own steps: the straggler's eps is the accountant's eps of its own count."""
    topo = random_irregular(N, seed=2)
    plan, nodes = _nodes("dyn_d2p", PRIVATE, topo, K)
    sim = AsyncPushSum(nodes, NetworkModel(delay="uniform", delay_mean=0.3, loss=0.1, stragglers={3: 5.0},
                                           horizon=40.0), seed=1, receivers=topo.out_neighbors)
    sim.run()
    assert sim.steps == [40, 40, 40, 8]
    eps = []
    for i, nd in enumerate(nodes):
        rep = nd.privacy_report()
        assert rep["steps_charged"] == sim.steps[i]
        direct = NodeAccountant(plan.accountant, plan.adjacency)
        for step in plan.charged_steps(i, 0, sim.steps[i]):
            direct.charge(step)
        assert rep["eps_rigorous"] == direct.epsilon(plan.delta_of(i))
        assert rep["eps_rigorous"] == pytest.approx(rigorous_epsilon(
            plan.steps(i, 0, sim.steps[i]), plan.delta_of(i), accountant=plan.accountant, adjacency=plan.adjacency),
            rel=1e-9)
        eps.append(rep["eps_rigorous"])
    assert eps[3] < 0.75 * eps[0] and eps[0] == pytest.approx(plan.eps_rigorous[0], rel=1e-6)
    recs = sim.node_records()
    assert [r["stopped"] for r in recs] == ["num_iters"] * 3 + ["horizon"]
    assert "8 of its 40 steps" in recs[3]["reason"]


def test_a_node_out_of_steps_stops_sending_while_the_others_go_on():
    topo = exp_one_peer(4)
    _, nodes = _nodes("sgp", {"lr": 0.05, "batch_size": 8}, topo, 12)
    sim = AsyncPushSum(nodes, NetworkModel(delay="exponential", delay_mean=0.4), seed=2, max_steps=[12, 12, 3, 12],
                       receivers=topo.out_neighbors)
    sim.advance(3.5)
    assert sim.steps[2] == 3 and sim.stop_reason[2] == "num_iters" and sim.stop_reason[0] is None
    sent2 = {e: out.seq for e, out in sim._out.items() if e[0] == 2}
    bits2 = int(sim.bits_sent[2])
    sim.run()
    assert sim.steps == [12, 12, 3, 12]
    assert {e: out.seq for e, out in sim._out.items() if e[0] == 2} == sent2 and int(sim.bits_sent[2]) == bits2
    assert all(sim.bits_sent[i] > 3 * bits2 for i in (0, 1, 3))
    assert sim.in_flight() == 0 and abs(sim.mass()["total"] - 4.0) <= 1e-12  # drained: every node done
    assert "reached its maximum of 3 steps" in sim.node_records()[2]["reason"]


def test_equal_speeds_without_delay_or_loss_is_the_synchronous_run():
    """The synchronous loop is the asynchronous network's special case, bit for bit (exp_one_peer: two shares per
    inbox, so summing in float64 rounds as the synchronous float32 sum does)."""
    topo = exp_one_peer(N)
    _, sync = _nodes("dyn_d2p", PRIVATE, topo, K)
    _, asyn = _nodes("dyn_d2p", PRIVATE, topo, K)
    for k in range(12):
        run_iteration(sync, k, receivers=topo.out_neighbors)
    AsyncPushSum(asyn, NetworkModel(delay="constant"), seed=0, max_steps=12, receivers=topo.out_neighbors).run()
    for a, b in zip(sync, asyn):
        assert torch.equal(a.x, b.x) and a.w == b.w
        assert a.accountant.state_dict() == b.accountant.state_dict() and a.accountant.steps_charged == 12


def test_an_algorithm_without_push_sum_weights_is_refused_by_the_engine():
    topo = exp_one_peer(4)
    _, nodes = _nodes("dp2_sgd", dict(lr=0.1, batch_size=4, G=1.0, noise_std=0.0, epsilon=2.0, delta=1e-4), topo, 4)
    with pytest.raises(ValueError, match=r"'dp2_sgd' node 0 sends shares without a push-sum weight.*mode = 'sync'"):
        AsyncPushSum(nodes, NetworkModel(), seed=0).run()


BASE = {"run": {"progress": False}, "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 32},
        "topology": {"name": "exp_one_peer", "n_nodes": 4}}


@pytest.mark.parametrize("network,algorithm,needles", [
    ({"delay_mean": -0.5}, "dyn_d2p", ["network.delay_mean", "got -0.5", ">= 0"]),
    ({"loss": 1.0}, "dyn_d2p", ["network.loss", "[0, 1)", "got 1.0", "lower it below 1"]),
    ({"speeds": [1.0, 0.0, 1.0, 1.0]}, "dyn_d2p", ["network.speeds[1]", "> 0", "got 0.0"]),
    ({"speeds": [1.0, 1.0]}, "dyn_d2p", ["one speed per node (4)", "got 2"]),
    ({"stragglers": {"9": 5.0}}, "dyn_d2p", ["stragglers names node 9", "0..3"]),
    ({"stragglers": {"1": 0.5}}, "dyn_d2p", ["stragglers[1]", ">= 1", "got 0.5"]),
    ({"delay": "pareto"}, "dyn_d2p", ["network.delay", "'exponential'", "got 'pareto'"]),
    ({"horizon": 0}, "dyn_d2p", ["network.horizon", "> 0", "got 0"]),
    ({}, "dp_csgp", ["cannot run algorithm 'dp_csgp'", "['sgp', 'dyn_d2p', 'privsgp_vr', 'privsgp']",
                     "network.mode = 'sync'"]),
    ({}, "dp2_sgd", ["cannot run algorithm 'dp2_sgd'", "push-sum weight", "network.mode = 'sync'"]),
    ({}, "partpsp", ["cannot run algorithm 'partpsp'", "barrier", "network.mode = 'sync'"]),
])
def test_bad_networks_are_refused_naming_the_value_the_range_and_the_fix(network, algorithm, needles):
    raw = {**BASE, "algorithm": {"name": algorithm}, "network": {"mode": "async", **network}}
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_network_keys_need_mode_async_and_the_mode_is_checked():
    with pytest.raises(ConfigError, match=r"network.loss = 0.1 describes the asynchronous network.*"
                                          r"set network.mode = 'async'"):
        config_from_dict({**BASE, "network": {"loss": 0.1}})
    with pytest.raises(ConfigError, match=r"network.mode must be 'sync' or 'async', got 'asynch'"):
        config_from_dict({**BASE, "network": {"mode": "asynch"}})
    with pytest.raises(ConfigError, match=r"run.backend = 'ray'.*set run.backend = 'inprocess'"):
        config_from_dict({**BASE, "run": {"backend": "ray"}, "network": {"mode": "async"}})
    with pytest.raises(ValueError, match=r"network.loss must be a probability in \[0, 1\), got 1.5"):
        NetworkModel(loss=1.5).check(4)
    assert config_from_dict(BASE).network["mode"] == "sync"


def test_run_experiment_async_writes_per_node_steps_and_eps(tmp_path, capsys):
    from flower_dp.experiments.cli_run import _report
    from flower_dp.experiments.runner import run_experiment

    raw = {**BASE, "run": {"progress": False, "num_iters": 10, "eval_every": 10, "reproducible": True},
           "data": {**BASE["data"], "test_samples": 50}, "model": {"name": "logreg"},
           "algorithm": {"name": "dyn_d2p", "params": PRIVATE},
           "network": {"mode": "async", "delay": "exponential", "delay_mean": 0.3, "loss": 0.1,
                       "stragglers": {"3": 5.0}, "horizon": 10.0}}
    cfg = config_from_dict(raw)
    res = run_experiment(cfg, out_dir=tmp_path / "a")
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    assert doc["status"] == "finished" and doc["config"]["network"]["mode"] == "async"
    net = doc["network"]
    assert [r["steps"] for r in net["per_node"]] == [10, 10, 10, 2] and net["checkpoints"] is False
    assert [r["stopped"] for r in net["per_node"]] == ["num_iters"] * 3 + ["horizon"]
    per_node = doc["privacy"]["per_node"]
    assert [p["steps_charged"] for p in per_node] == [10, 10, 10, 2]
    assert per_node[3]["eps_rigorous"] < per_node[0]["eps_rigorous"]
    assert [row["k"] for row in doc["history"]] == [10] and doc["history"][-1]["steps_min"] == 2
    assert not (tmp_path / "a" / "checkpoint.pt").exists()
    assert res.network["per_node"][3]["steps"] == 2
    _report(res)  # what flower-dp run prints: per node its steps and its own eps
    out = capsys.readouterr().out
    assert "after virtual time t=10" in out and "network: async (virtual time)" in out
    assert f"     3   0.20      2  {per_node[3]['eps_rigorous']:.4f}" in out and "2 of its 10 steps" in out
    again = run_experiment(cfg, out_dir=tmp_path / "b")  # --reproducible: the same numbers
    doc_b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert doc_b["history"] == doc["history"] and doc_b["network"] == net
    assert all(torch.equal(x.x, y.x) for x, y in zip(res.nodes, again.nodes))
    with pytest.raises(ValueError, match=r"resume=True cannot continue an asynchronous run.*new out_dir"):
        run_experiment(cfg, out_dir=tmp_path / "a", resume=True)
    with pytest.raises(ValueError, match=r"network.mode = 'async' runs the nodes in this process, got "
                                         r"backend='ray'"):
        run_experiment(cfg, backend="ray")


def test_the_shipped_async_stragglers_config_loads():
    from flower_dp.experiments.cli_run import builtin_config_path
    from flower_dp.experiments.config import load_config

    cfg = load_config(builtin_config_path("async_stragglers"))
    net = NetworkModel.from_config(cfg.network).check(cfg.n_nodes)
    assert cfg.network["mode"] == "async" and cfg.n_nodes == 8 and cfg.data["dataset"] == "fashion_mnist"
    assert net.speed(7) == pytest.approx(0.2) and net.loss == 0.1 and net.horizon > cfg.run["num_iters"]
