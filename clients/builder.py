"""The one node builder: an experiment config -> its data, partitions, plan, topology and model -> node i.

Its users build nodes (or plan them) through it, from the same config dict, so they build the same nodes:

* the in-process runner (:func:`flower_dp.experiments.runner.build_experiment`): ``build_parts(config)``,
  then ``parts.build_node(i, device)`` for every i;
* the push-sum ClientApp (:mod:`flower_dp.clients.push_sum_node`): the server plans once
  (``spec_from_config``: ``build_parts(config, test=False).plan``), each SuperNode builds its own node
  (``build_parts(config, plan=plan, test=False).build_node(node_id, device)``).  The drop-in path (your
  own model and data, ``plan_spec``/``model_builder``) shares the steps below it: :func:`model_dim`,
  :func:`base_topology`, :func:`run_topology` and :func:`make_run_node`;
* the Flower backend (:func:`flower_dp.experiments.flower_backend.run_flower_experiment`): one ``build_parts(config)``
  on the server gives the SuperNodes' spec (``spec_from_parts``), the test split and the evaluation model.

The order of the steps (and so which error a bad config raises first) is the runner's: load the data,
partition it, build the base topology, plan (its size d from a fresh model), derive the algorithm's
topology and check it is strongly connected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flower_dp import sources

from .base import Plan

__all__ = ["ExperimentParts", "build_parts", "model_dim", "base_topology", "run_topology", "make_run_node",
           "own_model", "own_dataset"]


def model_dim(model: torch.nn.Module) -> int:
    """The model size d (every parameter counts), as the plan is made for."""
    return sum(p.numel() for p in model.parameters())


def base_topology(name: str, n_nodes: int, kwargs: dict[str, Any] | None = None) -> Any:
    """The configured topology (:func:`flower_dp.topology.make_topology`, connectivity checked later)."""
    from flower_dp.topology import make_topology

    return make_topology(name, int(n_nodes), check=False, **dict(kwargs or {}))


def run_topology(plan: Plan, base: Any) -> Any:
    """The topology ``plan`` runs on (DPPS family: sync rounds, A(DP)2SGD: its matchings), strongly connected."""
    from flower_dp.topology import check_strongly_connected

    from .registry import topology_for

    topology = topology_for(plan, base)
    check_strongly_connected(topology)  # e.g. DPPS's 1-Out (self-loops only) is connected by its sync rounds
    return topology


def own_model(key: str, seed: int) -> torch.nn.Module:
    """A fresh model of the factory registered under ``key`` (:mod:`flower_dp.sources`), initialised from ``seed``
    (the global torch RNG is left unchanged), as :func:`flower_dp.models.build_model` builds a named model."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return sources.lookup(key).model_fn()


def own_dataset(key: str, *, train: bool) -> Any:
    """The training or test tensors registered under ``key`` as a :class:`flower_dp.data.ArrayDataset`."""
    from flower_dp.data import ArrayDataset

    src = sources.lookup(key)
    x, y = src.train if train else src.test
    return ArrayDataset(x, y, src.num_classes, key, synthetic=False)


def make_run_node(plan: Plan, node_id: int, *, topology: Any, model: torch.nn.Module, data_x: Any, data_y: Any,
                  device: str = "cpu", loss_fn: Callable | None = None) -> Any:
    """Node ``node_id`` of ``plan`` (:func:`flower_dp.clients.registry.make_node`); the loss defaults to
    cross-entropy, as in every runner."""
    from flower_dp.models import cross_entropy_loss

    from .registry import make_node

    return make_node(plan, node_id=node_id, topology=topology, model=model, loss_fn=loss_fn or cross_entropy_loss,
                     data_x=data_x, data_y=data_y, device=device)


