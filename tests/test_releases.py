"""Every release is charged or not released (issue 12, item 3; docs/privacy.md).

Inspects everything a push-sum node sends (shares and reduce contributions on the in-process
backend, the relay transport's ClientApp replies, the Ray hosts' segment results) and every Gau-LRQ
client reply, plus the results.json / history.csv of the runner and of both strategies, against an
explicit allow-list.  Any key that is not on it fails the test with its name: a new statistic must be
public by construction, charged by the accountant, or kept behind ``debug_metrics``.
"""

from __future__ import annotations

import csv
import functools
import json
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flower_dp.clients import registry
from flower_dp.clients.push_sum_app import build_plan_node, handle_content
from flower_dp.gossip import Contribution, Share, reduce_contributions, route_shares
from flower_dp.gossip.relay import ARRAYS_KEY, MESSAGE_KEYS, from_records
from flower_dp.models import build_model
from flower_dp.releases import DEBUG_ONLY_NODE_METRICS, HEURISTIC_BROADCAST_METRICS, PUBLIC_NODE_METRICS, node_metrics
from flower_dp.topology import make_topology

# ------------------------------------------------------------------------------------------------ allow-lists
#: Tensors a push-sum share may carry: the noised message only.  "x": the noised half step (push-sum
#: algorithms) or the model a D-PSGD node sends (its own x, a post-processing of earlier noised steps, or
#: DPPS/PEDFL's Laplace-noised model); "q": DP-CSGP's compressed noised difference.
SHARE_TENSORS = {"x", "q"}
#: Reduce contributions (sent in the clear to the reducer / every Ray host).  DPPS family only: a heuristic
#: algorithm with no DP proof, reported as eps_heuristic, whose protocol broadcasts its data-dependent
#: sensitivity estimate "S"; "S_real" is the simulation's oracle (max pairwise L1 of the clean half steps),
#: never a deployment mode.  Whitelisted so that the heuristic is visible; nothing here is charged.
CONTRIBUTIONS = {"S", "S_real"}
#: Per-node metrics that leave a node by default (flower_dp.releases): public schedules and message sizes,
#: plus DPPS's broadcast sensitivity (heuristic, see above).
NODE_METRICS = set(PUBLIC_NODE_METRICS) | set(HEURISTIC_BROADCAST_METRICS)
#: History row keys besides node metrics: iteration / round, total bits sent, test metrics of the
#: network-average model on public test data.
ROW_KEYS = {"k", "round", "bits_total", "acc_avg", "test_loss_avg", "acc_nodes_mean", "accuracy", "loss", "eval"}
#: privacy_report keys: eps numbers (any "eps*" key) and public descriptors of the mechanism.
PRIVACY_KEYS = {"delta", "accountant", "adjacency", "heuristic", "steps_charged", "memory_bytes", "node", "note",
                "privacy_note", "sampling", "not_accounted", "mechanism", "noise_sampler"}
#: A node state's public part (the coordinator's checkpoint): the noised push-sum state, the ledger.
STATE_KEYS = {"node_id", "algorithm", "x", "w", "bits_sent", "accountant", "exact_ledger", "extra"}
#: extra state that is a post-processing of noised values: D-PSGD's pending step lr (g + noise); DP-CSGP's
#: noised half step, its reference x_hat (the sum of its sent, noised q) and s (the sum of received q);
#: set-up flags
STATE_EXTRA = {"pending", "x_half", "x_hat", "s", "ready"}
#: KNOWN, not fixed here (reported): node-private state that the relay's checkpoint request ("state") and
#: the DPPS flush ("eval_params" with the head) send to the coordinator.  Listed so that nothing new joins it.
KNOWN_STATE_EXTRA = {
    "table": "PrivSGP-VR: clean per-block clipped gradients (coordinator checkpoint)",
    "avg": "PrivSGP-VR: their clean average (coordinator checkpoint)",
    "l": "DPPS family: the local head, trained without noise (heuristic algorithm)",
    "S_prev": "DPPS family: the previous broadcast sensitivity (heuristic algorithm)",
    "L1_prev": "DPPS family: L1 norm of the previous Laplace noise (heuristic algorithm)",
}
RELAY_REPLY = {"shares", "metrics", "contrib", "eval_params", "privacy", "state"}
RESULTS_TOP = {"name", "status", "error", "config", "seed", "algorithm", "backend", "num_iters_requested", "num_iters",
               "iters_per_round", "info", "history", "privacy", "bits_sent_per_node", "failures", "wall_time_s",
               "train_cpu_s", "timings", "versions", "uncharged_statistics_released", "release_warning",
               "wall_time_s_with_startup", "stop_reason",
               "noise",  # the noise mode label (secret | reproducible) and its note: public, nothing of the data
               "party"}  # the party the noise is calibrated to (the run's configuration): public


