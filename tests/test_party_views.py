"""What reaches each party of a Gau-LRQ run, collected from a real run and checked field by field against the view
:mod:`flower_dp.privacy.parties` declares for it.

One run is GauLRQ's own round loop (``GauLRQ.start``) over an in-process grid of N ClientApps, each behind
``gau_lrq_mod`` with its own key file, one of them failing its training; nothing is mocked inside the strategy or
the mod.  Everything that leaves the loop is collected: every message sent and every reply (contents and sizes),
``results.json`` and the other files of ``out_dir``, the ``Result`` that ``start`` returns, every log record (DEBUG
and above), and which key file each node opened.  Each party's view is then assembled from it, exactly as declared,
and every field of it must be on an allow-list of values public by construction (:data:`PUBLIC`: the configuration,
the public schedule and nonce, participation counts, sizes fixed by the public round spec, eps numbers, wall time), a
function of the released global models (recomputed from them here), or charged to that party (the sample, for the
network observer; whether it was itself sampled, for another client); a field of none of these fails the test with
its name.  The views of two runs whose samples differ but whose participation counts agree are compared: what is
public must be equal.

Push-sum's out-neighbour receives a node's shares: ``tests/test_releases.py`` checks every share a node sends
(in-process and through the relay) against its allow-list (the noised tensors ``x`` / ``q``, a float push-sum weight,
the integer wire bits), so it is not repeated here;
:func:`test_push_sum_share_carries_only_the_fields_test_releases_checks` makes sure no new field of a share escapes
that check.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_dp.clients import lrq_mod
from flower_dp.experiments.gau_lrq import InProcessGrid, _task_identity
from flower_dp.mechanisms.gau_lrq_codec import KEYS, PROBE_KEY, key_file_name, write_client_keys
from flower_dp.privacy.parties import PARTIES, SERVER_DECODES
from flower_dp.strategies._gau_lrq_aggregate import message_bytes
from flower_dp.strategies.gau_lrq import GauLRQ

N, B, K, D, CLIP = 8, 3, 3, 40, 0.5
FIRST = 7_340_000_000_000  # node ids no other number of a run can look like: FIRST + partition id
FAILING = 1  # the partition whose training raises (a failure the run counts and logs)
NODES = [FIRST + i for i in range(N)]

# ------------------------------------------------------------------------------------------------ field classes
PUBLIC = "public: the configuration, the public schedule or the public nonce"
COUNT = "public: a participation count (the declared views' 'counts')"
SIZE = "public: a size fixed by the public round spec and d"
EPS = "public: an eps, a function of the public z schedule and the round count"
TIME = "public: wall time (the 'when')"
RELEASED = "a function of the released global models (recomputed from them)"
WITHHELD = "withheld: must be None or empty"
SAMPLE = "charged: who was sampled (the network observer's gdp_sample_known bound)"
OWN = "charged: this client's own messages, key and whether it was sampled (fixed_size_pair_other_client)"
SERVER_ONLY = "the server's own view (no eps: it decodes every update)"

#: every class public by construction (its value may not depend on which clients were sampled)
INVARIANT = {PUBLIC, COUNT, SIZE, EPS, WITHHELD}

#: results.json / Result fields (flattened paths, lists as []) -> class; the first matching pattern wins
RESULT_FIELDS = [
    ("rounds[].sampled", COUNT), ("rounds[].received", COUNT), ("rounds[].dropped", COUNT),
    ("rounds[].failed", COUNT), ("rounds_completed", COUNT),
    ("rounds[].bytes_*", SIZE), ("rounds[].bits_*", SIZE), ("bits_per_round[]", SIZE), ("bytes_per_round[]", SIZE),
    ("total_bits_algorithmic", SIZE), ("total_bytes_carried", SIZE),
    ("rounds[].eps_*", EPS), ("eps_rigorous", EPS), ("eps_paper", EPS), ("eps_rigorous_per_round[]", EPS),
    ("eps_by_party.*", EPS), ("privacy.eps_*", EPS),
    ("rounds[].evaluate_serverapp.accuracy", RELEASED), ("accuracy_per_round[]", RELEASED),
    ("final_accuracy", RELEASED),
    ("rounds[].train_metrics", WITHHELD),
    ("rounds[].round", PUBLIC), ("rounds[].k", PUBLIC), ("rounds[].method", PUBLIC), ("rounds[].sigma", PUBLIC),
    ("rounds[].z", PUBLIC), ("rounds[].d", PUBLIC),
    ("algorithm", PUBLIC), ("config.*", PUBLIC), ("noise.*", PUBLIC), ("privacy.unit", PUBLIC),
    ("privacy.adjacency", PUBLIC), ("privacy.sampling", PUBLIC), ("privacy.party", PUBLIC),
    ("privacy.accountant", PUBLIC), ("privacy.note", PUBLIC), ("privacy.z[]", PUBLIC), ("privacy.warnings[]", PUBLIC),
    ("run", PUBLIC), ("run.*", PUBLIC),  # the caller's own run_info
    ("party", PUBLIC), ("stop_reason", PUBLIC), ("status", PUBLIC), ("uncharged_statistics_released", PUBLIC),
    # the Result start() returns
    ("result.arrays", RELEASED), ("result.evaluate_metrics_serverapp.*.accuracy", RELEASED),
    ("result.evaluate_metrics_serverapp.*.eps_*", EPS),
    ("result.train_metrics_clientapp", WITHHELD), ("result.evaluate_metrics_clientapp", WITHHELD),
]

#: log records at INFO and above: the template (``record.msg``) -> the class of each argument (one class: all)
LOG_TEMPLATES: dict[str, tuple | str] = {
    # Flower's FedAvg, at construction and in its summary
    "fraction_evaluate is set to 0.0. Federated evaluation will be skipped.": PUBLIC,
    "\t├──> Sampling:": PUBLIC, "\t│\t├──Fraction: train (%.2f) | evaluate ( %.2f)": PUBLIC,
    "\t│\t├──Minimum nodes: train (%d) | evaluate (%d)": PUBLIC,
    "\t│\t└──Minimum available nodes: %d": PUBLIC, "\t└──> Keys in records:": PUBLIC,
    "\t\t├── Weighted by: '%s'": PUBLIC, "\t\t├── ArrayRecord key: '%s'": PUBLIC,
    "\t\t└── ConfigRecord key: '%s'": PUBLIC,
    # GauLRQ's start, summary and warnings
    "Starting %s strategy:": PUBLIC, "\t├── Number of rounds: %d": PUBLIC,
    "\t├── ArrayRecord (%.2f MB)": SIZE,
    "\t├── ConfigRecord (%s): %s": PUBLIC, "\t├──> GauLRQ: method %s (%s), N=%d, B=%d, K=%s, S2=%s": PUBLIC,
    "\t│\t└── z_0=%.4g z_K-1=%.4g, eps target %s for party %s (%s plan %.4g, paper %.4g)":
        (PUBLIC, PUBLIC, PUBLIC, PUBLIC, PUBLIC, EPS, EPS),
    "": PUBLIC, "[ROUND %s/%s]": PUBLIC,
    "GauLRQ: the clients' train metrics (e.g. train_loss) are not published: they are statistics of the clients' "
    "private data that eps does not cover; pass train_metrics_aggr_fn (or debug_metrics=True) to publish them, "
    "uncharged": PUBLIC,
    # the rounds
    "Initial global evaluation results: %s": RELEASED, "Global evaluation": PUBLIC,
    "\t└──> MetricRecord: %s": RELEASED,
    "configure_train: Sampled %s nodes (out of %s)": (COUNT, PUBLIC),
    "aggregate_train: Received %s results and %s failures": (COUNT, COUNT),
    "GauLRQ round %d: %d sampled client(s) replied with an error and are dropped from the average (node ids and "
    "reasons at DEBUG only: they would reveal part of the hidden sample)": (PUBLIC, COUNT),
    "GauLRQ round %d: %d of %d sampled clients replied; the others are dropped from the average (still divided by "
    "B = %d)%s": (PUBLIC, COUNT, PUBLIC, PUBLIC, PUBLIC),
    "Privacy spent: epsilon=%.6f at delta=%g after %d releases (flower-dp, party %s, %s; paper's formula %.6f)":
        (EPS, PUBLIC, PUBLIC, PUBLIC, PUBLIC, EPS),
    "Strategy execution finished in %.2fs": TIME, "Final results:": PUBLIC,
    "\t%s": RELEASED,  # str(Result), line by line: checked below to be exactly the Result's rendering
}

#: the train ConfigRecord a sampled client receives: the server round and GauLRQ's public round spec
TRAIN_CONFIG = {"server-round", *KEYS.values()}
#: the files a run leaves in out_dir: results.json (public), the checkpoint (the server's: theta, the rounds)
OUT_FILES = {"results.json": "public", "checkpoint.pt": SERVER_ONLY}


def _master(label: str) -> bytes:
    return hashlib.sha256(b"test-party-views\x00" + label.encode()).digest()


def _update(pid: int) -> np.ndarray:
    """Client ``pid``'s fixed local update (norm 0.8 S2)."""
    u = np.random.default_rng(pid).standard_normal(D)
    return (0.8 * CLIP * u / np.linalg.norm(u)).astype(np.float32)


