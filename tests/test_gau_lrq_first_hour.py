"""What a Flower user meets in the first hour with GauLRQ (in-process, no Ray): the secret and key files, the mod check,
the node count, FedAvg's positional arguments, the warnings.  The Flower-simulation checks (a size mismatch
fails fast, the README's diff runs) are in ``test_gau_lrq_flower.py`` and ``test_readme_gau_lrq_diff.py``.
"""

from __future__ import annotations

import logging
import os
import stat

import numpy as np
import pytest

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_dp.experiments.gau_lrq import InProcessGrid, _task_identity
from flower_dp.mechanisms.gau_lrq_codec import load_secret
from flower_dp.strategies.gau_lrq import NOISE_TO_CLIP_LIMIT, GauLRQ
from lrq_keys import keyed_mod

N, D = 6, 40


def _train(msg: Message, ctx: Context) -> Message:
    """An ordinary train function (as Flower's template: reads the model from the message)."""
    w = msg.content["arrays"]["w"].numpy()
    new = w + 0.01 * np.random.default_rng(int(ctx.node_config["partition-id"])).normal(size=w.shape)
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new.astype(np.float32))}),
                               "metrics": MetricRecord({"num-examples": 10, "train_loss": 1.0})}), reply_to=msg)


def _app(mods) -> ClientApp:
    app = ClientApp(mods=mods)
    app.train()(_train)
    return app


class _Recorder(InProcessGrid):
    """InProcessGrid that keeps every message sent and every reply."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent, self.replies = [], []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.sent += messages
        out = super().send_and_receive(messages, timeout=timeout)
        self.replies += out
        return out


def _gau(**kw) -> GauLRQ:
    return GauLRQ(**{**dict(num_clients=N, clients_per_round=3, clip=0.5, epsilon=1e3, noise_multiplier=1.0,
                            secret=b"first-hour-secret-0123456789", fraction_evaluate=0.0), **kw})


def _start(strategy, grid, num_rounds=2):
    with _task_identity():
        return strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(D, np.float32))}),
                              num_rounds=num_rounds)


def test_client_app_without_the_mod_never_sends_model_weights():
    """No mod: the probe (no model in it) fails in the user's train function, GauLRQ stops before any train
    message carries the model, and no reply holds an ArrayRecord."""
    grid = _Recorder(_app([]), N)
    with pytest.raises(RuntimeError, match=r"6 of 6 ClientApps cannot take part.*gau_lrq_mod"):
        _start(_gau(), grid)
    assert grid.sent and all(len(m.content.array_records) == 0 for m in grid.sent)  # the model never left
    assert all(len(r.content.array_records) == 0 for r in grid.replies if not r.has_error())
    assert all(r.has_error() for r in grid.replies)


def test_client_app_with_another_secret_is_refused_before_training():
    grid = _Recorder(_app([keyed_mod(b"another-secret-0123456789abc")]), N)
    with pytest.raises(RuntimeError, match="holds a key that is not derived from this server's master secret"):
        _start(_gau(), grid)
    assert all(len(m.content.array_records) == 0 for m in grid.sent)


def test_with_the_mod_the_probe_passes_once_and_training_runs():
    grid = _Recorder(_app([keyed_mod(b"first-hour-secret-0123456789")]), N)
    _start(_gau(), grid, num_rounds=2)
    probes = [m for m in grid.sent if len(m.content.array_records) == 0]
    assert len(probes) == N  # every node once, before round 1
    assert len(grid.sent) == N + 2 * 3


def test_should_stop_ends_the_loop_after_its_round():
    """Flower 1.43's ``should_stop(round, result)``: called after each round; True stops there, results kept."""
    grid = _Recorder(_app([keyed_mod(b"first-hour-secret-0123456789")]), N)
    seen = []
    s = _gau()
    with _task_identity():
        s.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(D, np.float32))}), num_rounds=4,
                should_stop=lambda rnd, result: seen.append(rnd) or rnd == 2)
    assert seen == [1, 2] and len(s.rounds) == 2 and s.stop_reason == "should_stop: round 2"


