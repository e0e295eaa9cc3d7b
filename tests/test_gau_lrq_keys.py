"""Gau-LRQ's keys and what they give each party, shown by playing that party.

* Another client holds only its own key: re-simulating round 1 for the two neighbouring worlds (the target's update
  replaced) it finds both equally far from the released model, where the master secret's holder predicts the true
  world exactly.  A client presenting the master secret (or another client's key) is refused at the probe.
* The server derives every key, so it sees each clipped update within the LRQ layer it drew (Gau-SGD: exactly):
  there is no DP against the server, and the test shows it by decoding as the server can.
* Counted bytes do not depend on which clients were sampled; log records at INFO and above name no sampled or
  failed node.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_dp.clients.lrq_mod import make_gau_lrq_mod
from flower_dp.experiments.gau_lrq import InProcessGrid, _task_identity
from flower_dp.mechanisms import gau_lrq_codec as codec
from flower_dp.mechanisms.gau_lrq_codec import (ClientKey, client_key, client_run_key, clip_update, read_key_file,
                                                read_secret_file, write_client_keys)
from flower_dp.mechanisms.lrq import lrq_key, lrq_layers
from flower_dp.mechanisms.lrq_stream import chunk_rng, key_bytes, stream_entropy
from flower_dp.privacy.gau_lrq import client_level_epsilon
from flower_dp.strategies.gau_lrq import GauLRQ

N, B, CLIP = 6, 3, 1.0
TARGET, CURIOUS = 0, 5


def _master(label: str) -> bytes:
    return hashlib.sha256(b"test-gau-lrq-keys\x00" + label.encode()).digest()


def _updates(seed: int, d: int) -> dict[int, np.ndarray]:
    """Every client's clean update (norm 0.9 S2, inside the clip ball), a function of the seed."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(N):
        u = rng.standard_normal(d)
        out[i] = (0.9 * CLIP * u / np.linalg.norm(u)).astype(np.float32)
    return out


def _app(updates: dict[int, np.ndarray], mod) -> ClientApp:
    """A ClientApp whose train function moves theta by the client's fixed update (so every world is known)."""
    app = ClientApp(mods=[mod])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        w = msg.content["arrays"]["w"].numpy()
        new = (w + updates[int(ctx.node_config["partition-id"])]).astype(np.float32)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    return app


def _strategy(method: str, master: bytes, nonce: str, key_dir: Path | None, **kw) -> GauLRQ:
    return GauLRQ(**{**dict(num_clients=N, clients_per_round=B, clip=CLIP, num_rounds=1, noise_multiplier=5.0,
                            epsilon=1e4, method=method, secret=master, stream_nonce=nonce, key_dir=key_dir,
                            fraction_evaluate=0.0), **kw})


def _round(method: str, master: bytes, nonce: str, updates: dict[int, np.ndarray], key_dir: Path, d: int,
           **kw) -> tuple[np.ndarray, GauLRQ]:
    """theta_1 of one GauLRQ round from theta_0 = 0 under ``master`` and ``nonce`` (each node reads its own key file,
    written from ``master`` into ``key_dir``), and the strategy."""
    s = _strategy(method, master, nonce, key_dir, **kw)
    with _task_identity():
        res = s.start(grid=InProcessGrid(_app(updates, make_gau_lrq_mod(key_dir=key_dir)), N), num_rounds=1,
                      initial_arrays=ArrayRecord({"w": Array(np.zeros(d, np.float32))}))
    return res.arrays["w"].numpy().astype(np.float64), s


