"""The push-sum ClientApp: it imports neither torch nor the algorithms, and on Flower's deployment engine it keeps
each SuperNode's node in a persistent process (a *node worker*).

Flower's deployment engine runs every message in a fresh ``flwr-clientapp`` process (``--isolation subprocess``,
the default): it imports the ClientApp, runs one message and exits.  For push-sum over the relay that meant, per
message, importing torch and flower-dp (~6-9 s here) and rebuilding the node from ``context.state`` (its data
partition, model and state).

:func:`make_client_app` builds the ClientApp from this module, which imports only Flower, numpy and the typed wire
codec.  In a ``flwr-clientapp`` process it hands each message to a node worker: one long-lived Python process per
SuperNode that holds the node between messages (the node cache of
:func:`flower_dp.clients.push_sum_node.handle_content`), started on the first message and reached over a Unix
socket.  Elsewhere (Flower's simulation, whose ClientApps live in long-lived Ray actors already; tests;
``FLOWER_DP_NODE_WORKER=0``) the message runs in the ClientApp's own process.  Both paths run the same function on
the same inputs, so replies and ``context.state`` are bit-identical.  The node side (message handler, node
builders, the demo node) is :mod:`flower_dp.clients.push_sum_node`; its public names can also be imported from
here (``spec_from_config``, ``model_builder``, ``plan_spec``, ...): they load on first use.

Safety of the channel:

* The socket lives in ``$XDG_RUNTIME_DIR`` or the temp dir, in ``flower-dp-<uid>/``, a directory created with mode
  0700 and refused when it is not ours or is open to others; the socket itself is 0600.  The worker also checks
  the peer's uid (``SO_PEERCRED``) and answers only its own user.
* Requests and replies are typed values (:mod:`flower_dp.gossip.wire`: plain values and raw arrays), never a
  pickle; Flower's ``Array`` objects travel as (dtype, shape, stype, raw bytes) and are rebuilt bit for bit.
* ``context.state`` stays the source of truth, as without a worker: it goes to the worker with every message and
  comes back updated, so a worker that dies (or idles out) is replaced by one that rebuilds the node from it.

Lifetime: the worker is started in the SuperNode's process group, watches the ``flower-superexec`` process that
launched the ``flwr-clientapp`` (it exits within about a second of it), and exits after
``FLOWER_DP_NODE_WORKER_IDLE_S`` seconds (default 900) without a message.  Its log,
``flower-dp-<uid>/node-<key>.log``, is removed when it exits, unless a message failed.  It keeps the newest session
of its node only (an earlier run's node is dropped when the next run registers).  With your own node ``builder``
(``make_client_app(model_builder(...))``) every message runs in the ClientApp's process: a worker cannot call a
function of that process.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from flower_dp import sources
from flower_dp.gossip import wire

__all__ = ["make_client_app", "use_worker", "records_to_plain", "plain_to_records", "worker_dir", "call_worker",
           "serve", "ENV", "IDLE_ENV"]


def __getattr__(name: str) -> Any:
    """The node side's names (``spec_from_config``, ``model_builder``, ``plan_spec``, ``toy_builder``, ...) load
    from :mod:`flower_dp.clients.push_sum_node` on first use, so importing this module does not import torch."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    node = importlib.import_module(f"{__package__}.push_sum_node")
    try:
        return getattr(node, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

#: ``auto`` (default: a worker in ``flwr-clientapp`` processes only), ``1`` (always), ``0`` (never)
ENV = "FLOWER_DP_NODE_WORKER"
#: seconds a worker waits for its next message before it exits
IDLE_ENV = "FLOWER_DP_NODE_WORKER_IDLE_S"
DEFAULT_IDLE_S = 900.0
#: seconds the first message waits for a new worker to start and listen
START_TIMEOUT_S = 300.0
_LEN = struct.Struct("<Q")


# ---------------------------------------------------------------- Flower records <-> typed plain values

def _cfg_enc(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return ("b", np.frombuffer(bytes(v), dtype=np.uint8))
    if isinstance(v, list):
        return [_cfg_enc(x) for x in v]
    return v


def _cfg_dec(v: Any) -> Any:
    if isinstance(v, tuple):
        if len(v) != 2 or v[0] != "b":
            raise wire.WireError(f"malformed config value {v!r} from a node worker")
        return np.asarray(v[1], dtype=np.uint8).tobytes()
    if isinstance(v, list):
        return [_cfg_dec(x) for x in v]
    return v


def records_to_plain(rd: Any) -> dict[str, Any]:
    """A Flower ``RecordDict`` as plain typed values (:mod:`flower_dp.gossip.wire` carries them): every record by
    name and kind, ``bytes`` config values and every ``Array``'s raw data as ``uint8`` arrays."""
    out: dict[str, Any] = {"config": {}, "metrics": {}, "arrays": {}}
    for name, rec in rd.config_records.items():
        out["config"][name] = {k: _cfg_enc(v) for k, v in rec.items()}
    for name, rec in rd.metric_records.items():
        out["metrics"][name] = dict(rec.items())
    for name, rec in rd.array_records.items():
        out["arrays"][name] = [(k, a.dtype, list(a.shape), a.stype, np.frombuffer(a.data, dtype=np.uint8))
                               for k, a in rec.items()]
    return out


def plain_to_records(plain: dict[str, Any]) -> Any:
    """Inverse of :func:`records_to_plain` (the same records, in the same order, bit for bit)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

    rd = RecordDict()
    for name, rec in plain["config"].items():
        rd[name] = ConfigRecord({k: _cfg_dec(v) for k, v in rec.items()})
    for name, rec in plain["metrics"].items():
        rd[name] = MetricRecord(dict(rec))
    for name, items in plain["arrays"].items():
        rd[name] = ArrayRecord(array_dict={
            str(k): Array(dtype=str(dt), shape=tuple(int(s) for s in shape), stype=str(st),
                          data=np.asarray(data, dtype=np.uint8).tobytes())
            for k, dt, shape, st, data in items})
    return rd


# ---------------------------------------------------------------- the channel

def worker_dir() -> Path:
    """``flower-dp-<uid>`` in ``$XDG_RUNTIME_DIR`` (else the temp dir): created 0700; refused if it is not a
    directory of ours closed to others (a socket there is trusted as our own)."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    d = base / f"flower-dp-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{d} must be a directory owned by uid {os.getuid()} with mode 0700 (found mode "
                              f"{oct(st.st_mode & 0o777)}, owner {st.st_uid}); remove it, or set {ENV}=0 to run "
                              "every message in its own process")
    return d


def _send(sock: socket.socket, obj: Any) -> None:
    data = wire.to_bytes(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 22))
        if not chunk:
            raise ConnectionError(f"node worker channel closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> Any:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    return wire.from_bytes(_recv_exact(sock, n))


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except OSError:
        s.close()
        raise
    return s


def _spawn(path: Path, parent_pid: int, idle_s: float) -> subprocess.Popen:
    log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "flower_dp.clients.push_sum_app", "--socket", str(path), "--parent-pid",
             str(parent_pid), "--idle-s", str(idle_s)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True)
    finally:
        log.close()


def _start(path: Path, parent_pid: int, idle_s: float) -> socket.socket:
    """Start a worker on ``path`` and connect to it once it listens (the caller holds the key's lock)."""
    proc = _spawn(path, parent_pid, idle_s)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            return _connect(path)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = path.with_suffix(".log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the flower-dp node worker did not start (exit code {proc.poll()}; log "
                                   f"{path.with_suffix('.log')}):\n{tail}\nSet {ENV}=0 to run each message in its "
                                   "own process") from None
            time.sleep(0.05)


def call_worker(key: str, request: dict[str, Any], *, parent_pid: int | None = None,
                idle_s: float | None = None) -> dict[str, Any]:
    """Send ``request`` to the node worker named ``key`` (started first if none listens) and return its reply.

    The request is sent once: a worker that fails after receiving it raises here (the message fails, as it would
    in-process), it is never replayed.
    """
    d = worker_dir()
    name = hashlib.sha256(key.encode()).hexdigest()[:20]
    path = d / f"node-{name}.sock"
    idle = float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S) if idle_s is None else idle_s)
    try:
        sock = _connect(path)
    except OSError:
        with open(d / f"node-{name}.lock", "a") as lock:  # one starter per key
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                sock = _connect(path)  # another ClientApp started it meanwhile
            except OSError:
                sock = _start(path, os.getppid() if parent_pid is None else parent_pid, idle)
    with sock:
        _send(sock, request)
        reply = _recv(sock)
    if "error" in reply:
        raise RuntimeError(f"flower-dp node worker failed on this message:\n{reply['error']}")
    return reply