def _fail_unknown(keys, allowed, what: str) -> None:
    bad = sorted(str(k) for k in keys if k not in allowed and not str(k).startswith("eps"))
    assert not bad, f"{what}: {bad} leave(s) the node but are not on the allow-list (public, charged or debug-only)"


def _check_share(s: Share, k: int) -> None:
    assert isinstance(s, Share) and s.k == k
    _fail_unknown(s.tensors, SHARE_TENSORS, f"share {s.sender}->{s.receiver} tensors")
    assert s.weight is None or isinstance(s.weight, float), f"push-sum weight must be a float, got {type(s.weight)}"
    assert isinstance(s.wire_bits, int)


def _check_contrib(c) -> None:
    if c is None:
        return
    _fail_unknown(c, CONTRIBUTIONS, "reduce contribution")
    assert all(isinstance(v, Contribution) for v in c.values())


# ------------------------------------------------------------------------------------------------ set-ups
DP = dict(epsilon=2.0, delta=1e-4, accountant="rdp")
G = dict(G=2.0, **DP)
DPPS = dict(lr=0.1, batch_size=8, gamma_n=1e-3, b=5.0)
CASES = [
    ("dyn_d2p", dict(lr=0.1, batch_size=8, variant="dyn", **DP), "logreg", "random_irregular"),
    ("dp_csgp", dict(lr=0.1, batch_size=8, G=1.0, compressor="rand_0.5", gamma_c=0.5, **DP), "logreg",
     "random_irregular"),
    ("privsgp_vr", dict(lr=0.05, batch_size=8, **G), "logreg", "random_irregular"),
    ("privsgp", dict(lr=0.05, batch_size=8, **G), "logreg", "random_irregular"),
    ("dp2_sgd", dict(lr=0.05, batch_size=8, **G), "logreg", "undirected_ring"),
    ("adp2_sgd", dict(lr=0.05, batch_size=8, **G), "logreg", "undirected_ring"),
    ("partpsp", dict(sync_period=3, measure_real=True, **DPPS), "partpsp_mlp", "exp_one_peer"),
    ("sgpdp", dict(sync_period=3, **DPPS), "partpsp_mlp", "exp_one_peer"),
    ("pedfl", dict(DPPS), "partpsp_mlp", "exp_one_peer"),
    ("sgp", dict(lr=0.1, batch_size=8), "logreg", "random_irregular"),  # not private: keeps its statistics
]
N, K, J = 4, 3, 16


def _factory(algorithm, params, model, topo_name, n=N, k=K):
    g = torch.Generator().manual_seed(0)
    if model == "logreg":
        model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
        data = [(torch.randn(J, 5, generator=g), torch.randint(0, 2, (J,), generator=g)) for _ in range(n)]
    else:
        model_fn = functools.partial(build_model, "partpsp_mlp", seed=0)
        data = [(torch.randn(J, 1, 28, 28, generator=g), torch.randint(0, 10, (J,), generator=g)) for _ in range(n)]
    topo = make_topology(topo_name, n, **({"seed": 2} if topo_name == "random_irregular" else {}))
    dim = sum(p.numel() for p in model_fn().parameters())
    plan = registry.prepare(algorithm, dict(params), n_nodes=n, samples_per_node=[J] * n, num_iters=k, dim=dim,
                            seed=1)
    return plan, functools.partial(build_plan_node, plan=plan, topology=registry.topology_for(plan, topo),
                                   model_fn=model_fn, data=data)


