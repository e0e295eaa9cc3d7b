"""PushSumStrategy.start with FedAvg's signature (drop-in parity), through the relay's fake Grid.

``initial_arrays`` is the nodes' starting model; ``timeout`` and ``train_config`` are honoured; Flower's
``evaluate_fn(round, ArrayRecord)`` sees the network-average model; the ``Result``'s arrays load into the user's
model with ``to_torch_state_dict()`` and equal the network average; its metrics carry eps per round.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from flower_dp.clients import registry
from flower_dp.clients.push_sum_app import build_plan_node
from flower_dp.gossip import run_iteration
from flower_dp.mechanisms.flat import flatten_params
from flower_dp.models import build_model
from flower_dp.topology import make_topology

from test_push_sum_relay import FakeGrid, task_identity  # noqa: F401  (fixture)

N, K, R = 4, 4, 2


class _BNNet(torch.nn.Module):
    """A model with a buffer (an input shift, not trained): Result.arrays must carry it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc = torch.nn.Linear(5, 4)
        self.register_buffer("shift", torch.zeros(5))
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.out(torch.relu(self.fc(x - self.shift)))


def _factory(model_fn):
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(16, 5, generator=g), torch.randint(0, 2, (16,), generator=g)) for _ in range(N)]
    topo = make_topology("random_irregular", N, seed=2)
    dim = sum(p.numel() for p in model_fn().parameters())
    plan = registry.prepare("dyn_d2p", dict(lr=0.1, batch_size=8, variant="dyn", epsilon=2.0, delta=1e-4,
                                            accountant="rdp"), n_nodes=N, samples_per_node=[16] * N, num_iters=K,
                            dim=dim, seed=1, reproducible=True)
    return plan, functools.partial(build_plan_node, plan=plan, topology=registry.topology_for(plan, topo),
                                   model_fn=model_fn, data=data)


def _reference(factory, start_model=None):
    """The in-process run, nodes started from ``start_model``'s parameters when given."""
    nodes = [factory(i, "cpu") for i in range(N)]
    for nd in nodes:
        if start_model is not None:
            nd.model.load_state_dict(start_model.state_dict())
            nd.x = flatten_params(nd.model).to(torch.float32)
        nd.setup()
    for k in range(K):
        run_iteration(nodes, k)
    return nodes, (torch.stack([nd.eval_params().to(torch.float64) for nd in nodes]).sum(0) / N).to(torch.float32)


def test_start_has_fedavg_signature_and_returns_a_loadable_average(task_identity):
    """A user's model with a buffer: initial_arrays start every node, evaluate_fn sees the average as an ArrayRecord
    at rounds 0..R, train_config reaches the builder, Result.arrays loads into the model and is the network average."""
    from flwr.serverapp.strategy import FedAvg

    from flower_dp.strategies.push_sum import PushSumStrategy

    torch.set_num_threads(1)
    plan, factory = _factory(_BNNet)
    user = _BNNet()
    with torch.no_grad():  # a starting model different from the builder's, and a non-default buffer
        for p in user.parameters():
            p.mul_(0.5).add_(0.1)
        user.shift.fill_(0.25)
    _, want = _reference(factory, start_model=user)
    seen_config, evals = [], []

    def builder(i, spec, ctx):
        seen_config.append(spec.get("train_config"))
        return factory

    def evaluate_fn(rnd, arrays):
        assert isinstance(arrays, ArrayRecord)
        evals.append((rnd, arrays))
        return MetricRecord({"probe": float(rnd)})

    import inspect

    fed = inspect.signature(FedAvg.start).parameters
    mine = inspect.signature(PushSumStrategy.start).parameters
    # FedAvg's parameters in order, then Flower 1.43's optional should_stop where the installed FedAvg lacks it
    assert list(mine)[:len(fed)] == list(fed), f"start() parameters {list(mine)} differ from FedAvg's {list(fed)}"
    assert list(mine)[len(fed):] in ([], ["should_stop"]) and mine["should_stop"].default is None

    grid = FakeGrid(N, builder, fresh_process=True)
    strat = PushSumStrategy(N, {"algorithm": "dyn_d2p"}, num_iters=K, iters_per_round=R, transport="relay",
                            timeout_s=999)
    result = strat.start(grid, initial_arrays=ArrayRecord(user.state_dict()), timeout=7.5,
                         train_config=ConfigRecord({"lr-scale": 0.5}), evaluate_fn=evaluate_fn)
    assert strat.timeout_s == 7.5
    assert seen_config and all(c == {"lr-scale": 0.5} for c in seen_config)
    assert [r for r, _ in evals] == [0, 1, 2]
    assert np.array_equal(evals[0][1]["fc.weight"].numpy(), user.fc.weight.detach().numpy())

    model = _BNNet()
    model.load_state_dict(result.arrays.to_torch_state_dict())  # strict: every key, buffers too
    assert torch.equal(flatten_params(model), want), "Result.arrays is not the network-average model"
    assert torch.equal(model.shift, user.shift)  # buffers from initial_arrays
    assert np.array_equal(evals[-1][1]["out.bias"].numpy(), result.arrays["out.bias"].numpy())

    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert not any(key.startswith("eps_") for r in (1, 2) for key in result.train_metrics_clientapp[r])
    # the privacy spent lives where GauLRQ puts it: beside the server-side evaluation
    eps = [result.evaluate_metrics_serverapp[r]["eps_rigorous"] for r in (1, 2)]
    paper = [result.evaluate_metrics_serverapp[r]["eps_paper"] for r in (1, 2)]
    assert 0 < eps[0] < eps[1] <= plan.eps_rigorous[0] * (1 + 1e-9) + 1e-12
    assert eps[1] == max(p["eps_rigorous"] for p in strat.privacy)
    assert paper[1] == max(float(e) for e in plan.eps_paper) and paper[0] == paper[1]
    spent = strat.privacy_spent()  # the same figure in the type GauLRQ.privacy_spent() returns
    assert spent.epsilon == eps[1] and spent.delta == plan.delta_of(0) and spent.num_releases > 0
    assert result.evaluate_metrics_serverapp[0]["probe"] == 0.0 and result.evaluate_metrics_serverapp[2]["probe"] == 2.0