# ---------------------------------------------------------------------------------------------
# Another client: the re-simulation attack
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["lrq", "gaussian"])
def test_a_client_with_only_its_own_key_cannot_resimulate_the_round(method, tmp_path):
    """The standard DP adversary as a curious client: it holds theta_0, theta_1, every other client's clean update
    and its own key file, and re-simulates round 1 for world A and world B (the target's update replaced).

    With the master secret the true world's prediction is exact (max |pred - theta_1| = 0) and the other world's is
    not, whenever the target was sampled.  With only its own key (its best guess of the master is the one secret it
    has), both worlds are equally far from theta_1 (L2 distances within a few percent of each other) and guessing
    the world by the nearer prediction is right no more often than the DP bound of the round allows."""
    d, trials = 200, 16
    eps = client_level_epsilon(np.full(1, 5.0), 1e-5, B=B, N=N)
    target_in = master_apart = own_right = 0
    ratios = []
    for t in range(trials):
        master, nonce = _master(f"attack-{method}-{t}"), f"attack-{t}"
        world_a = _updates(t, d)
        world_b = {**world_a, TARGET: (-world_a[TARGET]).astype(np.float32)}  # the target's update replaced
        worlds = {"A": world_a, "B": world_b}
        truth = "AB"[t % 2]
        keys = tmp_path / f"run-{t}"
        theta1, real = _round(method, master, nonce, worlds[truth], keys, d, keep_decoded=True)
        own = read_key_file(keys / f"client-{CURIOUS}.key", CURIOUS)  # all the curious client holds of the keys
        assert own.key != master and own.key not in (client_key(master, i).key for i in range(N) if i != CURIOUS)

        # (1) holding the master secret: the true world is reproduced exactly
        pred = {w: _round(method, master, nonce, worlds[w], tmp_path / f"m-{t}-{w}", d)[0] for w in "AB"}
        other = "B" if truth == "A" else "A"
        assert np.abs(pred[truth] - theta1).max() == 0.0
        if TARGET in real.decoded[0]:  # the master's holder knows the sample, and tells the worlds apart
            target_in += 1
            master_apart += int(np.abs(pred[other] - theta1).max() > 0)
        else:  # the target was not sampled: both worlds release the same model
            assert np.abs(pred[other] - theta1).max() == 0.0
        # (2) holding only its own key: re-simulate with it as the master (the only secret it has)
        guess = {w: _round(method, own.key, nonce, worlds[w], tmp_path / f"o-{t}-{w}", d)[0] for w in "AB"}
        dist = {w: float(np.linalg.norm(guess[w] - theta1)) for w in "AB"}
        assert min(dist.values()) > 0  # never exact
        ratios.append(dist["A"] / dist["B"])
        own_right += int(min(dist, key=dist.get) == truth)
    ratios = np.array(ratios)
    bound = (np.exp(eps) + 1e-5) / (1 + np.exp(eps))  # most often any test can be right at (eps, delta)
    print(f"{method}: master secret: the true world exact in {trials}/{trials} trials, the other world apart in "
          f"{master_apart} of the {target_in} with the target sampled; own key only: distance ratio A/B in "
          f"[{ratios.min():.4f}, {ratios.max():.4f}], nearer world right {own_right}/{trials} (DP bound at eps "
          f"{eps:.3f}: {bound:.3f})")
    assert target_in >= 4 and master_apart >= target_in - 1  # LRQ's layers may absorb the change in a rare round
    assert np.all(np.abs(ratios - 1) < 0.1)  # equally far: the world changes theta_1 by far less than the noise
    assert own_right <= stats.binom.ppf(0.999, trials, bound)