# ------------------------------------------------------------------------------------------------ in-process
@pytest.mark.parametrize("algorithm,params,model,topo", CASES, ids=[c[0] for c in CASES])
def test_inprocess_messages_and_released_metrics(algorithm, params, model, topo):
    """Every share and contribution a node sends, and the metrics that leave it, are on the allow-list;
    the uncharged statistics exist on the node and come out only with debug (or for a non-private plan)."""
    torch.set_num_threads(1)
    plan, factory = _factory(algorithm, params, model, topo)
    nodes = [factory(i, "cpu") for i in range(N)]
    for nd in nodes:
        nd.setup()
    for k in range(K):
        contribs = {nd.node_id: nd.contribute(k) for nd in nodes}
        for c in contribs.values():
            _check_contrib(c)
        reduced = reduce_contributions(contribs)
        outboxes = {}
        for nd in nodes:
            outboxes[nd.node_id] = nd.local_step(k, reduced)
            for s in outboxes[nd.node_id]:
                _check_share(s, k)
            released = node_metrics(nd)
            if plan.private:
                _fail_unknown(released, NODE_METRICS, f"{algorithm} node {nd.node_id} metrics")
                hidden = set(nd.last_metrics()) - set(released)
                assert "loss" in hidden and hidden <= DEBUG_ONLY_NODE_METRICS, hidden
                assert set(node_metrics(nd, debug=True)) == set(nd.last_metrics())  # the opt-in releases them
            else:  # no privacy claim (eps = inf): the statistics are released
                assert set(released) == set(nd.last_metrics()) and "loss" in released
        inboxes = route_shares(outboxes, [nd.node_id for nd in nodes])
        for nd in nodes:
            nd.mix(inboxes[nd.node_id])


# ------------------------------------------------------------------------------------------------ runner files
def _runner_cfg(debug: bool | None):
    from flower_dp.experiments import config_from_dict

    run = {"name": "t", "seed": 1, "num_iters": 4, "eval_every": 2, "progress": False}
    if debug is not None:
        run["debug_metrics"] = debug
    return config_from_dict({
        "run": run,
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 32, "test_samples": 100},
        "model": {"name": "logreg"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": "dyn_d2p", "params": {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4, "batch_size": 8,
                                                    "lr": 0.1, "accountant": "rdp"}},
    })


def _check_results_doc(doc: dict, rows_csv: list[dict]) -> None:
    _fail_unknown(doc, RESULTS_TOP, "results.json top level")
    for row in doc["history"]:
        _fail_unknown(row, NODE_METRICS | ROW_KEYS, "results.json history row")
    for row in rows_csv:
        _fail_unknown(row, NODE_METRICS | ROW_KEYS, "history.csv column")
    for p in doc["privacy"]["per_node"]:
        _fail_unknown(p, PRIVACY_KEYS, "results.json privacy.per_node")


def _read(out):
    doc = json.loads((out / "results.json").read_text())
    with open(out / "history.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return doc, rows


def test_runner_results_release_only_public_values_unless_debug(tmp_path, capsys):
    from flower_dp.experiments import run_experiment

    run_experiment(_runner_cfg(None), out_dir=tmp_path / "default")
    doc, rows = _read(tmp_path / "default")
    _check_results_doc(doc, rows)
    assert doc["uncharged_statistics_released"] is False and "noise_std" in doc["history"][0]
    assert doc["config"]["run"]["debug_metrics"] is False

    run_experiment(_runner_cfg(True), out_dir=tmp_path / "debug")
    doc, _ = _read(tmp_path / "debug")
    assert doc["uncharged_statistics_released"] is True and "not charge" in doc["release_warning"]
    assert {"loss", "clip_fraction", "grad_norm_mean", "batch"} <= set(doc["history"][0])
    assert "WARNING" in capsys.readouterr().err


def test_debug_metrics_must_be_a_bool():
    from flower_dp.errors import ConfigError

    with pytest.raises(ConfigError, match="run.debug_metrics must be true or false"):
        _runner_cfg("yes")


# ------------------------------------------------------------------------------------------------ relay transport
@pytest.fixture
def task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class RecordingGrid:
    """A Flower Grid stand-in running the ClientApp body (handle_message) and keeping every reply record."""

    def __init__(self, n: int, factory):
        self.factory = factory
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={"partition-id": i},
                                          state=RecordDict(), run_config={}) for i in range(n)}
        self.replies: list[tuple[str, dict]] = []

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        out = []
        for m in messages:
            content = handle_content(m.content, self.contexts[m.metadata.dst_node_id], 1,
                                     lambda i, spec, ctx: self.factory)
            rec = dict(content["pushsum"])
            if MESSAGE_KEYS["payload"] in rec:  # the typed payload: JSON tree + its ArrayRecord
                rec[MESSAGE_KEYS["payload"]] = (rec[MESSAGE_KEYS["payload"]], content.array_records.get(ARRAYS_KEY))
            self.replies.append((str(m.content["pushsum"][MESSAGE_KEYS["action"]]), rec))
            out.append(Message(content, reply_to=m))
        return out


