"""Run a Flower app with ``flwr run`` on this machine: a SuperLink and a Ray head of its own, on 127.0.0.1.

Flower 1.42 deprecates ``flwr.simulation.run_simulation``; its replacement is ``flwr run`` of a packaged app
against a SuperLink started with ``--simulation``.  :func:`run_app` does that for a ServerApp and a ClientApp
named by reference (``"package.module:attribute"``): it writes a minimal app in Flower's layout (``pyproject.toml``
whose ``[tool.flwr.app.config]`` holds the run configuration, and one module that imports the two apps), starts a
SuperLink on a free loopback port and a Ray head on loopback (the simulation joins it through ``RAY_ADDRESS``:
``flwr run`` has no option for Ray's node address), runs ``flwr run --stream`` to its end and stops both.

Everything it starts runs in a process group of its own and is killed afterwards, also when the caller is
stopped with SIGTERM (:func:`sigterm_raises`): ``ray stop`` would stop every other Ray instance on the machine.
What the ServerApp computes comes back through files it writes (e.g. an ``out-dir`` in the run configuration);
:class:`FlwrRun` carries the output of ``flwr run`` and the SuperLink's log for error messages.

Who else on this machine can reach a run while it lasts: the Ray head started here runs with Ray's token
authentication (a random token in the caller's private work folder) and a private 0700 temporary folder, so other
local users can neither join it nor reach its sockets.  The SuperLink listens on 127.0.0.1 with ``--insecure``:
Flower closes its APIs only with TLS certificates and account authentication, so any local user who finds the port
can talk to it (e.g. ``flwr ls`` / ``flwr run`` against it) while the run lasts; nothing reaches it from another
machine.  Its state is in memory and its home (``FLWR_HOME``) in the caller's work folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

__all__ = ["COMPLETED", "FlwrRun", "client_app_from_config", "flwr_run", "free_port", "kill_group", "private_work_dir",
           "ray_head", "ray_token_env", "run_app", "sigterm_raises", "write_app"]

ConfigValue = bool | int | float | str


#: the status Flower gives a run that ended without an error (``flwr ls``)
COMPLETED = "finished:completed"


@dataclass(frozen=True)
class FlwrRun:
    """What one ``flwr run`` left: its return code; its output (stdout + stderr; for a run that did not complete,
    the run's whole log from ``flwr log --show``, which ``--stream`` can end before; the SuperLink log's tail); its
    wall seconds (the SuperLink and the Ray head already up); its run id and the status Flower gives it
    (``flwr ls``: ``"finished:completed"``, ``"finished:failed"``, ...) with Flower's details (e.g. the exception)."""

    returncode: int
    text: str
    wall_s: float
    run_id: str | None = None
    status: str = ""
    status_details: str = ""

    @property
    def completed(self) -> bool:
        """Whether Flower reports the run as finished without an error."""
        return self.status == COMPLETED

    def tail(self, chars: int = 4000) -> str:
        """The status line, then the last ``chars`` characters of the output."""
        head = f"flwr run status: {self.status or 'unknown'} {self.status_details}".rstrip()
        return head + "\n" + self.text[-chars:]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the process group that ``proc`` leads (started with ``start_new_session=True``)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        for _ in range(10):  # the group's other processes (Ray's, Flower's) end after their leader
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises ``SystemExit`` (in the main thread), so the caller's ``finally`` stops the
    processes it started: ``timeout`` or a CI runner stopping Python sends SIGTERM, whose default action would end
    the interpreter at once and leave the SuperLink and its simulation running."""
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
    """Return once 127.0.0.1:``port`` accepts connections; fail with ``why_it_died()`` if ``proc`` exits first or
    nothing listens after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise RuntimeError(why_it_died())
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {wait_s:.0f} s:\n{why_it_died()}")


def ray_token_env(folder: str | Path) -> dict[str, str]:
    """The environment that turns on Ray's token authentication (Ray >= 2.52) with a fresh random token written to
    ``folder/ray_token`` (0600): a Ray head started with it, and every process given it, accept only clients that
    hold the token.  Ray reads the setting once per process, so it must be in a process's environment when it
    starts (the head, the SuperLink and its simulation here), not set later."""
    import secrets

    token = Path(folder) / "ray_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