def _evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord:
    """The ServerApp's evaluation: a deterministic function of the released model alone (recomputed in the tests)."""
    return MetricRecord({"accuracy": _score(arrays["w"].numpy())})


def _score(w: np.ndarray) -> float:
    return float(1.0 / (1.0 + np.linalg.norm(w.astype(np.float64))))


# ------------------------------------------------------------------------------------------------ one run, collected
class RecordingGrid(InProcessGrid):
    """:class:`InProcessGrid` keeping every exchange: the messages sent and the replies, in order."""

    def __init__(self, app: ClientApp) -> None:
        super().__init__(app, N, first_node_id=FIRST)
        self.exchanges: list[list[tuple[Message, Message]]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        if messages:  # an empty exchange (client-side evaluation at fraction_evaluate=0) sends nothing
            self.exchanges.append(list(zip(messages, replies)))
        return replies


@dataclass
class Run:
    grid: RecordingGrid
    strategy: GauLRQ
    result: object
    doc: dict
    out_files: set
    records: list
    key_reads: list = field(default_factory=list)  # (partition id of the node, file name it opened)

    def exchanges(self, kind: str) -> list[list[tuple[Message, Message]]]:
        """The ``probe`` or ``train`` exchanges (a probe message carries no model)."""
        probe = [len(ex[0][0].content.array_records) == 0 for ex in self.grid.exchanges]
        return [ex for ex, p in zip(self.grid.exchanges, probe) if p == (kind == "probe")]

    def sampled(self) -> list[set[int]]:
        return [{int(m.metadata.dst_node_id) for m, _ in ex} for ex in self.exchanges("train")]

    def released(self) -> list[np.ndarray]:
        """theta_0 .. theta_K: each round's model as sent, then the final one."""
        sent = [ex[0][0].content["arrays"]["w"].numpy() for ex in self.exchanges("train")]
        return sent + [self.result.arrays["w"].numpy()]


def _sample_of(probe: GauLRQ, master: bytes) -> list[set[int]]:
    """The B-of-N samples of the K rounds under ``master`` (GauLRQ's own draw from the server's stream)."""
    probe._secret = master
    probe._set_run_keys()
    return [{int(n) for n in probe._sample(k, NODES)} for k in range(K)]


def _kw(master: bytes) -> dict:
    return dict(num_clients=N, clients_per_round=B, clip=CLIP, num_rounds=K, noise_multiplier=1.0, epsilon=1e4,
                secret=master, stream_nonce="party-views", fraction_evaluate=0.0, max_failed_rounds=K)


@pytest.fixture(scope="module")
def masters() -> tuple[bytes, bytes]:
    """Two master secrets whose samples differ in every round while the failing client takes part in the same rounds
    (so the participation counts agree), and in round 1 (so a failure is logged)."""
    fails, probe = NODES[FAILING], GauLRQ(**_kw(_master("probe")))
    found = {}
    for i in range(2000):
        m = _master(f"views-{i}")
        s = _sample_of(probe, m)
        pattern = tuple(fails in r for r in s)
        if pattern[0] and pattern not in found:
            found[pattern] = (m, s)
        elif pattern[0] and all(a != b for a, b in zip(found[pattern][1], s)):
            return found[pattern][0], m
    raise AssertionError("no two master secrets found")


_READ_KEY_FILE = lrq_mod.read_key_file


def _run(master: bytes, tmp_path: Path, caplog, monkeypatch, metrics=lambda pid: {"num-examples": 1}) -> Run:
    """One GauLRQ run (K rounds, N in-process ClientApps behind gau_lrq_mod, partition FAILING raising) under
    ``master``, everything that leaves it collected; ``metrics(pid)``: the user's train metrics."""
    keys = write_client_keys(master, N, tmp_path / "keys")
    reads: list[tuple[int, str]] = []

    def read_key_file(path, partition_id):
        reads.append((int(partition_id), Path(path).name))
        return _READ_KEY_FILE(path, partition_id)

    monkeypatch.setattr(lrq_mod, "read_key_file", read_key_file)
    app = ClientApp(mods=[lrq_mod.make_gau_lrq_mod(key_dir=keys)])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        pid = int(ctx.node_config["partition-id"])
        if pid == FAILING:
            raise RuntimeError("this client's training failed")
        w = msg.content["arrays"]["w"].numpy()
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array((w + _update(pid)).astype(np.float32))}),
                                   "metrics": MetricRecord(metrics(pid))}), reply_to=msg)

    caplog.set_level(logging.DEBUG, logger="flwr")
    first = len(caplog.records)
    s = GauLRQ(**_kw(master), out_dir=tmp_path / "out")
    grid = RecordingGrid(app)
    with _task_identity():
        result = s.start(grid=grid, num_rounds=K, initial_arrays=ArrayRecord({"w": Array(np.zeros(D, np.float32))}),
                         evaluate_fn=_evaluate)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    return Run(grid, s, result, doc, {p.name for p in (tmp_path / "out").iterdir()}, caplog.records[first:], reads)


