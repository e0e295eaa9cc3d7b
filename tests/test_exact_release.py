"""The exact-noise switch (noise_sampler="exact") in the push-sum nodes: integers on the wire's source, charged
with the discrete Gaussian's bound, recorded, and the float mode untouched."""

import math

import numpy as np
import pytest
import torch

from flower_dp.clients.registry import prepare
from flower_dp.mechanisms.exact_release import inflation, round_conditional, rounding_bound
from flower_dp.privacy.discrete_gaussian import exact_epsilon


def _plan(sampler, **kw):
    params = {"lr": 0.1, "batch_size": 8, "clip": 1.0, "epsilon": 4.0, "delta": 1e-5, "calibration": "rigorous", **kw}
    return prepare("dp2_sgd", params, n_nodes=2, samples_per_node=[64, 64], num_iters=6, dim=58,
                   seed=3, reproducible=True, noise_sampler=sampler)


def test_rounding_bound_is_enforced_in_integers():
    rng = np.random.default_rng(0)
    d = 50
    c = 16 * math.sqrt(d)
    v = rng.normal(size=(200, d))
    v *= (c / np.linalg.norm(v, axis=1))[:, None]
    v[:5] *= 1.05  # float error beyond the clip: still bounded after rounding
    ints, zeroed = round_conditional(v, rounding_bound(d), rng)
    assert ints.dtype == np.int64
    assert ((ints * ints).sum(1) <= rounding_bound(d)).all()
    assert zeroed >= 5 and np.abs(ints[5:] - v[5:]).max() < 1
    assert 1 < inflation(d) < 1.05 and 1 < inflation(100_000) < 1.002


def test_exact_plan_has_the_float_plans_eps():
    f, e = _plan("float"), _plan("exact")
    assert e.noise_sampler == "exact" and f.noise_sampler == "float"
    for i in range(2):
        assert e.eps_rigorous[i] <= f.eps_rigorous[i] * (1 + 1e-9)
        assert e.noise_multiplier[i][0] >= f.noise_multiplier[i][0]
        assert exact_epsilon(e.exact_steps(i), e.delta_of(i)) == pytest.approx(e.eps_rigorous[i])
    assert e.summary()["noise"]["sampler"] == "exact" and f.summary()["noise"]["sampler"] == "float"
    assert e.summary()["noise"]["gaussian_sampler"] == "cks-discrete-chacha20"


def _node(plan):
    from flower_dp.clients.registry import ALGORITHMS
    from flower_dp.topology import make_topology

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    x = torch.randn(64, 4)
    y = torch.randint(0, 4, (64,))
    node_cls = ALGORITHMS[plan.algorithm][2]
    return node_cls(plan, node_id=0, topology=make_topology("exp_one_peer", 2), model=model,
                    loss_fn=torch.nn.functional.cross_entropy, data_x=x, data_y=y)


def test_only_integers_reach_the_message_in_exact_mode():
    plan = _plan("exact")
    node = _node(plan)
    x0 = node.x.clone()
    shares = node.local_step(0)
    m = node.last_release
    assert m is not None and m.dtype == np.int64  # the release: integers
    d = x0.numel()
    gamma = float(plan.clip[0][0]) / (16 * math.sqrt(d))
    g_noisy = torch.from_numpy(m.astype(np.float64) * (gamma / 8)).to(torch.float32)
    # DP2-SGD sends x (its past releases' post-processing) and steps by the release after mixing: the step is a
    # function of m only, no other float reaches what the node publishes
    assert torch.equal(node.pending, 0.1 * g_noisy)
    assert all(torch.equal(s.tensors["x"], x0 * node.topology.send_weights(0, 0)[s.receiver]) for s in shares)
    rep = node.privacy_report()
    assert rep["noise_sampler"] == "exact" and rep["steps_charged"] == 1
    assert node.accountant.steps_charged == 0  # the float Gaussian accountant is not charged in exact mode
    (q, z), = node._exact_ledger
    assert q == pytest.approx(8 / 64) and z == pytest.approx(plan.noise_multiplier[0][0] / inflation(d), rel=1e-6)
    state = node.state_dict()
    fresh = _node(plan)
    fresh.load_state_dict(state)
    assert fresh.privacy_report()["eps_rigorous"] == rep["eps_rigorous"] > 0