@contextmanager
def ray_head(env: Mapping[str, str] | None = None, num_cpus: int | None = None) -> Iterator[str]:
    """Yield the address ``127.0.0.1:PORT`` of a Ray head of its own (no dashboard, loopback), stopped (its process
    group killed) on exit.  ``env``: the environment of the head and so of every Ray worker it starts (with
    :func:`ray_token_env` in it, the head accepts only clients holding the token); ``num_cpus``: its CPUs (default
    all of this machine's; its GPUs are Ray's own count).  Its temporary folder is private (0700) and removed."""
    bin_dir = Path(sys.executable).parent
    port = free_port()
    env = dict(os.environ if env is None else env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    ray_temp = tempfile.mkdtemp(prefix="rf", dir="/tmp")  # 0700; short: Ray's socket paths are length-limited
    head = subprocess.Popen(
        [str(bin_dir / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--include-dashboard=false", f"--num-cpus={num_cpus or os.cpu_count() or 1}", f"--temp-dir={ray_temp}",
         "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    with sigterm_raises():
        try:
            _wait_for_port(port, head, lambda: f"`ray start --head` exited with {head.returncode}")
            yield f"127.0.0.1:{port}"
        finally:
            kill_group(head)
            shutil.rmtree(ray_temp, ignore_errors=True)


def flwr_run(app: str | Path, work_dir: str | Path, *, federation_config: str, run_config: str = "",
             timeout_s: float | None = 600, runtime_install: bool = False, pythonpath: Sequence[str | Path] = (),
             env: Mapping[str, str] | None = None, num_cpus: int | None = None,
             ray_address: str | None = None, on_line: Callable[[str], None] | None = None) -> FlwrRun:
    """``flwr run APP --stream`` against a SuperLink (``--simulation``) and a Ray head of its own; both stopped after.

    ``ray_address`` (``"HEAD:PORT"`` of a running Ray cluster): the simulation joins that cluster instead
    (``RAY_ADDRESS``; no head is started here and the cluster is left running).  A head of its own runs with Ray's token
    authentication (:func:`ray_token_env`, the token in ``work_dir``) and a private temporary folder.

    ``work_dir`` receives ``flwr_home/`` (Flower's home: the connection, the installed FAB, the SuperLink log).
    ``federation_config``: e.g. ``"num-supernodes=8"``; ``run_config``: ``--run-config`` overrides (may be empty).
    ``runtime_install=False`` sets ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (the app runs on this
    environment); ``True`` leaves Flower's default (``uv sync`` of the app's dependencies per run).  ``pythonpath``:
    folders the ServerApp, the ClientApps and the Ray workers import from, besides the app.  A ``flwr run`` that
    runs past ``timeout_s`` (``None``: no bound) is stopped and raises :class:`TimeoutError` with its output so far.
    ``on_line``: called with each line of ``flwr run``'s output as it comes (progress on a long run)."""
    bin_dir = Path(sys.executable).parent
    home = Path(work_dir) / "flwr_home"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()  # flwr 1.41+: one HTTP port for the Control, Runtime and Fleet APIs
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local-run"\n\n[superlink.local-run]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    env = dict(os.environ if env is None else env, FLWR_HOME=str(home),
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # Ray keeps the node on 127.0.0.1 (flower_dp._ray_local)
    if runtime_install:
        env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(p).resolve()) for p in pythonpath]
                                            + [p for p in [env.get("PYTHONPATH", "")] if p])
    link_log = home / "superlink.log"

    def link_tail() -> str:
        return link_log.read_text(errors="replace")[-3000:] if link_log.is_file() else ""

    if ray_address:
        from ..gossip.ray_backend import check_ray_address

        check_ray_address(ray_address)
        head: Any = nullcontext(ray_address)
    else:
        env.update(ray_token_env(work_dir))
        head = _removing_after(ray_head(env, num_cpus=num_cpus), Path(env["RAY_AUTH_TOKEN_PATH"]))
    with head as address:
        env["RAY_ADDRESS"] = address
        with open(link_log, "w") as log:
            link = subprocess.Popen(
                [str(bin_dir / "flower-superlink"), "--insecure", "--simulation", "--host", "127.0.0.1",
                 "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with sigterm_raises():
            try:
                _wait_for_port(port, link, lambda: f"flower-superlink exited:\n{link_tail()}")
                cmd = [str(bin_dir / "flwr"), "run", str(app), "local-run", "--stream", "--federation-config",
                       federation_config]
                if run_config:
                    cmd += ["--run-config", run_config]
                t = time.monotonic()
                returncode, text = _streamed(cmd, env, timeout_s, on_line)
                if returncode is None:
                    raise TimeoutError(f"`flwr run {app}` ran past timeout_s = {timeout_s:g} s and was stopped; its "
                                       f"output so far:\n{text[-3000:]}\n--- superlink log ---\n{link_tail()}")
                wall = time.monotonic() - t
                run_id, status, details = _run_status(bin_dir, env, text)
                if run_id and status != COMPLETED:
                    log_text = _flwr(bin_dir, env, "log", run_id, "local-run", "--show")
                    text += "\n--- flwr log --show ---\n" + log_text
                return FlwrRun(returncode, text + "\n--- superlink log ---\n" + link_tail(), wall, run_id, status,
                               details)
            finally:
                kill_group(link)


def _streamed(cmd: list[str], env: Mapping[str, str], timeout_s: float | None,
              on_line: Callable[[str], None] | None) -> tuple[int | None, str]:
    """Run ``cmd`` with stdout and stderr merged, handing each line to ``on_line`` as it comes; ``(return code,
    output)``, the code None when it ran past ``timeout_s`` (its process group is then stopped)."""
    proc = subprocess.Popen(cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))

    reader = threading.Thread(target=read, name="flwr-run-output", daemon=True)
    reader.start()
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if proc.poll() is None:
            kill_group(proc)
    reader.join(timeout=10)
    return code, "".join(lines)


@contextmanager
def private_work_dir(prefix: str) -> Iterator[Path]:
    """A new 0700 folder for one ``flwr run`` (its app, Flower's home, the caller's files), removed with everything in
    it however the block ends: results, an error, a timeout, KeyboardInterrupt."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _removing_after(context: Any, path: Path) -> Iterator[Any]:
    """``context``, then ``path`` removed however it ends (the Ray token outlives no head)."""
    try:
        with context as value:
            yield value
    finally:
        path.unlink(missing_ok=True)


def _flwr(bin_dir: Path, env: Mapping[str, str], *args: str) -> str:
    """Output of one ``flwr`` CLI call (stdout + stderr; a call that does not end in 120 s says so)."""
    try:
        out = subprocess.run([str(bin_dir / "flwr"), *args], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return f"`flwr {' '.join(args)}` did not answer within 120 s"
    return out.stdout + out.stderr


def _run_status(bin_dir: Path, env: Mapping[str, str], text: str) -> tuple[str | None, str, str]:
    """(run id, status, status details) of the run ``flwr run`` started, from ``flwr ls``; ``(None, "", "")`` when
    its output names no run."""
    ids = re.findall(r"started run (\d+)", text)
    if not ids:
        return None, "", ""
    listing = _flwr(bin_dir, env, "ls", "local-run", "--run-id", ids[0], "--format", "json")
    try:
        run = json.loads(listing[listing.index("{"):])["runs"][0]
    except (ValueError, KeyError, IndexError):
        return ids[0], "", f"flwr ls gave no status: {listing[-500:]}"
    return ids[0], str(run.get("status", "")), str(run.get("status-details", ""))


def _toml_value(key: str, value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    raise TypeError(f"run config {key!r} = {value!r}: Flower's run configuration holds bool, int, float or str; "
                    "pass a path to a file for anything else")


def write_app(app_dir: str | Path, server_app: str, client_app: str,
              run_config: Mapping[str, ConfigValue] | None = None, *, name: str = "flower-dp-run") -> Path:
    """Write a Flower app in Flower's layout to ``app_dir``: ``pyproject.toml`` (components, ``run_config`` as the
    app's run configuration) and ``flower_dp_run_app.py``, which imports the ServerApp and the ClientApp named by
    ``"package.module:attribute"``.  Returns ``app_dir``."""
    refs = {"server_app": server_app, "client_app": client_app}
    lines = ['"""The ServerApp and the ClientApp of this run (written by flower_dp.experiments.flower_run.write_app)."""', ""]
    for alias, ref in refs.items():
        module, _, attr = ref.partition(":")
        if not module or not attr.isidentifier():
            raise ValueError(f"{alias} = {ref!r}: name the app as 'package.module:attribute', e.g. "
                             "'flower_dp.experiments.flower_backend:server_app'")
        lines += [f"import {module} as _{alias}_module", f"{alias} = _{alias}_module.{attr}"]
    app_dir = Path(app_dir)
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "flower_dp_run_app.py").write_text("\n".join(lines) + "\n")
    config = "\n".join(f"{k} = {_toml_value(k, v)}" for k, v in (run_config or {}).items())
    (app_dir / "pyproject.toml").write_text(f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "0.1.0"
description = "A run written by flower_dp.experiments.flower_run"
license = "Apache-2.0"
requires-python = ">=3.11"
dependencies = []

[tool.flwr.app]
publisher = "flower-dp"

[tool.flwr.app.components]
serverapp = "flower_dp_run_app:server_app"
clientapp = "flower_dp_run_app:client_app"

[tool.flwr.app.config]
{config}
""")
    return app_dir


def run_app(server_app: str, client_app: str, *, num_supernodes: int, work_dir: str | Path,
            run_config: Mapping[str, ConfigValue] | None = None, timeout_s: float | None = 600,
            pythonpath: Sequence[str | Path] = (), client_num_cpus: int = 1, client_num_gpus: float = 0.0,
            num_cpus: int | None = None, ray_address: str | None = None,
            on_line: Callable[[str], None] | None = None) -> FlwrRun:
    """Run a ServerApp and a ClientApp, each named ``"package.module:attribute"``, on ``num_supernodes`` simulated
    SuperNodes with ``flwr run`` (Flower's replacement for ``run_simulation``); the app is written to
    ``work_dir/app``.  ``pythonpath``: folders the two apps' modules are imported from when they are not installed.
    ``num_cpus``: the CPUs of the Ray head the simulation runs on (default all of this machine's); ``ray_address``:
    run the simulation on that running Ray cluster instead of a head of its own (:func:`flwr_run`); ``on_line``: each
    output line as it comes."""
    if int(num_supernodes) < 1:
        raise ValueError(f"num_supernodes = {num_supernodes!r}: a simulation needs at least 1 SuperNode")
    app = write_app(Path(work_dir) / "app", server_app, client_app, run_config)
    federation = (f"num-supernodes={int(num_supernodes)} client-resources-num-cpus={int(client_num_cpus)} "
                  f"client-resources-num-gpus={float(client_num_gpus)}")
    return flwr_run(app, work_dir, federation_config=federation, timeout_s=timeout_s, pythonpath=pythonpath,
                    num_cpus=num_cpus, ray_address=ray_address, on_line=on_line)


def client_app_from_config(build: Callable[[Mapping[str, Any]], Any],
                           key: Callable[[Mapping[str, Any]], Hashable] = lambda run_config: None) -> Any:
    """A ClientApp, importable by reference, that hands every train, evaluate and query message to the ClientApp
    ``build(run_config)``: made on a process's first message, again only for a run configuration of another
    ``key(run_config)``.  For an app whose ClientApp depends on the run (files named in its configuration)."""
    from flwr.clientapp import ClientApp

    app, made = ClientApp(), {}

    def handle(msg, context):
        k = key(context.run_config)
        if k not in made:
            made[k] = build(context.run_config)
        return made[k](msg, context)

    app.train()(handle)
    app.evaluate()(handle)
    app.query()(handle)
    return app
