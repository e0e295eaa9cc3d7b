"""Engine overhead and scale: the same Dyn-D2P nodes stepped in-process, on the Ray host actors, under Flower.

Engine overhead = wall time of one gossip segment under Flower on Ray (``run_simulation`` of
:class:`flower_dp.strategies.push_sum.PushSumStrategy` with the push-sum ClientApp: one Flower
round = one segment, its register messages to the n ClientApps, the segment on the 2 Ray host
actors, the network average) / the same segment in-process (:func:`flower_dp.gossip.run_iterations`).
n = 16 Dyn-D2P nodes (exp topology) with the shallow CNN, one epoch of each node's data
(synthetic Fashion-MNIST-shaped tensors: timing only); both sides build their nodes with the
ClientApp's ``model_builder`` and warm up with the same first epoch; 3 Flower rounds and 3
in-process segments alternate in time (the in-process one runs in the server's ``evaluate_fn``
between rounds), and the figure is the ratio of their minima.  Flower's fixed start-up (Ray,
SuperNodes, host actors, node build, the warm-up round) is reported separately, and so is the
host-actor engine without Flower (``ray_backend_*``, not interleaved).

Scale: node-iterations per second and resident memory per node for n = 256 two-layer nets
in-process, and the Ray backend at n = 8 / 32 / 64 shallow CNNs.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np
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


def _shallow_cnn():
    """``model_fn`` of the overhead run (module level: the Flower ClientApps and host actors call it)."""
    from flower_dp.models import build_model

    return build_model("shallow_cnn", seed=0)


def _synthetic_data(J: int, partition_id: int, num_partitions: int):
    """``load_data`` of the overhead run: J Fashion-MNIST-shaped samples of one node (timing only)."""
    g = torch.Generator().manual_seed(1000 + int(partition_id))
    return torch.randn(J, 1, 28, 28, generator=g), torch.randint(0, 10, (J,), generator=g)


def _spec_node(node_id: int, device: str = "cpu", *, spec: dict, J: int):
    """The node a Flower ClientApp builds for ``spec`` (``model_builder``), for in-process and host-actor runs."""
    from flower_dp.clients.push_sum_app import model_builder

    return model_builder(_shallow_cnn, functools.partial(_synthetic_data, J))(node_id, spec)(node_id, device)


def _flower_interleaved(n: int, spec: dict, J: int, iters: int, rounds: int, inprocess_nodes: list, threads: int) -> dict:
    """Flower rounds of ``iters`` iterations, each followed by the same segment in-process.

    ``run_simulation`` of :class:`PushSumStrategy` (Ray host actors, one round = one segment);
    round 1 warms up.  At the end of every round the server's ``evaluate_fn`` (which Flower calls
    while the host actors wait) steps ``inprocess_nodes`` (already warmed up, k = 0..iters-1)
    through their next segment.  So Flower rounds 2..rounds+1 and in-process segments alternate in
    time and see the same machine load.  A Flower round is timed from the end of the in-process
    segment before it to the end of its own segment (its register messages to the n ClientApps,
    the segment on the host actors, the network average, the per-node reports).
    """
    import ray
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from flower_dp.clients.push_sum_app import make_client_app, model_builder
    from flower_dp.gossip import run_iterations
    from flower_dp.strategies.push_sum import PushSumStrategy

    from . import engine as this

    ray.cloudpickle.register_pickle_by_value(this)  # Flower's workers and the hosts need not import benchmarks
    if ray.is_initialized():
        ray.shutdown()  # run_simulation starts its own Ray
    seen: dict = {"flower": [], "inprocess": []}

    def evaluate(rnd, avg):
        t_end = time.perf_counter()
        if rnd >= 2:
            seen["flower"].append(t_end - seen["resume"])
        else:
            seen["end_1"] = t_end
        if rnd == 2:
            impl = seen["strategy"].backend.call("__getattribute__", None, "_clip_impl")
            seen["clip_impl"] = sorted({f.__name__ for f in impl.values()})
        if rnd <= rounds:
            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                t0 = time.perf_counter()
                run_iterations(inprocess_nodes, rnd * iters, (rnd + 1) * iters)
                seen["inprocess"].append(time.perf_counter() - t0)
            finally:
                torch.set_num_threads(before)
        seen["resume"] = time.perf_counter()
        return None

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strat = PushSumStrategy(n, spec, num_iters=(rounds + 1) * iters, iters_per_round=iters, transport="ray",
                                evaluate_fn=evaluate, checkpoint=False, max_retries=0, timeout_s=600,
                                backend_kwargs={"num_hosts": 2})
        seen["strategy"] = strat
        strat.start(grid)

    from flower_dp._ray_local import use_loopback

    use_loopback()  # the simulation's Ray binds 127.0.0.1
    t0 = time.perf_counter()
    run_simulation(server_app=server, client_app=make_client_app(model_builder(_shallow_cnn, functools.partial(
        _synthetic_data, J))), num_supernodes=n, backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    t_end = time.perf_counter()
    if len(seen["flower"]) < rounds:
        raise RuntimeError(f"the Flower run finished {len(seen['flower'])} of {rounds} timed rounds (see the log above)")
    tim = seen["strategy"].timings
    return {"flower_rounds_s": [round(t, 3) for t in seen["flower"]],
            "inprocess_segments_s": [round(t, 3) for t in seen["inprocess"]],
            "flower_startup_s": round(seen["end_1"] - t0, 2),  # Ray, SuperNodes, host actors, node build, round 1
            "flower_total_s": round(t_end - t0, 2),
            "flower_backend_start_s": round(tim.get("backend_start_s", float("nan")), 2),
            "clip_impl_flower": seen.get("clip_impl")}


def run_overhead(quick: bool = False, *, skip_ray: bool = False) -> dict:
    """Flower-on-Ray segment / in-process segment, n = 16 (4 quick) shallow CNN Dyn-D2P nodes, one epoch.

    Both use the whole machine as well as they can: Flower runs the nodes on 2 host actors of 1
    thread; in-process, 1 thread and ``torch.set_num_threads(cpu count)`` are tried on one
    iteration and the faster is used (intra-op threads lose badly on a loaded machine).  The
    nodes are built by the same ``model_builder`` the Flower ClientApps use, so both sides run
    identical nodes (the clipping path each side uses is reported: ghost norms on both).  Flower
    rounds and in-process segments alternate (:func:`_flower_interleaved`); the figure is the
    ratio of the minima (medians beside it).
    """
    try:
        from flower_dp.clients.push_sum_app import plan_spec
        from flower_dp.gossip import run_iterations
    except ImportError as exc:
        return missing("flower_dp.clients.push_sum_app (the algorithms)", exc)
    n, J, batch = (4, 32, 16) if quick else (16, 128, 32)
    iters = J // batch  # one epoch of each node's data (expected batch B, Poisson rate B/J)
    rounds = 2 if quick else 3
    params = {"variant": "dyn", "epsilon": 2.0, "delta": 1e-5, "batch_size": batch, "lr": 0.05}
    spec = plan_spec("dyn_d2p", params, n_nodes=n, model_fn=_shallow_cnn, samples_per_node=J,
                     num_iters=(rounds + 1) * iters, topology="exp")
    factory = functools.partial(_spec_node, spec=spec, J=J)
    out = {"n": n, "samples_per_node": J, "batch": batch, "iterations": iters, "model": "shallow_cnn",
           "algorithm": "dyn_d2p", "topology": "exp", "data": "synthetic (timing only)"}
    cpus = os.cpu_count() or 1
    before = torch.get_num_threads()
    nodes = [factory(i, "cpu") for i in range(n)]
    for nd in nodes:
        nd.setup()
    run_iterations(nodes, 0, 1)  # first calls (allocator, lazy init)
    probe = {}
    for threads in sorted({1, cpus}):  # one iteration each (k = 1, 2), part of the warm-up epoch
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        run_iterations(nodes, len(probe) + 1, len(probe) + 2)
        probe[threads] = time.perf_counter() - t0
    torch.set_num_threads(before)
    threads = min(probe, key=probe.get)
    if len(probe) + 1 < iters:
        run_iterations(nodes, len(probe) + 1, iters)  # finish the warm-up epoch (k = 0..iters-1)
    out.update({"inprocess_probe_s_per_iteration": {str(k): round(v, 3) for k, v in probe.items()},
                "inprocess_threads": threads, "clip_impl_inprocess": nodes[0]._clip_impl.__name__})
    if skip_ray:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        run_iterations(nodes, iters, 2 * iters)
        out["inprocess_s"] = round(time.perf_counter() - t0, 3)
        torch.set_num_threads(before)
        out.update(missing("Ray run skipped (--skip-ray)"))
        return out
    import ray

    try:  # the host-actor engine alone (no Flower messages), as a breakdown; not interleaved
        t0 = time.perf_counter()
        be = _ray_backend(n, factory, num_hosts=2)
        out["ray_backend_startup_s"] = round(time.perf_counter() - t0, 2)
        be.run_segment(0, iters)  # warm-up
        res = be.run_segment(iters, 2 * iters)
        out["ray_backend_segment_s"] = round(res.wall_time_s, 3)
        out["clip_impl_ray_backend"] = sorted({f.__name__ for f in be.call("__getattribute__", None, "_clip_impl").values()})
        be.shutdown()
    except Exception as exc:  # noqa: BLE001 -- report, do not crash the suite
        out["ray_backend_note"] = f"failed: {type(exc).__name__}: {exc}"
    finally:
        ray.shutdown()
    try:
        out.update(_flower_interleaved(n, spec, J, iters, rounds, nodes, threads))
    except Exception as exc:  # noqa: BLE001
        out.update(missing("Flower-on-Ray run failed", exc))
        return out
    finally:
        if ray.is_initialized():
            ray.shutdown()
    fl, ip = out["flower_rounds_s"], out["inprocess_segments_s"]
    out["flower_segment_s"] = min(fl)
    out["inprocess_s"] = min(ip)
    out["value"] = round(min(fl) / min(ip), 3)
    out["median_ratio"] = round(float(np.median(fl)) / float(np.median(ip)), 3)
    if "ray_backend_segment_s" in out:
        out["ray_backend_ratio"] = round(out["ray_backend_segment_s"] / min(ip), 3)
    out["num_hosts"] = 2
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
