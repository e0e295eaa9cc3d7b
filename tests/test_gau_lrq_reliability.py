"""Gau-LRQ faults, resume and the experiment function, in-process (no Ray).

Issue 9 (Gau-LRQ parts): a failing client is dropped without breaking the others' decoding and the
accountant still charges the round; a stopped run resumed from its checkpoint ends with exactly the
numbers of an uninterrupted run; corrupted or foreign checkpoints are refused.  Also
:func:`flower_dp.experiments.gau_lrq.run_gau_lrq`, the function ``flower-dp reproduce`` calls.
"""

from __future__ import annotations

import json
import logging
import math
import re

import numpy as np
import pytest
from scipy import stats

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_dp.clients.lrq_mod import make_gau_lrq_mod
from lrq_keys import keyed_mod
from flower_dp.errors import CheckpointError, DecodeError
from flower_dp.experiments.gau_lrq import (InProcessGrid, _task_identity, make_client_app, resolve_method,
                                           run_gau_lrq, train)
from flower_dp.privacy.gau_lrq import client_level_epsilon
from flower_dp.strategies.gau_lrq import GauLRQ

SECRET = b"0123456789abcdef-reliability"
N, B, D, CLIP = 10, 4, 5000, 0.2


def _user_train(fail=lambda pid, rnd: False):
    """An ordinary train function (moves w towards a per-partition target); raises where ``fail`` says."""

    def fn(msg: Message, ctx: Context) -> Message:
        pid, rnd = int(ctx.node_config["partition-id"]), int(msg.content["config"]["server-round"])
        if fail(pid, rnd):
            raise RuntimeError(f"client {pid} crashed in round {rnd}")
        w = msg.content["arrays"]["w"].numpy()
        target = np.random.default_rng(pid).normal(size=w.shape).astype(np.float32)
        new = (w + 0.05 * (target - w)).astype(np.float32)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord({"num-examples": 10, "train-loss": float(pid)})}),
                       reply_to=msg)

    return fn


def _app(fail=lambda pid, rnd: False, secret=SECRET) -> ClientApp:
    app = ClientApp(mods=[keyed_mod(secret)])
    app.train()(_user_train(fail))
    return app


def _strategy(**kw) -> GauLRQ:
    base = dict(num_clients=N, clients_per_round=B, clip=CLIP, num_rounds=5, noise_multiplier=1.0, epsilon=1e4,
                secret=SECRET, stream_nonce="rel")
    return GauLRQ(**{**base, **kw})


def _start(strategy: GauLRQ, app: ClientApp, rounds: int = 5, grid=None):
    with _task_identity():
        return strategy.start(grid=grid or InProcessGrid(app, N), num_rounds=rounds,
                              initial_arrays=ArrayRecord({"w": Array(np.zeros(D, np.float32))}),
                              evaluate_fn=lambda r, a: MetricRecord({"accuracy": float(a["w"].numpy()[0])}))


def test_failed_client_is_dropped_others_decode_and_the_round_is_still_charged():
    """One sampled client raises: the rest decode, the server adds its noise share, eps is the full round's charge."""
    ref = _strategy(keep_decoded=True)
    _start(ref, _app())
    victim = sorted(ref.decoded[1])[0]  # a client sampled in round 2 (same nonce + secret -> same sample below)
    s = _strategy(keep_decoded=True)
    result = _start(s, _app(fail=lambda pid, rnd: pid == victim and rnd == 2))
    r2 = s.rounds[1]
    assert r2["sampled"] == B and r2["received"] == B - 1 and r2["dropped"] == 1 and r2["failed"] == 1
    assert "failed_nodes" not in r2  # ids of sampled clients stay unpublished (the B-of-N sample is secret)
    assert set(s.decoded[1]) == set(ref.decoded[1]) - {victim}
    for pid, hat in s.decoded[1].items():  # the others decoded exactly as without the failure
        np.testing.assert_array_equal(hat, ref.decoded[1][pid])
    # the accountant charges what the sampling implies, failure or not
    assert [r["eps_rigorous"] for r in s.rounds] == [r["eps_rigorous"] for r in ref.rounds]
    assert s.rounds[-1]["eps_rigorous"] == pytest.approx(client_level_epsilon(np.full(5, 1.0), 1e-5, B=B, N=N))
    # the dropped client's share of the noise, N(0, sigma^2 I), added by the server: the sum keeps B sigma^2
    sigma = s.sigma(1)
    extra = s.dropout_noise[1] / sigma
    assert stats.kstest(extra, "norm").pvalue > 1e-3 and abs(extra.std() - 1) < 0.05
    # theta_3 = theta_2 + (sum of the B - 1 decoded + compensation) / B
    want = (s.thetas[1][0].astype(np.float64) + (sum(s.decoded[1].values()) + s.dropout_noise[1]) / B)
    np.testing.assert_array_equal(s.thetas[2][0], want.astype(np.float32))
    assert s.stop_reason == "completed" and len(result.evaluate_metrics_serverapp) == 6