@pytest.fixture
def runs(masters, tmp_path, caplog, monkeypatch) -> tuple[Run, Run]:
    a = _run(masters[0], tmp_path / "a", caplog, monkeypatch)
    b = _run(masters[1], tmp_path / "b", caplog, monkeypatch)
    assert all(x != y for x, y in zip(a.sampled(), b.sampled()))  # the samples differ in every round
    assert [r["failed"] for r in a.doc["rounds"]] == [r["failed"] for r in b.doc["rounds"]]
    assert a.doc["rounds"][0]["failed"] == 1  # the failure happened
    return a, b


# ------------------------------------------------------------------------------------------------ views
def _flatten(obj, path: str = ""):
    if isinstance(obj, Mapping):
        if not obj and path:
            yield path, {}
        for k, v in obj.items():
            yield from _flatten(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _flatten(v, path + "[]")
    else:
        yield path, obj


def _result_class(path: str) -> str:
    for pattern, cls in RESULT_FIELDS:
        if fnmatch.fnmatchcase(path, pattern):
            return cls
    raise AssertionError(f"field {path!r} is in a party's view but on no allow-list (public by construction, a "
                         "function of the released models, or charged): classify it in RESULT_FIELDS, or keep it out")


def _log_fields(records) -> list[tuple[str, str, object]]:
    """(field, class, value) of each argument of each record at INFO and above; an unknown template fails."""
    out = []
    for r in records:
        if r.levelno < logging.INFO:
            continue
        assert r.msg in LOG_TEMPLATES, (f"log record {logging.getLevelName(r.levelno)} {r.msg!r} is in the network "
                                        "and model observers' view but on no allow-list: add it to LOG_TEMPLATES "
                                        "with the class of each argument, or log it at DEBUG")
        args = (r.args,) if isinstance(r.args, Mapping) else tuple(r.args or ())
        classes = LOG_TEMPLATES[r.msg]
        classes = (classes,) * len(args) if isinstance(classes, str) else classes
        assert len(classes) == len(args), (r.msg, args)
        name = f"log[{logging.getLevelName(r.levelno)}] {r.msg!r}"
        out += [(name, PUBLIC, None)] if not args else [(f"{name} arg {i}", c, a) for i, (c, a) in
                                                         enumerate(zip(classes, args))]
    return out


def _result_obj(result) -> dict:
    return {"arrays": result.arrays["w"].numpy(),
            "train_metrics_clientapp": {r: dict(m) for r, m in result.train_metrics_clientapp.items()},
            "evaluate_metrics_clientapp": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()},
            "evaluate_metrics_serverapp": {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}}


