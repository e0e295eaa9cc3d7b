"""Flower's deployment engine on 127.0.0.1: one ``flower-superlink`` and N ``flower-supernode`` processes.

Each process runs in its own process group and is killed afterwards (SIGTERM, then SIGKILL), whatever the
test did, also when pytest itself is stopped with SIGTERM (:func:`flwr_run_helper.sigterm_raises`); no Ray
cluster is started (each ClientApp runs in its own process, as on real machines; the push-sum ClientApp's node
workers run in their SuperNode's process group, so they go with it).
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``: the apps use the flower-dp installed here.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from flwr_run_helper import free_port, kill_group, sigterm_raises


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s; log:\n{log.read_text()[-3000:]}")


@contextmanager
def deployment(tmp_path: Path, n_supernodes: int, poll_s: float = 0.1, node_config=lambda i: ""):
    """Yield ``run(app, run_config, timeout) -> dict``; stops every process on exit.  ``poll_s``: the SuperNodes'
    ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (Flower's default 1 s); ``node_config(i)``: more of SuperNode i's
    ``--node-config`` (e.g. its own key file)."""
    bin_dir = Path(sys.executable).parent
    home = tmp_path / "flwr_home"
    home.mkdir()
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "mine"\n\n[superlink.mine]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               # a SuperNode's SuperExec looks for a new ClientApp task every second by default
               FLWR_SUPEREXEC_TASK_POLL_INTERVAL=str(poll_s))
    env.pop("RAY_ADDRESS", None)
    procs: list[subprocess.Popen] = []
    with sigterm_raises():
        try:
            link_log = home / "superlink.log"
            link = subprocess.Popen([str(bin_dir / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port",
                                     str(port), "--database", str(home / "state.db")],
                                    env=env, stdout=open(link_log, "w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            procs.append(link)
            _wait_port(port, link, link_log)
            for i in range(n_supernodes):
                log = home / f"supernode{i}.log"
                procs.append(subprocess.Popen(
                    [str(bin_dir / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
                     "--port", str(free_port()), "--node-config",
                     f"partition-id={i} num-partitions={n_supernodes} {node_config(i)}".strip()],
                    env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True))

            def run(app: Path, run_config: str, timeout: int = 500) -> dict:
                """``flwr run`` to the end; returns rc, the run's output, its id and status (``flwr ls``), wall
                seconds."""
                t = time.monotonic()
                out = subprocess.run([str(bin_dir / "flwr"), "run", str(app), "mine", "--stream", "--run-config",
                                      run_config], env=env, capture_output=True, text=True, timeout=timeout)
                wall = time.monotonic() - t
                text = out.stdout + out.stderr
                logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-2500:]}" for p in sorted(home.glob("*.log")))
                ids = re.findall(r"\[RUN (\d+)", text + logs) or re.findall(r"(?i)run[ _-]?id\D{0,5}(\d{6,})", text)
                status = ""
                if ids:
                    ls = subprocess.run([str(bin_dir / "flwr"), "ls", "mine", "--run-id", ids[-1], "--format",
                                         "json"], env=env, capture_output=True, text=True, timeout=120)
                    status = ls.stdout + ls.stderr
                return {"rc": out.returncode, "output": text, "logs": logs, "status": status, "wall_s": wall,
                        "run_id": ids[-1] if ids else None}

            yield run
        finally:
            for p in reversed(procs):
                kill_group(p)
