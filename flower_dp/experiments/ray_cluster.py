"""A config's push-sum nodes on the Ray host actors, driven by the run engine: ``[run] backend = "ray"``.

:class:`RaySegments` is the :class:`flower_dp.engine.SegmentBackend` of :func:`flower_dp.experiments.run_experiment`
with ``backend="ray"``: the nodes live on :class:`flower_dp.gossip.ray_backend.RayGossipBackend` host actors (a few
long-lived Ray actors holding several nodes each, shares passed host to host), while this process keeps everything
the engine keeps for every backend (results, checkpoints, resume, budgets, status).  No Flower is involved.  Each
host builds its nodes itself from the config and the plan made here (:class:`ConfigNodeFactory`: the one node
builder, :func:`flower_dp.clients.builder.build_parts`), so a seeded (``reproducible``) run gives the in-process
numbers bit for bit on CPU.

Where the hosts run: :func:`ray_connection` joins the cluster at ``ray_address`` (``"HEAD:PORT"`` or ``"auto"``, else
``RAY_ADDRESS``; it never starts a head there and never stops the cluster, only disconnects) or, without one,
starts a Ray of its own on 127.0.0.1 (no dashboard) in a private 0700 temporary folder (its sockets, session files
and logs readable by this user alone), stopped and removed at the end.  Its TCP ports on 127.0.0.1 stay open to
the other users of this machine while the run lasts: Ray's token authentication (``RAY_AUTH_MODE=token``) is read
once per process, before this process could turn it on, so it cannot be switched on for a Ray started in-process.
The hosts are spread over the cluster's nodes by a placement group
(one bundle per host: ``ray_placement`` ``"SPREAD"`` by default, ``"STRICT_SPREAD"`` for one host per node), each
host pinned to ``ray_num_gpus_per_host`` GPUs; by default there is one host per CPU (or per GPU share) of the
cluster.  ``results.json`` records where each host ran (``"ray"``: Ray node id, GPU ids, its push-sum nodes).

A host lost mid-segment (its worker or its whole node died) fails the segment with
:class:`flower_dp.gossip.NodeFailureError` naming the host, its Ray node and its push-sum nodes; the engine keeps
the checkpoint of the last segment, and ``resume=True`` continues on the nodes that remain.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import sources
from ..gossip.protocol import SegmentResult

__all__ = ["RaySegments", "ConfigNodeFactory", "ray_connection", "ray_settings"]

#: parts built from one config in a host process, by the config's key (a host builds all its nodes from them)
_PARTS: dict[str, Any] = {}


class ConfigNodeFactory:
    """Builds push-sum node ``node_id`` of a config on a Ray host: ``factory(node_id, device)``.

    Carries the config (a dict), the plan made by the driver (nothing is calibrated again on a host) and the own
    models and data registered in the driver (:mod:`flower_dp.sources`, e.g. by :func:`flower_dp.train_private`),
    which are installed in the host process before its first node is built.
    """

    def __init__(self, config: dict[str, Any], plan: Any) -> None:
        import json

        self.config, self.plan = config, plan
        self.own = {k: v for k, v in sources.snapshot().items()
                    if k in (config["data"]["dataset"], config["model"]["name"])}
        self.key = json.dumps(config, sort_keys=True, default=str)

    def __call__(self, node_id: int, device: str) -> Any:
        from ..clients.builder import build_parts

        if self.own:
            sources.install(self.own)
        parts = _PARTS.get(self.key)
        if parts is None:
            parts = _PARTS[self.key] = build_parts(self.config, plan=self.plan, test=False)
        return parts.build_node(int(node_id), device)


def ray_settings(run: dict[str, Any], ray_address: str | None = None) -> dict[str, Any]:
    """The Ray keys of a config's ``[run]`` table as keyword arguments of :class:`RaySegments` (``ray_address``
    given here wins over the config's)."""
    return {"address": ray_address if ray_address is not None else run.get("ray_address"),
            "num_hosts": run.get("ray_num_hosts"), "num_gpus_per_host": float(run.get("ray_num_gpus_per_host", 0.0)),
            "placement": str(run.get("ray_placement", "SPREAD"))}