def _check_relay_reply(action: str, rec: dict, private: bool, known: set) -> None:
    # param_layout: names and shapes of the model's parameters (the architecture, public), for Result.arrays
    _fail_unknown(rec, {"partition_id", "device", "param_layout", MESSAGE_KEYS["payload"]}, "relay reply record")
    if MESSAGE_KEYS["payload"] not in rec:
        return
    body = from_records(*rec[MESSAGE_KEYS["payload"]])
    _fail_unknown(body, RELAY_REPLY, f"relay {action} reply")
    for s in body.get("shares", []):
        _check_share(s, s.k)
    _check_contrib(body.get("contrib"))
    if private:
        _fail_unknown(body.get("metrics", {}), NODE_METRICS, f"relay {action} metrics")
    _fail_unknown(body.get("privacy", {}), PRIVACY_KEYS, "relay privacy report")
    if "state" in body:
        st = body["state"]
        _fail_unknown(st, STATE_KEYS, "relay node state")
        extra = set(st.get("extra", {}))
        _fail_unknown(extra, STATE_EXTRA | set(KNOWN_STATE_EXTRA), "relay node state extra")
        known |= extra & set(KNOWN_STATE_EXTRA)


RELAY_CASES = [c for c in CASES if c[0] in ("dyn_d2p", "dp_csgp", "privsgp_vr", "partpsp", "sgp")]


@pytest.mark.parametrize("algorithm,params,model,topo", RELAY_CASES, ids=[c[0] for c in RELAY_CASES])
def test_relay_replies_and_strategy_results(task_identity, tmp_path, algorithm, params, model, topo):
    """Every ClientApp reply of the relay transport, and the strategy's results.json / history.csv."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    torch.set_num_threads(1)
    plan, factory = _factory(algorithm, params, model, topo, k=4)
    grid = RecordingGrid(N, factory)
    strat = PushSumStrategy(N, {"algorithm": algorithm, "plan": plan}, num_iters=4, iters_per_round=2,
                            transport="relay", out_dir=tmp_path, timeout_s=5)
    strat.start(grid)
    known: set = set()
    assert any(a == "flush" for a, _ in grid.replies)
    for action, rec in grid.replies:
        _check_relay_reply(action, rec, plan.private, known)
    doc, rows = _read(tmp_path)
    if plan.private:
        _check_results_doc(doc, rows)
        assert doc["uncharged_statistics_released"] is False
        assert not any("loss" in h or "clip_fraction" in h for h in doc["history"])
    else:
        assert doc["uncharged_statistics_released"] is True and "loss" in doc["history"][0]
    assert known <= set(KNOWN_STATE_EXTRA)


def test_relay_debug_metrics_releases_and_says_so(task_identity, tmp_path):
    from flower_dp.strategies.push_sum import PushSumStrategy

    plan, factory = _factory(*CASES[0], k=2)
    strat = PushSumStrategy(N, {"algorithm": "dyn_d2p", "plan": plan}, num_iters=2, iters_per_round=2,
                            transport="relay", out_dir=tmp_path, timeout_s=5, debug_metrics=True)
    strat.start(RecordingGrid(N, factory))
    doc, _ = _read(tmp_path)
    assert doc["uncharged_statistics_released"] is True and "release_warning" in doc
    assert {"loss", "clip_fraction", "grad_norm_mean", "batch"} <= set(doc["history"][0])


# ------------------------------------------------------------------------------------------------ Ray transport
@pytest.fixture
def ray_local():
    ray = pytest.importorskip("ray")
    from flower_dp.gossip.ray_backend import ensure_ray

    if not ray.is_initialized():
        ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


def test_ray_hosts_release_only_public_metrics(ray_local):
    """The Ray hosts' segment results (what reaches the driver): public metrics only, unless debug."""
    from flower_dp.gossip.ray_backend import RayGossipBackend

    torch.set_num_threads(1)
    plan, factory = _factory(*CASES[0], k=4)
    be = RayGossipBackend(N, factory, num_hosts=2, timeout_s=60)
    try:
        be.setup()
        res = be.run_segment(0, 2)
        for i, rows in res.metrics.items():
            for row in rows:
                _fail_unknown(row, NODE_METRICS, f"ray node {i} metrics")
        _fail_unknown(res.metric_means(), NODE_METRICS, "ray metric means")
        for red in res.reduced:
            _fail_unknown(red or {}, CONTRIBUTIONS, "ray reduced values")
        dbg = be.run_segment(2, 4, debug_metrics=True)
        assert "loss" in dbg.metric_means() and "grad_norm_mean" in dbg.metric_means()
    finally:
        be.shutdown()