def model_observer(run: Run) -> list[tuple[str, str, object]]:
    """The released global models and the results' public fields (results.json, the Result, the log records at
    INFO and above): not who was sampled."""
    view = [(f"released theta_{k}", RELEASED, w) for k, w in enumerate(run.released())]
    view += [(p, _result_class(p), v) for p, v in _flatten(run.doc)]
    res = _result_obj(run.result)
    view += [("result.arrays", RELEASED, res.pop("arrays"))]
    view += [(f"result.{p}", _result_class(f"result.{p}"), v) for p, v in _flatten(res)]
    return view + _log_fields(run.records)


def _traffic(run: Run) -> list[tuple[str, str, object]]:
    """Who sends what to whom, and its size (contents under TLS), per exchange: the receivers and repliers (the
    sample), and the sizes of the messages and of the replies as multisets (an error reply: the length of its
    reason; the failure itself is a public count).  The sizes are of the records a message carries; its routing
    metadata names the receiver, whom this observer sees anyway."""
    view = []
    for e, ex in enumerate(run.grid.exchanges):
        view += [(f"exchange {e}: receivers", SAMPLE, sorted(int(m.metadata.dst_node_id) for m, _ in ex)),
                 (f"exchange {e}: repliers", SAMPLE, sorted(int(r.metadata.src_node_id) for _, r in ex)),
                 (f"exchange {e}: request bytes", SIZE, sorted(message_bytes(m.content) for m, _ in ex)),
                 (f"exchange {e}: reply bytes", SIZE, sorted((1, len(r.error.reason)) if r.has_error() else
                                                             (0, message_bytes(r.content)) for _, r in ex))]
    return view