def use_worker(setting: str | None = None) -> bool:
    """Whether messages go to a node worker: ``setting`` (or ``$FLOWER_DP_NODE_WORKER``) ``"1"``/``"0"``, or
    ``"auto"`` (default): only in a ``flwr-clientapp`` process, which Flower starts for every message."""
    value = str(os.environ.get(ENV, "auto") if setting is None else setting).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value != "auto":
        raise ValueError(f"{ENV}={value!r} is not valid; use auto (default), 1 or 0")
    return Path(sys.argv[0] if sys.argv else "").name == "flwr-clientapp"


# ---------------------------------------------------------------- registering on Ray without torch

class WireNodeFactory:
    """``factory(node_id, device)`` of a built-in node builder, made from a ``register`` message as it came (typed
    spec bytes, Flower's ``train_config`` and ``initial_arrays``): the node is decoded and built on its host actor
    (:func:`flower_dp.clients.push_sum_node.build_from_wire`), so this module, and the ClientApp, stay torch-free."""

    __slots__ = ("spec", "train_config", "initial")

    def __init__(self, spec: bytes, train_config: dict[str, Any] | None, initial: dict[str, np.ndarray] | None):
        self.spec, self.train_config, self.initial = bytes(spec), train_config, initial

    def __getstate__(self) -> tuple[Any, ...]:
        return self.spec, self.train_config, self.initial

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.spec, self.train_config, self.initial = state

    def __call__(self, node_id: int, device: str = "cpu") -> Any:
        from .push_sum_node import build_from_wire

        return build_from_wire(node_id, device, spec=self.spec, train_config=self.train_config, initial=self.initial)