def test_a_client_presenting_the_master_secret_is_refused_at_the_probe(tmp_path):
    """The curious client's node is given the server's master secret file (as the old set-up did): its mod refuses
    the file, the probe stops the run before any model leaves the server, and the error names the fix."""
    secret_file = tmp_path / "lrq.secret"
    codec.create_secret_file(secret_file)
    master = read_secret_file(secret_file)
    keys = tmp_path / "keys"
    honest, curious = make_gau_lrq_mod(key_dir=keys), make_gau_lrq_mod(secret_file)

    def mixed(msg, ctx, call_next):
        return (curious if int(ctx.node_config["partition-id"]) == CURIOUS else honest)(msg, ctx, call_next)

    sent = []

    class Recorder(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            sent.extend(messages)
            return super().send_and_receive(messages, timeout=timeout)

    s = _strategy("lrq", master, "probe", keys)
    with pytest.raises(RuntimeError, match=r"1 of 6 ClientApps cannot take part.*node 6: error reply.*this is the "
                                           r"server's master secret; give each client only its own key: flower-dp "
                                           r"lrq-keys --secret-file"):
        with _task_identity():
            s.start(grid=Recorder(_app(_updates(0, 10), mixed), N), num_rounds=1,
                    initial_arrays=ArrayRecord({"w": Array(np.zeros(10, np.float32))}))
    assert sent and all(len(m.content.array_records) == 0 for m in sent)  # the model never left


@pytest.mark.parametrize("held", ["master", "other_client", "other_file"])
def test_the_probe_names_which_key_a_client_holds_when_it_is_not_its_own(held, tmp_path):
    """A client whose key is the master secret itself, or another client's key (forged as its own, or that client's
    file), is refused before training, named, with the fix."""
    master = _master("probe-kinds")
    keys = tmp_path / "keys"
    write_client_keys(master, N, keys)
    if held == "master":
        bad = make_gau_lrq_mod(key=ClientKey(CURIOUS, master))
        want = r"node 6 \(partition 5\): presents the server's master secret as its key.*flower-dp lrq-keys"
    elif held == "other_client":
        bad = make_gau_lrq_mod(key=ClientKey(CURIOUS, client_key(master, TARGET).key))
        want = r"node 6 \(partition 5\): holds client 0's key, not its own.*flower-dp lrq-keys"
    else:
        bad = make_gau_lrq_mod(keys / f"client-{TARGET}.key")
        want = r"node 6: error reply.*holds client 0's key, got it on the client with partition-id 5.*flower-dp lrq-keys"
    honest = make_gau_lrq_mod(key_dir=keys)

    def mixed(msg, ctx, call_next):
        return (bad if int(ctx.node_config["partition-id"]) == CURIOUS else honest)(msg, ctx, call_next)

    s = _strategy("lrq", master, "kinds", None)
    with pytest.raises(RuntimeError, match=want):
        with _task_identity():
            s.start(grid=InProcessGrid(_app(_updates(0, 10), mixed), N), num_rounds=1,
                    initial_arrays=ArrayRecord({"w": Array(np.zeros(10, np.float32))}))


def test_key_files_hold_one_client_each_and_reveal_no_other_key(tmp_path):
    """Each key file holds its client's key (header, partition id) and nothing the other keys or the master could be
    read from; the master secret file is refused as a key and a key file is refused as the master secret."""
    master = _master("files")
    keys = write_client_keys(master, N, tmp_path / "keys")
    assert (keys.stat().st_mode & 0o777) == 0o700
    for i in range(N):
        f = keys / f"client-{i}.key"
        assert (f.stat().st_mode & 0o777) == 0o600
        text = f.read_bytes()
        assert text.startswith(b"flower-dp gau-lrq client key v1\npartition-id " + str(i).encode() + b"\n")
        assert read_key_file(f, i) == client_key(master, i)
        others = [master, *(client_key(master, j).key for j in range(N) if j != i)]
        assert not any(o in text or o.hex().encode() in text for o in others)
    secret_file = tmp_path / "lrq.secret"
    secret_file.write_bytes(master)
    secret_file.chmod(0o600)
    with pytest.raises(ValueError, match="this is the server's master secret; give each client only its own key"):
        read_key_file(secret_file, 0)
    with pytest.raises(ValueError, match="is a client key file, got it as the server's master secret"):
        read_secret_file(keys / "client-0.key")


# ---------------------------------------------------------------------------------------------
# The server: no DP against it, demonstrated
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["lrq", "gaussian"])
def test_the_server_sees_each_clipped_update_within_its_layer(method, tmp_path):
    """The server derives client i's key from the master secret, redraws client i's randomness and so localises
    its clipped update: LRQ, to the layer [hat - R, hat - L) of known width w = R - L per coordinate (the decoded
    error is uniform on it given the key, not the N(0, sigma^2) the accountant charges); Gau-SGD, exactly (it
    subtracts the client's noise, up to float32 rounding)."""
    d, master, nonce = 2000, _master(f"server-{method}"), "server"
    updates = {i: (u * 40).astype(np.float32) for i, u in _updates(7, d).items()}  # norm 36 S2: clipped to S2
    _, s = _round(method, master, nonce, updates, tmp_path / "keys", d, keep_decoded=True, noise_multiplier=1.0)
    spec = s.round_spec(0)
    assert len(s.decoded[0]) == B
    for pid, hat in s.decoded[0].items():  # what the server decoded, and all it holds: the master secret
        clipped = clip_update(updates[pid].astype(np.float64), CLIP)[0]
        key = lrq_key(client_run_key(client_key(master, pid), nonce), 0, pid)
        if method == "lrq":
            x, lo, hi = lrq_layers(chunk_rng(stream_entropy(key_bytes(key)), 0), d, spec.sigma)
            width = hi - lo
            inside = (hat - hi <= clipped) & (clipped < hat - lo)
            mid = hat - (hi + lo) / 2
            assert inside.all() and np.all(np.abs(clipped - mid) <= width / 2)
            print(f"partition {pid}: every coordinate within its layer; width / sigma median "
                  f"{np.median(width) / spec.sigma:.3f}, max |Dt - mid| / sigma {np.abs(clipped - mid).max() / spec.sigma:.3f}"
                  f" (the accountant's error: N(0, sigma^2), unbounded)")
        else:
            noise = spec.sigma * codec._private_rng(key).standard_normal(d)
            err = np.abs(hat - noise - clipped).max()
            assert err <= 1e-6 * np.abs(hat).max() and err < 1e-4 * spec.sigma
            print(f"partition {pid}: clipped update recovered to {err:.2e} (sigma {spec.sigma:.3f})")