def network_observer(run: Run) -> list[tuple[str, str, object]]:
    """Who sends and when (so the sample), the byte counts, the released models and public fields."""
    return model_observer(run) + _traffic(run)


def client(run: Run, pid: int) -> list[tuple[str, str, object]]:
    """What reaches client ``pid``: the messages it is sent (the probe; a train message in each round that sampled
    it), the key file it opens, and the released models."""
    node = FIRST + pid
    view = [(f"released theta_{k}", RELEASED, w) for k, w in enumerate(run.released())]
    for e, ex in enumerate(run.grid.exchanges):
        for m, _ in ex:
            if int(m.metadata.dst_node_id) != node:
                continue
            kind = "train" if len(m.content.array_records) else "probe"
            view.append((f"exchange {e}: a {kind} message reaches it", OWN, True))
            for name, rec in m.content.items():
                for k, v in (rec.items() if hasattr(rec, "items") else []):
                    if isinstance(rec, ArrayRecord):
                        view.append((f"{kind}.{name}.{k}", RELEASED, v.numpy()))
                    else:
                        allowed = {PROBE_KEY, "server-round"} if kind == "probe" else TRAIN_CONFIG
                        assert k in allowed, f"client {pid} receives {kind} {name}.{k} = {v!r}, on no allow-list"
                        view.append((f"{kind}.{name}.{k}", PUBLIC, v))
    view += [(f"key file {name}", OWN, name) for p, name in run.key_reads if p == pid]
    return view


