"""The node worker of the push-sum ClientApp (:mod:`flower_dp.clients.push_sum_app`, issue 14): one persistent node
process per SuperNode.

* Flower records survive the worker's typed channel bit for bit (no pickle);
* a relay run whose every message goes through ``make_client_app(worker="1")`` (a real worker process, reached over
  its Unix socket) ends bit-identical to the in-process run, and its nodes stay in one process;
* the ClientApp module imports neither torch nor ray; the node side's names still import from it;
* a worker's error reaches the ClientApp with its traceback; an unsafe socket directory is refused.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from flower_dp.clients import push_sum_app as node_worker
from flower_dp.clients import push_sum_node

ROOT = Path(__file__).resolve().parents[1]
N, K, R = 4, 4, 2
SPEC = {"builder": "toy", "n_nodes": N, "topology": "random_irregular", "topology_kwargs": {"seed": 0},
        "node_kwargs": {"dim": 16, "seed": 0}}


@pytest.fixture
def short_runtime_dir(monkeypatch):
    """A short ``$XDG_RUNTIME_DIR`` (a Unix socket path has at most 107 bytes); workers started in it are stopped."""
    d = tempfile.mkdtemp(prefix="fdp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", d)
    monkeypatch.setenv(node_worker.IDLE_ENV, "60")
    yield Path(d)
    for log in Path(d).glob("flower-dp-*/node-*.log"):
        for pid in re.findall(r"node worker (\d+): listening", log.read_text()):
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def task_identity(monkeypatch):
    """Flower's Message needs the identity of the running task (set by Flower's runtimes)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def test_records_round_trip_bit_for_bit():
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

    state = {"w": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "h": torch.randn(2).to(torch.float16)}
    rd = RecordDict({
        "cfg": ConfigRecord({"s": "x", "i": 3, "f": float("nan"), "t": True, "blob": b"\x00\xff" * 7,
                             "bl": [b"a", b"bc"], "il": [1, 2], "fl": [0.5], "sl": ["u", "v"], "bo": [True, False]}),
        "m": MetricRecord({"acc": 0.75, "n": 4, "fl": [0.1, 0.2]}),
        "a": ArrayRecord(state),
        "raw": ArrayRecord(array_dict={"z": Array(dtype="float32", shape=(2,), stype="numpy.ndarray",
                                                  data=np.float32([1.5, -2]).tobytes())}),
    })
    back = node_worker.plain_to_records(node_worker.records_to_plain(rd))
    assert list(back.keys()) == list(rd.keys())
    c0, c1 = dict(rd["cfg"]), dict(back["cfg"])
    assert np.isnan(c1.pop("f")) and np.isnan(c0.pop("f")) and c1 == c0
    assert type(back["cfg"]["i"]) is int and type(back["cfg"]["t"]) is bool
    assert dict(back["m"]) == dict(rd["m"])
    for name in ("a", "raw"):
        for key, arr in rd[name].items():
            got = back[name][key]
            assert (got.dtype, tuple(got.shape), got.stype, got.data) == (arr.dtype, tuple(arr.shape), arr.stype,
                                                                          arr.data)
    loaded = back["a"].to_torch_state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


class WorkerGrid:
    """A Flower Grid whose SuperNodes run the ClientApp of :func:`node_worker.make_client_app`: each its own
    ``Context`` and, with ``worker="1"``, its own node worker process (keyed by the Flower node id)."""

    def __init__(self, app):
        from flwr.app import Context, RecordDict

        self.app = app
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={"partition-id": i},
                                          state=RecordDict(), run_config={}) for i in range(N)}

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        return [self.app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]


def _relay_run(tmp_path: Path, worker: str) -> dict:
    from flower_dp.results import load_checkpoint
    from flower_dp.strategies.push_sum import PushSumStrategy

    out = tmp_path / f"out-{worker}"
    strat = PushSumStrategy(N, SPEC, num_iters=K, iters_per_round=R, transport="relay", out_dir=out, timeout_s=60)
    strat.start(WorkerGrid(node_worker.make_client_app(worker=worker)))
    return load_checkpoint(out)["nodes"]


def test_relay_through_node_workers_equals_inprocess(task_identity, short_runtime_dir, tmp_path, monkeypatch):
    from flower_dp import sources
    from flower_dp.gossip import run_iteration

    # own models registered by an earlier test in this process (train_private) would keep every message here
    monkeypatch.setattr(sources, "_SOURCES", {})

    ref = [push_sum_node.toy_builder(i, SPEC)(i, "cpu") for i in range(N)]
    for k in range(K):
        run_iteration(ref, k)
    push_sum_node._RELAY_CACHE.clear()
    states = _relay_run(tmp_path, "1")
    assert not push_sum_node._RELAY_CACHE, "with a worker, no node may live in the ClientApp's process"
    for nd in ref:
        assert torch.equal(states[nd.node_id]["x"], nd.x) and states[nd.node_id]["w"] == nd.w
    logs = sorted(short_runtime_dir.glob("flower-dp-*/node-*.log"))
    assert len(logs) == N, [p.name for p in logs]  # one worker per SuperNode, each started once
    assert all(p.read_text().count("listening on") == 1 for p in logs)
    d = next(short_runtime_dir.glob("flower-dp-*"))
    assert d.stat().st_mode & 0o777 == 0o700
    assert all(s.stat().st_mode & 0o777 == 0o600 for s in d.glob("*.sock"))
    # the same run without workers: the same states
    same = _relay_run(tmp_path, "0")
    for i in range(N):
        assert torch.equal(same[i]["x"], states[i]["x"]) and same[i]["w"] == states[i]["w"]