def test_all_clients_failing_leaves_only_server_noise_and_user_metrics_aggregation_composes():
    """All sampled clients fail in round 1: theta moves by pure noise N(0, sigma^2/B); FedAvg's metric options pass."""
    seen = []

    def aggr(records, key):
        seen.append(len(records))
        return MetricRecord({"clients": len(records)})

    s = _strategy(keep_decoded=True, train_metrics_aggr_fn=aggr)
    _start(s, _app(fail=lambda pid, rnd: rnd == 1), rounds=2)
    assert s.rounds[0]["received"] == 0 and s.rounds[0]["train_metrics"] is None
    step = (s.thetas[1][0].astype(np.float64) - s.thetas[0][0]) / (s.sigma(0) / math.sqrt(B))
    assert abs(step.std() - 1) < 0.05
    assert seen == [B] and s.rounds[1]["train_metrics"] == {"clients": B}


def test_a_systematic_client_failure_stops_the_run_naming_the_error(tmp_path):
    """Every sampled client failing round after round is not trained through on server noise: after
    max_failed_rounds such rounds the run stops with the clients' error, results saved as failed; a streak
    broken by a good round starts over."""
    s = _strategy(out_dir=tmp_path, max_failed_rounds=2)
    with pytest.raises(RuntimeError, match=r"2 consecutive rounds \(up to round 3.*client \d+ crashed in round 3"):
        _start(s, _app(fail=lambda pid, rnd: rnd != 1), rounds=5)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["stop_reason"].startswith("failed: RuntimeError") and saved["rounds_completed"] == 2
    s = _strategy(max_failed_rounds=2)
    _start(s, _app(fail=lambda pid, rnd: rnd in (1, 3)), rounds=4)  # never two in a row
    assert [r["received"] for r in s.rounds] == [0, B, 0, B]
    with pytest.raises(ValueError, match="max_failed_rounds"):
        _strategy(max_failed_rounds=0)


def test_tampered_reply_stops_with_decode_error_and_saves_results(tmp_path, caplog):
    """A message altered in transit is not silently dropped: DecodeError; results saved as failed.  The node and
    its partition (sampled, so part of the hidden sample) are named only in a DEBUG record, the server's own view,
    never in the error that the results' stop reason carries."""

    class TamperingGrid(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            replies = super().send_and_receive(messages, timeout=timeout)
            if messages and int(messages[0].content["config"]["server-round"]) == 2:
                rec = replies[0].content["gau-lrq.payload"]
                a = rec["m"].numpy().copy()
                a[3] ^= 0x10
                replies[0].content["gau-lrq.payload"] = ArrayRecord({"m": Array(a)})
            return replies

    s = _strategy(out_dir=tmp_path)
    caplog.set_level(logging.DEBUG, logger="flwr")
    with pytest.raises(DecodeError, match=r"round 2: a sampled client's reply does not decode with its partition's key"):
        _start(s, None, grid=TamperingGrid(_app(), N))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["stop_reason"].startswith("failed: DecodeError") and saved["rounds_completed"] == 1
    assert "node" not in saved["stop_reason"].split("(node and partition at DEBUG)")[1]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "does not decode" in r.getMessage()]
    assert len(debug) == 1 and re.search(r"round 2: node \d+ \(partition \d+\)", debug[0])


