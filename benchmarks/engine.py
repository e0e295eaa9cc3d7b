"""Engine overhead and scale: the same Dyn-D2P nodes stepped in-process and on the Ray host actors.

Engine overhead = time of one gossip segment on :class:`flower_dp.gossip.ray_backend.RayGossipBackend`
(the engine the Flower simulation runs segments on; Flower's own ~18 s start-up and per-round
messages are not included) / time of the same segment in-process
(:func:`flower_dp.gossip.run_iterations`).  n = 16 Dyn-D2P nodes with the shallow CNN, one
epoch of each node's data (synthetic Fashion-MNIST-shaped tensors: timing only).

Scale: node-iterations per second and resident memory per node for n = 256 two-layer nets
in-process, and the Ray backend at n = 8 / 32 / 64 shallow CNNs.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from ._common import current_rss_mb, missing

__all__ = ["build_node", "run_overhead", "run_scale"]


def _plan(n: int, J: int, iters: int, seed: int = 0, batch: int = 32):
    from flower_dp.clients.registry import prepare

    params = {"variant": "dyn", "epsilon": 2.0, "delta": 1e-5, "batch_size": batch, "lr": 0.05}
    return prepare("dyn_d2p", params, n_nodes=n, samples_per_node=[J] * n, num_iters=iters, dim=1, seed=seed)


def build_node(node_id: int, device: str = "cpu", *, plan, model_name: str, J: int, seed: int = 0):
    """``factory(node_id, device)``: a Dyn-D2P node with synthetic data (picklable via functools.partial)."""
    from flower_dp.clients.registry import make_node
    from flower_dp.models import build_model
    from flower_dp.topology import make_topology

    g = torch.Generator().manual_seed(1000 * seed + node_id)
    x = torch.randn(J, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (J,), generator=g)
    topo = make_topology("exp", plan.n_nodes)
    return make_node(plan, node_id=node_id, topology=topo, model=build_model(model_name, seed=seed),
                     loss_fn=F.cross_entropy, data_x=x, data_y=y, device=device)


def _plan_for(n: int, model_name: str, J: int, iters: int, batch: int = 32):
    import dataclasses

    plan = _plan(n, J, iters, batch=batch)
    from flower_dp.models import build_model, count_parameters

    return dataclasses.replace(plan, dim=count_parameters(build_model(model_name)))


def _inprocess_seconds(factory, n: int, iters: int) -> float:
    """Seconds for iterations 1..iters (iteration 0 warms up: first vmap call, allocator)."""
    from flower_dp.gossip import run_iterations

    nodes = [factory(i, "cpu") for i in range(n)]
    for nd in nodes:
        nd.setup()
    run_iterations(nodes, 0, 1)
    t0 = time.perf_counter()
    run_iterations(nodes, 1, iters + 1)
    return time.perf_counter() - t0


def _ray_backend(n: int, factory, num_hosts: int):
    import ray

    from flower_dp.gossip.ray_backend import RayGossipBackend, ensure_ray

    from . import engine as this

    ray.cloudpickle.register_pickle_by_value(this)  # hosts need not import the benchmarks package
    ensure_ray(num_cpus=num_hosts)
    be = RayGossipBackend(n, factory, num_hosts=num_hosts, timeout_s=600)
    be.setup()
    return be


def run_overhead(quick: bool = False, *, skip_ray: bool = False) -> dict:
    """Ray segment / in-process segment, n = 16 (4 quick) shallow CNN Dyn-D2P nodes, one epoch."""
    try:
        import flower_dp.clients.registry  # noqa: F401
    except ImportError as exc:
        return missing("flower_dp.clients.registry (the algorithms)", exc)
    n, J, batch = (4, 32, 16) if quick else (16, 128, 32)
    iters = J // batch  # one epoch of each node's data (expected batch B, Poisson rate B/J)
    plan = _plan_for(n, "shallow_cnn", J, iters + 1, batch)  # + 1 warm-up iteration
    factory = functools.partial(build_node, plan=plan, model_name="shallow_cnn", J=J)
    out = {"n": n, "samples_per_node": J, "batch": batch, "iterations": iters, "model": "shallow_cnn",
           "algorithm": "dyn_d2p", "data": "synthetic (timing only)"}
    t_in = _inprocess_seconds(factory, n, iters)
    out["inprocess_s"] = round(t_in, 3)
    if skip_ray:
        out.update(missing("Ray run skipped (--skip-ray)"))
        return out
    try:
        import flower_dp.gossip.ray_backend  # noqa: F401
    except ImportError as exc:
        out.update(missing("flower_dp.gossip.ray_backend", exc))
        return out
    import ray

    try:
        t0 = time.perf_counter()
        be = _ray_backend(n, factory, num_hosts=2)
        out["ray_startup_s"] = round(time.perf_counter() - t0, 2)
        be.run_segment(0, 1)  # warm-up, as in-process
        res = be.run_segment(1, iters + 1)
        out["ray_segment_s"] = round(res.wall_time_s, 3)
        be.shutdown()
    except Exception as exc:  # noqa: BLE001 -- report, do not crash the suite
        out.update(missing("Ray segment failed", exc))
        return out
    finally:
        ray.shutdown()
    t_in2 = _inprocess_seconds(factory, n, iters)  # again after Ray: brackets load changes
    out["inprocess_s_after"] = round(t_in2, 3)
    out["num_hosts"] = 2
    out["value"] = round(out["ray_segment_s"] / ((t_in + t_in2) / 2), 3)
    return out


def run_scale(quick: bool = False, *, skip_ray: bool = False) -> dict:
    """In-process n = 256 (16 quick) two-layer nets; Ray n = 8/32/64 (4 quick) shallow CNNs."""
    out: dict = {}
    try:
        import flower_dp.clients.registry  # noqa: F401
    except ImportError as exc:
        m = missing("flower_dp.clients.registry (the algorithms)", exc)
        return {"inprocess_mlp": m, "ray_cnn": m, "max_nodes_inprocess_mlp": None, "max_nodes_flower_cnn": None}
    from flower_dp.gossip import run_iterations

    n, J, iters = (8, 64, 2) if quick else (256, 64, 4)
    plan = _plan_for(n, "mlp_2layer", J, iters + 1)
    factory = functools.partial(build_node, plan=plan, model_name="mlp_2layer", J=J)
    rss0 = current_rss_mb()
    nodes = [factory(i, "cpu") for i in range(n)]
    for nd in nodes:
        nd.setup()
    run_iterations(nodes, 0, 1)  # warm-up
    t0 = time.perf_counter()
    run_iterations(nodes, 1, iters + 1)
    dt = time.perf_counter() - t0
    rss1 = current_rss_mb()
    out["inprocess_mlp"] = {"n": n, "iterations": iters, "samples_per_node": J, "seconds": round(dt, 3),
                            "node_iterations_per_s": round(n * iters / dt, 2),
                            "rss_mb_per_node": round((rss1 - rss0) / n, 3), "rss_mb_total": round(rss1, 1)}
    out["max_nodes_inprocess_mlp"] = n
    del nodes
    ray_sizes = (4,) if quick else (8, 32, 64)
    out["ray_cnn"] = {}
    out["max_nodes_flower_cnn"] = None
    if skip_ray:
        out["ray_cnn"] = missing("Ray run skipped (--skip-ray)")
        return out
    try:
        import ray

        import flower_dp.gossip.ray_backend  # noqa: F401
    except ImportError as exc:
        out["ray_cnn"] = missing("flower_dp.gossip.ray_backend", exc)
        return out
    for n in ray_sizes:
        iters = 2
        plan = _plan_for(n, "shallow_cnn", J, iters + 1)
        factory = functools.partial(build_node, plan=plan, model_name="shallow_cnn", J=J)
        try:
            t0 = time.perf_counter()
            be = _ray_backend(n, factory, num_hosts=2)
            startup = time.perf_counter() - t0
            be.run_segment(0, 1)  # warm-up
            res = be.run_segment(1, iters + 1)
            seg = res.wall_time_s
            be.shutdown()
            out["ray_cnn"][str(n)] = {"iterations": iters, "startup_s": round(startup, 2), "segment_s": round(seg, 3),
                                      "node_iterations_per_s": round(n * iters / seg, 2)}
            out["max_nodes_flower_cnn"] = n
        except Exception as exc:  # noqa: BLE001 -- the largest n that ran is the figure
            out["ray_cnn"][str(n)] = missing(f"n={n} failed", exc)
            break
        finally:
            ray.shutdown()
    return out