# ------------------------------------------------------------------------------------------------ Gau-LRQ
SECRET = b"0123456789abcdef-test-releases"
#: What a Gau-LRQ reply's metadata may hold: decoding parameters of the sent message (all functions of the
#: message or public: d, sigma, dtype, chunking, the keyed tag, packing lo/width, QG's noised scale and its
#: bit width b, BQ's public levels), the partition id (keys the stream), the message's bit counts.
LRQ_META = {"d", "sigma", "layer_dtype", "chunk_size", "tag", "lo", "width", "m_dtype", "scale", "b", "s", "m",
            "gau-lrq.partition-id", "gau-lrq.bits_algorithmic", "gau-lrq.bits_entropy"}
LRQ_META_NONE = LRQ_META | {"gau-lrq.norm", "gau-lrq.clipped", "gau-lrq.linf"}  # the update is sent in the clear
LRQ_PAYLOAD = {"m", "u", "t"}
USER_METRICS = {"num-examples": 10, "train-loss": 0.5}  # the user's own record: passed through untouched


@pytest.fixture
def flwr_identity():
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = old


def _user_train(msg: Message, ctx: Context) -> Message:
    w = msg.content["arrays"]["w"].numpy()
    new = w + 0.05 * np.random.default_rng(int(ctx.node_config["partition-id"])).normal(size=w.shape).astype(np.float32)
    return Message(RecordDict({"arrays": ArrayRecord({"w": Array(new)}), "metrics": MetricRecord(dict(USER_METRICS))}),
                   reply_to=msg)


def _train_message(strategy, rnd: int = 1):
    from lrq_keys import keyed_mod

    class _Grid:
        def get_node_ids(self):
            return list(range(100, 100 + strategy.N))

        def send_and_receive(self, messages, timeout=None):  # GauLRQ's probe, answered by the mod
            mod = keyed_mod(SECRET)
            return [mod(m, Context(run_id=1, node_id=m.metadata.dst_node_id, state=RecordDict(), run_config={},
                                   node_config={"partition-id": m.metadata.dst_node_id - 100}), _user_train)
                    for m in messages]

    return list(strategy.configure_train(rnd, ArrayRecord({"w": Array(np.zeros(300, np.float32))}), ConfigRecord(),
                                         _Grid()))


