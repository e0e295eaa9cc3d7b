"""GauLRQ as a drop-in for Flower's FedAvg, in-process (no Ray).

A user's ServerApp code calls ``FedAvg(**kw).start(...)``; swapping in ``GauLRQ(**kw, num_clients=N, clip=...,
epsilon=...)`` must accept the same keyword arguments (or refuse what it cannot honour in one error that names
the GauLRQ setting), keep Flower's evaluation defaults and logging, give back the user's train metrics
unaltered, and report the privacy spent per round in the ``Result``.  The Flower-simulation version of the
swap is ``tests/test_gau_lrq_flower_dropin.py``.
"""

from __future__ import annotations

import inspect
import logging
import math

import numpy as np
import pytest

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from flower_dp.experiments.gau_lrq import InProcessGrid, _task_identity
from flower_dp.privacy.gau_lrq import client_level_epsilon
from flower_dp.privacy import paper
from flower_dp.strategies.gau_lrq import GauLRQ
from lrq_keys import keyed_mod

SECRET = b"0123456789abcdef-dropin-test"
N, D, CLIP, Z = 6, 50, 0.5, 1.2


def _user_metrics(pid: int, rnd: int) -> dict:
    """What the user's train function reports (partition-dependent, so an average is checkable)."""
    return {"num-examples": 10 * (pid + 1), "train-loss": 1.0 / (pid + 1) + rnd, "steps": 3}


def _client_app() -> ClientApp:
    """An ordinary Flower ClientApp (train + evaluate); the only Gau-LRQ line is the mod."""
    app = ClientApp(mods=[keyed_mod(SECRET)])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        pid, rnd = int(ctx.node_config["partition-id"]), int(msg.content["config"]["server-round"])
        w = msg.content["arrays"]["w"].numpy()
        new = (w + 0.1 * (np.random.default_rng(pid).normal(size=w.shape) - w)).astype(np.float32)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}),
                                   "metrics": MetricRecord(_user_metrics(pid, rnd))}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, ctx: Context) -> Message:
        pid = int(ctx.node_config["partition-id"])
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 5, "eval-acc": 0.1 * pid})}),
                       reply_to=msg)

    return app


def _initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(D, np.float32))})


def _fedavg_kwargs(capture: list | None = None) -> dict:
    """The keyword arguments a user passes to FedAvg (N = 6 SuperNodes)."""
    def train_aggr(records, key):
        if capture is not None:
            capture.append([dict(next(iter(r.metric_records.values()))) for r in records])
        return aggregate_metricrecords(records, key)

    return dict(fraction_train=0.5, fraction_evaluate=0.5, min_train_nodes=2, min_evaluate_nodes=2,
                min_available_nodes=N, weighted_by_key="num-examples", arrayrecord_key="arrays",
                configrecord_key="config", train_metrics_aggr_fn=train_aggr,
                evaluate_metrics_aggr_fn=aggregate_metricrecords)


def _gau(**kw) -> GauLRQ:
    return GauLRQ(**{**dict(num_clients=N, clip=CLIP, epsilon=1e3, noise_multiplier=Z, secret=SECRET,
                            stream_nonce="dropin"), **kw})


def _start(strategy, num_rounds=2, **kw):
    with _task_identity():
        return strategy.start(grid=InProcessGrid(_client_app(), N), initial_arrays=_initial(), num_rounds=num_rounds,
                              **kw)


def test_gau_lrq_accepts_every_fedavg_keyword_argument():
    """GauLRQ's signature holds FedAvg's (installed Flower) with FedAvg's defaults; start has FedAvg's signature.

    ``start`` may add Flower 1.43's ``should_stop`` after FedAvg's parameters, optional, where the installed Flower's
    FedAvg lacks it; where it has it, the two lists are equal.
    """
    fed = inspect.signature(FedAvg.__init__).parameters
    gau = inspect.signature(GauLRQ.__init__).parameters
    missing = [n for n in fed if n != "self" and n not in gau]
    assert not missing, f"FedAvg arguments GauLRQ does not take: {missing}"
    for name in ("fraction_evaluate", "min_evaluate_nodes", "weighted_by_key", "arrayrecord_key", "configrecord_key"):
        assert gau[name].default == fed[name].default, name
    s_fed = inspect.signature(FedAvg.start).parameters
    s_gau = inspect.signature(GauLRQ.start).parameters
    assert list(s_gau)[:len(s_fed)] == list(s_fed)
    extra = list(s_gau)[len(s_fed):]
    assert extra in ([], ["should_stop"]), extra
    if extra:
        assert s_gau["should_stop"].default is None


def test_fedavg_keywords_are_honoured_and_sample_size_follows_fedavgs_rule():
    """fraction_train=0.5, min_train_nodes=2 of N=6 -> FedAvg trains max(int(3.0), 2) = 3 nodes: GauLRQ's B = 3."""
    kw = _fedavg_kwargs()
    FedAvg(**kw)  # the same arguments are valid for FedAvg
    s = _gau(**kw)
    assert s.B == 3 and s.fraction_train == 0.5 and s.min_train_nodes == 3 and s.min_available_nodes == N
    assert s.fraction_evaluate == 0.5 and s.min_evaluate_nodes == 2
    assert _gau().B == N and _gau().fraction_evaluate == 1.0  # FedAvg's defaults: every node trains and evaluates
    assert _gau(fraction_train=0.1).B == 2  # FedAvg's min_train_nodes default (2) applies