def test_float_mode_is_unchanged():
    plan = _plan("float")
    a, b = _node(plan), _node(plan)
    shares = a.local_step(0)
    # the float step by hand: grad_mean + release_gaussian, exactly as before the switch
    idx = b.sample_poisson(0, 8)
    g, _ = b.grad_mean(b.x, idx, 8, float(plan.clip[0][0]), 0)
    noise, _ = b.release_gaussian(0, g.numel())
    assert torch.equal(a.pending, 0.1 * (g + noise))
    assert len(shares) >= 1
    assert a.last_release is None


def test_bad_noise_sampler():
    with pytest.raises(ValueError, match="noise_sampler must be one of"):
        _plan("secure")


def test_exact_mode_is_refused_where_the_node_has_no_exact_release():
    from flower_dp.errors import ConfigError

    with pytest.raises(ConfigError, match="noise_sampler='exact' covers"):
        prepare("privsgp_vr", {"lr": 0.1, "batch_size": 8, "clip": 1.0, "epsilon": 4.0, "delta": 1e-5},
                n_nodes=2, samples_per_node=[64, 64], num_iters=6, dim=58, seed=3, noise_sampler="exact")


def test_a_secret_mode_restore_charges_the_replayed_segment_to_the_exact_ledger():
    """An exact node restored at k0 in secret mode resends [k0, k1) with fresh discrete Gaussian noise: its exact
    ledger (what it reports from) charges those steps again, never less than the releases charged them; the float
    accountant stays untouched; a budget that cannot cover the rest stops the run."""
    from flower_dp.errors import BudgetExceededError
    from flower_dp.privacy import charge_replay

    plan = prepare("dp2_sgd", {"lr": 0.1, "batch_size": 8, "clip": 1.0, "epsilon": 4.0, "delta": 1e-5},
                   n_nodes=2, samples_per_node=[64, 64], num_iters=6, dim=58, seed=3, reproducible=False,
                   noise_sampler="exact")
    node = _node(plan)
    for k in range(3):
        node.mix([s for s in node.local_step(k) if s.receiver == 0])
    before = node.privacy_report()
    state = charge_replay(node.state_dict(), plan, 0, 1, 3)
    restored = _node(plan)
    restored.load_state_dict(state)
    after = restored.privacy_report()
    assert after["steps_charged"] == before["steps_charged"] + 2 == 5
    assert restored.accountant.steps_charged == 0  # exact mode charges only its own ledger
    charged = [(q, z, c) for (q, z), c in node._exact_ledger.items()]  # what the three releases charged
    fifth = [(q, z, 2) for q, z, _ in charged[:1]]  # the same release twice more
    assert after["eps_rigorous"] >= exact_epsilon(charged + fifth, plan.delta_of(0)) * (1 - 1e-9)
    assert after["eps_rigorous"] > before["eps_rigorous"]
    tight = prepare("dp2_sgd", {"lr": 0.1, "batch_size": 8, "clip": 1.0, "epsilon": 4.0, "delta": 1e-5,
                                "budget_epsilon": 4.0}, n_nodes=2, samples_per_node=[64, 64], num_iters=6, dim=58,
                    seed=3, noise_sampler="exact")
    with pytest.raises(BudgetExceededError, match="budget_epsilon"):
        charge_replay(node.state_dict(), tight, 0, 1, 3)