def _private_dir(prefix: str) -> Path:
    """A new 0700 folder under /tmp (short: Ray's socket paths are length-limited)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp" if os.path.isdir("/tmp") else None))


@contextmanager
def ray_connection(address: str | None) -> Iterator[dict[str, Any]]:
    """Ray up in this process for one run; yields ``{"address": ..., "own": bool}``.

    ``address`` (or ``RAY_ADDRESS``): join that cluster (checked to answer within seconds first), disconnect at the
    end, never stop it.  None: start a Ray of its own on 127.0.0.1 (no dashboard) in a private 0700 temporary folder,
    and stop it and remove the folder at the end.  A Ray
    already initialised in this process is used as it is and left running.
    """
    import ray

    from .._ray_local import use_loopback
    from ..gossip.ray_backend import check_ray_address

    if ray.is_initialized():
        yield {"address": ray.get_runtime_context().gcs_address, "own": False}
        return
    addr = address or os.environ.get("RAY_ADDRESS") or None
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    pythonpath = os.pathsep.join([p for p in sys.path if p] + inherited)
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                          "runtime_env": {"env_vars": {"PYTHONPATH": pythonpath}}}
    saved = {"PYTHONPATH": os.environ.get("PYTHONPATH")}
    folder = None
    try:
        os.environ["PYTHONPATH"] = pythonpath  # workers of a local Ray inherit this process's environment
        if addr:
            check_ray_address(addr)
            _init(addr, kw)
        else:
            use_loopback()
            folder = _private_dir("fdr")
            _init("local", {**kw, "_node_ip_address": "127.0.0.1", "_temp_dir": str(folder / "ray")})
        yield {"address": ray.get_runtime_context().gcs_address, "own": addr is None}
    finally:
        try:
            ray.shutdown()  # on a joined cluster: this driver disconnects, the cluster runs on
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _init(address: str, kw: dict[str, Any]) -> None:
    """``ray.init`` with Ray's version-mismatch error turned into one naming the fix."""
    import ray

    try:
        ray.init(address=address, **kw)
    except Exception as exc:  # noqa: BLE001 - re-raised, named
        text = str(exc)
        if "version" in text.lower() and "mismatch" in text.lower():
            flat = " ".join(text.split())[:600]
            raise RuntimeError(
                f"the Ray cluster at {address!r} runs another Ray or Python version than this process (Ray "
                f"{ray.__version__}, Python {sys.version.split()[0]}): {flat}; fix: install the "
                "cluster's Ray version here (pip install 'ray==<its version>') or start the cluster with this one"
            ) from exc
        raise


def _iteration_major_means(metrics: dict[int, list[dict[str, float]]], iters: int) -> dict[str, float]:
    """Each metric's mean over iterations and nodes, summed in the in-process runner's order (iteration by iteration,
    nodes in id order), so the history rows are the in-process ones bit for bit."""
    import numpy as np

    vals: dict[str, list[float]] = {}
    for it in range(iters):
        for i in sorted(metrics):
            for key, v in metrics[i][it].items():
                vals.setdefault(key, []).append(float(v))
    return {key: float(np.nanmean(v)) if v else float("nan") for key, v in vals.items()}