@pytest.mark.parametrize("method", ["lrq", "gaussian", "qg", "bq", "none"])
def test_gau_lrq_client_reply_is_the_encoded_update_only(flwr_identity, method):
    """The mod's reply: the encoded update and its public metadata; the user's own metrics, untouched, only when the
    server publishes them (a train_metrics_aggr_fn), else they stay on the client."""
    from flwr.app import MetricRecord

    from flower_dp.clients.lrq_mod import META_KEY, PAYLOAD_KEY
    from lrq_keys import keyed_mod
    from flower_dp.mechanisms.gau_lrq_codec import lrq_public_range
    from flower_dp.strategies.gau_lrq import GauLRQ

    for publish in (False, True):
        aggr = (lambda contents, key: MetricRecord({})) if publish else None
        s = GauLRQ(num_clients=6, clients_per_round=2, clip=0.1, num_rounds=3, epsilon=20.0, method=method,
                   secret=SECRET, stream_nonce="rel", train_metrics_aggr_fn=aggr)
        for debug in (False, True):
            mod = keyed_mod(SECRET, debug_metrics=debug)
            for m in _train_message(s):
                ctx = Context(run_id=1, node_id=m.metadata.dst_node_id,
                              node_config={"partition-id": m.metadata.dst_node_id - 100}, state=RecordDict(),
                              run_config={})
                r = mod(m, ctx, _user_train)
                assert not r.has_error()
                _fail_unknown(r.content.keys(), {"metrics", PAYLOAD_KEY, META_KEY}, "Gau-LRQ reply records")
                _fail_unknown(r.content[PAYLOAD_KEY].keys(), LRQ_PAYLOAD, "Gau-LRQ payload arrays")
                meta = dict(r.content[META_KEY])
                _fail_unknown(meta, LRQ_META_NONE if method == "none" else LRQ_META, f"Gau-LRQ {method} metadata")
                user = dict(r.content["metrics"]) if "metrics" in r.content.keys() else {}
                if debug and method != "none":  # the opt-in adds the clean update's statistics, labelled gau-lrq.*
                    assert {"gau-lrq.norm", "gau-lrq.clipped", "gau-lrq.linf"} <= set(user)
                    user = {k: v for k, v in user.items() if not k.startswith("gau-lrq.")}
                # nothing added (no partition-id either), nothing changed; kept on the client unless published
                assert user == (USER_METRICS if publish or method == "none" else {})
                if method == "qg":  # the bit width is LRQ's public one, from sigma and S2 only, never from the data
                    assert meta["b"] == lrq_public_range(s.round_spec(0))[1]


def test_gau_lrq_results_publish_no_client_statistics(flwr_identity, tmp_path):
    """results.json of a Gau-LRQ run with failing clients: no client train metrics, no failed ids,
    no clean-update statistics; the debug switch publishes them and says so."""
    from flower_dp.experiments.gau_lrq import InProcessGrid, _task_identity
    from flwr.clientapp import ClientApp

    from lrq_keys import keyed_mod
    from flower_dp.strategies.gau_lrq import GauLRQ

    def app(debug):
        a = ClientApp(mods=[keyed_mod(SECRET, debug_metrics=debug)])

        def train(msg, ctx):
            if int(ctx.node_config["partition-id"]) == 0:
                raise RuntimeError("client 0 crashed")
            return _user_train(msg, ctx)

        a.train()(train)
        return a

    round_keys = {"round", "k", "method", "sigma", "z", "sampled", "received", "dropped", "failed", "d",
                  "bytes_payload", "bytes_carried", "bytes_downlink", "bits_algorithmic", "bits_entropy",
                  "bits_per_coord", "train_metrics", "evaluate_serverapp"}
    for debug in (False, True):
        out = tmp_path / str(debug)
        s = GauLRQ(num_clients=6, clients_per_round=3, clip=0.1, num_rounds=3, epsilon=20.0, secret=SECRET,
                   stream_nonce="rel", out_dir=out, debug_metrics=debug)
        with _task_identity():
            s.start(grid=InProcessGrid(app(debug), 6), num_rounds=3,
                    initial_arrays=ArrayRecord({"w": Array(np.zeros(300, np.float32))}),
                    evaluate_fn=lambda r, a: MetricRecord({"accuracy": 0.0}))
        doc = json.loads((out / "results.json").read_text())
        text = (out / "results.json").read_text()
        if not debug:
            for r in doc["rounds"]:
                _fail_unknown(r, round_keys, "Gau-LRQ round record")
                assert r["train_metrics"] is None
            assert "train-loss" not in text and "failed_nodes" not in text and "gau-lrq.norm" not in text
            assert doc["uncharged_statistics_released"] is False
        else:
            assert doc["uncharged_statistics_released"] is True and "release_warning" in doc
            assert any(r["train_metrics"] and "train-loss" in r["train_metrics"] for r in doc["rounds"])
    assert math.isfinite(doc["eps_rigorous"] if "eps_rigorous" in doc else 0.0)