def is_ray_register(content: Any) -> bool:
    """Whether a message is a Ray-transport ``register`` that names its host actors in plain values."""
    from flower_dp.gossip.relay import MESSAGE_KEYS as K

    cfg = content.config_records.get("pushsum")
    return (cfg is not None and K["ray"] in cfg and str(cfg.get(K["action"])) == "register"
            and str(cfg.get(K["transport"])) == "ray")


def register_on_ray(content: Any, context: Any) -> Any:
    """Answer a Ray-transport ``register`` (:func:`is_ray_register`) for a built-in builder: join the cluster
    the message names (deployment engine; a no-op once joined), hand the message's spec to this node's host
    actor, reply with the partition id and the node's device.  Nothing here imports torch: a fresh ClientApp
    (or node worker) answers in the time of ``import ray`` and joining the cluster."""
    import json

    from flwr.app import ConfigRecord, RecordDict

    from flower_dp.gossip.ray_backend import ensure_ray, register_node
    from flower_dp.gossip.relay import ARRAYS_KEY, MESSAGE_KEYS as K

    cfg = content["pushsum"]
    placement = json.loads(str(cfg[K["ray"]]))
    if placement.get("address"):
        ensure_ray(placement["address"])
    arrays = content.array_records.get(ARRAYS_KEY)
    config = content.config_records.get("config")
    factory = WireNodeFactory(cfg[K["spec"]], dict(config) if config is not None and len(config) else None,
                              {n: arrays[n].numpy() for n in arrays} if arrays is not None and len(arrays) else None)
    node_id = int(context.node_config["partition-id"])
    device = register_node(placement["name"], placement["namespace"], node_id, int(placement["n_nodes"]),
                           int(placement["num_hosts"]), factory)
    return RecordDict({"pushsum": ConfigRecord({"partition_id": node_id, "device": device})})


def _handle_content(content: Any, context: Any, run_id: int, builder: Any = None) -> Any:
    """One message's reply: a Ray ``register`` of a built-in builder without torch, everything else through the
    node side (:func:`flower_dp.clients.push_sum_node.handle_content`)."""
    if builder is None and is_ray_register(content):
        return register_on_ray(content, context)
    from .push_sum_node import handle_content

    return handle_content(content, context, run_id, builder)


# ---------------------------------------------------------------- the worker process

