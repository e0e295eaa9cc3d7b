"""`flwr run` an example app against a SuperLink and a Ray head of the test's own, both on 127.0.0.1.

The SuperLink (``--simulation``) and the Ray head (``--block``) run in their own process groups and are
killed afterwards: ``ray stop`` would stop every other Ray instance on the machine.  The simulation's Ray
joins the loopback head through ``RAY_ADDRESS`` (``flwr run`` has no option for Ray's node address).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)


@contextmanager
def sigterm_raises():
    """While inside, SIGTERM raises ``SystemExit`` (in the main thread), so the caller's ``finally`` stops the
    processes it started: ``timeout`` or a CI runner stopping pytest sends SIGTERM, whose default action would
    end the interpreter at once and leave the SuperLink and SuperNodes running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _wait_for_port(port: int, proc: subprocess.Popen, why_it_died, wait_s: float = 90) -> None:
    """Return once 127.0.0.1:``port`` accepts connections (at most ``wait_s``); fail with ``why_it_died()`` if
    ``proc`` exits first."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert proc.poll() is None, why_it_died()
        time.sleep(0.5)


@contextmanager
def ray_head(env: dict[str, str] | None = None, num_cpus: int = 2):
    """Yield the address ``127.0.0.1:PORT`` of a Ray head of this test's own (no dashboard, loopback), stopped
    (its process group killed) on exit."""
    bin_dir = Path(sys.executable).parent
    port = free_port()
    env = dict(os.environ if env is None else env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    ray_temp = tempfile.mkdtemp(prefix="rf", dir="/tmp")  # short: Ray's socket paths are length-limited
    head = subprocess.Popen(
        [str(bin_dir / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--include-dashboard=false", f"--num-cpus={num_cpus}", f"--temp-dir={ray_temp}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    with sigterm_raises():
        try:
            _wait_for_port(port, head, lambda: f"ray start --head exited with {head.returncode}")
            yield f"127.0.0.1:{port}"
        finally:
            _kill_group(head)
            shutil.rmtree(ray_temp, ignore_errors=True)


def flwr_run(app: Path, tmp_path: Path, *, federation_config: str, run_config: str, timeout: int = 400,
             runtime_install: bool = False, times: dict | None = None) -> str:
    """Run ``flwr run APP``; return its stdout + stderr (and the SuperLink log's tail).

    ``runtime_install=False`` sets FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1; ``True`` leaves Flower's default
    (``uv sync`` of the app's dependencies into a fresh environment per run).  ``times["flwr_run_s"]``, when a dict
    is given: the wall seconds of ``flwr run`` itself (the SuperLink and the Ray head already up)."""
    bin_dir = Path(sys.executable).parent
    home = tmp_path / "flwr_home"
    home.mkdir()
    port = free_port()  # flwr 1.41: one HTTP port for the Control, Runtime and Fleet APIs
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "mine"\n\n[superlink.mine]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # Ray keeps the node on 127.0.0.1 (flower_dp._ray_local)
    if runtime_install:
        env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION")
    with ray_head(env) as ray_address:
        env["RAY_ADDRESS"] = ray_address
        link = subprocess.Popen(
            [str(bin_dir / "flower-superlink"), "--insecure", "--simulation", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=open(home / "superlink.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        with sigterm_raises():
            try:
                _wait_for_port(port, link, lambda: (home / "superlink.log").read_text()[-3000:])
                t = time.monotonic()
                out = subprocess.run(
                    [str(bin_dir / "flwr"), "run", str(app), "mine", "--stream", "--federation-config",
                     federation_config, "--run-config", run_config], env=env, capture_output=True, text=True,
                    timeout=timeout)
                if times is not None:
                    times["flwr_run_s"] = time.monotonic() - t
                return out.stdout + out.stderr + "\n--- superlink log ---\n" + (home / "superlink.log").read_text()[-3000:]
            finally:
                _kill_group(link)