def test_node_count_mismatch_fails_at_once_in_simulation():
    import time

    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"num_clients N = 7 .*got 6 connected SuperNodes"):
        _start(_gau(num_clients=7), _Recorder(_app([keyed_mod(b"x" * 20)]), N))
    took = time.monotonic() - t0
    print(f"in-process size mismatch failed after {took:.1f} s")
    assert took < 30  # the count is final after 1 s without change; the rest is the start's own set-up


def test_missing_secret_file_is_created_0600_and_its_path_logged(tmp_path, caplog):
    path = tmp_path / "sub" / "gau_lrq.secret"
    with caplog.at_level(logging.WARNING):
        s = GauLRQ(num_clients=N, clip=0.5, epsilon=8.0, secret_file=str(path))
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    assert str(path) in caplog.text and "created the master secret file" in caplog.text
    assert load_secret(secret_file=str(path)) == path.read_bytes() and s.secret_file == str(path)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        GauLRQ(num_clients=N, clip=0.5, epsilon=8.0, secret_file=str(path))  # exists: reused, not re-created
    assert "created the master secret file" not in caplog.text


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_secret_file_readable_by_others_is_refused(tmp_path, mode):
    path = tmp_path / "s.secret"
    path.write_bytes(os.urandom(32))
    path.chmod(mode)
    with pytest.raises(ValueError, match=rf"{path}.*got mode {mode:04o}.*chmod 600"):
        GauLRQ(num_clients=N, clip=0.5, epsilon=8.0, secret_file=str(path))
    with pytest.raises(ValueError, match="chmod 600"):
        load_secret(secret_file=str(path))


def test_key_file_readable_by_others_is_refused_by_the_client(tmp_path):
    from flower_dp.mechanisms.gau_lrq_codec import read_key_file, write_client_keys

    keys = write_client_keys(b"first-hour-secret-0123456789", N, tmp_path / "keys")
    path = keys / "client-2.key"
    path.chmod(0o640)
    with pytest.raises(ValueError, match=rf"{path}.*got mode 0640.*chmod 600"):
        read_key_file(path, 2)


def test_missing_secret_file_on_the_server_names_what_it_is_and_how_to_make_it(tmp_path):
    with pytest.raises(ValueError, match=r"does not exist.*GauLRQ\(secret_file=...\) creates it.*0o600"):
        load_secret(secret_file=str(tmp_path / "none.secret"))


def test_fedavg_positional_arguments():
    """GauLRQ(0.5, ...) is FedAvg(0.5): fraction_train; GauLRQ(1.0) alone names what it still needs."""
    s = GauLRQ(0.5, 0.0, num_clients=N, clip=0.5, epsilon=8.0, secret=b"y" * 20)
    assert (s.B, s.fraction_evaluate) == (3, 0.0)
    with pytest.raises(ValueError, match="num_clients"):
        GauLRQ(1.0)


def test_learning_warning_names_the_numbers_and_what_helps(caplog):
    """20 clients, 5 per round, eps 8, the 62k-parameter template CNN: noise ~70x the clip norm -> WARNING."""
    s = GauLRQ(num_clients=20, clients_per_round=5, clip=0.5, epsilon=8.0, num_rounds=5, secret=b"z" * 20)
    with caplog.at_level(logging.WARNING):
        out = s.check_learning(62006)
    assert out["ratio"] > 60 and "learning is implausible" in caplog.text and "B >= " in caplog.text
    ok = GauLRQ(num_clients=100, clients_per_round=50, clip=0.5, epsilon=8.0, num_rounds=5, secret=b"z" * 20)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert ok.check_learning(62006)["ratio"] < NOISE_TO_CLIP_LIMIT
    assert "learning is implausible" not in caplog.text


def test_train_metrics_warning_when_not_published(caplog):
    with caplog.at_level(logging.WARNING):
        _start(_gau(), _Recorder(_app([keyed_mod(b"first-hour-secret-0123456789")]), N), num_rounds=1)
    assert "train metrics (e.g. train_loss) are not published" in caplog.text