def test_exact_mode_samples_and_rounds_on_the_nodes_chacha20_keystream():
    """Every random choice of an exact release comes from the node's ChaCha20 keystream: the Poisson sample is kept
    with probability exactly B/J (uniform integers in [0, J), checked by a binomial count over many draws) and the
    rounding coins are 53-bit uniforms; both streams are keyed by the node's key, so another key gives another
    batch."""
    from flower_dp.rng import PRIVATE_PURPOSES, KeyStream, exact_stream, stream_key

    assert "rounding" in PRIVATE_PURPOSES
    s = KeyStream(stream_key(5, 0, "data", 0))
    n, num, den = 400_000, 3, 7
    hits = int(s.below(n, num, den).sum())
    p = num / den
    assert abs(hits - n * p) < 5 * math.sqrt(n * p * (1 - p))
    u = KeyStream(stream_key(5, 0, "rounding", 0)).uniform53(100_000)
    assert u.min() >= 0 and u.max() < 1 and np.all(u * 2 ** 53 == np.floor(u * 2 ** 53))
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / len(u))
    with pytest.raises(ValueError, match="num <= den"):
        s.below(3, 8, 7)

    plan = _plan("exact")
    node = _node(plan)
    idx = node.sample_poisson(2, 8)
    keep = exact_stream(node._private_key, 0, "data", 2).below(64, 8, 64)
    assert idx.tolist() == np.flatnonzero(keep).tolist()
    other = exact_stream(node._private_key, 1, "data", 2).below(64, 8, 64)
    assert not np.array_equal(keep, other)


def test_dp_csgp_compresses_a_function_of_the_integer_release_in_exact_mode():
    """DP-CSGP releases through the same exact release: its half step, which the compressor sends differences of,
    is x - lr (gamma / B) m, a function of the int64 release m and the node's public past."""
    from flower_dp.clients.registry import ALGORITHMS
    from flower_dp.topology import make_topology

    plan = prepare("dp_csgp", {"lr": 0.1, "batch_size": 8, "G": 1.0, "epsilon": 4.0, "delta": 1e-5,
                               "compressor": "rand_0.5", "gamma_c": 0.5},
                   n_nodes=2, samples_per_node=[64, 64], num_iters=6, dim=58, seed=3, reproducible=True,
                   noise_sampler="exact")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    node = ALGORITHMS["dp_csgp"][2](plan, node_id=0, topology=make_topology("exp_one_peer", 2), model=model,
                                    loss_fn=torch.nn.functional.cross_entropy, data_x=torch.randn(64, 4),
                                    data_y=torch.randint(0, 4, (64,)))
    node.setup()
    x0 = node.x.clone()
    node.local_step(0)
    m = node.last_release
    assert m is not None and m.dtype == np.int64
    gamma = float(plan.clip[0][0]) / (16 * math.sqrt(x0.numel()))
    assert torch.equal(node.x_half, x0 - 0.1 * torch.from_numpy(m.astype(np.float64) * (gamma / 8)).float())
    assert node.privacy_report()["noise_sampler"] == "exact" and node.accountant.steps_charged == 0


def test_an_exact_run_says_so_in_results_json_and_reports_the_discrete_gaussian_eps(tmp_path):
    """run_experiment with [run] noise_sampler = "exact": results.json names the sampler and each node's eps is the
    discrete Gaussian bound of its own releases (rounding inflation included), at most the target."""
    import json

    from flower_dp.experiments import config_from_dict, run_experiment

    cfg = config_from_dict({
        "run": {"name": "exact", "seed": 1, "num_iters": 6, "eval_every": 3, "progress": False, "reproducible": True,
                "noise_sampler": "exact"},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 64, "test_samples": 200},
        "model": {"name": "logreg"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": "dyn_d2p", "params": {"variant": "const", "epsilon": 4.0, "delta": 1e-4,
                                                    "batch_size": 8, "lr": 0.1, "accountant": "rdp"}},
    })
    res = run_experiment(cfg, out_dir=tmp_path)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert res.status == "finished" and doc["noise"]["sampler"] == "exact"
    assert doc["noise"]["gaussian_sampler"] == "cks-discrete-chacha20"
    plan = res.plan
    for rep in doc["privacy"]["per_node"]:
        i = rep["node"]
        assert rep["noise_sampler"] == "exact" and rep["steps_charged"] == 6
        assert rep["eps_rigorous"] == pytest.approx(exact_epsilon(plan.exact_steps(i), plan.delta_of(i)), rel=1e-6)
        assert rep["eps_rigorous"] <= 4.0 * (1 + 1e-9)
