"""Issue 12 item 2, "noise is secret": privacy noise and private sampling come from a per-node secret by default.

(a) two runs of the same config and seed draw different noise (push-sum, Gau-LRQ); (b) the seeded simulation mode
(``reproducible=True``) gives identical numbers and says so in the results; (c) nothing secret reaches results.json,
history.csv, checkpoints, reprs or logs.
"""

from __future__ import annotations

import json
import logging
import pickle

import numpy as np
import pytest
import torch

import flower_dp.rng as rng
from flower_dp.clients import registry
from flower_dp.experiments import config_from_dict, run_experiment
from flower_dp.mechanisms.noise import gaussian_noise
from flower_dp.rng import NodeKey, node_secret, noise_generator, noise_record, numpy_rng, torch_generator
from flower_dp.topology import make_topology

#: a known "secret" for the leak test: 256 bits with no run of zero bytes (so its forms are distinctive)
KNOWN = int.from_bytes(bytes((0x5A + 7 * i) % 251 + 1 for i in range(32)), "big")


def _cfg(reproducible=False, **run):
    return config_from_dict({
        "run": {"name": "secret-noise", "seed": 1, "num_iters": 4, "eval_every": 2, "progress": False,
                "reproducible": reproducible, **run},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 32, "test_samples": 64},
        "model": {"name": "logreg"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": "dyn_d2p", "params": {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4, "batch_size": 8,
                                                    "lr": 0.1, "accountant": "rdp"}},
    })


def _plan(algorithm="dyn_d2p", reproducible=False, **params):
    p = {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4, "batch_size": 8, "lr": 0.1, "accountant": "rdp", **params}
    return registry.prepare(algorithm, p, n_nodes=4, samples_per_node=[32] * 4, num_iters=4, dim=8, seed=3,
                            reproducible=reproducible)


def _node(plan, i=0):
    from flower_dp.models import build_model

    g = torch.Generator().manual_seed(0)
    return registry.make_node(plan, node_id=i, topology=make_topology("exp_one_peer", 4),
                              model=build_model("logreg", num_classes=2, in_features=3, seed=0),
                              loss_fn=torch.nn.functional.cross_entropy,
                              data_x=torch.randn(32, 3, generator=g), data_y=torch.randint(0, 2, (32,), generator=g))


# ---------------------------------------------------------------------------------------------- the rng API
def test_node_secret_is_fresh_hidden_and_the_reproducible_key_is_the_seed():
    a, b = node_secret(False, 3), node_secret(False, 3)
    assert a != b and a.mode == "secret" and a._value.bit_length() > 200
    assert repr(a) == str(a) == "NodeKey(secret)" and str(a._value) not in repr(a)
    with pytest.raises(TypeError):
        json.dumps(a)  # a secret never slips into a JSON file
    r = node_secret(True, 3)
    assert r.mode == "reproducible" and r == node_secret(True, 3)
    # the reproducible key draws exactly the streams of the seed (committed results and backend tests stay valid)
    assert torch.equal(torch.randn(5, generator=torch_generator(r, 2, "noise", 7)),
                       torch.randn(5, generator=torch_generator(3, 2, "noise", 7)))
    assert np.array_equal(noise_generator(r, 2, 7).standard_normal(5), noise_generator(3, 2, 7).standard_normal(5))
    assert numpy_rng(r, 1, "data", 4).random() == numpy_rng(3, 1, "data", 4).random()
    # the node-local round trip (a relay node's context.state) and pickling keep the key
    assert NodeKey.from_bytes(a.to_bytes()) == a and pickle.loads(pickle.dumps(a)) == a
    assert noise_record(False)["mode"] == "secret" and "seed" in noise_record(True)["note"]