def _handle(request: dict[str, Any]) -> dict[str, Any]:
    from flwr.app import Context

    if request.get("op") != "handle":
        raise ValueError(f"unknown node worker request {request.get('op')!r}; valid: handle")
    context = Context(run_id=int(request["run_id"]), node_id=int(request["node_id"]),
                      node_config=dict(request["node_config"]), state=plain_to_records(request["state"]),
                      run_config=dict(request["run_config"]))
    content = _handle_content(plain_to_records(request["content"]), context, int(request["run_id"]))
    return {"content": records_to_plain(content), "state": records_to_plain(context.state)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(path: str | Path, parent_pid: int, idle_s: float = DEFAULT_IDLE_S) -> None:
    """Answer node requests on the Unix socket ``path`` until ``parent_pid`` exits or ``idle_s`` pass idle.  The
    node side (torch, the algorithms) loads with the first request that needs it: a Ray ``register`` does not."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead worker's socket (the starter holds the lock)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(str(path))
    finally:
        os.umask(old)
    srv.listen(16)
    srv.settimeout(1.0)
    last, failed = time.monotonic(), False
    print(f"flower-dp node worker {os.getpid()}: listening on {path} (parent {parent_pid}, idle {idle_s:g} s)",
          flush=True)
    try:
        while _alive(parent_pid) and time.monotonic() - last < idle_s:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                if _peer_uid(conn) != os.getuid():
                    continue
                try:
                    request = _recv(conn)
                except (ConnectionError, wire.WireError) as exc:
                    print(f"node worker: bad request ({exc})", flush=True)
                    continue
                try:
                    reply = _handle(request)
                except Exception:  # noqa: BLE001 - the ClientApp raises it
                    reply, failed = {"error": traceback.format_exc()}, True
                    print(reply["error"], flush=True)
                with contextlib.suppress(OSError):
                    _send(conn, reply)
            last = time.monotonic()
    finally:
        srv.close()
        print(f"flower-dp node worker {os.getpid()}: exits", flush=True)
        # the log stays only when a message failed (the ClientApp's error points to it)
        for p in (path, path.with_suffix(".lock")) + (() if failed else (path.with_suffix(".log"),)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


# ---------------------------------------------------------------- the ClientApp

def _run_here(content: Any, context: Any, run_id: int, builder: Any, own: dict[str, Any] | None = None) -> Any:
    if not own:
        return _handle_content(content, context, run_id, builder)
    from .push_sum_node import handle_content

    sources.install(own)  # the nodes are built here, from this process's own models and data
    return handle_content(content, context, run_id, builder)


def make_client_app(builder: Any = None, *, worker: str | None = None):
    """The push-sum ``ClientApp`` (Message API, ``@app.train``).

    Parameters
    ----------
    builder : callable (node_id, spec, context) -> factory, optional
        Default: ``BUILDERS[spec["builder"]]`` (``"toy"`` or ``"registry"``); for your own model and
        data, ``model_builder(model_fn, load_data)``.  A node worker cannot call a function of your process, so
        with a builder every message runs in the ClientApp's own process.  The own models and data registered in
        this process (:mod:`flower_dp.sources`, e.g. by :func:`flower_dp.train_private`) travel with the app, so
        the nodes of a config that names them are built from them wherever the app runs (its messages then run in
        the ClientApp's own process too).
    worker : "auto", "1" or "0", optional
        Node worker per SuperNode (see the module docstring); default ``$FLOWER_DP_NODE_WORKER`` or ``"auto"``.
    """
    from flwr.app import Message
    from flwr.clientapp import ClientApp

    app = ClientApp()
    own = sources.snapshot()  # pickled with the app into the simulation's processes

    @app.train()
    def train(msg: Message, context: Any) -> Message:
        run_id = int(msg.metadata.run_id)
        if builder is not None or own or not use_worker(worker):
            return Message(_run_here(msg.content, context, run_id, builder, own), reply_to=msg)
        reply = call_worker(f"{os.getppid()}:{context.node_id}", {
            "op": "handle", "run_id": run_id, "node_id": int(context.node_id),
            "node_config": dict(context.node_config), "run_config": dict(context.run_config),
            "state": records_to_plain(context.state), "content": records_to_plain(msg.content)})
        state = plain_to_records(reply["state"])
        for name in [n for n in context.state.keys() if n not in state]:
            del context.state[name]
        for name, rec in state.items():
            context.state[name] = rec
        return Message(plain_to_records(reply["content"]), reply_to=msg)

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flower_dp.clients.push_sum_app",
                                description="flower-dp node worker (started by the push-sum ClientApp)")
    p.add_argument("--socket", required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # clean up the socket on a group kill
    serve(a.socket, a.parent_pid, a.idle_s)


if __name__ == "__main__":
    main()
