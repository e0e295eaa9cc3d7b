"""FedAvg -> GauLRQ in a user's ServerApp, in a real Flower simulation, and ``flwr run`` of the example with
Flower's default runtime dependency installation.

The user's ServerApp and ClientApp are this module's :data:`server_app` and :data:`client_app`, run by ``flwr run``
(:func:`flower_dp.experiments.flower_run.run_app`: a SuperLink and a Ray head of its own on 127.0.0.1) in other processes; the
ServerApp writes what the assertions read to the JSON file named in the run config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from flower_dp.clients.lrq_mod import make_gau_lrq_mod
from flower_dp.experiments.flower_run import run_app
from flwr_run_helper import flwr_run
from flower_dp.privacy.gau_lrq import client_level_epsilon
from flower_dp.strategies.gau_lrq import GauLRQ

N, D = 4, 30


def _metrics(pid: int, rnd: int) -> dict:
    return {"num-examples": 8 * (pid + 1), "loss": 2.0 / (pid + 1) + 0.5 * rnd}


def _client_app() -> ClientApp:
    """A user's ClientApp (train + evaluate); the Gau-LRQ line is the mod (each node reads its own key from the run
    config's ``lrq-key-dir``)."""
    app = ClientApp(mods=[make_gau_lrq_mod()])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid, rnd = int(context.node_config["partition-id"]), int(msg.content["config"]["server-round"])
        w = msg.content["arrays"]["w"].numpy()
        new = (w + 0.2 * (np.random.default_rng(pid).normal(size=w.shape) - w)).astype(np.float32)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord(_metrics(pid, rnd))}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 4, "acc": 0.25 * pid})}), reply_to=msg)

    return app


#: the user's ClientApp
client_app = _client_app()
#: the user's ServerApp, FedAvg swapped for GauLRQ; writes what the test reads to the run config's ``out-file``
server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    seen: list = []

    def train_aggr(records, key):
        seen.append([dict(next(iter(r.metric_records.values()))) for r in records])
        return aggregate_metricrecords(records, key)

    kw = dict(fraction_train=0.5, fraction_evaluate=1.0, min_train_nodes=2, min_evaluate_nodes=2,
              min_available_nodes=N, train_metrics_aggr_fn=train_aggr)
    FedAvg(**kw)  # what the user had
    strategy = GauLRQ(**kw, num_clients=N, clip=0.5, epsilon=100.0, noise_multiplier=1.0,
                      secret_file=str(rc["lrq-secret-file"]), key_dir=str(rc["lrq-key-dir"]), keep_decoded=True)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(D, np.float32))}),
                            num_rounds=2, timeout=300)
    Path(str(rc["out-file"])).write_text(json.dumps({
        "stop_reason": strategy.stop_reason, "B": strategy.B, "delta": strategy.delta, "seen": seen,
        "decoded_pids": {k: sorted(v) for k, v in strategy.decoded.items()},
        "num_releases": strategy.privacy_spent().num_releases,
        **{name: {r: dict(m) for r, m in getattr(result, name).items()}
           for name in ("evaluate_metrics_serverapp", "train_metrics_clientapp", "evaluate_metrics_clientapp")}}))


@pytest.mark.flower
def test_user_serverapp_swaps_fedavg_for_gau_lrq_with_the_same_keywords(tmp_path):
    """The user's FedAvg(**kw) becomes GauLRQ(**kw, num_clients, clip, epsilon): Result with eps per round, the
    user's train metrics averaged as FedAvg would (no key added, none changed), client evaluation on."""
    secret = tmp_path / "lrq.secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    out = tmp_path / "seen.json"
    run = run_app(f"{__name__}:server_app", f"{__name__}:client_app", num_supernodes=N, work_dir=tmp_path / "flwr",
                  pythonpath=[Path(__file__).resolve().parent], timeout_s=600,
                  run_config={"out-file": str(out), "lrq-secret-file": str(secret),
                              "lrq-key-dir": str(tmp_path / "keys")})
    assert out.is_file(), f"the ServerApp did not finish:\n{run.tail()}"
    got = json.loads(out.read_text())
    seen, decoded = got["seen"], {int(k): v for k, v in got["decoded_pids"].items()}
    server, train = ({int(r): m for r, m in got[name].items()}
                     for name in ("evaluate_metrics_serverapp", "train_metrics_clientapp"))
    assert got["stop_reason"] == "completed" and got["B"] == 2
    for r in (1, 2):
        eps = client_level_epsilon(np.full(r, 1.0), got["delta"], B=2, N=N)
        assert server[r]["eps_rigorous"] == pytest.approx(eps, rel=1e-9)
        assert server[r]["eps_paper"] > 0
        pids = decoded[r - 1]
        assert sorted(seen[r - 1], key=lambda m: m["num-examples"]) == [_metrics(p, r) for p in pids]
        w = np.array([8.0 * (p + 1) for p in pids])
        want = float(np.sum(w * np.array([_metrics(p, r)["loss"] for p in pids])) / w.sum())
        assert train[r] == pytest.approx({"loss": want}, rel=1e-12)
    assert set(got["evaluate_metrics_clientapp"]) == set()  # evaluated, but unpublished without an aggregator
    assert got["num_releases"] == 2


@pytest.mark.slow
@pytest.mark.flower
def test_flwr_run_example_with_flowers_default_runtime_dependency_installation(tmp_path):
    """`flwr run examples/gau_lrq` with FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION unset: Flower's `uv sync`
    has nothing to fetch (flower-dp comes from this environment), the run trains and writes eps per round."""
    out = tmp_path / "out"
    app = Path(__file__).resolve().parents[1] / "examples" / "gau_lrq"
    text = flwr_run(app, tmp_path, federation_config="num-supernodes=4", runtime_install=True,
                    run_config=(f"num-clients=4 clients-per-round=2 num-rounds=2 local-steps=1 test-samples=100 "
                                f"out-dir='{out}' lrq-secret-file='{tmp_path / 'lrq.secret'}' "
                                f"lrq-key-dir='{tmp_path / 'keys'}'"))
    assert "App dependencies installed successfully via uv sync" in text, text[-4000:]
    res = out / "lrq" / "results.json"
    assert res.is_file(), text[-4000:]
    doc = json.loads(res.read_text())
    assert doc["rounds_completed"] == 2 and doc["stop_reason"] == "completed"
    assert 0 < doc["eps_rigorous_per_round"][0] < doc["eps_rigorous_per_round"][1]
