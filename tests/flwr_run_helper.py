"""`flwr run` an app folder from a test: :mod:`flower_dp.flower_run` with the test's ``tmp_path`` and a string back.

The SuperLink (``--simulation``) and the Ray head run in their own process groups and are killed afterwards.
"""

from __future__ import annotations

from pathlib import Path

from flower_dp.flower_run import free_port, kill_group, ray_head, sigterm_raises
from flower_dp.flower_run import flwr_run as _flwr_run

__all__ = ["flwr_run", "free_port", "kill_group", "ray_head", "sigterm_raises"]


def flwr_run(app: Path, tmp_path: Path, *, federation_config: str, run_config: str, timeout: int = 400,
             runtime_install: bool = False, times: dict | None = None) -> str:
    """Run ``flwr run APP``; return its stdout + stderr (and the SuperLink log's tail).  ``times["flwr_run_s"]``,
    when a dict is given: the wall seconds of ``flwr run`` itself (the SuperLink and the Ray head already up)."""
    run = _flwr_run(app, tmp_path, federation_config=federation_config, run_config=run_config, timeout_s=timeout,
                    runtime_install=runtime_install)
    if times is not None:
        times["flwr_run_s"] = run.wall_s
    return run.text