class DeploymentWorkerGrid(WorkerGrid):
    """:class:`WorkerGrid` as the strategy sees Flower's deployment Grid: no simulation Ray to wait for, the nodes
    join the cluster the run names."""

    push_messages = None


def _mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_ray_register_through_node_workers_imports_no_torch(task_identity, short_runtime_dir, tmp_path, monkeypatch):
    """The Ray transport's ``register`` on the deployment engine: each SuperNode's node worker joins the named
    cluster and hands the message's spec to its host actor, which builds the node; the worker never loads torch
    (its start is what delays the first iteration, 4 at once on 2 cores), and the run equals the in-process one."""
    import ray

    from flower_dp import sources
    from flower_dp.gossip import run_iteration
    from flower_dp.results import load_checkpoint
    from flower_dp.strategies.push_sum import PushSumStrategy
    from flwr_run_helper import ray_head

    monkeypatch.setattr(sources, "_SOURCES", {})
    ref = [push_sum_node.toy_builder(i, SPEC)(i, "cpu") for i in range(N)]
    for k in range(K):
        run_iteration(ref, k)
    out = tmp_path / "out-ray"
    try:
        with ray_head() as address:
            strat = PushSumStrategy(N, SPEC, num_iters=K, iters_per_round=R, transport="ray", out_dir=out,
                                    timeout_s=60, backend_kwargs={"address": address, "num_hosts": 2})
            strat.start(DeploymentWorkerGrid(node_worker.make_client_app(worker="1")))
            logs = sorted(short_runtime_dir.glob("flower-dp-*/node-*.log"))
            pids = [int(p) for log in logs for p in re.findall(r"node worker (\d+): listening", log.read_text())]
            assert len(pids) == N, [log.read_text()[-2000:] for log in logs]
            loaded = [pid for pid in pids if "libtorch" in _mapped_libraries(pid)]
            assert not loaded, f"node workers {loaded} loaded torch to register on Ray"
    finally:
        ray.shutdown()
    states = load_checkpoint(out)["nodes"]
    for nd in ref:
        assert torch.equal(states[nd.node_id]["x"], nd.x) and states[nd.node_id]["w"] == nd.w


def test_wire_factory_builds_the_node_the_message_names():
    """The factory a torch-free ``register`` hands the host actor builds the node the full path builds."""
    from flower_dp.gossip.relay import encode

    spec = {**SPEC, "_session": "s", "_ray": {"name": "x"}}
    initial = {"x": np.arange(16, dtype=np.float32)}
    factory = node_worker.WireNodeFactory(encode(spec), {"lr": 0.1}, initial)
    node = pickle.loads(pickle.dumps(factory))(2, "cpu")
    want = push_sum_node.toy_builder(2, spec)(2, "cpu")
    push_sum_node.keys.apply_initial_arrays(want, initial)
    assert isinstance(node, push_sum_node.ToyQuadraticNode) and node.node_id == 2
    assert torch.equal(node.x, want.x) and torch.equal(node.x, torch.arange(16, dtype=torch.float32))


def test_worker_error_reaches_the_client_app(short_runtime_dir):
    with pytest.raises(RuntimeError, match="unknown node worker request 'nope'"):
        node_worker.call_worker("test:1", {"op": "nope"}, parent_pid=os.getpid(), idle_s=30)


def test_unsafe_runtime_dir_is_refused(short_runtime_dir):
    d = short_runtime_dir / f"flower-dp-{os.getuid()}"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    with pytest.raises(PermissionError, match="mode 0700"):
        node_worker.worker_dir()


def test_setting_is_checked():
    assert node_worker.use_worker("1") and not node_worker.use_worker("0")
    assert not node_worker.use_worker("auto")  # pytest is not a flwr-clientapp process
    with pytest.raises(ValueError, match="auto .default., 1 or 0"):
        node_worker.use_worker("sometimes")


def test_client_app_module_imports_neither_torch_nor_ray():
    code = ("import sys; import push_sum_example.client_app; "
            "print(sorted(m for m in ('torch', 'ray', 'flower_dp.clients.registry') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples" / "push_sum"),
                                                         os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