class RaySegments:
    """The engine's backend for a config's nodes on Ray host actors (see the module docstring).

    Parameters
    ----------
    n_nodes : int
    factory : ConfigNodeFactory
    num_hosts : int, optional
        Host actors; default one per CPU of the cluster (per GPU share with ``num_gpus_per_host``), at most n_nodes.
    num_gpus_per_host : float
        GPUs each host is pinned to (0: CPU only).  Asked of a cluster without them: an error.
    placement : ``"SPREAD"`` | ``"STRICT_SPREAD"``
        Ray's placement-group strategy for the hosts' bundles.
    device : str
        Device of the nodes (``"cpu"``; ``"auto"``/``"cuda"``: the host's GPU where it has one).
    timeout_s : float
        Longest wait for another host at one iteration.
    log : callable (str) -> None, optional
        Where the progress line of every segment goes (default: stderr).
    """

    def __init__(self, n_nodes: int, factory: ConfigNodeFactory, *, num_hosts: int | None = None,
                 num_gpus_per_host: float = 0.0, placement: str = "SPREAD", device: str = "cpu",
                 timeout_s: float = 120.0, log: Any = None) -> None:
        self.n_nodes, self.factory = int(n_nodes), factory
        self.num_hosts, self.num_gpus_per_host = num_hosts, float(num_gpus_per_host)
        self.placement, self.device, self.timeout_s = placement, device, float(timeout_s)
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.backend: Any = None
        self.hosts: list[dict[str, Any]] = []

    # -- SegmentBackend ------------------------------------------------------------------
    def start(self, k: int, restore) -> None:
        from ..gossip.ray_backend import RayGossipBackend, host_actor_name

        device = None if self.device in ("auto", "cuda") else self.device
        self.backend = RayGossipBackend(
            self.n_nodes, num_hosts=self.num_hosts, num_gpus_per_host=self.num_gpus_per_host, num_cpus_per_host=1.0,
            device=device, timeout_s=self.timeout_s, placement=self.placement)
        self.backend.register_all(self.factory)
        self.hosts = [dict(h, actor_name=host_actor_name(self.backend.name, h["host"]))
                      for h in self.backend.host_info()]
        on = len({h["ray_node_id"] for h in self.hosts})
        self.log(f"flower-dp: ray: {self.backend.num_hosts} hosts on {on} Ray node(s) ({self.placement}), "
                 f"{self.n_nodes} push-sum nodes, devices {sorted(set(self.backend.devices))}")
        if k == 0:
            self.backend.setup()
        else:
            self.backend.load_state_dicts(restore(), k=k)

    def run_segment(self, k0: int, k1: int, *, debug_metrics: bool = False, restore=None) -> SegmentResult:
        from ..gossip.ray_backend import NodeFailureError

        try:
            seg = self.backend.run_segment(k0, k1, debug_metrics=debug_metrics)
        except NodeFailureError as exc:
            where = next((h for h in self.hosts if h["host"] == exc.host), {})
            raise NodeFailureError(
                f"segment k={k0}..{k1 - 1}: host {exc.host} on Ray node {where.get('ray_node_id', '?')} (push-sum "
                f"nodes {exc.nodes}) was lost; the run stopped with its checkpoint at k={k0}; resume it "
                "(`flower-dp run CONFIG --resume DIR --backend ray`, or resume=True) to continue on the Ray nodes "
                "that remain", host=exc.host, nodes=exc.nodes, k0=k0, k1=k1) from exc
        means = _iteration_major_means(seg.metrics, k1 - k0)
        self.log(f"flower-dp: ray: k={k0}..{k1 - 1} on {self.backend.num_hosts} hosts in {seg.wall_time_s:.2f} s")
        return SegmentResult(seg.k0, seg.k1, seg.bits_sent, wall_time_s=seg.wall_time_s, means=means)

    def network_average(self) -> Any:
        return self._asking(self.backend.network_average)

    def privacy_reports(self) -> dict[int, dict[str, Any]]:
        return {int(i): dict(r) for i, r in self._asking(self.backend.privacy_reports).items()}

    def state_dicts(self) -> dict[int, Any]:
        return self._asking(self.backend.state_dicts)

    def _asking(self, fn: Any) -> Any:
        """``fn()`` (a question to every host between segments); a host found dead is a
        :class:`~flower_dp.gossip.NodeFailureError` naming it, as in a segment."""
        import ray

        from ..gossip.ray_backend import NodeFailureError

        try:
            return fn()
        except ray.exceptions.RayActorError as exc:
            text = str(exc)
            lost = [h for h in self.hosts if str(h.get("actor_name", "\0")) in text or h["ray_node_id"] in text]
            where = lost[0] if lost else {"host": -1, "ray_node_id": "?", "nodes": []}
            raise NodeFailureError(
                f"host {where['host']} on Ray node {where['ray_node_id']} (push-sum nodes {where['nodes']}) was lost "
                "after its segment; the run stopped with its last checkpoint; resume it (`flower-dp run CONFIG "
                "--resume DIR --backend ray`, or resume=True) to continue on the Ray nodes that remain",
                host=where["host"], nodes=where["nodes"], k0=-1, k1=-1) from exc

    def shutdown(self) -> None:
        if self.backend is not None:
            self.backend.shutdown()
            self.backend = None

    def record(self) -> dict[str, Any]:
        """The ``"ray"`` section of ``results.json``: the placement and, per host, its Ray node id, GPU ids, device
        and push-sum nodes."""
        return {"placement": self.placement, "num_gpus_per_host": self.num_gpus_per_host,
                "hosts": [{key: h[key] for key in ("host", "ray_node_id", "gpu_ids", "device", "nodes")}
                          for h in self.hosts]}