def test_plan_carries_the_mode_and_nodes_draw_from_their_own_secret():
    plan = _plan()
    assert plan.reproducible is False and plan.summary()["noise"]["mode"] == "secret"
    assert plan.summary()["reproducible"] is False
    n1, n2 = _node(plan), _node(plan)  # the same node of the same plan built twice
    assert not torch.equal(n1.gaussian(0, 1.0, 50), n2.gaussian(0, 1.0, 50))
    assert not torch.equal(n1.sample_poisson(0, 16), n2.sample_poisson(0, 16))
    assert torch.equal(n1.gaussian(0, 1.0, 50), n1.gaussian(0, 1.0, 50))  # a node redraws its own k exactly
    # nor do they equal the public seed's stream
    assert not torch.equal(n1.gaussian(0, 1.0, 50), gaussian_noise(50, 1.0, noise_generator(plan.seed, 0, 0)))
    rep = _plan(reproducible=True)
    assert rep.summary()["noise"]["mode"] == "reproducible"
    r1, r2 = _node(rep), _node(rep)
    assert torch.equal(r1.gaussian(0, 1.0, 50), r2.gaussian(0, 1.0, 50))
    assert torch.equal(r1.sample_poisson(0, 16), r2.sample_poisson(0, 16))


def test_privsgp_block_choice_and_dpps_noise_use_the_secret():
    base = {"epsilon": 4.0, "delta": 1e-4, "lr": 0.1}
    pv = registry.prepare("privsgp_vr", {"batch_size": 4, "G": 1.0, **base}, n_nodes=4,
                          samples_per_node=[32] * 4, num_iters=200, dim=8, seed=3)
    a, b = _node(pv), _node(pv)
    blocks = lambda nd: [int(numpy_rng(nd._private_key, 0, "data", k).integers(nd.n_blocks)) for k in range(40)]
    assert blocks(a) != blocks(b)  # the key the node's local_step uses for its block draw is its own secret
    src = open(registry.__file__.replace("registry.py", "privsgp_vr.py")).read()
    assert 'numpy_rng(self._private_key, i, "data", k)' in src
    src = open(registry.__file__.replace("registry.py", "dpps.py")).read()
    assert "self.plan.seed" not in src.replace('"init"', "")  # every DPPS noise draw is keyed by the node key


def test_restored_node_draws_a_fresh_secret_unless_reproducible():
    nd = _node(_plan())
    before = nd.gaussian(2, 1.0, 30)
    nd.load_state_dict(nd.state_dict())  # resume / restart after a dead worker
    assert not torch.equal(before, nd.gaussian(2, 1.0, 30))
    rd = _node(_plan(reproducible=True))
    before = rd.gaussian(2, 1.0, 30)
    rd.load_state_dict(rd.state_dict())
    assert torch.equal(before, rd.gaussian(2, 1.0, 30))


# ---------------------------------------------------------------------------------------------- (a), (b) push-sum
def test_same_seed_default_mode_draws_different_noise_reproducible_mode_same_numbers(tmp_path):
    runs = [run_experiment(_cfg(), out_dir=tmp_path / f"s{i}") for i in range(2)]
    xs = [torch.cat([nd.x for nd in r.nodes]) for r in runs]
    assert not torch.equal(xs[0], xs[1])
    for i in range(2):
        doc = json.loads((tmp_path / f"s{i}" / "results.json").read_text())
        assert doc["noise"]["mode"] == "secret" and doc["privacy"]["plan"]["noise"]["mode"] == "secret"
        assert doc["config"]["run"]["reproducible"] is False
    reps = [run_experiment(_cfg(reproducible=True), out_dir=tmp_path / f"r{i}") for i in range(2)]
    assert reps[0].history == reps[1].history
    for a, b in zip(reps[0].nodes, reps[1].nodes):
        assert torch.equal(a.x, b.x) and a.w == b.w
    doc = json.loads((tmp_path / "r0" / "results.json").read_text())
    assert doc["noise"]["mode"] == "reproducible" and "do not know the seed" in doc["noise"]["note"]