def server(run: Run) -> list[tuple[str, str, object]]:
    """Everything: every message with the keys that decode it, the sample, the DEBUG records, the checkpoint."""
    debug = [(f"log[DEBUG] {r.msg!r}", SERVER_ONLY, r.getMessage()) for r in run.records if r.levelno < logging.INFO]
    return network_observer(run) + debug + [(f"out_dir/{f}", SERVER_ONLY, f) for f in run.out_files
                                            if OUT_FILES.get(f) == SERVER_ONLY]


VIEWS = {"model_observer": model_observer, "client": client, "network_observer": network_observer, "server": server}


def _invariant(view) -> list[tuple[str, object]]:
    return [(name, repr(v)) for name, cls, v in view if cls in INVARIANT]


def _ids_in(text: str) -> list[int]:
    return [n for n in NODES if str(n) in text]


# ------------------------------------------------------------------------------------------------ the tests
def test_every_declared_gau_lrq_party_has_its_view_checked_here():
    """A party declared in flower_dp.privacy.parties without a view here fails: its view must be checked too."""
    assert set(VIEWS) == set(PARTIES["gau_lrq"])


def test_the_model_observer_sees_the_released_models_and_public_fields_only(runs):
    """Every field of results.json, the Result and the log records at INFO and above is public by construction or a
    function of the released models (recomputed here); none names a node, a partition or the sample, and the
    public part is the same for two different samples."""
    a, b = runs
    for run in runs:
        view = model_observer(run)
        assert not [f for f, cls, _ in view if cls not in INVARIANT | {RELEASED, TIME}]
        assert all(v is None or v == {} for _, cls, v in view if cls == WITHHELD)
        text = "\n".join([repr(v) for _, _, v in view] + [r.getMessage() for r in run.records
                                                           if r.levelno >= logging.INFO])
        assert not _ids_in(text), f"a node id reaches the model observer: {_ids_in(text)}"
        assert not re.search(r"partition[- ]?(id)?\s*\d", text)
        assert set(run.out_files) == set(OUT_FILES)  # results.json and the server's checkpoint, nothing else
        # RELEASED values are the released models' own function, and nothing else
        released = run.released()
        scores = [_score(w) for w in released]
        assert run.doc["accuracy_per_round"] == pytest.approx(scores, rel=1e-12)
        assert [r["evaluate_serverapp"]["accuracy"] for r in run.doc["rounds"]] == pytest.approx(scores[1:], rel=1e-12)
        assert [dict(run.result.evaluate_metrics_serverapp[r])["accuracy"] for r in range(K + 1)] == pytest.approx(
            scores, rel=1e-12)
        final = [r.getMessage()[1:] for r in run.records if r.msg == "\t%s"]  # the "Final results" block
        assert final == str(run.result).splitlines()
        assert all(rec["train_metrics"] is None for rec in run.doc["rounds"])
        assert not run.result.train_metrics_clientapp and not run.result.evaluate_metrics_clientapp
    assert _invariant(model_observer(a)) == _invariant(model_observer(b))


def test_the_network_observer_learns_the_sample_it_is_charged_for_and_nothing_else_about_it(runs):
    """Senders, receivers and sizes of every message: the identities are the sample (charged: GDP conditioned on
    it, gdp_sample_known); everything else, counted bytes and INFO+ log records included, is the same for two
    different samples of the same participation count."""
    a, b = runs
    for run in runs:
        view = network_observer(run)
        assert not [f for f, cls, _ in view if cls not in INVARIANT | {RELEASED, TIME, SAMPLE}]
        # the identities it sees: every node at the probe, then exactly each round's sample
        probe = run.exchanges("probe")
        assert len(probe) == 1 and {int(m.metadata.dst_node_id) for m, _ in probe[0]} == set(NODES)
        assert [len(s) for s in run.sampled()] == [B] * K
        replies = [{int(r.metadata.src_node_id) for _, r in ex} for ex in run.exchanges("train")]
        assert replies == run.sampled()
        charged = run.doc["eps_by_party"]["network_observer"]
        assert charged["bound"] == "gdp_sample_known"
        assert charged["eps"] >= run.doc["eps_by_party"]["model_observer"]["eps"]
        # within an exchange every message has one size, and so has every reply that is not an error
        for ex in run.grid.exchanges:
            assert len({message_bytes(m.content) for m, _ in ex}) == 1
            assert len({message_bytes(r.content) for _, r in ex if not r.has_error()}) == 1
    assert a.sampled() != b.sampled()
    assert _invariant(network_observer(a)) == _invariant(network_observer(b))
    per = a.doc["rounds"][0]["bytes_carried"] // a.doc["rounds"][0]["received"]  # one reply's counted bytes
    for run in runs:
        assert [r["bytes_carried"] for r in run.doc["rounds"]] == [per * r["received"] for r in run.doc["rounds"]]


