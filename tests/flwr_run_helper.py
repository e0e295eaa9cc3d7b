"""`flwr run` from a test: :mod:`flower_dp.experiments.flower_run` with the test's ``tmp_path``, and what a test's ServerApp
hands back.

The SuperLink (``--simulation``) and the Ray head run in their own process groups and are killed afterwards.  A
ServerApp runs in a process of its own, so what a test checks comes back through files: :func:`save_strategy`
(in the ServerApp) writes what a :class:`~flower_dp.strategies.push_sum.PushSumStrategy` saw, :func:`load_strategy`
(in the test) reads it, and :func:`saving_errors` keeps a failed strategy run's traceback for the test's message
(the ServerApp goes on with its next run).  :func:`run_test_app` runs a ServerApp defined in a test module
(``tests/`` is on the simulation's path) with the push-sum ClientApp.
"""

from __future__ import annotations

import json
import traceback
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Mapping

from flower_dp.experiments.flower_run import FlwrRun, free_port, kill_group, ray_head, run_app, sigterm_raises
from flower_dp.experiments.flower_run import flwr_run as _flwr_run

__all__ = ["flwr_run", "free_port", "kill_group", "load_strategy", "ray_head", "run_test_app", "save_strategy",
           "saving_errors", "sigterm_raises"]

TESTS_DIR = Path(__file__).resolve().parent
#: the push-sum ClientApp, as ``run_flower_experiment`` runs it
PUSH_SUM_CLIENT = "flower_dp.experiments.flower_backend:client_app"


def flwr_run(app: Path, tmp_path: Path, *, federation_config: str, run_config: str, timeout: int = 400,
             runtime_install: bool = False, times: dict | None = None) -> str:
    """Run ``flwr run APP``; return its stdout + stderr (and the SuperLink log's tail).  ``times["flwr_run_s"]``,
    when a dict is given: the wall seconds of ``flwr run`` itself (the SuperLink and the Ray head already up)."""
    run = _flwr_run(app, tmp_path, federation_config=federation_config, run_config=run_config, timeout_s=timeout,
                    runtime_install=runtime_install)
    if times is not None:
        times["flwr_run_s"] = run.wall_s
    return run.text


def run_test_app(server_app: str, tmp_path: Path, *, num_supernodes: int, run_config: Mapping[str, Any],
                 client_app: str = PUSH_SUM_CLIENT, timeout: int = 400) -> FlwrRun:
    """``flwr run`` of ``server_app`` (``"test_module:attribute"``) and ``client_app`` on ``num_supernodes``
    simulated SuperNodes; Flower's files go to ``tmp_path / "flwr"``."""
    return run_app(server_app, client_app, num_supernodes=num_supernodes, work_dir=tmp_path / "flwr",
                   run_config=dict(run_config), timeout_s=timeout, pythonpath=[TESTS_DIR])


def _plain(obj: Any) -> Any:
    """numpy / torch scalars and arrays as JSON values (floats keep every bit: JSON allows NaN and Infinity here)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def save_strategy(path: str | Path, strategy: Any, *, result: Any = None, averages: Mapping[int, Any] | None = None,
                  **extra: Any) -> None:
    """Write what ``strategy`` saw to ``path`` (``.json``): its ``history``, ``privacy``, ``failures`` and
    ``timings``, the ``evaluate_metrics_serverapp`` of its Flower ``result`` and ``extra`` values; ``averages``
    (round -> network-average tensor, e.g. recorded by an ``evaluate_fn``) go beside it as ``.pt``."""
    import torch

    path = Path(path)
    doc = {"history": strategy.history, "privacy": strategy.privacy, "failures": strategy.failures,
           "timings": strategy.timings,
           "evaluate_metrics_serverapp": {} if result is None else
           {str(rnd): dict(metrics) for rnd, metrics in result.evaluate_metrics_serverapp.items()},
           **extra}
    if averages is not None:
        torch.save({int(rnd): avg.clone() for rnd, avg in averages.items()}, path.with_suffix(".pt"))
    path.with_suffix(".json").write_text(json.dumps(doc, default=_plain))


@contextmanager
def saving_errors(path: str | Path) -> Iterator[None]:
    """In a ServerApp: an exception in the block is not raised but written, with its traceback, to ``path``
    (``.error``), where :func:`load_strategy` of the same ``path`` shows it.  The output of ``flwr run --stream``
    can end before a ServerApp's traceback reaches it (a ServerApp that raised at once left none there)."""
    try:
        yield
    except Exception:  # noqa: BLE001 - handed to the test through the file
        path = Path(path).with_suffix(".error")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(traceback.format_exc())


def load_strategy(path: str | Path, run: FlwrRun) -> SimpleNamespace:
    """What :func:`save_strategy` wrote at ``path``: ``history``, ``privacy``, ``failures``, ``timings``,
    ``evaluate_metrics_serverapp`` (keyed by round), the ``extra`` values, and ``averages`` (round -> tensor; empty
    when none were saved).  Fails with the traceback :func:`saving_errors` kept, or else the end of ``run``'s
    output, when the ServerApp did not write it."""
    import torch

    path = Path(path)
    error = path.with_suffix(".error")
    assert not error.is_file(), f"the ServerApp failed before it wrote {path.name}.json:\n{error.read_text()}"
    assert path.with_suffix(".json").is_file(), f"the ServerApp wrote no {path.name}.json; flwr run:\n{run.tail()}"
    doc = json.loads(path.with_suffix(".json").read_text())
    doc["evaluate_metrics_serverapp"] = {int(rnd): m for rnd, m in doc["evaluate_metrics_serverapp"].items()}
    pt = path.with_suffix(".pt")
    doc["averages"] = torch.load(pt, weights_only=True) if pt.is_file() else {}
    return SimpleNamespace(**doc)