class _Crash(BaseException):
    """Stands for the server process being killed (not an Exception: nothing may catch it)."""


def test_resume_ends_with_exactly_the_numbers_of_an_uninterrupted_run(tmp_path):
    """Crash in round 4 (after checkpoints of rounds 1-3), resume -> bit-identical theta, records and metrics."""
    full = _strategy(out_dir=tmp_path / "full")
    res_full = _start(full, _app())

    class CrashingGrid(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            if messages and int(messages[0].content["config"]["server-round"]) == 4:
                raise _Crash()
            return super().send_and_receive(messages, timeout=timeout)

    stopped = _strategy(out_dir=tmp_path / "part")
    with pytest.raises(_Crash):
        _start(stopped, None, grid=CrashingGrid(_app(), N))
    part = json.loads((tmp_path / "part" / "results.json").read_text())
    assert part["rounds_completed"] == 3 and part["stop_reason"].startswith("failed")

    resumed = _strategy(out_dir=tmp_path / "part", resume=True, stream_nonce=None)  # nonce comes from the checkpoint
    res = _start(resumed, _app())
    np.testing.assert_array_equal(res.arrays["w"].numpy(), res_full.arrays["w"].numpy())
    a = json.loads((tmp_path / "full" / "results.json").read_text())
    b = json.loads((tmp_path / "part" / "results.json").read_text())
    assert a == b  # every per-round record, eps, bits, bytes, accuracy and the stop reason
    assert {k: dict(v) for k, v in res.evaluate_metrics_serverapp.items()} == \
        {k: dict(v) for k, v in res_full.evaluate_metrics_serverapp.items()}


def test_resume_refuses_other_settings_other_secret_and_corrupted_checkpoints(tmp_path):
    """CheckpointError names what differs; a flipped byte fails the checksum; no checkpoint -> error, nothing run."""
    s = _strategy(out_dir=tmp_path)
    _start(s, _app(), rounds=2)
    with pytest.raises(CheckpointError, match="clip"):
        _start(_strategy(out_dir=tmp_path, resume=True, clip=0.3), _app())
    with pytest.raises(CheckpointError, match="secret"):
        _start(_strategy(out_dir=tmp_path, resume=True, secret=b"another-secret-of-16+bytes"), _app())
    with pytest.raises(CheckpointError, match="stream_nonce"):
        _start(_strategy(out_dir=tmp_path, resume=True, stream_nonce="other"), _app())
    ck = tmp_path / "checkpoint.pt"
    raw = bytearray(ck.read_bytes())
    raw[-20] ^= 0xFF
    ck.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum"):
        _start(_strategy(out_dir=tmp_path, resume=True), _app())
    with pytest.raises(CheckpointError, match="no checkpoint"):
        _start(_strategy(out_dir=tmp_path / "empty", resume=True), _app())
    with pytest.raises(ValueError, match="out_dir"):
        _strategy(resume=True)


# ---------------------------------------------------------------------------------------------
# The experiment function (what `flower-dp reproduce gau-lrq` calls)
# ---------------------------------------------------------------------------------------------
SMALL = dict(num_clients=8, clients_per_round=3, num_rounds=3, local_steps=2, dataset="synthetic_fashion_mnist",
             model="logreg", per_class=5, test_samples=300, lr=0.1)


def test_resolve_method_accepts_paper_names_and_codes():
    assert resolve_method("Gau-LRQ-SGD") == resolve_method("lrq") == "gau-lrq"
    assert resolve_method("Dynamic Gau-LRQ-SGD") == resolve_method("dlrq") == "dynamic-gau-lrq"
    assert resolve_method("none") == "local-sgd" and resolve_method("QG_SGD") == "qg-sgd"
    with pytest.raises(ValueError, match="method"):
        resolve_method("fedavg")


def test_run_gau_lrq_results_dict_and_files(tmp_path):
    """Per-round accuracy, bits, bytes and eps; results.json = the returned dict; the secret is nowhere in them."""
    res = run_gau_lrq("gau-lrq", noise_multiplier=0.5, out_dir=tmp_path, **SMALL)
    assert res["stop_reason"] == "completed" and res["rounds_completed"] == 3
    assert len(res["accuracy_per_round"]) == 4 and all(0 <= a <= 1 for a in res["accuracy_per_round"])
    assert len(res["bits_per_round"]) == 3 and all(b > 0 for b in res["bits_per_round"])
    assert res["eps_rigorous"] == pytest.approx(client_level_epsilon(np.full(3, 0.5), 1e-5, B=3, N=8))
    assert res["eps_paper"] < res["eps_rigorous"]
    assert res["run"]["dataset"] == "synthetic_fashion_mnist" and res["run"]["local_steps"] == 2
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps({k: v for k, v in res.items() if k != "wall_time_s"}))
    secret = (tmp_path / "lrq.secret").read_bytes()
    assert (tmp_path / "lrq.secret").stat().st_mode & 0o077 == 0
    for f in ("results.json", "checkpoint.pt"):
        blob = (tmp_path / f).read_bytes()
        assert secret not in blob and secret.hex().encode() not in blob