def test_each_client_receives_the_released_models_public_config_and_its_own_key_only(runs):
    """Client i is sent the probe (the public nonce) and, in the rounds that sampled it (charged: whether it was
    sampled), the released model and GauLRQ's public round spec, the same for every recipient and for any sample;
    it opens its own key file only and is charged an eps (per-client keys)."""
    for run in runs:
        assert run.strategy.per_client_keys and run.doc["eps_by_party"]["client"]["eps"] is not None
        released = run.released()
        for pid in range(N):
            view = client(run, pid)
            assert not [f for f, cls, _ in view if cls not in {PUBLIC, RELEASED, OWN}]
            assert {name for f, cls, name in view if f.startswith("key file")} == {key_file_name(pid)}
            text = "\n".join(repr(v) for f, cls, v in view if cls != RELEASED)
            assert not [n for n in _ids_in(text)], f"client {pid} is told of nodes {_ids_in(text)}"
            trains = [v for f, cls, v in view if f.startswith("train.arrays")]
            rounds = [k for k, s in enumerate(run.sampled()) if FIRST + pid in s]
            assert len(trains) == len(rounds)
            for k, w in zip(rounds, trains):
                np.testing.assert_array_equal(w, released[k])
    # the train config is one record for every recipient of a round, and the same whoever was sampled
    cfg = {tuple(sorted((k, repr(v)) for k, v in m.content["config"].items()))
           for run in runs for ex in run.grid.exchanges for m, _ in ex if "arrays" in m.content}
    assert len(cfg) == K  # one per round (its server-round and k), across both samples


def test_the_server_has_no_eps_and_alone_sees_the_node_ids(runs):
    """The server decodes every update (its eps is None, with the reason); the DEBUG records naming the failed node
    and the checkpoint are its own view, not any other party's."""
    for run in runs:
        assert run.doc["eps_by_party"]["server"] == {"eps": None, "reason": SERVER_DECODES}
        only = [(f, v) for f, cls, v in server(run) if cls == SERVER_ONLY]
        assert any(str(FIRST + FAILING) in str(v) for _, v in only)  # the failed node, at DEBUG
        others = [view(run) if name != "client" else sum((client(run, i) for i in range(N)), [])
                  for name, view in VIEWS.items() if name != "server"]
        assert not [f for v in others for f, cls, _ in v if cls == SERVER_ONLY]


def test_reply_sizes_do_not_depend_on_the_users_own_metrics(masters, tmp_path, caplog, monkeypatch):
    """The same run with the user's usual train metrics (num-examples 10 (i+1)): the replies of one round still have
    one size, since the mod forwards the user's MetricRecord only when the server publishes it (its serialised
    size follows its values: integers travel as varints)."""
    run = _run(masters[0], tmp_path, caplog, monkeypatch, metrics=lambda pid: {"num-examples": 10 * (pid + 1)})
    sizes = [{message_bytes(r.content) for _, r in ex if not r.has_error()} for ex in run.exchanges("train")]
    assert all(len(s) == 1 for s in sizes), sizes


def test_push_sum_share_carries_only_the_fields_test_releases_checks():
    """A push-sum out-neighbour receives Share objects; tests/test_releases.py checks their tensors (allow-list),
    weight and wire bits, and sender / receiver / k are the public topology and schedule.  A new field of a share
    would escape that check: it fails here first."""
    from flower_dp.gossip import Share

    assert {f.name for f in fields(Share)} == {"sender", "receiver", "k", "tensors", "weight", "wire_bits"}