def test_secret_mode_resume_continues_with_fresh_secrets(tmp_path, monkeypatch):
    """A stopped secret-mode run resumes and finishes (fresh node secrets: valid, not the uninterrupted numbers)."""
    from flower_dp import results as rio  # the file layer the run engine checkpoints through

    real, calls = rio.save_checkpoint, {"n": 0}

    def stop_after_first(*a, **k):
        real(*a, **k)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(rio, "save_checkpoint", stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(_cfg(), out_dir=tmp_path)
    monkeypatch.undo()
    res = run_experiment(_cfg(), out_dir=tmp_path, resume=True)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert res.status == "finished" and [h["k"] for h in doc["history"]] == [2, 4] and doc["noise"]["mode"] == "secret"


def test_cli_reproducible_flag(tmp_path, capsys):
    from flower_dp.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\nname = "c"\nseed = 1\nnum_iters = 2\neval_every = 2\nprogress = false\n'
                   '[data]\ndataset = "synthetic_fashion_mnist"\nsamples_per_node = 16\ntest_samples = 32\n'
                   '[model]\nname = "logreg"\n[topology]\nname = "exp_one_peer"\nn_nodes = 2\n'
                   '[algorithm]\nname = "dyn_d2p"\n[algorithm.params]\nvariant = "const"\nepsilon = 50.0\n'
                   'batch_size = 8\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--reproducible"]) == 0
    assert "noise: reproducible (simulation mode" in capsys.readouterr().out
    assert json.loads((tmp_path / "a" / "results.json").read_text())["noise"]["mode"] == "reproducible"
    assert main(["run", str(cfg), "--out", str(tmp_path / "b")]) == 0
    assert "noise: secret" in capsys.readouterr().out


def test_reproduce_labels_the_noise_mode():
    from flower_dp.reproduce import _with_noise_mode, noise_label
    from flower_dp.reproduce.core import RunSpec

    spec = RunSpec("r", {}, {"run": {"seed": 0}})
    assert _with_noise_mode(spec, True).config["run"]["reproducible"] is True
    assert _with_noise_mode(spec, False).config["run"]["reproducible"] is False
    other = RunSpec("g", {}, {"method": "gau-lrq"}, kind="gau_lrq")
    assert _with_noise_mode(other, True).config["reproducible"] is True
    assert "reproducible" not in _with_noise_mode(other, False).config
    assert "**secret**" in noise_label({}, [{"noise_mode": "secret"}])
    assert "do not know the seed" in noise_label({}, [{"noise_mode": "reproducible"}])
    assert "do not know the seed" in noise_label({}, [{}])  # a record from before secret noise: seeded


def test_relay_node_rebuilt_in_another_process_keeps_its_secret():
    """context.state (node-local) carries the key, so a relay node rebuilt between contribute(k) and step(k)
    replays k with the same noise and batch."""
    from flwr.app import ConfigRecord

    from flower_dp.clients import push_sum_node as app
    from flower_dp.gossip import relay as keys

    plan = _plan()
    built = []

    def builder(node_id, spec, context):
        return lambda i, device: built.append(_node(plan, i)) or built[-1]

    class Ctx:
        state: dict = {}

    ctx = Ctx()
    node = builder(0, {}, ctx)(0, "cpu")
    ctx.state = {"pushsum": ConfigRecord({"spec": keys.encode({"builder": "custom"}), "version": 0, "session": "s"})}
    app._save_relay_node(ctx, 1, 0, node, 0)
    assert "private_key" in ctx.state["pushsum"]
    app._RELAY_CACHE.clear()  # "another process": the node must be rebuilt from context.state
    rebuilt, _ = app._relay_node(ctx, 1, 0, builder, "contribute", 0)
    assert rebuilt is not node and rebuilt._private_key == node._private_key
    assert torch.equal(rebuilt.gaussian(1, 1.0, 20), node.gaussian(1, 1.0, 20))
    app._RELAY_CACHE.clear()


# ---------------------------------------------------------------------------------------------- (c) no leak
def _forms(value: int) -> list[bytes]:
    raw = value.to_bytes(32, "big")
    h = format(value, "x")
    return [str(value).encode(), h.encode(), h.upper().encode(), raw, raw[::-1], raw.hex().encode(),
            raw[:16], raw[16:], raw[::-1][:16]]


def test_the_secret_reaches_no_file_log_or_repr(tmp_path, monkeypatch, caplog, capsys):
    monkeypatch.setattr(rng.secrets, "randbits", lambda k: KNOWN)
    caplog.set_level(logging.DEBUG)
    res = run_experiment(_cfg(), out_dir=tmp_path, progress=False)
    assert all(nd._private_key._value == KNOWN for nd in res.nodes)  # the hook took: every node holds KNOWN
    # the noise really came from it
    nd = res.nodes[0]
    assert torch.equal(nd.gaussian(0, 1.0, 8), gaussian_noise(8, 1.0, noise_generator(KNOWN, 0, 0)))
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"results.json", "history.csv", "checkpoint.pt"}
    blobs = {p.name: p.read_bytes() for p in files}
    from flower_dp.results import load_checkpoint

    ck = load_checkpoint(tmp_path)
    blobs["checkpoint (unpickled, repr)"] = repr(ck).encode()
    blobs["checkpoint (re-pickled)"] = pickle.dumps(ck)
    out = capsys.readouterr()
    blobs["logs"] = (caplog.text + out.out + out.err).encode()
    blobs["reprs"] = (repr(res) + repr(nd.plan) + repr(nd.__dict__) + json.dumps(nd.plan.summary(), default=str)
                      ).encode()
    blobs["state_dict"] = pickle.dumps(nd.state_dict())
    for name, blob in blobs.items():
        for form in _forms(KNOWN):
            assert form not in blob, f"the node secret leaks into {name}"