@dataclass
class ExperimentParts:
    """What every node of one experiment config is built from (:func:`build_parts`)."""

    config: dict[str, Any]
    train: Any
    test: Any  # None when built with test=False
    partitions: list
    plan: Plan
    topology: Any
    dim: int | None = None  # the model size, when the plan was made here

    def new_model(self) -> torch.nn.Module:
        """A fresh model of the config (deterministic initialisation from the run's seed)."""
        from flower_dp.models import build_model

        model = self.config["model"]
        if sources.is_own(model["name"]):
            return own_model(model["name"], int(self.config["run"]["seed"]))
        kw = {k: v for k, v in model.items() if k != "name"}
        return build_model(model["name"], num_classes=self.train.num_classes, seed=int(self.config["run"]["seed"]),
                           **kw)

    def build_node(self, node_id: int, device: str = "cpu") -> Any:
        """Node ``node_id``: its partition of the training set, a fresh model, the plan and the topology (drawing its
        noise ahead when the config's ``run.prefetch_noise`` says so)."""
        idx = torch.as_tensor(self.partitions[node_id], dtype=torch.long)
        node = make_run_node(self.plan, node_id, topology=self.topology, model=self.new_model(),
                             data_x=self.train.x[idx], data_y=self.train.y[idx], device=device)
        if self.config["run"].get("prefetch_noise", False) and hasattr(node, "prefetch_noise"):
            node.prefetch_noise(True)
        return node

    def test_data(self) -> tuple[Any, Any]:
        """``(x_test, y_test)``: the test split, its first ``data.test_samples`` when set."""
        x_test, y_test = self.test.x, self.test.y
        m = self.config["data"]["test_samples"]
        if m:
            x_test, y_test = x_test[: int(m)], y_test[: int(m)]
        return x_test, y_test

    def info(self, device: str) -> dict[str, Any]:
        """The runner's ``info`` section of the results."""
        return {
            "dataset": self.train.name,
            "synthetic_data": bool(getattr(self.train, "synthetic", False)),
            "samples_per_node": [len(p) for p in self.partitions],
            "test_samples": len(self.test_data()[0]),
            "dim": self.dim if self.dim is not None else model_dim(self.new_model()),
            "topology": self.topology.name,
            "device": device,
        }


def build_parts(config: Any, *, plan: Plan | None = None, test: bool = True) -> ExperimentParts:
    """Load the data, partition it, build the topology and (without ``plan``) the plan of an experiment config.

    Parameters
    ----------
    config : an ExperimentConfig's ``to_dict()`` (or the config itself)
    plan : Plan, optional
        The plan the server made (a SuperNode builds its node from it; nothing is calibrated again).
        Default: plan here with :func:`flower_dp.clients.registry.prepare`.
    test : bool
        Also load the test split (the runner evaluates; a SuperNode does not).

    Datasets are cached per process by :func:`flower_dp.data.load_dataset` (read-only).
    """
    from flower_dp.data import load_dataset, partition

    from .registry import prepare

    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    seed, n, data = int(cfg["run"]["seed"]), int(cfg["topology"]["n_nodes"]), cfg["data"]
    scaling = data.get("scaling", "standard")
    if sources.is_own(data["dataset"]):
        train, test_set = own_dataset(data["dataset"], train=True), own_dataset(data["dataset"], train=False)
    else:
        train = load_dataset(data["dataset"], train=True, root=data["root"], scaling=scaling)
        test_set = load_dataset(data["dataset"], train=False, root=data["root"], scaling=scaling) if test else None
    parts = partition(np.asarray(train.y), n, scheme=data["partition"], alpha=data["alpha"], seed=seed)
    if data["samples_per_node"]:
        parts = [p[: int(data["samples_per_node"])] for p in parts]
    topo_kw = {k: v for k, v in cfg["topology"].items() if k not in ("name", "n_nodes")}
    base = base_topology(cfg["topology"]["name"], n, topo_kw)
    out = ExperimentParts(config=cfg, train=train, test=test_set, partitions=parts, plan=plan, topology=None)
    if plan is None:
        out.dim = model_dim(out.new_model())
        out.plan = prepare(cfg["algorithm"]["name"], dict(cfg["algorithm"]["params"]), n_nodes=n,
                           samples_per_node=[len(p) for p in parts], num_iters=int(cfg["run"]["num_iters"]),
                           dim=out.dim, seed=seed, reproducible=bool(cfg["run"].get("reproducible", False)),
                           noise_sampler=cfg["run"].get("noise_sampler", "float"))
    out.topology = run_topology(out.plan, base)
    return out
