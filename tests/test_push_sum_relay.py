"""The server-relay transport without a Flower simulation: PushSumStrategy driven through a fake Grid.

The fake Grid hands every message to :func:`flower_dp.clients.push_sum_node.handle_message` (the
ClientApp's body) and can drop the ClientApp's process cache before every message, the worst
case of Flower running a node's next message in another process.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch

from flower_dp.clients import push_sum_node
from flower_dp.clients.push_sum_node import build_plan_node, handle_content
from flower_dp.errors import CheckpointError, GossipTimeoutError
from flower_dp.gossip import run_iteration
from flower_dp.results import load_checkpoint
from flower_dp.topology import make_topology

N, K, R = 8, 6, 3


@pytest.fixture
def task_identity(monkeypatch):
    """Flower's Message needs the identity of the running task (set by Flower's runtimes)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class FakeGrid:
    """``get_node_ids`` / ``send_and_receive`` of a Flower Grid with ``live`` SuperNodes (Flower ids 100 + i)."""

    def __init__(self, live: int, builder, *, fresh_process: bool):
        from flwr.app import Context, RecordDict

        self.builder, self.fresh_process = builder, fresh_process
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, node_config={"partition-id": i},
                                          state=RecordDict(), run_config={}) for i in range(live)}
        self.messages = 0

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Message, RecordDict

        out = []
        for m in messages:
            ctx = self.contexts.get(m.metadata.dst_node_id)
            if ctx is None:
                continue  # no such SuperNode: no reply (Flower would time out)
            if self.fresh_process:
                push_sum_node._RELAY_CACHE.clear()
            out.append(Message(handle_content(m.content, ctx, 1, self.builder), reply_to=m))
            self.messages += 1
        return out


