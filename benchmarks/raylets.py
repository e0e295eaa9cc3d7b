"""Across Ray nodes: the host-actor backend's throughput on one raylet vs two raylets of this machine.

Both layouts are ``ray.cluster_utils.Cluster`` instances on 127.0.0.1 with the same totals
(2 CPUs, 2 fake GPUs: Ray only hands out ids, no CUDA is used): one raylet declaring both, or two
raylets declaring one each.  Two host actors ask for one GPU each, so on two raylets they land on
different Ray nodes and every share between them crosses from one object store to the other
(loopback), while on one raylet they share one object store.  Nodes compute on the CPU
(``device="cpu"``).  n = 16 shallow-CNN Dyn-D2P nodes (8 quick: tiny sizes), segments of 4 iterations;
the layouts run in A-B-B-A order (each start is a fresh cluster) so that a drift in machine load
hits both alike, and the figure is node-iterations per second on two raylets / on one (from the
fastest segment; the median segment beside it).  Same machine, same cores: the figure is the cost
of going through two raylets (object transfer between stores, cross-node scheduling), not a
speed-up from more hardware.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import sys
import tempfile
import time

from ._common import missing

__all__ = ["run", "LAYOUTS"]

#: raylets -> (num_cpus, num_gpus) each; the same totals
LAYOUTS = {1: (2, 2), 2: (1, 1)}


def _start_cluster(raylets: int):
    import ray
    from ray.cluster_utils import Cluster

    from flower_dp._ray_local import use_loopback

    use_loopback()
    if ray.is_initialized():
        ray.shutdown()
    # workers inherit the environment, not sys.path (as flower_dp.gossip.ray_backend.ensure_ray does)
    path = [p for p in sys.path if p] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(os.pathsep.join(path).split(os.pathsep)))
    temp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # short: Ray's socket paths are length-limited
    cluster = Cluster(shutdown_at_exit=True)
    cpus, gpus = LAYOUTS[raylets]
    try:
        for _ in range(raylets):
            cluster.add_node(num_cpus=cpus, num_gpus=gpus, node_ip_address="127.0.0.1", include_dashboard=False,
                             temp_dir=temp)
        cluster.wait_for_nodes(timeout=60)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    except BaseException:
        _stop_cluster(cluster, temp)
        raise
    return cluster, temp


def _stop_cluster(cluster, temp: str) -> None:
    import ray

    try:
        ray.shutdown()
    finally:
        try:
            cluster.shutdown()
        finally:
            shutil.rmtree(temp, ignore_errors=True)


def _one_layout(raylets: int, n: int, factory, iters: int, segments: int) -> dict:
    import ray

    from flower_dp.gossip.ray_backend import RayGossipBackend

    from . import engine

    t0 = time.perf_counter()
    cluster, temp = _start_cluster(raylets)
    try:
        ray.cloudpickle.register_pickle_by_value(engine)  # hosts need not import the benchmarks package
        be = RayGossipBackend(n, factory, num_hosts=2, num_gpus_per_host=1, device="cpu", timeout_s=600)
        try:
            info = be.host_info()
            be.setup()
            startup = time.perf_counter() - t0
            be.run_segment(0, iters)  # warm-up
            seg = [be.run_segment(s * iters, (s + 1) * iters).wall_time_s for s in range(1, segments + 1)]
        finally:
            be.shutdown()
    finally:
        _stop_cluster(cluster, temp)
    return {"raylets": raylets, "startup_s": round(startup, 2), "segments_s": [round(s, 3) for s in seg],
            "ray_nodes_of_hosts": len({h["ray_node_id"] for h in info}),
            "gpu_ids_of_hosts": [h["gpu_ids"] for h in info], "devices": sorted({h["device"] for h in info})}


def run(quick: bool = False, *, skip_ray: bool = False) -> dict:
    """Node-iterations per second on 2 raylets / on 1 raylet (see the module docstring)."""
    if skip_ray:
        return missing("Ray run skipped (--skip-ray)")
    try:
        import ray  # noqa: F401
        from ray.cluster_utils import Cluster  # noqa: F401

        import flower_dp.gossip.ray_backend  # noqa: F401
    except ImportError as exc:
        return missing("ray.cluster_utils / flower_dp.gossip.ray_backend", exc)
    from . import engine

    n, J, iters, segments = (4, 32, 2, 1) if quick else (16, 64, 4, 3)
    order = (1, 2) if quick else (1, 2, 2, 1)
    plan = engine._plan_for(n, "shallow_cnn", J, (segments + 1) * iters)
    factory = functools.partial(engine.build_node, plan=plan, model_name="shallow_cnn", J=J)
    runs = [_one_layout(r, n, factory, iters, segments) for r in order]
    out: dict = {"n": n, "iterations_per_segment": iters, "samples_per_node": J, "model": "shallow_cnn",
                 "algorithm": "dyn_d2p", "num_hosts": 2, "order": list(order), "runs": runs}
    for r in (1, 2):
        segs = [s for run_ in runs if run_["raylets"] == r for s in run_["segments_s"]]
        out[f"node_iterations_per_s_{r}"] = round(n * iters / min(segs), 2)
        out[f"median_node_iterations_per_s_{r}"] = round(n * iters / statistics.median(segs), 2)
    out["hosts_on_distinct_ray_nodes_2"] = all(run_["ray_nodes_of_hosts"] == 2 for run_ in runs if run_["raylets"] == 2)
    out["value"] = round(out["node_iterations_per_s_2"] / out["node_iterations_per_s_1"], 3)
    out["median_ratio"] = round(out["median_node_iterations_per_s_2"] / out["median_node_iterations_per_s_1"], 3)
    return out
