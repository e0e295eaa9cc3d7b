"""The ClientApp of ``run_gau_lrq(backend="simulation")`` (:mod:`flower_dp.experiments.gau_lrq_app`), in-process.

The simulation's SuperNodes run the module-level ``client_app``, which runs either the caller's ClientApp carried as
a :mod:`flower_dp.experiments.handoff` file (``client-app-file``) or ``make_client_app`` (each node's key from ``lrq-key-dir``).  Both
must answer as the ClientApp they stand for: the same seeded run through :class:`InProcessGrid` gives the same numbers.
The simulation itself: tests/test_gau_lrq_flower.py.
"""

from __future__ import annotations

from flwr.clientapp import ClientApp

from flower_dp.experiments import handoff
from flower_dp.clients.lrq_mod import make_gau_lrq_mod
from flower_dp.mechanisms.gau_lrq_codec import write_client_keys
from flower_dp.experiments import gau_lrq_app
from flower_dp.experiments.gau_lrq import (InProcessGrid, _task_identity, make_client_app, reproducible_secret,
                                           run_inputs, train)
from flower_dp.strategies.gau_lrq import GauLRQ

N = 6
INPUTS = dict(dataset="synthetic_fashion_mnist", model="logreg", seed=0, per_class=5, local_steps=2, lr=0.1,
              test_samples=200)


def _results(app: ClientApp, run_config: dict) -> dict:
    """GauLRQ for 2 rounds on N in-process nodes running ``app`` with ``run_config``: its results (no wall time)."""
    strategy = GauLRQ(num_clients=N, clients_per_round=3, clip=0.5, num_rounds=2, noise_multiplier=0.5,
                      epsilon=1e4, secret=reproducible_secret(0), stream_nonce="app", fraction_evaluate=0.0)
    initial, train_cfg, ev = run_inputs(**INPUTS)
    with _task_identity():
        strategy.start(grid=InProcessGrid(app, N, run_config), initial_arrays=initial, train_config=train_cfg,
                       evaluate_fn=ev)
    return strategy.results()


def test_a_pickled_client_app_runs_as_the_original(tmp_path, monkeypatch):
    """``client-app-file``: the module-level ClientApp loads the caller's ClientApp from its hand-off file and the
    run gives exactly the numbers of the original app; the secret file is not read for it."""
    keys = str(write_client_keys(reproducible_secret(0), N, tmp_path / "keys"))
    own = ClientApp(mods=[make_gau_lrq_mod(key_dir=keys)])
    own.train()(train)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    pickled = handoff.write(own, folder / "client_app.pkl")
    want = _results(own, {})
    reads = []
    monkeypatch.setattr(handoff, "read", lambda path, _read=handoff.read: reads.append(path) or _read(path))
    got = _results(gau_lrq_app.client_app,
                   {"client-app-file": str(pickled), "lrq-secret-file": str(tmp_path / "no-such-file")})
    assert got["stop_reason"] == "completed" and got["rounds_completed"] == 2
    assert got == want
    assert reads == [pickled]  # loaded once for all nodes and rounds


def test_without_a_client_app_file_the_clients_run_make_client_app_on_the_key_folder(tmp_path):
    """No ``client-app-file``: ``make_client_app()`` reading each node's own key from ``lrq-key-dir``, the same
    numbers as that app given the folder itself."""
    keys = str(write_client_keys(reproducible_secret(0), N, tmp_path / "keys"))
    want = _results(make_client_app(keys), {})
    got = _results(gau_lrq_app.client_app, {"client-app-file": "", "lrq-key-dir": keys})
    assert got["stop_reason"] == "completed" and got == want
