"""Run an experiment config as a Flower simulation on Ray, same results file.

:func:`run_flower_experiment` is the Flower twin of :func:`flower_dp.experiments.run_experiment`: one SuperNode per
push-sum node, one Flower round per segment of ``run.eval_every`` iterations, shares exchanged peer to peer between
Ray host actors, the network-average model evaluated by the server after every round.  It runs :data:`server_app`
and the push-sum ClientApp with ``flwr run`` (:func:`flower_dp.experiments.flower_run.run_app`, Flower 1.42's replacement for
``run_simulation``); the config travels as a JSON file named in the run configuration, and the models and data
registered in this process (:mod:`flower_dp.sources`, e.g. by :func:`flower_dp.train_private`) as a
:mod:`flower_dp.experiments.handoff` file beside it (a private folder, read only by the simulation this call starts), installed
by :data:`server_app` and :data:`client_app` before they build a node.  The strategy's run engine
writes ``results.json`` in the runner's layout (history rows with ``k``, ``bits_total``, the evaluation; per-node
privacy; ``config``; ``info``), so reports and sweeps treat both backends alike.  Same seed and config with
``[run] reproducible = true`` -> the same numbers on CPU (by default every node's noise comes from its own secret).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .. import results as rio
from .. import sources
from .flower_run import client_app_from_config, private_work_dir, run_app
from ..recorder import FAILED, RUNNING
from .config import ExperimentConfig, config_from_dict

__all__ = ["run_flower_experiment", "server_app", "client_app"]

#: the ServerApp of :func:`run_flower_experiment`; its run configuration: ``config-file`` (the experiment config as
#: JSON), ``sources-file`` (the own models and data, or empty), ``out-dir``, ``num-hosts``, ``num-gpus-per-host``,
#: ``timeout-s``, ``resume``, ``started-at`` (Unix time)
server_app = ServerApp()


def _install_sources(run_config) -> None:
    """Install the own models and data of ``sources-file`` (if any) in this process."""
    path = str(run_config.get("sources-file", ""))
    if path:
        from . import handoff

        sources.install(handoff.read(path))


def _push_sum_client(run_config) -> ClientApp:
    from ..clients.push_sum_app import make_client_app

    _install_sources(run_config)  # before the app: it takes the registered sources with it
    return make_client_app()


#: the push-sum ClientApp (:func:`flower_dp.clients.push_sum_app.make_client_app`), made in each ClientApp process
#: once the own models and data of ``sources-file`` are installed there
client_app = client_app_from_config(_push_sum_client, key=lambda rc: str(rc.get("sources-file", "")))


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    import torch

    from ..clients.builder import build_parts
    from ..clients.push_sum_app import spec_from_parts
    from ..strategies.push_sum import PushSumStrategy
    from .runner import evaluate_params

    rc = context.run_config
    _install_sources(rc)
    cfg = config_from_dict(json.loads(Path(str(rc["config-file"])).read_text()))
    # the one node builder, as the in-process runner builds its run: the plan the SuperNodes get, the test split and
    # the evaluation model (the SuperNodes build their nodes from the same config and plan)
    parts = build_parts(cfg.to_dict())
    plan = parts.plan
    x_test, y_test = parts.test_data()
    model = parts.new_model()
    info = {"dataset": parts.test.name, "synthetic_data": bool(getattr(parts.test, "synthetic", False)),
            "test_samples": len(x_test), "dim": int(plan.dim), "topology": cfg.topology["name"], "device": "cpu"}

    def evaluate(rnd: int, avg: torch.Tensor) -> dict[str, float]:
        acc, loss = evaluate_params(model, avg, x_test, y_test)
        return {"acc_avg": acc, "test_loss_avg": loss}

    strategy = PushSumStrategy(
        cfg.n_nodes, spec_from_parts(parts), num_iters=int(plan.num_iters), iters_per_round=int(cfg.run["eval_every"]),
        transport="ray", evaluate_fn=evaluate, out_dir=str(rc["out-dir"]), timeout_s=float(rc["timeout-s"]),
        checkpoint=bool(cfg.run.get("checkpoint", True)), run_name=str(cfg.run["name"]), resume=bool(rc["resume"]),
        debug_metrics=bool(cfg.run.get("debug_metrics", False)), run_info=info, party=cfg.privacy["party"],
        backend_kwargs={"num_hosts": int(rc["num-hosts"]), "num_gpus_per_host": float(rc["num-gpus-per-host"])})
    strategy.timings["startup_s"] = time.time() - float(rc["started-at"])  # flwr run starting Flower and this app
    strategy.start(grid)


def run_flower_experiment(cfg: ExperimentConfig, *, out_dir: str | Path, num_hosts: int = 2,
                          num_gpus_per_host: float = 0.0, timeout_s: float = 600.0,
                          resume: bool | None = None, run_timeout_s: float | None = None,
                          ray_address: str | None = None) -> dict[str, Any]:
    """Run ``cfg`` under ``flwr run`` on ``cfg.n_nodes`` simulated SuperNodes; return the results document it wrote.

    ``resume=None`` resumes when ``out_dir`` already holds a checkpoint of this config.  ``timeout_s``: how long a
    segment may take; ``run_timeout_s``: how long the whole ``flwr run`` may take (``None``: no bound).
    ``ray_address`` (``"HEAD:PORT"``; default the config's ``run.ray_address``, else ``RAY_ADDRESS``): the simulation
    runs on that running
    Ray cluster instead of a Ray head of its own on 127.0.0.1 (:func:`flower_dp.experiments.flower_run.run_app`).  The private
    work folder (the config, the own models and data, Flower's home) is removed on every way out: success, failure,
    timeout, KeyboardInterrupt.
    """
    if cfg.network["mode"] == "async":
        raise ValueError("network.mode = 'async' runs the nodes in this process, got the Flower backend (synchronous "
                         "rounds between SuperNodes); run it with flower-dp run / run_experiment (in process) or set "
                         "network.mode = 'sync'")
    out = rio.ensure_writable_dir(out_dir).resolve()
    prev = rio.read_json(out / "results.json")
    if resume is None:
        resume = (out / rio.CHECKPOINT_NAME).is_file() and bool(prev) and prev.get("config") == cfg.to_dict()
    address = ray_address or cfg.run.get("ray_address") or os.environ.get("RAY_ADDRESS") or None
    with private_work_dir("flower-dp-flwr-") as work:  # the own data below is read by this run alone
        (work / "config.json").write_text(json.dumps(cfg.to_dict()))
        own = sources.snapshot()
        if own:
            from . import handoff

            handoff.write(own, work / "sources.pkl")
        if (out / "results.json").is_file() and not resume:
            (out / "results.json").unlink()  # what is there afterwards is this run's
        run = run_app("flower_dp.experiments.flower_backend:server_app",
                      "flower_dp.experiments.flower_backend:client_app",
                      num_supernodes=cfg.n_nodes, work_dir=work, timeout_s=run_timeout_s, pythonpath=_user_paths(),
                      ray_address=address, on_line=flower_progress if cfg.run.get("progress", True) else None,
                      run_config={"config-file": str(work / "config.json"),
                                  "sources-file": str(work / "sources.pkl") if own else "", "out-dir": str(out),
                                  "num-hosts": int(num_hosts), "num-gpus-per-host": float(num_gpus_per_host),
                                  "timeout-s": float(timeout_s), "resume": bool(resume), "started-at": time.time()})
    doc = rio.read_json(out / "results.json")
    if doc is None or doc.get("status") in (RUNNING, FAILED, None):
        raise RuntimeError(f"the Flower simulation of {cfg.run['name']!r} ended without results, or failed, in "
                           f"{str(out)!r} (flwr run exited with {run.returncode}); the end of its output:\n"
                           f"{run.tail()}")
    return doc


def flower_progress(line: str) -> None:
    """Echo one line of ``flwr run``'s output to stderr as it comes (Flower's own round and log lines)."""
    print(line, file=sys.stderr, flush=True)


def _user_paths() -> list[str]:
    """The folders on this process's ``sys.path`` outside the Python installation (the script's folder, a project
    root): the simulation imports from them what this process does (e.g. the module of a ``model_fn``)."""
    prefixes = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.is_dir() and not any(str(path).startswith(p + "/") or str(path) == p for p in prefixes):
            out.append(str(path))
    return list(dict.fromkeys(out))