def test_reproduce_records_of_runs_from_before_the_filter_drop_the_uncharged_statistics():
    """A reused results.json written before the filter (no flag, loss in the history): its record keeps only
    the public columns; a debug run's record keeps everything and says so."""
    from flower_dp.reproduce.core import RunSpec, record_from_doc

    spec = RunSpec("r", {"algorithm": "Dyn-D2P"}, {}, seed=0)
    row = {"k": 2, "acc_avg": 0.5, "test_loss_avg": 1.0, "bits_total": 10, "noise_std": 0.1, "clip": 1.0,
           "loss": 0.7, "clip_fraction": 0.3, "grad_norm_mean": 2.0, "batch": 7.0}
    old = record_from_doc(spec, {"status": "finished", "history": [dict(row)], "privacy": {"per_node": []}})
    assert set(old["history"][0]) == {"k", "acc_avg", "test_loss_avg", "bits_total", "noise_std", "clip"}
    assert old["uncharged_statistics_released"] is False and old["final_loss"] == 1.0
    dbg = record_from_doc(spec, {"status": "finished", "history": [dict(row)], "privacy": {"per_node": []},
                                 "uncharged_statistics_released": True})
    assert dbg["history"][0] == row and dbg["uncharged_statistics_released"] is True


def test_a_finished_run_from_before_debug_metrics_is_still_reused(tmp_path):
    """Its config has no run.debug_metrics (it ran with the statistics released, the filter drops them from the
    record): reused, not retrained."""
    from flower_dp import results as rio
    from flower_dp.reproduce.core import RunSpec, _run_pushsum

    cfg = _runner_cfg(None).to_dict()
    old = json.loads(json.dumps(cfg))
    del old["run"]["debug_metrics"]
    rio.write_json(tmp_path / "results.json", {"status": "finished", "config": old, "history": []})
    doc = _run_pushsum(RunSpec("r", {}, cfg, seed=1), tmp_path, "inprocess")
    assert doc["_reused"] is True


def test_gau_lrq_diverged_client_sends_a_zero_update_not_an_error(flwr_identity):
    """A non-finite local update (a data-dependent event) is not revealed by an error reply: the mod encodes a
    zero update (inside the clip ball, covered by the charge; distributed like a compensated dropped client)."""
    from flower_dp.clients.lrq_mod import META_KEY
    from lrq_keys import keyed_mod
    from flower_dp.strategies.gau_lrq import GauLRQ

    def diverged(msg, ctx):
        w = msg.content["arrays"]["w"].numpy()
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.full_like(w, np.nan))}),
                                   "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)

    s = GauLRQ(num_clients=6, clients_per_round=2, clip=0.1, num_rounds=3, epsilon=20.0, secret=SECRET,
               stream_nonce="rel", keep_decoded=True)
    msgs = _train_message(s)
    mod = keyed_mod(SECRET)
    replies = []
    for m in msgs:
        ctx = Context(run_id=1, node_id=m.metadata.dst_node_id,
                      node_config={"partition-id": m.metadata.dst_node_id - 100}, state=RecordDict(), run_config={})
        r = mod(m, ctx, diverged)
        assert not r.has_error() and META_KEY in r.content
        replies.append(r)
    s.aggregate_train(1, replies)
    assert s.rounds[0]["received"] == 2 and s.rounds[0]["failed"] == 0
    for hat in s.decoded[0].values():  # decoded = 0 + N(0, sigma^2): noise only
        assert abs(hat.std() / s.sigma(0) - 1) < 0.2 and abs(hat.mean()) < 5 * s.sigma(0) / math.sqrt(hat.size)