def test_without_initial_arrays_the_builders_model_and_named_arrays(task_identity):
    """No initial_arrays: the nodes keep the builder's model; Result.arrays still loads into a buffer-free model."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    torch.set_num_threads(1)
    model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
    _, factory = _factory(model_fn)
    _, want = _reference(factory)
    grid = FakeGrid(N, lambda i, spec, ctx: factory, fresh_process=False)
    result = PushSumStrategy(N, {"algorithm": "dyn_d2p"}, num_iters=K, iters_per_round=R,
                             transport="relay").start(grid)
    model = model_fn()
    model.load_state_dict(result.arrays.to_torch_state_dict())
    assert torch.equal(flatten_params(model), want)
    # the same run started from initial_arrays equal to the builder's model gives the same numbers
    grid = FakeGrid(N, lambda i, spec, ctx: factory, fresh_process=False)
    again = PushSumStrategy(N, {"algorithm": "dyn_d2p"}, num_iters=K, iters_per_round=R, transport="relay").start(
        grid, initial_arrays=ArrayRecord(model_fn().state_dict()))
    assert all(np.array_equal(again.arrays[k].numpy(), result.arrays[k].numpy()) for k in result.arrays)


def test_initial_arrays_of_another_model_fail_with_the_fix(task_identity):
    from flower_dp.strategies.push_sum import PushSumStrategy

    model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
    _, factory = _factory(model_fn)
    grid = FakeGrid(N, lambda i, spec, ctx: factory, fresh_process=False)
    strat = PushSumStrategy(N, {"algorithm": "dyn_d2p"}, num_iters=K, iters_per_round=R, transport="relay")
    with pytest.raises((RuntimeError, ValueError), match="initial_arrays do not fit"):
        strat.start(grid, initial_arrays=ArrayRecord(_BNNet().state_dict()))


def test_should_stop_ends_the_run_cleanly_and_a_resume_finishes_it(task_identity, tmp_path):
    """Flower 1.43's ``should_stop(round, result)``: True after round 1 ends the run there (results and checkpoint
    saved, status stopped, ``stop_reason``); ``resume=True`` runs round 2 and ends with the uninterrupted average."""
    import json

    from flower_dp.strategies.push_sum import PushSumStrategy

    torch.set_num_threads(1)
    model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
    _, factory = _factory(model_fn)
    _, want = _reference(factory)
    asked = []

    def should_stop(rnd, result):
        asked.append((rnd, sorted(result.train_metrics_clientapp)))
        return rnd == 1

    grid = FakeGrid(N, lambda i, spec, ctx: factory, fresh_process=False)
    cut = PushSumStrategy(N, {"algorithm": "dyn_d2p"}, num_iters=K, iters_per_round=R, transport="relay",
                          out_dir=tmp_path)
    cut.start(grid, should_stop=should_stop)
    assert asked == [(1, [1])] and [h["k"] for h in cut.history] == [R]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "stopped" and doc["stop_reason"] == "should_stop: round 1"

    grid = FakeGrid(N, lambda i, spec, ctx: factory, fresh_process=False)
    rest = PushSumStrategy(N, {"algorithm": "dyn_d2p"}, num_iters=K, iters_per_round=R, transport="relay",
                           out_dir=tmp_path, resume=True)
    result = rest.start(grid, should_stop=should_stop)
    assert [h["k"] for h in rest.history] == [R, K]
    assert asked == [(1, [1]), (2, [2])]  # asked after the last round too; the run is complete whatever it answers
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "finished"
    model = model_fn()
    model.load_state_dict(result.arrays.to_torch_state_dict())
    assert torch.equal(flatten_params(model), want)