# ---------------------------------------------------------------------------------------------
# The network observer and the log reader: counts and records independent of the sample
# ---------------------------------------------------------------------------------------------
def _nonce_whose_sample(strategy: GauLRQ, node_ids: list[int], pick) -> str:
    """A public nonce whose B-of-N sample of round 1 satisfies ``pick(partition ids)`` (searched, not forced)."""
    first = min(node_ids)
    for i in range(10_000):
        strategy.stream_nonce = f"bytes-{i:06d}"  # fixed width, as os.urandom(8).hex()
        strategy._set_run_keys()
        pids = [n - first for n in strategy._sample(0, node_ids)]
        if pick(pids):
            return strategy.stream_nonce
    raise AssertionError("no nonce found")


@pytest.mark.parametrize("method", ["lrq", "gaussian", "qg", "bq"])
def test_counted_bytes_do_not_depend_on_which_clients_were_sampled(method, tmp_path):
    """N 130, B 6: a round whose sampled partition ids (and node ids: 2^63 - 64 + i, whose varint widths differ
    too) are all below 64 and one where they are all above carry the same counted bytes, up and down."""
    n, b, d = 130, 6, 300
    first = 2**63 - 64  # partitions < 64 get node ids < 2^63 (9-byte varints), the others >= 2^63 (10 bytes)
    master = _master(f"bytes-{method}")
    keys = write_client_keys(master, n, tmp_path / "keys")
    kw = dict(num_clients=n, clients_per_round=b, clip=CLIP, num_rounds=1, noise_multiplier=1.0, epsilon=1e4,
              method=method, secret=master, fraction_evaluate=0.0, bq_bits=8)
    ids = list(range(first, first + n))
    probe = GauLRQ(**kw, stream_nonce="search")
    low = _nonce_whose_sample(probe, ids, lambda p: max(p) < 64)
    high = _nonce_whose_sample(probe, ids, lambda p: min(p) >= 64)
    rng = np.random.default_rng(0)
    updates = {i: (rng.standard_normal(d) * rng.uniform(0.001, 0.1)).astype(np.float32) for i in range(n)}
    counted = {}
    for name, nonce in (("low", low), ("high", high)):
        s = GauLRQ(**kw, stream_nonce=nonce)
        with _task_identity():
            s.start(grid=InProcessGrid(_app(updates, make_gau_lrq_mod(key_dir=keys)), n, first_node_id=first),
                    num_rounds=1, initial_arrays=ArrayRecord({"w": Array(np.zeros(d, np.float32))}))
        r = s.rounds[0]
        assert r["received"] == b
        counted[name] = {k: r[k] for k in ("bytes_carried", "bytes_payload", "bytes_downlink", "bits_algorithmic")}
    print(f"{method}: {counted}")
    assert counted["low"] == counted["high"]


