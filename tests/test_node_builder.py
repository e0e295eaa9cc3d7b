"""One node builder (issue 13): the in-process runner and the push-sum ClientApp both build nodes through
:mod:`flower_dp.clients.builder`, and a SuperNode's node equals the runner's node i."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "flower_dp" / "experiments" / "runner.py"
APP = ROOT / "clients" / "push_sum_node.py"
FLOWER_BACKEND = ROOT / "flower_dp" / "experiments" / "flower_backend.py"
#: the steps only the builder takes (loading and partitioning data, topology, planning, making nodes, models)
STEPS = {"load_dataset", "partition", "make_topology", "check_strongly_connected", "topology_for", "make_node",
         "build_model"}


#: push_sum_node's experiment and drop-in node builders (its toy demo node builds its own topology)
APP_BUILDERS = ("spec_from_config", "build_registry_node", "build_plan_node", "registry_builder", "plan_spec",
                "model_builder")


def _names(path: Path, functions: tuple[str, ...] = ()) -> tuple[set[str], set[str]]:
    """(names imported, names called) in the module (or only in ``functions``), function-level imports included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if functions:
        defs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        assert set(functions) <= set(defs), sorted(set(functions) - set(defs))
        tree = ast.Module(body=[defs[f] for f in functions], type_ignores=[])
    imported, called = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[-1] for a in node.names)
            imported.update(a.name.split(".")[-1] for a in node.names)
        elif isinstance(node, ast.Call):
            f = node.func
            called.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return imported, called


@pytest.mark.parametrize("path", [RUNNER, APP, FLOWER_BACKEND], ids=["runner", "push_sum_node", "flower_backend"])
def test_runner_and_client_app_go_through_the_builder(path):
    imported, called = _names(path)
    assert "build_parts" in imported and "build_parts" in called, f"{path.name} does not call build_parts"
    own, own_calls = _names(path, APP_BUILDERS if path == APP else ())
    assert not (STEPS & (own | own_calls)), f"{path.name} builds nodes itself: {sorted(STEPS & (own | own_calls))}"
    for dup in ("_partitions", "_new_model", "_load_cached", "_DATA_CACHE"):
        assert not re.search(rf"\b{dup}\b", path.read_text()), f"{path.name} still has {dup}"


def _cfg(algorithm: str):
    from flower_dp.experiments import config_from_dict

    params = {"lr": 0.1, "batch_size": 8}
    if algorithm == "dyn_d2p":
        params.update(variant="dyn", epsilon=4.0, delta=1e-4, accountant="rdp")
    else:  # partpsp (its MLP): the DPPS family runs on the topology with its sync rounds
        params.update(gamma_n=1e-3, b=5.0, sync_period=3)
    return config_from_dict({
        "run": {"name": "b", "seed": 3, "num_iters": 4, "eval_every": 2, "progress": False, "reproducible": True},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 24, "test_samples": 50},
        "model": {"name": "logreg" if algorithm == "dyn_d2p" else "partpsp_mlp"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": algorithm, "params": params},
    })


def _same(a, b, path="state"):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b), path
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b)):
            _same(u, v, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), path


@pytest.mark.parametrize("algorithm", ["dyn_d2p", "partpsp"])
def test_client_app_node_equals_the_runners_node(algorithm):
    """spec_from_config (server) + the ClientApp's registry builder (SuperNode i) == build_experiment's node i."""
    from flower_dp.clients.push_sum_app import BUILDERS, spec_from_config
    from flower_dp.experiments.runner import build_experiment

    cfg = _cfg(algorithm)
    nodes, plan, topology, _, _, info = build_experiment(cfg)
    spec = spec_from_config(cfg)
    _same(dataclasses.asdict(spec["plan"]), dataclasses.asdict(plan), "plan")
    assert spec["config"] == cfg.to_dict()
    assert info["topology"] == topology.name and info["samples_per_node"] == [24] * 4
    for i, runner_node in enumerate(nodes):
        node = BUILDERS[spec["builder"]](i, spec, None)(i, "cpu")  # what handle_message does on "register"
        assert type(node) is type(runner_node) and node.topology.name == topology.name
        _same(node.state_dict(), runner_node.state_dict())
        _same(node.model.state_dict(), runner_node.model.state_dict(), "model")
        assert torch.equal(node.data_x, runner_node.data_x) and torch.equal(node.data_y, runner_node.data_y)
        for k in range(6):  # the same send weights, sync rounds included
            assert node.topology.send_weights(i, k) == runner_node.topology.send_weights(i, k)