def test_gau_lrq_runs_get_a_fresh_secret_and_nonce_reproducible_runs_the_same(tmp_path):
    from flower_dp.experiments.gau_lrq import run_gau_lrq

    small = dict(num_clients=6, clients_per_round=2, num_rounds=2, local_steps=1, dataset="synthetic_fashion_mnist",
                 model="logreg", per_class=3, test_samples=100, lr=0.1, noise_multiplier=0.8)
    a = run_gau_lrq("gau-lrq", out_dir=tmp_path / "a", **small)
    # the same folder again: never the earlier secret unasked
    old = (tmp_path / "a" / "lrq.secret").read_bytes()
    b = run_gau_lrq("gau-lrq", out_dir=tmp_path / "a", **small)
    new = (tmp_path / "a" / "lrq.secret").read_bytes()
    assert old != new and (tmp_path / "a" / "lrq.secret").stat().st_mode & 0o077 == 0
    assert a["config"]["stream_nonce"] != b["config"]["stream_nonce"]
    assert "seed" not in a["config"]["stream_nonce"]
    assert a["noise"]["mode"] == b["noise"]["mode"] == "secret"
    c = run_gau_lrq("gau-lrq", **small)  # no out_dir: a fresh in-memory secret
    assert c["config"]["secret_file"] is None and c["config"]["stream_nonce"] not in (a["config"]["stream_nonce"],)
    text = json.dumps(b) + (tmp_path / "a" / "results.json").read_text()
    assert new.hex() not in text
    blob = (tmp_path / "a" / "checkpoint.pt").read_bytes() + (tmp_path / "a" / "results.json").read_bytes()
    assert new not in blob and new.hex().encode() not in blob
    # the Gau-SGD baseline too: a fresh secret every run (its Gaussian noise is keyed by it)
    g1, g2 = (run_gau_lrq("gau-sgd", **small) for _ in range(2))
    assert g1["config"]["stream_nonce"] != g2["config"]["stream_nonce"] and g1["noise"]["mode"] == "secret"
    # reproducible: secret and nonce from the seed, the same numbers, labelled
    r1, r2 = (run_gau_lrq("gau-lrq", reproducible=True, **small) for _ in range(2))
    strip = lambda r: {k: v for k, v in r.items() if k != "wall_time_s"}
    assert strip(r1) == strip(r2) and r1["noise"]["mode"] == "reproducible" and "seed" in r1["noise"]["note"]
    with pytest.raises(ValueError, match="reproducible"):
        run_gau_lrq("gau-lrq", reproducible=True, secret=b"0123456789abcdef0123", **small)