@pytest.mark.parametrize("kw,names", [
    (dict(clients_per_round=2, fraction_train=0.5), ["fraction_train=0.5", "clients_per_round=2"]),
    (dict(clients_per_round=2, min_train_nodes=4, min_available_nodes=9),
     ["min_train_nodes=4", "min_available_nodes=9"]),
    (dict(min_train_nodes=7), ["min_train_nodes=7"]),
])
def test_what_cannot_be_honoured_is_one_error_naming_the_gau_lrq_setting(kw, names):
    with pytest.raises(ValueError) as err:
        _gau(**kw)
    msg = str(err.value)
    assert all(n in msg for n in names) and "set clients_per_round=B and num_clients=N" in msg, msg


def test_num_rounds_given_once_in_start_plans_the_schedule_and_logs_like_flower(caplog):
    """num_rounds only in start(); Flower's [ROUND r/R] lines and final summary; eps per round in the Result."""
    s = _gau(**_fedavg_kwargs())
    assert s.K is None
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="flwr"):
            result = _start(s, num_rounds=2)
    finally:
        flwr_logger.removeHandler(caplog.handler)
    text = caplog.text
    for line in ("Starting GauLRQ strategy:", "Number of rounds: 2", "[ROUND 1/2]", "[ROUND 2/2]",
                 "Strategy execution finished in", "Final results:", "Privacy spent: epsilon=",
                 "aggregate_train: Received 3 results and 0 failures"):
        assert line in text, line
    assert s.K == 2 and s.stop_reason == "completed"
    for r in (1, 2):
        m = result.evaluate_metrics_serverapp[r]
        assert m["eps_rigorous"] == pytest.approx(client_level_epsilon(np.full(r, Z), s.delta, B=3, N=N), rel=1e-9)
        assert m["eps_paper"] == pytest.approx(paper.paper_eps_gau_lrq(np.full(r, Z), s.delta, B=3, N=N), rel=1e-9)
    assert result.evaluate_metrics_serverapp[1]["eps_rigorous"] < result.evaluate_metrics_serverapp[2]["eps_rigorous"]
    assert set(result.evaluate_metrics_clientapp) == {1, 2}  # client evaluation ran (fraction_evaluate=0.5)


def test_user_train_metrics_come_back_unaltered():
    """The aggregation function sees exactly the user's MetricRecords (no partition-id, no gau-lrq.* key), and
    the Result holds FedAvg's weighted average of them."""
    seen: list = []
    s = _gau(**_fedavg_kwargs(capture=seen), keep_decoded=True)
    result = _start(s, num_rounds=2)
    assert len(seen) == 2
    for rnd, records in enumerate(seen, start=1):
        pids = sorted(s.decoded[rnd - 1])  # partitions that trained in this round
        assert sorted(records, key=lambda m: m["num-examples"]) == [_user_metrics(p, rnd) for p in pids]
        w = np.array([10.0 * (p + 1) for p in pids])
        want = float(np.sum(w * np.array([_user_metrics(p, rnd)["train-loss"] for p in pids])) / w.sum())
        got = result.train_metrics_clientapp[rnd]
        assert set(got) == {"train-loss", "steps"} and got["train-loss"] == pytest.approx(want, rel=1e-12)
        assert got["steps"] == pytest.approx(3.0)


def test_default_publishes_no_client_metrics_but_still_reports_eps():
    """Without an aggregation function (or debug_metrics) client metrics stay unpublished (uncharged statistics);
    the privacy metrics are there every round all the same."""
    s = _gau(clients_per_round=2)
    result = _start(s, num_rounds=2,
                    evaluate_fn=lambda r, a: MetricRecord({"norm": float(np.linalg.norm(a["w"].numpy()))}))
    assert result.train_metrics_clientapp == {} and result.evaluate_metrics_clientapp == {}
    assert set(result.evaluate_metrics_serverapp[0]) == {"norm"}
    assert set(result.evaluate_metrics_serverapp[2]) == {"norm", "eps_rigorous", "eps_paper"}
    spent = s.privacy_spent()
    assert spent.epsilon == result.evaluate_metrics_serverapp[2]["eps_rigorous"] and spent.num_releases == 2
    assert not math.isinf(spent.epsilon)


def test_no_flower_internal_imports():
    """Public Flower API only: no flwr.supercore (internals) in the Gau-LRQ strategy and mod."""
    import flower_dp.clients.lrq_mod as mod
    import flower_dp.strategies.flower_privacy as fpv
    import flower_dp.strategies.gau_lrq as strat

    for m in (strat, mod, fpv):
        src = inspect.getsource(m)
        assert "flwr.supercore" not in src and "get_all_nested_objects" not in src, m.__name__