def _plan_factory(algorithm, params, model, topo_name):
    from flower_dp.clients import registry
    from flower_dp.models import build_model

    g = torch.Generator().manual_seed(0)
    if model == "logreg":
        model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
        data = [(torch.randn(16, 5, generator=g), torch.randint(0, 2, (16,), generator=g)) for _ in range(N)]
    else:
        model_fn = functools.partial(build_model, "partpsp_mlp", seed=0)
        data = [(torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(N)]
    topo = make_topology(topo_name, N, **({"seed": 2} if topo_name == "random_irregular" else {}))
    dim = sum(p.numel() for p in model_fn().parameters())
    plan = registry.prepare(algorithm, params, n_nodes=N, samples_per_node=[16] * N, num_iters=K, dim=dim, seed=1,
                            reproducible=True)  # bit-identical backends: the seeded simulation mode
    return functools.partial(build_plan_node, plan=plan, topology=registry.topology_for(plan, topo),
                             model_fn=model_fn, data=data)


DP = dict(epsilon=2.0, delta=1e-4, accountant="rdp")
CASES = [
    ("dyn_d2p", dict(lr=0.1, batch_size=8, variant="dyn", **DP), "logreg", "random_irregular"),
    ("dp_csgp", dict(lr=0.1, batch_size=8, G=1.0, compressor="rand_0.5", gamma_c=0.5, **DP), "logreg",
     "random_irregular"),
    ("partpsp", dict(lr=0.1, batch_size=8, gamma_n=1e-3, b=5.0, sync_period=3), "partpsp_mlp", "exp_one_peer"),
]


G = dict(G=2.0, **DP)
ALL_CASES = CASES + [
    ("sgp", dict(lr=0.1, batch_size=8), "logreg", "random_irregular"),
    ("privsgp_vr", dict(lr=0.05, batch_size=8, **G), "logreg", "random_irregular"),
    ("privsgp", dict(lr=0.05, batch_size=8, **G), "logreg", "random_irregular"),
    ("dp2_sgd", dict(lr=0.05, batch_size=8, **G), "logreg", "undirected_ring"),
    ("adp2_sgd", dict(lr=0.05, batch_size=8, **G), "logreg", "undirected_ring"),
    ("sgpdp", dict(lr=0.1, batch_size=8, gamma_n=1e-3, b=5.0, sync_period=3), "partpsp_mlp", "exp_one_peer"),
    ("pedfl", dict(lr=0.1, batch_size=8, gamma_n=1e-3, b=5.0), "partpsp_mlp", "exp_one_peer"),
]


@pytest.mark.parametrize("algorithm,params,model,topo", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_relay_with_a_new_process_per_message_matches_inprocess(task_identity, tmp_path, algorithm, params, model,
                                                                  topo):
    """Every registry algorithm; every node rebuilt from context.state at every message (DPPS family: between
    contribute and step too)."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    torch.set_num_threads(1)
    factory = _plan_factory(algorithm, params, model, topo)
    ref = [factory(i, "cpu") for i in range(N)]
    for nd in ref:
        nd.setup()
    for k in range(K):
        run_iteration(ref, k)
    grid = FakeGrid(N, lambda i, spec, ctx: factory, fresh_process=True)
    strat = PushSumStrategy(N, {"algorithm": algorithm}, num_iters=K, iters_per_round=R, transport="relay",
                            out_dir=tmp_path, timeout_s=5)
    strat.start(grid)
    states = load_checkpoint(tmp_path)["nodes"]
    for nd in ref:
        mine = states[nd.node_id]
        assert torch.equal(mine["x"], nd.x) and mine["w"] == nd.w, f"node {nd.node_id} differs"
        assert mine["accountant"] == nd.state_dict()["accountant"]
    assert [p["eps_rigorous"] for p in strat.privacy] == [nd.privacy_report()["eps_rigorous"] for nd in ref]


def test_relay_resume_from_checkpoint_equals_uninterrupted(task_identity, tmp_path):
    """Stop a relay run after round 1, resume it from out_dir: same final nodes as one uninterrupted run."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    factory = _plan_factory(*[CASES[2][i] for i in (0, 1, 2, 3)])
    full = PushSumStrategy(N, {"algorithm": "partpsp"}, num_iters=K, iters_per_round=R, transport="relay",
                           out_dir=tmp_path / "full", timeout_s=5)
    full.start(FakeGrid(N, lambda i, s, c: factory, fresh_process=False))
    cut = PushSumStrategy(N, {"algorithm": "partpsp"}, num_iters=K, iters_per_round=R, transport="relay",
                          out_dir=tmp_path / "cut", timeout_s=5)
    cut.start(FakeGrid(N, lambda i, s, c: factory, fresh_process=False), num_rounds=1)
    assert load_checkpoint(tmp_path / "cut")["k"] == R
    with pytest.raises(CheckpointError, match="different run"):  # other settings refuse the checkpoint
        PushSumStrategy(N, {"algorithm": "partpsp"}, num_iters=K + 1, iters_per_round=R, transport="relay",
                        out_dir=tmp_path / "cut", resume=True).start(FakeGrid(N, None, fresh_process=False))
    rest = PushSumStrategy(N, {"algorithm": "partpsp"}, num_iters=K, iters_per_round=R, transport="relay",
                           out_dir=tmp_path / "cut", timeout_s=5, resume=True)
    rest.start(FakeGrid(N, lambda i, s, c: factory, fresh_process=False))  # new SuperNodes: nodes come from the file
    # the results file has the in-process runner's layout
    import json

    doc = json.loads((tmp_path / "cut" / "results.json").read_text())
    runner_keys = {"name", "status", "error", "config", "seed", "algorithm", "backend", "num_iters_requested",
                   "num_iters", "history", "privacy", "bits_sent_per_node", "wall_time_s", "versions"}
    assert runner_keys <= set(doc) and doc["status"] == "finished" and doc["backend"] == "flower-relay"
    assert [row["k"] for row in doc["history"]] == [R, K] and "per_node" in doc["privacy"]
    assert (tmp_path / "cut" / "history.csv").read_text().startswith("round,k,bits_total")
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "cut")
    assert a["history"] == b["history"] and a["bits"] == b["bits"]
    for sa, sb in zip(a["nodes"], b["nodes"]):
        assert torch.equal(sa["x"], sb["x"]) and sa["w"] == sb["w"]


@pytest.mark.parametrize("live", [4, 12])
def test_supernode_count_mismatch_in_simulation_fails_at_once(task_identity, tmp_path, live):
    """4 or 12 SuperNodes for 8 nodes in simulation (the count is known once Flower starts them): a ConfigError
    naming both counts and the fix, in about a second, not after timeout_s."""
    from flower_dp.errors import ConfigError
    from flower_dp.strategies.push_sum import PushSumStrategy

    grid = FakeGrid(live, None, fresh_process=False)
    strat = PushSumStrategy(N, {"builder": "toy", "n_nodes": N}, num_iters=K, iters_per_round=R, transport="relay",
                            out_dir=tmp_path, timeout_s=300)
    t = time.monotonic()
    with pytest.raises(ConfigError, match=rf"simulation runs {live} SuperNodes, n_nodes = 8.*set num-supernodes = 8"):
        strat.start(grid)
    assert time.monotonic() - t < 5


def test_fewer_supernodes_on_the_deployment_engine_fail_after_node_wait_s(task_identity, tmp_path, caplog):
    """Deployment engine (a Grid with push_messages): the wait for missing SuperNodes is logged and lasts
    node_wait_s, then GossipTimeoutError names the counts and both fixes."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    grid = FakeGrid(4, None, fresh_process=False)
    grid.push_messages = lambda msgs: []  # what makes it look like the deployment engine's Grid
    strat = PushSumStrategy(N, {"builder": "toy", "n_nodes": N}, num_iters=K, iters_per_round=R, transport="relay",
                            out_dir=tmp_path, timeout_s=300, node_wait_s=1.0)
    t = time.monotonic()
    with caplog.at_level("INFO", logger="flwr"), pytest.raises(
            GossipTimeoutError, match=r"4 Flower SuperNodes connected within node_wait_s = 1 s, n_nodes = 8.*"
                                      r"set num-supernodes = 8.*raise node_wait_s"):
        strat.start(grid)
    assert 1.0 <= time.monotonic() - t < 5
    assert any("4 of 8 SuperNodes connected; waiting up to 1 s" in r.getMessage() for r in caplog.records)


def test_a_wrong_ray_address_on_the_deployment_engine_fails_in_seconds_naming_it(task_identity, tmp_path):
    """transport='ray' on the deployment engine with a Ray address nobody listens on: no wait for a simulation's
    Ray; ConnectionError naming the address and the fix within seconds."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    grid = FakeGrid(N, None, fresh_process=False)
    grid.push_messages = lambda msgs: []  # what makes it look like the deployment engine's Grid
    strat = PushSumStrategy(N, {"builder": "toy", "n_nodes": N}, num_iters=K, iters_per_round=R, transport="ray",
                            out_dir=tmp_path, timeout_s=300, backend_kwargs={"address": "127.0.0.1:9"})
    t = time.monotonic()
    with pytest.raises(ConnectionError, match=r"the Ray address '127.0.0.1:9' does not answer.*ray start --head"):
        strat.start(grid)
    assert time.monotonic() - t < 10


def test_ray_transport_on_the_deployment_engine_without_a_cluster_fails_before_the_node_wait(
        task_identity, tmp_path, monkeypatch):
    """transport='ray', no address, deployment engine, SuperNodes still missing: the missing shared Ray cluster is
    reported at once, not after node_wait_s."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    grid = FakeGrid(4, None, fresh_process=False)
    grid.push_messages = lambda msgs: []  # what makes it look like the deployment engine's Grid
    strat = PushSumStrategy(N, {"builder": "toy", "n_nodes": N}, num_iters=K, iters_per_round=R, transport="ray",
                            out_dir=tmp_path, node_wait_s=60)
    t = time.monotonic()
    with pytest.raises(ValueError, match=r"transport='ray' cannot work on Flower's deployment engine"):
        strat.start(grid)
    assert time.monotonic() - t < 5