def test_gau_lrq_resume_reuses_the_checkpointed_runs_own_secret(tmp_path):
    from flower_dp.experiments.gau_lrq import run_gau_lrq

    small = dict(num_clients=6, clients_per_round=2, num_rounds=2, local_steps=1, dataset="synthetic_fashion_mnist",
                 model="logreg", per_class=3, test_samples=100, lr=0.1, noise_multiplier=0.8)
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

    from flower_dp.clients.lrq_mod import make_gau_lrq_mod
    from flower_dp.experiments.gau_lrq import train

    class Crash(BaseException):  # the whole process dies (an Exception would be a dropped client)
        pass

    def crashing(msg: Message, ctx: Context) -> Message:
        if int(msg.content["config"]["server-round"]) == 2:
            raise Crash()
        return train(msg, ctx)

    app = ClientApp(mods=[make_gau_lrq_mod()])  # its own key from the run's key folder (run config lrq-key-dir)
    app.train()(crashing)
    with pytest.raises(Crash):
        run_gau_lrq("gau-lrq", out_dir=tmp_path, client_app=app, **small)
    secret = (tmp_path / "lrq.secret").read_bytes()
    ck_nonce = json.loads((tmp_path / "results.json").read_text())["config"]["stream_nonce"]
    res = run_gau_lrq("gau-lrq", out_dir=tmp_path, resume=True, **small)
    assert (tmp_path / "lrq.secret").read_bytes() == secret and res["config"]["stream_nonce"] == ck_nonce
    with pytest.raises(ValueError, match="master secret"):
        run_gau_lrq("gau-lrq", out_dir=tmp_path / "empty", resume=True, **small)


def test_a_checkpoint_from_before_the_switch_resumes_only_in_the_seeded_mode(tmp_path, monkeypatch):
    """Runs checkpointed before [run] reproducible existed were seeded: --reproducible resumes them, secret refuses."""
    from flower_dp import results as rio
    from flower_dp.errors import CheckpointError

    run_experiment(_cfg(reproducible=True), out_dir=tmp_path)
    ck = rio.load_checkpoint(tmp_path)
    del ck["config"]["run"]["reproducible"]
    rio.save_checkpoint(tmp_path, ck)
    assert run_experiment(_cfg(reproducible=True), out_dir=tmp_path, resume=True).status == "finished"
    ck = rio.load_checkpoint(tmp_path)
    ck["config"]["run"].pop("reproducible", None)
    rio.save_checkpoint(tmp_path, ck)
    with pytest.raises(CheckpointError, match="different config"):
        run_experiment(_cfg(), out_dir=tmp_path, resume=True)


def test_secret_mode_restore_charges_the_replayed_segment_again():
    """Issue 12: a node restored at k0 in secret mode resends the lost segment's steps with fresh noise, so its
    ledger charges [k0, k1) a second time; reproducible mode resends identical messages and charges nothing more;
    a budget that cannot cover the rest of the run stops it with BudgetExceededError."""
    from flower_dp.clients.registry import prepare
    from flower_dp.errors import BudgetExceededError
    from flower_dp.privacy import NodeAccountant, charge_replay, rigorous_epsilon

    params = {"epsilon": 2.0, "delta": 1e-5, "batch_size": 8, "lr": 0.1}
    kw = dict(n_nodes=2, samples_per_node=[80, 80], num_iters=20, dim=10, seed=0)
    plan = prepare("dp2_sgd", params, **kw)
    acc = NodeAccountant(plan.accountant, plan.adjacency)
    for s in plan.steps(0, 0, 10):
        acc.charge(s)
    state = {"accountant": acc.state_dict(), "x": None}
    out = charge_replay(state, plan, 0, 10, 15)
    again = NodeAccountant(plan.accountant, plan.adjacency)
    again.load_state_dict(out["accountant"])
    assert again.steps_charged == 15
    assert again.epsilon(plan.delta) == pytest.approx(rigorous_epsilon(plan.steps(0, 0, 15), plan.delta,
                                                                        accountant=plan.accountant), rel=1e-9)
    seeded = prepare("dp2_sgd", params, reproducible=True, **kw)
    assert charge_replay(state, seeded, 0, 10, 15) is state
    tight = prepare("dp2_sgd", {**params, "budget_epsilon": 2.0}, **kw)
    with pytest.raises(BudgetExceededError, match="budget_epsilon"):
        charge_replay(state, tight, 0, 10, 15)