def test_log_records_name_no_sampled_or_failed_node(tmp_path, caplog):
    """A run in which sampled clients fail: no log record at INFO or above names a sampled or failed node id or a
    partition id (the sample is hidden); the DEBUG records, the server's own view, do."""
    n, b, d = 12, 4, 30
    first = 7_340_000_000_000  # node ids no other number in a log line can look like
    master = _master("logs")
    keys = write_client_keys(master, n, tmp_path / "keys")
    updates = _updates(3, d)
    updates.update({i: updates[i % N] for i in range(N, n)})
    app = ClientApp(mods=[make_gau_lrq_mod(key_dir=keys)])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        pid = int(ctx.node_config["partition-id"])
        if pid % 2 == 0:
            raise RuntimeError("this client's training failed")
        w = msg.content["arrays"]["w"].numpy()
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array((w + updates[pid]).astype(np.float32))}),
                                   "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    s = GauLRQ(num_clients=n, clients_per_round=b, clip=CLIP, num_rounds=3, noise_multiplier=1.0, epsilon=1e4,
               secret=master, fraction_evaluate=0.0, keep_decoded=True, max_failed_rounds=5)
    caplog.set_level(logging.DEBUG, logger="flwr")
    with _task_identity():
        s.start(grid=InProcessGrid(app, n, first_node_id=first), num_rounds=3,
                initial_arrays=ArrayRecord({"w": Array(np.zeros(d, np.float32))}))
    assert sum(r["failed"] for r in s.rounds) > 0  # the run had failures
    sampled = {first + pid for k in s.decoded for pid in s.decoded[k]}
    public = [r for r in caplog.records if r.levelno >= logging.INFO]
    text = "\n".join(r.getMessage() for r in public)
    assert "replied with an error" in text  # the failures are logged, as counts
    assert not [node for node in range(first, first + n) if str(node) in text], text
    assert not re.search(r"partition[- ]?(id)?\s*\d", text)
    debug = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    assert any(str(node) in debug for node in range(first, first + n) if node not in sampled)  # the failed ones


def test_lrq_keys_command_exports_each_clients_key_and_refuses_a_key_as_the_master(tmp_path, capsys):
    """``flower-dp lrq-keys``: the files a deployment gives its SuperNodes, one each, equal to what the server
    derives; given a client key file instead of the master secret it refuses, naming why."""
    from flower_dp.cli import main

    secret_file = tmp_path / "lrq.secret"
    codec.create_secret_file(secret_file)
    master = read_secret_file(secret_file)
    assert main(["lrq-keys", "--secret-file", str(secret_file), "--num-clients", "4", "--out", str(tmp_path / "k")]) == 0
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == [f"client-{i}.key" for i in range(4)]
    assert all(read_key_file(tmp_path / "k" / f"client-{i}.key", i) == client_key(master, i) for i in range(4))
    assert main(["lrq-keys", "--secret-file", str(secret_file), "--num-clients", "4", "--partition-id", "2",
                 "--out", str(tmp_path / "one")]) == 0
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["client-2.key"]
    assert "client-2.key" in capsys.readouterr().out
    assert main(["lrq-keys", "--secret-file", str(tmp_path / "k" / "client-0.key"), "--num-clients", "4",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "is a client key file" in capsys.readouterr().err
