"""Flower-on-Ray and server-relay push-sum runs give the in-process numbers.

The three Flower runs compared here (the toy nodes on Ray and on the relay, PartPSP on Ray) run one after the
other in one ``flwr run`` (:func:`flower_dp.experiments.flower_run.run_app`) of :data:`SERVER`, shared by the tests of this
module (:func:`flower_runs`); it writes what each strategy saw to the run's folder
(:func:`flwr_run_helper.save_strategy`) for its test to compare.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.clients.push_sum_app import build_toy_node
from flower_dp.gossip import run_iteration
from flower_dp.topology import make_topology

from flwr_run_helper import flwr_run, load_strategy, run_test_app, save_strategy, saving_errors

pytestmark = pytest.mark.flower

N, K, R = 8, 12, 6
SPEC = {"builder": "toy", "n_nodes": N, "topology": "random_irregular", "topology_kwargs": {"seed": 4},
        "node_kwargs": {"dim": 16, "seed": 7}}

#: the Flower runs of this module, each into ``out-dir/<name>`` (``out-dir``: its run configuration): ``ray`` and
#: ``relay`` (the toy nodes of :data:`SPEC` on either transport, :func:`_toy_run`) and ``partpsp``
#: (:func:`_partpsp_run`); a run that fails leaves its traceback for its test and the next one runs
SERVER = ServerApp()


def _reference():
    """In-process run of the same nodes; returns per-round network averages, loss means, bits."""
    topo = make_topology("random_irregular", N, seed=4)
    nodes = [build_toy_node(i, "cpu", topology=topo, dim=16, seed=7) for i in range(N)]
    avgs, losses, bits = [], [], 0
    for k0 in range(0, K, R):
        vals = []
        for k in range(k0, k0 + R):
            log = run_iteration(nodes, k)
            bits += sum(log.bits_sent.values())
            vals += [nd.last_metrics()["loss"] for nd in nodes]
        avgs.append((torch.stack([nd.z().double() for nd in nodes]).sum(0) / N).float())
        losses.append(sum(vals) / len(vals))
    return avgs, losses, bits


@SERVER.main()
def _main(grid: Grid, context: Context) -> None:
    out = Path(str(context.run_config["out-dir"]))
    for name in ("ray", "relay", "partpsp"):
        with saving_errors(out / name / "strategy"):
            if name == "partpsp":
                _partpsp_run(grid, out / name)
            else:
                _toy_run(grid, out / name, transport=name)


@pytest.fixture(scope="module")
def flower_runs(tmp_path_factory):
    """The one ``flwr run`` of :data:`SERVER` for this module: its :class:`FlwrRun` and its ``out-dir``."""
    out = tmp_path_factory.mktemp("flower_runs")
    run = run_test_app("test_flower_push_sum:SERVER", out, num_supernodes=N, run_config={"out-dir": str(out)})
    return run, out


def _toy_run(grid: Grid, out: Path, transport: str) -> None:
    """In the ServerApp: the toy nodes on ``transport``, two rounds of R iterations, into ``out``."""
    from flower_dp.strategies.push_sum import PushSumStrategy

    averages = {}

    def evaluate(rnd, avg):
        averages[rnd] = avg.clone()
        return {"norm": float(avg.norm())}

    kw = {"backend_kwargs": {"num_hosts": 2}} if transport == "ray" else {}
    strat = PushSumStrategy(N, SPEC, num_iters=K, iters_per_round=R, transport=transport, evaluate_fn=evaluate,
                            out_dir=out, timeout_s=60, **kw)
    result = strat.start(grid)
    save_strategy(out / "strategy", strat, result=result, averages=averages)


@pytest.mark.parametrize("transport", ["ray", "relay"])
def test_flower_push_sum_matches_inprocess(transport, flower_runs):
    """Flower rounds of R iterations (Ray hosts, or server relay) == in-process, to the bit for the toy node."""
    avgs, losses, bits = _reference()
    run, out = flower_runs
    out = out / transport
    strat = load_strategy(out / "strategy", run)
    for rnd in (1, 2):
        assert torch.equal(strat.averages[rnd], avgs[rnd - 1]), f"round {rnd}: network average differs"
        assert strat.history[rnd - 1]["loss"] == pytest.approx(losses[rnd - 1], rel=1e-12)
    assert strat.history[-1]["bits_total"] == bits
    doc = json.loads((out / "results.json").read_text())
    assert doc["status"] == "finished" and doc["backend"] == f"flower-{transport}" and len(doc["history"]) == 2
    assert doc["history"][-1]["norm"] == pytest.approx(float(avgs[-1].norm()))
    assert strat.evaluate_metrics_serverapp[2]["norm"] == pytest.approx(float(avgs[-1].norm()))
    if transport == "ray":
        assert (out / "checkpoint.pt").exists()
    print(f"{transport}: timings {strat.timings} (flwr run of the module's three runs: {run.wall_s:.1f} s)")


def _partpsp_config():
    """PartPSP (reduce step every iteration) on Fashion-MNIST, seeded simulation mode (Flower == in-process)."""
    from flower_dp.experiments import config_from_dict

    return config_from_dict({
        "run": {"seed": 3, "num_iters": 6, "eval_every": 3, "checkpoint": False, "progress": False,
                "reproducible": True},  # Flower == in-process bit for bit: the seeded simulation mode
        "data": {"dataset": "fashion_mnist", "samples_per_node": 32, "test_samples": 200},
        "model": {"name": "partpsp_mlp"},
        "topology": {"name": "exp_one_peer", "n_nodes": N},
        "algorithm": {"name": "partpsp", "params": {"lr": 0.1, "batch_size": 8, "gamma_n": 1e-3, "b": 5.0,
                                                     "sync_period": 3}},
    })


def _partpsp_run(grid: Grid, out: Path) -> None:
    """In the ServerApp: :func:`_partpsp_config` on two Ray host actors, evaluated as the runner does, into
    ``out``."""
    from flower_dp.clients.push_sum_app import spec_from_config
    from flower_dp.data import load_dataset
    from flower_dp.experiments.runner import evaluate_params
    from flower_dp.models import build_model
    from flower_dp.strategies.push_sum import PushSumStrategy

    torch.set_num_threads(1)
    spec = spec_from_config(_partpsp_config())
    test = load_dataset("fashion_mnist", train=False)
    x_test, y_test = test.x[:200], test.y[:200]
    model = build_model("partpsp_mlp", num_classes=10, seed=3)

    def evaluate(rnd, avg):
        acc, loss = evaluate_params(model, avg, x_test, y_test)
        return {"acc_avg": acc, "test_loss_avg": loss}

    strat = PushSumStrategy(N, spec, num_iters=spec["plan"].num_iters, iters_per_round=3, evaluate_fn=evaluate,
                            out_dir=out, timeout_s=120, backend_kwargs={"num_hosts": 2})
    strat.start(grid)
    save_strategy(out / "strategy", strat)


def test_flower_on_ray_partpsp_matches_inprocess_runner(flower_runs):
    """PartPSP (reduce step every iteration) from an experiment config: Flower-on-Ray == run_experiment."""
    from flower_dp.experiments import run_experiment

    torch.set_num_threads(1)
    ref = run_experiment(_partpsp_config(), out_dir=None, progress=False)
    run, out = flower_runs
    strat = load_strategy(out / "partpsp" / "strategy", run)
    hist = strat.history
    assert [h["k"] for h in hist] == [h["k"] for h in ref.history] == [3, 6]
    for mine, theirs in zip(hist, ref.history):
        assert mine["eval"]["acc_avg"] == theirs["acc_avg"]
        assert mine["eval"]["test_loss_avg"] == theirs["test_loss_avg"]
        assert mine["bits_total"] == theirs["bits_total"]
        assert mine["sensitivity_est"] == pytest.approx(theirs["sensitivity_est"], rel=1e-9)
    per_node = strat.privacy
    assert [p["node"] for p in per_node] == list(range(N)) and "eps_rigorous" in per_node[0]


@pytest.mark.slow
def test_flwr_run_example_app(tmp_path):
    """`flwr run` on examples/push_sum against a SuperLink of our own (free ports, killed afterwards); its
    simulation joins a Ray cluster started on 127.0.0.1 (RAY_ADDRESS), so nothing binds another address."""
    app = Path(__file__).resolve().parents[1] / "examples" / "push_sum"
    text = flwr_run(app, tmp_path, federation_config="num-supernodes=8",
                    run_config=f"experiment='toy' num-iters=20 out-dir='{tmp_path / 'out'}'")
    assert "PUSH_SUM_DONE" in text, text[-4000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["status"] == "finished" and [h["k"] for h in doc["history"]] == [10, 20]
    # same numbers as the in-process loop on the same toy nodes
    topo = make_topology("random_irregular", 8, seed=0)
    nodes = [build_toy_node(i, "cpu", topology=topo, dim=16, seed=0) for i in range(8)]
    bits = sum(sum(run_iteration(nodes, k).bits_sent.values()) for k in range(20))
    assert doc["history"][-1]["bits_total"] == bits


@pytest.mark.parametrize("paper", ["dyn_d2p", "privsgp_vr", "dp_csgp", "partpsp"])
def test_example_paper_configs_plan(paper, monkeypatch):
    """examples/push_sum ships one config per decentralized paper; each loads and plans (server side)."""
    import sys

    from flower_dp.clients.push_sum_app import spec_from_config
    from flower_dp.experiments import load_config

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples" / "push_sum"))
    from push_sum_example.server_app import _config_path

    path = _config_path(paper)
    assert path.parent.name == "configs" and path.is_file()
    spec = spec_from_config(load_config(path).with_overrides({"run.num_iters": 20}))
    assert spec["plan"].algorithm == paper and spec["plan"].n_nodes == 8 and spec["plan"].num_iters == 20
    sys.modules.pop("push_sum_example.server_app", None)


@pytest.mark.slow
def test_flwr_run_with_fewer_supernodes_than_nodes_fails_fast(tmp_path):
    """8 push-sum nodes on 4 simulated SuperNodes under `flwr run`: the ServerApp fails at once naming both counts
    and the fix (the count is known when Flower starts the SuperNodes), not after a timeout.  `flwr run` ended
    10.5 s after its start at load ~1 and 32.5 s at load 12-16 on 2 cores, nearly all of it Flower starting and
    stopping its simulation; the bound catches a timeout-long wait coming back."""
    app = Path(__file__).resolve().parents[1] / "examples" / "push_sum"
    times: dict = {}
    text = flwr_run(app, tmp_path, federation_config="num-supernodes=4",
                    run_config=f"experiment='toy' n-nodes=8 out-dir='{tmp_path / 'out'}'", timeout=300, times=times)
    assert "the simulation runs 4 SuperNodes, n_nodes = 8" in text and "set num-supernodes = 8" in text, text[-4000:]
    assert "PUSH_SUM_DONE" not in text
    print(f"flwr run, 8 nodes on 4 SuperNodes: failed after {times['flwr_run_s']:.1f} s of flwr run")
    assert times["flwr_run_s"] < 60
