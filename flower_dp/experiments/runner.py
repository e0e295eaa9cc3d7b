"""The in-process runner: build n nodes from a config, run K gossip iterations, report.

Every ``eval_every`` iterations (a *segment*) the runner evaluates the network-average
model on the test set, appends a history row, writes ``results.json`` and
``history.csv`` and a checksummed checkpoint (atomically), so a crash loses at most one
segment and ``resume=True`` continues the run: with ``[run] reproducible = true`` it ends with exactly
the numbers of an uninterrupted run; by default (secret mode) the restored nodes draw fresh secrets, so
the rest of the run gets fresh, independent noise and batches (valid, but not the same numbers).
``results.json`` says which in ``"noise"`` (:func:`flower_dp.rng.noise_record`).

The privacy numbers in the results come from the algorithm's plan and nodes: per node,
the rigorous eps of the noise actually added next to the paper formula's eps (the DPPS family,
which has no DP proof: ``eps_rigorous`` null and ``eps_heuristic`` with a ``privacy_note``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import results as rio
from ..errors import NonFiniteError
from ..gossip import run_iteration
from ..privacy.budget import charge_replay
from ..models import cross_entropy_loss, resolve_device
from ..recorder import (FAILED, RUNNING, SAMPLER_REFUSAL, STOPPED, RunRecorder, completed_status, plan_summary,
                        sampler_identity)
from ..releases import node_is_private, node_metrics, release_fields
from ..rng import noise_record
from .config import ExperimentConfig

__all__ = ["RunResult", "run_experiment", "build_experiment", "evaluate_params", "STOP_FILE_ENV", "CLEAN_STOP_NAME",
           "stop_requested"]

#: Names a file whose existence asks every in-process run (of this process and of the processes it starts) to stop at
#: the end of its current segment: the checkpoint is written, no iteration after it runs, and the run's status is
#: ``"stopped"``.  ``flower-dp reproduce`` sets it to ``OUT/STOP`` for its runs (``touch OUT/STOP`` ends a sweep
#: without losing or double-charging anything; the same command resumes).
STOP_FILE_ENV = "FLOWER_DP_STOP_FILE"
#: Written beside the checkpoint by a run that stopped on request (:meth:`flower_dp.recorder.RunRecorder.mark_clean_stop`):
#: ``{"k": k}``, the checkpoint's iteration, after which nothing ran.  A resume from that very checkpoint charges no
#: replayed segment (a resume from any other, after a crash or a kill, charges the segment after it again:
#: :func:`flower_dp.privacy.budget.charge_replay`).  It is consumed (deleted) before the resumed run's first iteration.
CLEAN_STOP_NAME = RunRecorder.CLEAN_STOP_NAME


def stop_requested() -> bool:
    """Whether the file named by :data:`STOP_FILE_ENV` exists (a stop at the end of the current segment)."""
    path = os.environ.get(STOP_FILE_ENV)
    return bool(path) and Path(path).exists()


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


_loss_fn = cross_entropy_loss  # the name earlier code imported


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

    parts = build_parts(cfg)
    eval_model = parts.new_model()
    device = resolve_device(str(cfg.run.get("device", "cpu")))
    nodes = [parts.build_node(i, device) for i in range(cfg.n_nodes)]
    return nodes, parts.plan, parts.topology, parts.test_data(), eval_model, parts.info(device)


def _network_average(nodes) -> torch.Tensor:
    flats = [n.eval_params().detach().to("cpu", torch.float64) for n in nodes]
    return (torch.stack(flats).sum(0) / len(flats)).to(torch.float32)



def _plan_num_iters(plan, requested: int) -> int:
    return int(getattr(plan, "num_iters", requested) or requested)


def _privacy_section(plan, nodes, device: str = "cpu") -> dict[str, Any]:
    per_node = []
    for node in nodes:
        rep = dict(node.privacy_report())
        rep["node"] = node.node_id
        per_node.append(rep)
    return {"per_node": per_node, "plan": plan_summary(plan, device)}


def _different_config(where: str, got: Any, want: Any) -> str:
    return (f"the checkpoint in {where} was written by a different config; "
            "resume with the same config or use a new --out folder")


def _upgrade_checkpoint(ckpt: dict[str, Any]) -> None:
    if isinstance((ckpt.get("config") or {}).get("run"), dict):  # before [run] reproducible every run was seeded
        ckpt["config"]["run"].setdefault("reproducible", True)


def _progress(total: int, enabled: bool, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    quiet = not enabled or os.environ.get("CI") or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, disable=bool(quiet), unit="it", leave=False)


def run_experiment(
    cfg: ExperimentConfig,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool | None = None,
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
    """
    torch.set_num_threads(max(1, int(os.environ.get("FLOWER_DP_THREADS", torch.get_num_threads()))))
    t0 = time.perf_counter()
    out = out_dir if out_dir is not None else cfg.run.get("out_dir")
    # the identity names the sampler of the nodes' device (numpy on the CPU, torch's float64 normal on CUDA), known
    # once build_experiment resolved it (checkpoints are loaded and saved after that)
    recorder = RunRecorder(out, identity=lambda: {"config": cfg.to_dict(), **sampler_identity(info["device"])},
                           checkpoint=cfg.run.get("checkpoint", True),
                           refusals={"config": _different_config, **SAMPLER_REFUSAL})
    out_path = recorder.out_dir
    nodes, plan, topology, (x_test, y_test), eval_model, info = build_experiment(cfg)
    eval_model, x_test, y_test = _to_device(eval_model, x_test, y_test, info["device"])
    K = _plan_num_iters(plan, int(cfg.run["num_iters"]))
    eval_every = int(cfg.run["eval_every"])
    history: list[dict[str, Any]] = []
    bits = np.zeros(len(nodes), dtype=np.int64)
    k_start = 0
    if resume:
        if out_path is None:
            raise ValueError("resume=True needs an out_dir holding a checkpoint; got out_dir=None")
        ckpt = recorder.load_checkpoint(upgrade=_upgrade_checkpoint)
        k_start = int(ckpt["k"])
        clean_here = recorder.take_clean_stop() == k_start  # the record is consumed before any iteration runs
        for node, state in zip(nodes, ckpt["nodes"]):
            if hasattr(node, "plan") and not clean_here:
                # secret mode: the segment a crashed or killed run may have sent is charged again
                state = charge_replay(state, node.plan, node.node_id, k_start, min(K, k_start + eval_every))
            node.load_state_dict(state)
        history, bits = ckpt["history"], np.asarray(ckpt["bits"], dtype=np.int64)
        train_cpu = float(ckpt.get("train_cpu_s", 0.0))
    else:
        recorder.take_clean_stop()  # a fresh start: a stop record of an earlier run means nothing
        for node in nodes:
            node.setup()
        train_cpu = 0.0  # CPU seconds spent in the iterations (not in set-up or evaluation)

    status, error = RUNNING, None
    debug = bool(cfg.run.get("debug_metrics", False))
    released = release_fields(debug, private=all(node_is_private(n) for n in nodes))
    if debug and released.get("uncharged_statistics_released"):
        print(f"flower-dp: WARNING: {released['release_warning']}", file=sys.stderr)

    def write(status_now: str) -> None:
        if out_path is None:
            return
        recorder.write({
            "name": cfg.run["name"],
            "status": status_now,
            "error": error,
            "config": cfg.to_dict(),
            "seed": cfg.run["seed"],
            "noise": noise_record(plan.reproducible, device=info["device"]),
            "algorithm": cfg.algorithm["name"],
            "backend": "inprocess",
            "num_iters_requested": int(cfg.run["num_iters"]),
            "num_iters": K,
            "info": info,
            "history": history,
            **released,
            "privacy": _privacy_section(plan, nodes, info["device"]),
            "bits_sent_per_node": bits.tolist(),
            "wall_time_s": time.perf_counter() - t0,
            "train_cpu_s": train_cpu,
            "versions": rio.versions(),
        }, history)

    show = cfg.run.get("progress", True) if progress is None else progress
    bar = _progress(K - k_start, show, cfg.run["name"])
    k = k_start
    try:
        while k < K:
            k_stop = min(K, (k // eval_every + 1) * eval_every)
            seg_metrics: dict[str, list[float]] = {}
            c0 = time.process_time()
            for kk in range(k, k_stop):
                log = run_iteration(nodes, kk, receivers=topology.out_neighbors)
                for i, b in log.bits_sent.items():
                    bits[i] += b
                for node in nodes:  # only what may leave the node (flower_dp.releases), unless debug_metrics
                    for key, v in node_metrics(node, debug).items():
                        seg_metrics.setdefault(key, []).append(float(v))
                if bar is not None:
                    bar.update(1)
            k = k_stop
            train_cpu += time.process_time() - c0
            avg = _network_average(nodes)
            if not bool(torch.isfinite(avg).all()):
                raise NonFiniteError(f"the network-average model became non-finite by iteration {k - 1}", step=k - 1)
            acc, loss = evaluate_params(eval_model, avg.to(info["device"]), x_test, y_test)
            row: dict[str, Any] = {"k": k, "acc_avg": acc, "test_loss_avg": loss, "bits_total": int(bits.sum())}
            if cfg.run.get("eval_nodes"):
                accs = [evaluate_params(eval_model, nd.eval_params(), x_test, y_test)[0] for nd in nodes]
                row["acc_nodes_mean"] = float(np.mean(accs))
            for key, vals in seg_metrics.items():
                row[key] = float(np.nanmean(vals)) if vals else float("nan")
            history.append(row)
            if recorder.checkpoint:
                recorder.save_checkpoint({"k": k, "nodes": [n.state_dict() for n in nodes], "history": history,
                                          "bits": bits.tolist(), "train_cpu_s": train_cpu})
            if k < K and recorder.checkpoint and stop_requested():
                recorder.mark_clean_stop(k)  # after the checkpoint: nothing runs after k
                status = STOPPED
                break
            write(RUNNING)
        else:
            status = completed_status(K, int(cfg.run["num_iters"]))
    except NonFiniteError as exc:
        status, error = FAILED, str(exc)
        write(status)
        raise
    finally:
        if bar is not None:
            bar.close()
    write(status)
    final_acc = history[-1]["acc_avg"] if history else float("nan")
    return RunResult(
        status=status,
        history=history,
        privacy=_privacy_section(plan, nodes, info["device"]),
        final_accuracy=final_acc,
        out_dir=out_path,
        wall_time_s=time.perf_counter() - t0,
        nodes=list(nodes),
    )
