"""The in-process runner: build n nodes from a config and run them in this process on the run engine.

:func:`run_experiment` builds the nodes, the plan and the test split of a config (:func:`build_experiment`, the
node builder the ClientApp uses too) and drives them with :func:`flower_dp.engine.run_segments` through
:class:`InProcessBackend`: every ``eval_every`` iterations (a *segment*) the network-average model is evaluated on
the test set and the engine records the segment (history row, ``results.json``, ``history.csv``, checkpoint), so a
crash loses at most one segment and ``resume=True`` continues the run.  With ``[run] reproducible = true`` a resumed
run ends with exactly the numbers of an uninterrupted one; by default (secret mode) the restored nodes draw fresh
secrets (valid, not the same numbers; ``results.json`` says which in ``"noise"``).

With ``[network] mode = "async"`` the nodes run on the emulated asynchronous network instead
(:class:`flower_dp.gossip.asynchronous.AsyncSegments`: virtual time, each node at its own pace, delays and losses):
a segment is ``eval_every`` nominal steps of virtual time, ``results.json`` gets a ``"network"`` entry (per node its
steps and why it stopped; each node's eps is in ``privacy.per_node``, from its own ledger), and the run keeps no
checkpoint, so it cannot be resumed.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..engine import STOP_FILE_ENV, RunHeader, RunProgress, SegmentPlan, run_segments, stop_requested
from ..gossip import run_iteration
from ..gossip.protocol import LocalNodes, SegmentResult
from ..models import resolve_device
from ..privacy.parties import push_sum_eps_by_party_from_reports
from ..recorder import SAMPLER_REFUSAL, RunRecorder, plan_summary, sampler_identity
from ..releases import node_is_private, node_metrics, release_fields
from ..rng import noise_record
from .config import SECTIONS, ExperimentConfig

__all__ = ["RunResult", "run_experiment", "build_experiment", "evaluate_params", "InProcessBackend", "STOP_FILE_ENV",
           "CLEAN_STOP_NAME", "stop_requested"]

#: Written beside the checkpoint by a run that stopped on request (:meth:`flower_dp.recorder.RunRecorder.mark_clean_stop`):
#: ``{"k": k}``, the checkpoint's iteration, after which nothing ran.  A resume from that very checkpoint charges no
#: replayed segment (a resume from any other, after a crash or a kill, charges the segment after it again:
#: :func:`flower_dp.privacy.budget.charge_replay`).  It is consumed (deleted) before the resumed run's first iteration.
CLEAN_STOP_NAME = RunRecorder.CLEAN_STOP_NAME


@dataclass
class RunResult:
    """What a run produced (also written to ``out_dir/results.json``)."""

    status: str
    history: list[dict[str, Any]]
    privacy: dict[str, Any]
    final_accuracy: float
    out_dir: Path | None
    wall_time_s: float
    nodes: list[Any] = field(default_factory=list, repr=False)
    #: the party the run is calibrated to and every party's entry (:mod:`flower_dp.privacy.parties`)
    party: str = "out_neighbour"
    eps_by_party: dict[str, Any] = field(default_factory=dict)
    #: the plan every node was built from (:class:`flower_dp.clients.base.Plan`; None for a plan-less algorithm)
    plan: Any = field(default=None, repr=False)
    #: an asynchronous run's network entry (:meth:`flower_dp.gossip.asynchronous.AsyncSegments.record`); {} for sync
    network: dict[str, Any] = field(default_factory=dict)

    @property
    def eps_rigorous_max(self) -> float | None:
        """Largest per-node rigorous eps; None when no node has one (DPPS family: see :attr:`eps_heuristic_max`)."""
        vals = [p.get("eps_rigorous") for p in self.privacy.get("per_node", [])]
        vals = [float(v) for v in vals if v is not None]
        return max(vals) if vals else None

    @property
    def eps_heuristic_max(self) -> float | None:
        """Largest per-node heuristic eps (DPPS family: no DP proof, per node-message); None for proven mechanisms."""
        vals = [float(p["eps_heuristic"]) for p in self.privacy.get("per_node", []) if p.get("eps_heuristic") is not None]
        return max(vals) if vals else None


@torch.no_grad()
def evaluate_params(model: torch.nn.Module, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch: int = 1000):
    """Accuracy and mean cross-entropy of ``model`` with flat parameters ``flat`` on (x, y)."""
    from ..mechanisms import load_flat_params_

    load_flat_params_(model, flat)
    model.eval()
    correct, loss_sum = 0, 0.0
    for s in range(0, len(x), batch):
        logits = model(x[s : s + batch])
        loss_sum += float(torch.nn.functional.cross_entropy(logits, y[s : s + batch], reduction="sum"))
        correct += int((logits.argmax(1) == y[s : s + batch]).sum())
    n = max(len(x), 1)
    return correct / n, loss_sum / n


def _to_device(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: str):
    return model.to(device), x.to(device), y.to(device)


def build_experiment(cfg: ExperimentConfig):
    """Load data, partition it, build the topology, the plan and the nodes (:func:`flower_dp.clients.builder.build_parts`,
    the node builder the ClientApp uses too).

    Returns ``(nodes, plan, topology, (x_test, y_test), eval_model, info)``.
    """
    from ..clients.builder import build_parts

    parts = build_parts(cfg.to_dict())
    eval_model = parts.new_model()
    device = resolve_device(str(cfg.run.get("device", "cpu")))
    nodes = [parts.build_node(i, device) for i in range(cfg.n_nodes)]
    return nodes, parts.plan, parts.topology, parts.test_data(), eval_model, parts.info(device)


def _plan_experiment(cfg: ExperimentConfig):
    """:func:`build_experiment` without the nodes (they are built where they run): ``([], plan, topology, test
    split, eval_model, info)``."""
    from ..clients.builder import build_parts

    parts = build_parts(cfg.to_dict())
    device = resolve_device(str(cfg.run.get("device", "cpu")))
    return [], parts.plan, parts.topology, parts.test_data(), parts.new_model(), parts.info(device)


def _build_node0(cfg: ExperimentConfig, plan: Any) -> Any:
    """Node 0 of ``cfg`` on the CPU, built from ``plan`` (what every node of the run is: private or not)."""
    from ..clients.builder import build_parts

    return build_parts(cfg.to_dict(), plan=plan, test=False).build_node(0, "cpu")


def _plan_num_iters(plan, requested: int) -> int:
    return int(getattr(plan, "num_iters", requested) or requested)


def _different_config(where: str, got: Any, want: Any) -> str:
    return (f"the checkpoint in {where} was written by a different config; "
            "resume with the same config or use a new --out folder")


def _upgrade_checkpoint(ckpt: dict[str, Any]) -> None:
    if isinstance((ckpt.get("config") or {}).get("run"), dict):  # before [run] reproducible every run was seeded
        ckpt["config"]["run"].setdefault("reproducible", True)
    if isinstance(ckpt.get("config"), dict) and isinstance(ckpt["config"].get("run"), dict):  # before [privacy]
        ckpt["config"].setdefault("privacy", {"party": "out_neighbour"})
        ckpt["config"].setdefault("network", copy.deepcopy(SECTIONS["network"]))  # before [network]


def _progress(total: int, enabled: bool, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    quiet = not enabled or os.environ.get("CI") or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, disable=bool(quiet), unit="it", leave=False)



class InProcessBackend(LocalNodes):
    """The in-process loop as a :class:`flower_dp.engine.SegmentBackend`: every node lives in this process and an
    iteration is :func:`flower_dp.gossip.run_iteration` over them (``receivers``: the topology's out-neighbours).

    ``on_iteration()`` is called after every iteration (a progress bar).
    """

    def __init__(self, nodes: list[Any], receivers: Any, on_iteration: Any = None) -> None:
        self.nodes, self.receivers, self.on_iteration = list(nodes), receivers, on_iteration

    def start(self, k: int, restore) -> None:
        """Set the nodes up (``k == 0``) or load the states ``restore()`` gives (iteration ``k``)."""
        if k == 0:
            for node in self.nodes:
                node.setup()
            return
        states = restore()
        for i, node in enumerate(self.nodes):
            node.load_state_dict(states[i])

    def run_segment(self, k0: int, k1: int, *, debug_metrics: bool = False, restore=None) -> SegmentResult:
        """Iterations ``k0 .. k1 - 1``; the metric means over iterations and nodes of what may leave a node
        (:func:`flower_dp.releases.node_metrics`; everything with ``debug_metrics``)."""
        t0 = time.perf_counter()
        bits = np.zeros(len(self.nodes), dtype=np.int64)
        seg_metrics: dict[str, list[float]] = {}
        for kk in range(k0, k1):
            log = run_iteration(self.nodes, kk, receivers=self.receivers)
            for i, b in log.bits_sent.items():
                bits[i] += b
            for node in self.nodes:
                for key, v in node_metrics(node, debug_metrics).items():
                    seg_metrics.setdefault(key, []).append(float(v))
            if self.on_iteration is not None:
                self.on_iteration()
        means = {key: float(np.nanmean(vals)) if vals else float("nan") for key, vals in seg_metrics.items()}
        return SegmentResult(int(k0), int(k1), bits, wall_time_s=time.perf_counter() - t0, means=means)

    def shutdown(self) -> None:
        """Nothing to release: the nodes stay with the caller (:attr:`RunResult.nodes`)."""


def run_experiment(
    cfg: ExperimentConfig,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool | None = None,
    backend: str | None = None,
    ray_address: str | None = None,
) -> RunResult:
    """Run ``cfg`` in-process and return (and, with ``out_dir``, write) its results.

    Parameters
    ----------
    cfg : ExperimentConfig
        A validated config (:func:`flower_dp.experiments.load_config`).
    out_dir : path, optional
        Where ``results.json``, ``history.csv`` and ``checkpoint.pt`` go (default ``cfg.run["out_dir"]``;
        ``None`` writes nothing).
    resume : bool
        Continue from ``out_dir/checkpoint.pt`` (same config); with ``[run] reproducible = true`` the
        resumed run ends with the same numbers as an uninterrupted one, in secret mode it continues
        with fresh node secrets.
    progress : bool, optional
        Show a progress bar (default from the config; always quiet when stderr is not a terminal or ``CI`` is set).
    backend : ``"inprocess"`` | ``"ray"``, optional
        Where the nodes run (default the config's ``run.backend``): in this process, or on Ray host actors
        (:mod:`flower_dp.experiments.ray_cluster`; the same numbers on CPU for a reproducible run).
    ray_address : str, optional
        ``"HEAD:PORT"`` or ``"auto"`` of a running Ray cluster to join (default the config's ``run.ray_address``,
        else ``RAY_ADDRESS``, else a local Ray of this run's own); only with ``backend="ray"``.
    """
    where = str(backend if backend is not None else cfg.run.get("backend", "inprocess"))
    if where not in ("inprocess", "ray"):
        raise ValueError(f"backend must be 'inprocess' or 'ray', got {where!r}")
    if cfg.network["mode"] == "async" and where != "inprocess":
        raise ValueError(f"network.mode = 'async' runs the nodes in this process, got backend={where!r}; pass "
                         "backend='inprocess' (the asynchronous network on Ray actors is not built yet)")
    if cfg.network["mode"] == "async" and resume:
        raise ValueError("resume=True cannot continue an asynchronous run (network.mode = 'async'): it keeps no "
                         "checkpoint (its in-flight messages and per-edge running sums are not saved); start it again "
                         "in a new out_dir")
    if where == "inprocess" and ray_address is not None:
        raise ValueError(f"ray_address={ray_address!r} is for backend='ray', got backend='inprocess'; pass "
                         "backend='ray' (--backend ray) or drop the address")
    if where == "ray":
        from .ray_cluster import ray_connection

        with ray_connection(ray_address if ray_address is not None else cfg.run.get("ray_address")) as conn:
            return _run(cfg, out_dir, resume, progress, conn)
    return _run(cfg, out_dir, resume, progress, None)


def _run(cfg: ExperimentConfig, out_dir, resume: bool, progress: bool | None, ray: dict[str, Any] | None
         ) -> RunResult:
    """:func:`run_experiment` on the backend chosen: in process (``ray`` None) or on the Ray connection ``ray``."""
    from .config import placeless

    torch.set_num_threads(max(1, int(os.environ.get("FLOWER_DP_THREADS", torch.get_num_threads()))))
    t0 = time.perf_counter()  # the wall time counts the set-up too
    out = out_dir if out_dir is not None else cfg.run.get("out_dir")
    if resume and out is None:
        raise ValueError("resume=True needs an out_dir holding a checkpoint; got out_dir=None")
    asynchronous = cfg.network["mode"] == "async"
    # the identity names the sampler of the nodes' device (numpy on the CPU, torch's float64 normal on CUDA), known
    # once build_experiment resolved it (checkpoints are loaded and saved after that)
    recorder = RunRecorder(out, identity=lambda: {"config": placeless(cfg.to_dict()),
                                                  **sampler_identity(info["device"])},
                           checkpoint=cfg.run.get("checkpoint", True) and not asynchronous,
                           refusals={"config": _different_config, **SAMPLER_REFUSAL})
    if ray is None:
        nodes, plan, topology, (x_test, y_test), eval_model, info = build_experiment(cfg)
        probe = nodes
    else:  # the nodes are built on the Ray hosts; node 0 built here answers what every node of the plan is
        nodes, plan, topology, (x_test, y_test), eval_model, info = _plan_experiment(cfg)
        probe = [_build_node0(cfg, plan)]
    n_nodes = cfg.n_nodes
    eval_model, x_test, y_test = _to_device(eval_model, x_test, y_test, info["device"])
    K = _plan_num_iters(plan, int(cfg.run["num_iters"]))
    debug = bool(cfg.run.get("debug_metrics", False))
    released = release_fields(debug, private=all(node_is_private(n) for n in probe))
    if debug and released.get("uncharged_statistics_released"):
        print(f"flower-dp: WARNING: {released['release_warning']}", file=sys.stderr)
    segments = SegmentPlan(n_nodes=n_nodes, num_iters=K, iters_per_segment=int(cfg.run["eval_every"]),
                           num_iters_requested=int(cfg.run["num_iters"]),
                           replay_plan=plan if all(hasattr(n, "plan") for n in probe) else None)
    replay_plan_ok = segments.replay_plan is not None
    del probe

    def node_params() -> list[torch.Tensor]:
        if ray is None:
            return [nd.eval_params() for nd in nodes]
        flats = backend.backend.call("eval_params")
        return [flats[i].to(info["device"]) for i in range(n_nodes)]

    def evaluate(rnd: int, avg: torch.Tensor) -> dict[str, float]:
        acc, loss = evaluate_params(eval_model, avg.to(info["device"]), x_test, y_test)
        row = {"acc_avg": acc, "test_loss_avg": loss}
        if cfg.run.get("eval_nodes"):
            accs = [evaluate_params(eval_model, flat, x_test, y_test)[0] for flat in node_params()]
            row["acc_nodes_mean"] = float(np.mean(accs))
        return row

    show = cfg.run.get("progress", True) if progress is None else progress
    bar = _progress(K, show, cfg.run["name"]) if ray is None and not asynchronous else None
    tick = None if bar is None else (lambda: bar.update(1))
    if asynchronous:  # every node at most K steps (its plan's num_iters); segments of eval_every nominal steps
        from ..gossip.asynchronous import AsyncSegments, NetworkModel

        backend: Any = AsyncSegments(nodes, NetworkModel.from_config(cfg.network), seed=int(cfg.run["seed"]),
                                     max_steps=K, receivers=topology.out_neighbors, debug_metrics=debug)
        segments = SegmentPlan(n_nodes=n_nodes, num_iters=backend.num_ticks,
                               iters_per_segment=int(cfg.run["eval_every"]), num_iters_requested=backend.num_ticks,
                               budget_cut=K < int(cfg.run["num_iters"]))
    elif ray is None:
        backend = InProcessBackend(nodes, topology.out_neighbors, on_iteration=tick)
    else:
        from .ray_cluster import ConfigNodeFactory, RaySegments, ray_settings

        kw = ray_settings(cfg.run)
        backend = RaySegments(n_nodes, ConfigNodeFactory(cfg.to_dict(), plan), num_hosts=kw["num_hosts"],
                              num_gpus_per_host=kw["num_gpus_per_host"], placement=kw["placement"],
                              device=str(cfg.run.get("device", "cpu")))

    def header(prog: RunProgress) -> RunHeader:
        extras: dict[str, Any] = {"train_cpu_s": prog.train_cpu_s}
        if ray is not None:
            extras["ray"] = {"address": ray["address"], "own_instance": ray["own"], **backend.record()}
        if asynchronous:
            extras["network"] = backend.record()
        return RunHeader(name=cfg.run["name"], backend="inprocess" if ray is None else "ray",
                         algorithm=cfg.algorithm["name"], config=cfg.to_dict(), seed=cfg.run["seed"],
                         noise=noise_record(plan.reproducible, device=info["device"], sampler=plan.noise_sampler),
                         released=released,
                         plan_summary=plan_summary(plan, info["device"]),
                         num_iters_requested=int(cfg.run["num_iters"]), num_iters=K, info=info, extras=extras,
                         party=cfg.privacy["party"], transport="inprocess" if ray is None else "ray",
                         states_to_server=bool(recorder.checkpoint))

    try:
        prog = run_segments(backend, segments, recorder=recorder, header=header, evaluate=evaluate, resume=resume,
                            stop_file=lambda: stop_requested(), debug_metrics=debug, upgrade=_upgrade_checkpoint,
                            progress=RunProgress(n_nodes, started=t0))
    finally:
        if bar is not None:
            bar.close()
    per_node = ([dict(r, node=i) for i, r in backend.privacy_reports().items()] if ray is None
                else list(prog.privacy))  # the Ray hosts are gone: their last reports, kept by the engine
    return RunResult(
        status=prog.status,
        history=prog.history,
        privacy={"per_node": per_node, "plan": plan_summary(plan, info["device"])},
        final_accuracy=prog.history[-1]["acc_avg"] if prog.history else float("nan"),
        out_dir=recorder.out_dir,
        wall_time_s=time.perf_counter() - t0,
        nodes=list(nodes),
        party=cfg.privacy["party"],
        eps_by_party=push_sum_eps_by_party_from_reports(per_node, transport="inprocess" if ray is None else "ray",
                                                        states_to_server=bool(recorder.checkpoint)),
        plan=plan if replay_plan_ok else None,
        network=backend.record() if asynchronous else {},
    )