def test_run_gau_lrq_dynamic_matches_the_fixed_budget_and_local_sgd_has_no_privacy(tmp_path):
    """Dynamic Gau-LRQ at a fixed z's budget: same rigorous eps (private side), z_k decreasing; Local SGD: eps inf."""
    fixed = run_gau_lrq("gau-lrq", noise_multiplier=0.5, **SMALL)
    dyn = run_gau_lrq("dynamic-gau-lrq", noise_multiplier=0.5, **SMALL)
    z = np.array(dyn["privacy"]["z"])
    assert np.all(np.diff(z) < 0) and dyn["config"]["tau"] == 0.9 and dyn["algorithm"].startswith("Dynamic")
    assert fixed["eps_rigorous"] * (1 - 2e-3) <= dyn["eps_rigorous"] <= fixed["eps_rigorous"] * (1 + 1e-6)
    none = run_gau_lrq("local-sgd", **SMALL)
    assert none["eps_rigorous"] == float("inf") and none["bits_per_round"][0] == 32 * 3 * (784 * 10 + 10)
    with pytest.raises(ValueError, match="epsilon or noise_multiplier"):
        run_gau_lrq("gau-sgd", **SMALL)


def test_run_gau_lrq_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path):
    """The runner with LeNet-style user code: kill it in round 3, resume -> the same numbers.

    Comparing two runs needs the seeded simulation mode (reproducible=True: secret and nonce from the seed);
    by default every run draws a fresh secret and nonce (tests/test_secret_noise.py)."""

    full = run_gau_lrq("gau-lrq", noise_multiplier=0.5, out_dir=tmp_path / "full", reproducible=True, **SMALL)
    assert full["noise"]["mode"] == "reproducible" and "seed" in full["noise"]["note"]

    def crashing(msg: Message, ctx: Context) -> Message:
        if int(msg.content["config"]["server-round"]) == 3:
            raise _Crash()
        return train(msg, ctx)

    app = ClientApp(mods=[make_gau_lrq_mod()])  # its own key from the run's key folder (run config lrq-key-dir)
    app.train()(crashing)
    with pytest.raises(_Crash):
        run_gau_lrq("gau-lrq", noise_multiplier=0.5, out_dir=tmp_path / "part", reproducible=True,
                    client_app=app, **SMALL)
    res = run_gau_lrq("gau-lrq", noise_multiplier=0.5, out_dir=tmp_path / "part", reproducible=True,
                      resume=True, client_app=make_client_app(), **SMALL)
    assert {k: v for k, v in res.items() if k != "wall_time_s"} == {k: v for k, v in full.items() if k != "wall_time_s"}


def test_client_app_builder_wraps_an_unchanged_train_function(tmp_path):
    """make_lrq_client_app(train_fn, key_dir=...) is the user's ClientApp plus the mod; a round decodes."""
    from flower_dp.clients.lrq_mod import make_lrq_client_app

    path = tmp_path / "lrq.secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    app = make_lrq_client_app(_user_train(), key_dir=str(tmp_path / "keys"))
    s = _strategy(secret=None, secret_file=str(path), key_dir=str(tmp_path / "keys"), keep_decoded=True)
    _start(s, app, rounds=1)
    assert s.rounds[0]["received"] == B and len(s.decoded[0]) == B
