"""Engine overhead and scale: the same Dyn-D2P nodes stepped in-process, on the Ray host actors, under Flower.

Engine overhead = wall time of one gossip segment under Flower on Ray (``flwr run`` of
:class:`flower_dp.strategies.push_sum.PushSumStrategy` with the push-sum ClientApp: one Flower
round = one segment, its register messages to the n ClientApps, the segment on the 2 Ray host
actors, the network average) / the same segment in-process (:func:`flower_dp.gossip.run_iterations`).
n = 16 Dyn-D2P nodes (exp topology) with the shallow CNN, one epoch of each node's data
(synthetic Fashion-MNIST-shaped tensors: timing only); both sides build their nodes with the
ClientApp's ``model_builder`` and warm up with the same first epoch; 9 Flower rounds and 9
in-process segments alternate in time (the in-process one runs in the server's ``evaluate_fn``
between rounds), and the figure is the ratio of their minima.  Flower's fixed start-up (Ray,
SuperNodes, host actors, node build, the warm-up round) is reported separately, and so is the
host-actor engine without Flower (``ray_backend_*``, not interleaved).

Scale (:func:`run_scale`): node-iterations per second and resident memory per node against n:
two-layer-net nodes in-process and on 2 Ray host actors (n = 8, 64, 256, 1,024), shallow-CNN
nodes as Flower SuperNodes under ``flwr run`` (n = 8, 32, 64); :func:`plot_scale` draws the curves.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from flower_dp.experiments.flower_run import client_app_from_config

from ._common import PeakSampler, current_rss_mb, missing

__all__ = ["build_node", "run_overhead", "run_scale", "scale_keys", "plot_scale"]


def _plan(n: int, J: int, iters: int, seed: int = 0, batch: int = 32):
    from flower_dp.clients.registry import prepare

    params = {"variant": "dyn", "epsilon": 2.0, "delta": 1e-5, "batch_size": batch, "lr": 0.05}
    return prepare("dyn_d2p", params, n_nodes=n, samples_per_node=[J] * n, num_iters=iters, dim=1, seed=seed)


@functools.lru_cache(maxsize=4)
def _exp_topology(n: int):
    from flower_dp.topology import make_topology

    return make_topology("exp", n)


def build_node(node_id: int, device: str = "cpu", *, plan, model_name: str, J: int, seed: int = 0, topology=None):
    """``factory(node_id, device)``: a Dyn-D2P node with synthetic data (picklable via functools.partial).

    ``topology``: the network's (shared by the nodes, as the runner's); default the exp graph of ``plan.n_nodes``,
    one per process (a topology per node would cost n dense (n, n) matrices per phase: 80 MB a node at n = 1,024).
    """
    from flower_dp.clients.registry import make_node
    from flower_dp.models import build_model

    g = torch.Generator().manual_seed(1000 * seed + node_id)
    x = torch.randn(J, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (J,), generator=g)
    topo = _exp_topology(plan.n_nodes) if topology is None else topology
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


ROUND_PARTS = ("register", "run_segment", "network_average", "privacy_reports", "param_layout")


def _timed_strategy():
    """:class:`PushSumStrategy` that adds up where each round's time goes (``timings["<part>_s_<round>"]``, parts
    :data:`ROUND_PARTS`: the register messages to the ClientApps, the host actors' segment, the network average, the
    nodes' privacy reports (eps), the model layout)."""
    from flower_dp.strategies._push_sum_backend import FlowerSegments
    from flower_dp.strategies.push_sum import PushSumStrategy

    class TimedSegments(FlowerSegments):
        _round = 0

        def _timed(self, part, fn, *a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                key = f"{part}_s_{self._round}"
                self.s.timings[key] = self.s.timings.get(key, 0.0) + time.perf_counter() - t

        def _register(self, rnd, **kw):
            self._round = rnd
            return self._timed("register", super()._register, rnd, **kw)

        def _new_backend(self):
            be = super()._new_backend()
            for name in ROUND_PARTS[1:]:
                setattr(be, name, functools.partial(self._timed, name, getattr(be, name)))
            return be

    class Timed(PushSumStrategy):
        segments_class = TimedSegments

    return Timed


def _round_parts(timings: dict, rnd: int, total: float) -> dict:
    parts = {p: round(timings.get(f"{p}_s_{rnd}", 0.0), 3) for p in ROUND_PARTS}
    parts["other"] = round(total - sum(parts.values()), 3)
    return parts


def _overhead_spec(n: int, J: int, batch: int, num_iters: int) -> dict:
    """The node spec of the overhead and Flower scale runs: n shallow-CNN Dyn-D2P nodes, J samples each."""
    from flower_dp.clients.push_sum_app import plan_spec

    params = {"variant": "dyn", "epsilon": 2.0, "delta": 1e-5, "batch_size": batch, "lr": 0.05}
    return plan_spec("dyn_d2p", params, n_nodes=n, model_fn=_shallow_cnn, samples_per_node=J, num_iters=num_iters,
                     topology="exp")


def _bench_client(run_config) -> ClientApp:
    from flower_dp.clients.push_sum_app import make_client_app, model_builder

    J = int(run_config["samples-per-node"])
    return make_client_app(model_builder(_shallow_cnn, functools.partial(_synthetic_data, J)))


#: the ClientApp of the Flower runs below: the push-sum ClientApp with :func:`_shallow_cnn` and :func:`_synthetic_data`
#: of ``samples-per-node`` samples (run configuration), made once per ClientApp process
CLIENT = client_app_from_config(_bench_client, key=lambda rc: int(rc["samples-per-node"]))
#: the ServerApp of the Flower runs below; run configuration: ``scenario`` ("interleaved": :func:`_flower_interleaved`,
#: "cnn-point": :func:`_flower_cnn_point`), ``n``, ``samples-per-node``, ``batch``, ``iterations``, ``rounds``,
#: ``threads``, ``root-pid`` (the process whose Ray workers are measured) and ``out-file`` (what it saw, JSON)
SERVER = ServerApp()


@SERVER.main()
def _server_main(grid: Grid, context: Context) -> None:
    import json

    rc = context.run_config
    seen = (_interleaved_rounds if rc["scenario"] == "interleaved" else _cnn_point_rounds)(grid, rc)
    with open(str(rc["out-file"]), "w") as fh:
        json.dump(seen, fh)


def _run_flower(scenario: str, n: int, J: int, batch: int, iters: int, rounds: int = 1, threads: int = 1) -> dict:
    """``flwr run`` of :data:`SERVER` and :data:`CLIENT` on n SuperNodes (:func:`flower_dp.experiments.flower_run.run_app`);
    returns what the ServerApp saw, with ``t0`` (Unix time before the start) and ``t_end`` (after the end)."""
    import json
    import tempfile
    from pathlib import Path

    from flower_dp.experiments.flower_run import run_app

    with tempfile.TemporaryDirectory(prefix="engine-bench-") as work:
        out_file = Path(work) / "seen.json"
        t0 = time.time()
        run = run_app("benchmarks.engine:SERVER", "benchmarks.engine:CLIENT", num_supernodes=n, work_dir=work,
                      pythonpath=[Path(__file__).resolve().parents[1]], timeout_s=3600,
                      run_config={"scenario": scenario, "n": n, "samples-per-node": J, "batch": batch,
                                  "iterations": iters, "rounds": rounds, "threads": threads, "root-pid": os.getpid(),
                                  "out-file": str(out_file)})
        t_end = time.time()
        if not out_file.is_file():
            raise RuntimeError(f"the Flower run ({scenario}, n={n}) ended without its timings; the end of its "
                               f"output:\n{run.tail()}")
        return {**json.loads(out_file.read_text()), "t0": t0, "t_end": t_end}


def _start_timed(grid: Grid, spec: dict, num_iters: int, iters: int, evaluate, timeout_s: float, state: dict,
                 seen: dict) -> dict:
    """Run the timed strategy (:func:`_timed_strategy`, 2 Ray host actors, no checkpoint, no retry) to its end;
    ``state["strategy"]`` is it (for ``evaluate``); returns ``seen`` with the strategy's ``timings``."""
    strat = _timed_strategy()(spec["plan"].n_nodes, spec, num_iters=num_iters, iters_per_round=iters, transport="ray",
                              evaluate_fn=evaluate, checkpoint=False, max_retries=0, timeout_s=timeout_s,
                              backend_kwargs={"num_hosts": 2})
    state["strategy"] = strat
    strat.start(grid)
    seen["timings"] = dict(strat.timings)
    return seen


def _interleaved_rounds(grid: Grid, rc) -> dict:
    """The ServerApp side of :func:`_flower_interleaved`: builds and warms up the in-process nodes, then runs the
    strategy, stepping those nodes through a segment in every ``evaluate_fn``."""
    from flower_dp.gossip import run_iterations

    n, J, iters, rounds, threads = (int(rc[k]) for k in ("n", "samples-per-node", "iterations", "rounds", "threads"))
    spec = _overhead_spec(n, J, int(rc["batch"]), (rounds + 1) * iters)
    t_build = time.time()
    nodes = [_spec_node(i, "cpu", spec=spec, J=J) for i in range(n)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    for nd in nodes:
        nd.setup()
    run_iterations(nodes, 0, iters)  # the warm-up epoch (k = 0..iters-1), as in run_overhead
    torch.set_num_threads(before)
    seen: dict = {"flower": [], "inprocess": [], "inprocess_build_s": time.time() - t_build}
    state: dict = {}

    def evaluate(rnd, avg):
        t_end = time.perf_counter()
        if rnd >= 2:
            seen["flower"].append(t_end - state["resume"])
        else:
            seen["end_1"] = time.time()
        if rnd == 2:
            impl = state["strategy"].backend.call("__getattribute__", None, "_clip_impl")
            seen["clip_impl"] = sorted({f.__name__ for f in impl.values()})
        if rnd <= rounds:
            torch.set_num_threads(threads)
            try:
                t0 = time.perf_counter()
                run_iterations(nodes, rnd * iters, (rnd + 1) * iters)
                seen["inprocess"].append(time.perf_counter() - t0)
            finally:
                torch.set_num_threads(before)
        state["resume"] = time.perf_counter()
        return None

    return _start_timed(grid, spec, (rounds + 1) * iters, iters, evaluate, 600, state, seen)


def _flower_interleaved(n: int, J: int, batch: int, iters: int, rounds: int, threads: int) -> dict:
    """Flower rounds of ``iters`` iterations, each followed by the same segment in-process.

    ``flwr run`` of :class:`PushSumStrategy` (Ray host actors, one round = one segment); round 1 warms up.  At the
    end of every round the server's ``evaluate_fn`` (which Flower calls while the host actors wait) steps n
    in-process nodes (built in the ServerApp's process like the ClientApps' and warmed up for one epoch with
    ``threads`` torch threads) through their next segment.  So Flower rounds 2..rounds+1 and in-process segments
    alternate in time and see the same machine load.  A Flower round is timed from the end of the in-process
    segment before it to the end of its own segment (its register messages to the n ClientApps, the segment on the
    host actors, the network average, the per-node reports).
    """
    seen = _run_flower("interleaved", n, J, batch, iters, rounds, threads)
    if len(seen["flower"]) < rounds:
        raise RuntimeError(f"the Flower run finished {len(seen['flower'])} of {rounds} timed rounds")
    tim = seen["timings"]
    # a timed round also holds the tail of the round before (after the in-process segment: Flower's own
    # bookkeeping) and not its own evaluate_fn: "other" is what no part below accounts for
    parts = [_round_parts(tim, rnd, t) for rnd, t in enumerate(seen["flower"], start=2)]
    return {"flower_rounds_s": [round(t, 3) for t in seen["flower"]], "flower_round_parts_s": parts,
            "inprocess_segments_s": [round(t, 3) for t in seen["inprocess"]],
            # flwr run, Ray, SuperNodes, host actors, node build, round 1 (not the in-process nodes' build)
            "flower_startup_s": round(seen["end_1"] - seen["t0"] - seen["inprocess_build_s"], 2),
            "flower_total_s": round(seen["t_end"] - seen["t0"], 2),
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
        from flower_dp.gossip import run_iterations
    except ImportError as exc:
        return missing("flower_dp.clients.push_sum_app (the algorithms)", exc)
    n, J, batch = (4, 32, 16) if quick else (16, 128, 32)
    iters = J // batch  # one epoch of each node's data (expected batch B, Poisson rate B/J)
    # 9 timed rounds: a median of 3 moved by 0.3 between idle runs (0.86-1.19 on 2026-11-26)
    rounds = 2 if quick else 9
    spec = _overhead_spec(n, J, batch, (rounds + 1) * iters)
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
        out.update(_flower_interleaved(n, J, batch, iters, rounds, threads))
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
    # the rounds without the nodes' privacy reports (every node's eps, recomputed from its whole ledger each
    # round on the host actors; the in-process yardstick computes none)
    fl_np = [t - p["privacy_reports"] for t, p in zip(fl, out["flower_round_parts_s"])]
    out["ratio_without_privacy_reports"] = round(min(fl_np) / min(ip), 3)
    out["median_ratio_without_privacy_reports"] = round(float(np.median(fl_np)) / float(np.median(ip)), 3)
    if "ray_backend_segment_s" in out:
        out["ray_backend_ratio"] = round(out["ray_backend_segment_s"] / min(ip), 3)
    out["num_hosts"] = 2
    return out


#: sizes of the scale benchmark (quick: tiny, a smoke test)
MLP_SIZES, CNN_FLOWER_SIZES = (8, 64, 256, 1024), (8, 32, 64)
QUICK_MLP_SIZES, QUICK_CNN_FLOWER_SIZES = (4, 8), (4,)
#: the largest MLP network's segments alternate with this one's (the throughput ratio under the same load)
REFERENCE_N = 64


def _log(msg: str) -> None:
    print(f"[bench scale] {msg}", file=sys.stderr, flush=True)



def _rate_vs_reference(out: dict, n: int, segs, per: int, has_reference: bool) -> None:
    """Put the run's rate into ``out`` and, beside an interleaved reference network, the ratio to its rate."""
    out.update(_rate(n, segs, per))
    if has_reference:
        for key in ("node_iterations_per_s", "median_node_iterations_per_s"):
            name = "throughput_ratio_vs_reference" if key == "node_iterations_per_s" else \
                "median_throughput_ratio_vs_reference"
            out[name] = round(out[key] / out["reference"][key], 3)

def _rate(n: int, seconds: list[float], iters_each: int) -> dict:
    """Node-iterations per second over all timed segments and by the median segment."""
    return {"node_iterations_per_s": round(n * iters_each * len(seconds) / sum(seconds), 2),
            "median_node_iterations_per_s": round(n * iters_each / statistics.median(seconds), 2),
            "segments_s": [round(t, 3) for t in seconds]}


def _segments(run, k0: int, iters: int, per: int) -> list[float]:
    """Wall seconds of ``run(k, k + per)`` over ``k0 .. k0 + iters`` in segments of ``per`` iterations."""
    out = []
    for k in range(k0, k0 + iters, per):
        t0 = time.perf_counter()
        run(k, min(k0 + iters, k + per))
        out.append(time.perf_counter() - t0)
    return out


def _mlp_nodes(n: int, J: int, batch: int, iters: int) -> list:
    from flower_dp.topology import make_topology

    plan = _plan_for(n, "mlp_2layer", J, iters, batch=batch)
    topo = make_topology("exp", n)  # one topology for every node, as the runner builds them
    nodes = [build_node(i, "cpu", plan=plan, model_name="mlp_2layer", J=J, topology=topo) for i in range(n)]
    for nd in nodes:
        nd.setup()
    return nodes


def _interleaved(run_main, run_ref, iters: int, per: int, ref_iters: int) -> tuple[list[float], list[float]]:
    """Segments of ``per`` iterations of the main network, each followed by ``ref_iters`` of the reference one
    (both from k = 1 on, after their warm-up): the same machine load for both."""
    main, ref = [], []
    for j, k in enumerate(range(1, 1 + iters, per)):
        main += _segments(run_main, k, min(per, 1 + iters - k), per)
        ref += _segments(run_ref, 1 + j * ref_iters, ref_iters, ref_iters)
    return main, ref


def _mlp_inprocess_point(n: int, J: int, batch: int, iters: int, per: int, ref: int | None = None) -> dict:
    """n two-layer-net Dyn-D2P nodes in this process: build, 1 warm-up iteration, ``iters`` timed; RSS.

    ``ref``: also a ``ref``-node network, whose segments of ``iters`` iterations alternate with this one's (so
    the throughput ratio sees the same machine load); its memory is measured and left out of this one's."""
    from flower_dp.gossip import run_iterations

    from ._common import proc_memory_mb

    # the fixed costs (lazy imports, first-call allocations) before the baseline: a 2-node network, one iteration
    warm_nodes = _mlp_nodes(2, J, batch, 1)
    run_iterations(warm_nodes, 0, 1)
    del warm_nodes
    rss0 = current_rss_mb()
    sampler = PeakSampler(current_rss_mb)
    t0 = time.perf_counter()
    nodes = _mlp_nodes(n, J, batch, iters + 1)
    build_s = time.perf_counter() - t0
    rss_built = current_rss_mb()
    run_iterations(nodes, 0, 1)  # warm-up
    out = {"n": n, "iterations": iters, "build_s": round(build_s, 2)}
    ref_mb = 0.0
    if ref:
        before = current_rss_mb()
        ref_iters = iters
        ref_nodes = _mlp_nodes(ref, J, batch, 1 + ref_iters * len(range(1, 1 + iters, per)))
        run_iterations(ref_nodes, 0, 1)
        ref_mb = max(0.0, current_rss_mb() - before)
        segs, ref_segs = _interleaved(lambda a, b: run_iterations(nodes, a, b),
                                      lambda a, b: run_iterations(ref_nodes, a, b), iters, per, ref_iters)
        r = _rate(ref, ref_segs, ref_iters)
        out["reference"] = {"n": ref, "iterations_per_segment": ref_iters, "rss_mb": round(ref_mb, 1), **r}
    else:
        segs = _segments(lambda a, b: run_iterations(nodes, a, b), 1, iters, per)
    rss1 = current_rss_mb() - ref_mb
    peak = sampler.stop()
    _rate_vs_reference(out, n, segs, per, bool(ref))
    out.update({"rss_mb_base": round(rss0, 1), "rss_mb_after": round(rss1, 1), "rss_mb_peak": round(peak, 1),
                "peak_includes_reference_mb": round(ref_mb, 1),
                "rss_mb_per_node": round((rss1 - rss0) / n, 3),
                "rss_mb_per_node_built": round((rss_built - rss0) / n, 3),
                "rss_mb_per_node_peak": round((peak - rss0) / n, 3),
                "pss_mb_after": round(proc_memory_mb(os.getpid(), pss=True).get("pss", float("nan")), 1),
                "torch_threads": torch.get_num_threads()})
    return out


def _point_main() -> None:
    """Child process entry: ``_mlp_inprocess_point(**json argv[1])``, its JSON on the last stdout line."""
    import json

    kw = json.loads(sys.argv[1])
    torch.set_num_threads(int(kw.pop("threads")))
    print(json.dumps(_mlp_inprocess_point(**kw)), flush=True)


def _mlp_inprocess(n: int, J: int, batch: int, iters: int, per: int, ref: int | None = None) -> dict:
    """:func:`_mlp_inprocess_point` in a fresh Python process (its RSS holds this n's nodes and nothing else)."""
    import json
    import subprocess
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    kw = {"n": n, "J": J, "batch": batch, "iters": iters, "per": per, "ref": ref, "threads": torch.get_num_threads()}
    code = f"import sys; sys.path.insert(0, {root!r}); from benchmarks.engine import _point_main; _point_main()"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(kw)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the n={n} child exited with {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ray_memory(host_pids: list[int], root: int | None = None) -> dict:
    """Summed RSS (and PSS) of the host actors and of every Ray worker process under ``root`` (default this
    process), MiB."""
    from ._common import proc_memory_mb, ray_worker_pids

    hosts = [proc_memory_mb(p, pss=True) for p in host_pids]
    workers = ray_worker_pids(root)
    allm = [proc_memory_mb(p, pss=True) for p in workers]
    return {"hosts_rss_mb": round(sum(m.get("rss", 0.0) for m in hosts), 1),
            "hosts_pss_mb": round(sum(m.get("pss", 0.0) for m in hosts), 1),
            "hosts_hwm_mb": round(sum(m.get("hwm", 0.0) for m in hosts), 1),
            "workers_rss_mb": round(sum(m.get("rss", 0.0) for m in allm), 1),
            "workers_pss_mb": round(sum(m.get("pss", 0.0) for m in allm), 1),
            "workers": sorted(workers.values())}


def _workers_rss_mb() -> float:
    from ._common import proc_memory_mb, ray_worker_pids

    return sum(proc_memory_mb(p).get("rss", 0.0) for p in ray_worker_pids())


def _mlp_ray_backend(n: int, J: int, batch: int, iters: int):
    from flower_dp.gossip.ray_backend import RayGossipBackend
    from flower_dp.topology import make_topology

    plan = _plan_for(n, "mlp_2layer", J, iters, batch=batch)
    topo = make_topology("exp", n)  # pickled with every node's factory; its copies on a host are one object
    factory = functools.partial(build_node, plan=plan, model_name="mlp_2layer", J=J, topology=topo)
    return RayGossipBackend(n, None, num_hosts=2, timeout_s=900), factory


def _mlp_ray_point(n: int, J: int, batch: int, iters: int, per: int, ref: int | None = None) -> dict:
    """n two-layer-net nodes on 2 host actors (Ray already up): the same figures as in-process; memory: the summed
    RSS of the 2 host actor processes (empty, after the run, peak sampled every 0.5 s) and of every Ray worker.
    ``ref``: as in :func:`_mlp_inprocess_point`, on 2 more host actors (not in the memory figures)."""
    from ._common import proc_memory_mb

    t0 = time.perf_counter()
    be, factory = _mlp_ray_backend(n, J, batch, iters + 1)
    ref_be = None
    out = {"n": n, "iterations": iters, "num_hosts": 2}
    try:
        pids = [h["pid"] for h in be.host_info()]
        empty = _ray_memory(pids)
        sampler = PeakSampler(lambda: sum(proc_memory_mb(p).get("rss", 0.0) for p in pids), period_s=0.5)
        be.register_all(factory)
        be.setup()
        out["build_s"] = round(time.perf_counter() - t0, 2)
        be.run_segment(0, 1)  # warm-up
        if ref:
            nseg = len(range(1, 1 + iters, per))
            ref_be, ref_factory = _mlp_ray_backend(ref, J, batch, 1 + iters * nseg)
            ref_be.register_all(ref_factory)
            ref_be.setup()
            ref_be.run_segment(0, 1)
            segs, ref_segs = _interleaved(lambda a, b: be.run_segment(a, b), lambda a, b: ref_be.run_segment(a, b),
                                          iters, per, iters)
            out["reference"] = {"n": ref, "iterations_per_segment": iters, **_rate(ref, ref_segs, iters)}
        else:
            segs = _segments(lambda a, b: be.run_segment(a, b), 1, iters, per)
        peak = sampler.stop()
        after = _ray_memory(pids)
    finally:
        be.shutdown()
        if ref_be is not None:
            ref_be.shutdown()
    _rate_vs_reference(out, n, segs, per, bool(ref))
    out.update({"memory_empty_hosts": empty, "memory_after": after, "hosts_rss_mb_peak": round(peak, 1),
                "hosts_rss_mb": after["hosts_rss_mb"], "hosts_rss_mb_per_node": round(after["hosts_rss_mb"] / n, 3),
                "hosts_rss_mb_per_node_delta": round((after["hosts_rss_mb"] - empty["hosts_rss_mb"]) / n, 3),
                "hosts_hwm_mb": after["hosts_hwm_mb"]})
    return out


def _cnn_point_rounds(grid: Grid, rc) -> dict:
    """The ServerApp side of :func:`_flower_cnn_point`: two rounds, timed and measured in ``evaluate_fn``."""
    n, J, iters = (int(rc[k]) for k in ("n", "samples-per-node", "iterations"))
    spec = _overhead_spec(n, J, int(rc["batch"]), 2 * iters)
    seen: dict = {}
    state: dict = {}

    def evaluate(rnd, avg):
        seen[f"end_{rnd}"] = time.time()
        strat = state["strategy"]
        seen[f"gossip_s_{rnd}"] = strat.timings.get("gossip_s", float("nan"))
        if "host_pids" not in seen:
            seen["host_pids"] = [h["pid"] for h in strat.backend.host_info()]
        seen[f"memory_{rnd}"] = _ray_memory(seen["host_pids"], root=int(rc["root-pid"]))
        seen[f"resume_{rnd}"] = time.time()
        return None

    return _start_timed(grid, spec, 2 * iters, iters, evaluate, 900, state, seen)


def _flower_cnn_point(n: int, J: int, batch: int, iters: int) -> dict:
    """n shallow-CNN Dyn-D2P nodes as Flower SuperNodes (``flwr run``, PushSumStrategy, push-sum ClientApp).

    Two Flower rounds of ``iters`` iterations each; round 1 (Ray, SuperNodes, host actors, node build, first
    segment) warms up, round 2 is timed from the end of round 1 to the end of its own segment (the register
    messages to the n ClientApps, the segment on the 2 host actors, the network average).  Memory: the Ray
    worker processes of this run (host actors, Flower's ClientApp actors, idle workers) after each round,
    and their summed RSS sampled every 0.5 s (peak).
    """
    sampler = PeakSampler(_workers_rss_mb, period_s=0.5)
    try:
        seen = _run_flower("cnn-point", n, J, batch, iters)
    finally:
        peak = sampler.stop()
    if "end_2" not in seen:
        raise RuntimeError(f"the Flower run at n={n} did not finish its timed round")
    rnd_s = seen["end_2"] - seen["resume_1"]
    seg_s = seen["gossip_s_2"] - seen["gossip_s_1"]
    mem = seen["memory_2"]
    parts = _round_parts(seen["timings"], 2, rnd_s)
    return {"n": n, "iterations": iters, "num_hosts": 2, "round_s": round(rnd_s, 3), "segment_s": round(seg_s, 3),
            "round_2_parts_s": parts,
            "node_iterations_per_s": round(n * iters / rnd_s, 2),
            "segment_node_iterations_per_s": round(n * iters / seg_s, 2),
            "startup_s": round(seen["end_1"] - seen["t0"], 2), "total_s": round(seen["t_end"] - seen["t0"], 2),
            "memory_round_1": seen["memory_1"], "memory_round_2": mem, "workers_rss_mb_peak": round(peak, 1),
            "workers_rss_mb": mem["workers_rss_mb"], "workers_rss_mb_per_node": round(mem["workers_rss_mb"] / n, 3),
            "hosts_rss_mb": mem["hosts_rss_mb"], "hosts_rss_mb_per_node": round(mem["hosts_rss_mb"] / n, 3)}


def _slope(points: dict, key: str) -> float | None:
    """Marginal MiB per node: least-squares slope of ``key`` over n (what one more node costs)."""
    ns = [int(n) for n, v in points.items() if isinstance(v, dict) and v.get(key) is not None]
    if len(ns) < 2:
        return None
    ys = [points[str(n)][key] for n in ns]
    return round(float(np.polyfit(ns, ys, 1)[0]), 3)


def _grow(out: dict, series: str, sizes, label: str, point, describe, how: str = "") -> None:
    """``point(n)`` for each n of ``sizes`` in turn into ``out[series][str(n)]``, and ``out["max_nodes_" + series]``:
    the largest n that ran is the figure, so the first failure is recorded (``missing``) and ends the series."""
    for n in sizes:
        _log(f"{label} n={n} {how}...")
        try:
            r = point(n)
        except Exception as exc:  # noqa: BLE001 -- the largest n that ran is the figure
            out[series][str(n)] = missing(f"n={n} failed", exc)
            break
        out[series][str(n)] = r
        out[f"max_nodes_{series}"] = n
        _log("  " + describe(n, r))


def run_scale(quick: bool = False, *, skip_ray: bool = False) -> dict:
    """Node-iterations/s and memory vs n: two-layer-net Dyn-D2P nodes in-process and on 2 Ray host actors
    (n = 8, 64, 256, 1,024), shallow-CNN nodes as Flower SuperNodes (n = 8, 32, 64); quick: n = 4, 8 / 4.

    Every point builds its nodes, runs 1 warm-up iteration and times ``iters`` (20; quick 2) in segments of 5.
    In-process points run in a fresh Python process each (RSS delta = that n's nodes); Ray points on 2 host
    actors of one Ray instance (fresh actors per n; memory: summed RSS of the host actor processes); Flower
    points are one ``flwr run`` each (:func:`_flower_cnn_point`).
    """
    out: dict = {"inprocess_mlp": {}, "ray_mlp": {}, "flower_cnn": {}, "max_nodes_inprocess_mlp": None,
                 "max_nodes_ray_mlp": None, "max_nodes_flower_cnn": None}
    if not quick:
        _log("about 10 min on 2 idle cores; progress below")
    try:
        import flower_dp.clients.registry  # noqa: F401
    except ImportError as exc:
        m = missing("flower_dp.clients.registry (the algorithms)", exc)
        out.update(inprocess_mlp=m, ray_mlp=m, flower_cnn=m)
        return out
    mlp_sizes, cnn_sizes = (QUICK_MLP_SIZES, QUICK_CNN_FLOWER_SIZES) if quick else (MLP_SIZES, CNN_FLOWER_SIZES)
    J, batch = (32, 16) if quick else (64, 32)
    iters, per = (2, 1) if quick else (20, 5)
    cnn_J, cnn_batch = (32, 16) if quick else (64, 16)
    out["config"] = {"mlp": {"model": "mlp_2layer", "samples_per_node": J, "batch": batch},
                     "cnn": {"model": "shallow_cnn", "samples_per_node": cnn_J, "batch": cnn_batch},
                     "algorithm": "dyn_d2p", "topology": "exp", "data": "synthetic (timing only)",
                     "timed_iterations": iters, "segment_iterations": per, "warmup_iterations": 1,
                     "flower_warmup_round_iterations": iters}
    def ref(n: int) -> int | None:  # the largest MLP size also times a REFERENCE_N network alongside
        return REFERENCE_N if n == max(mlp_sizes) and n > REFERENCE_N else None

    def vs_ref(n: int, r: dict) -> str:
        return f"; vs n={ref(n)} alongside: {r['throughput_ratio_vs_reference']}" if ref(n) else ""

    # quick: in this process (no child start-up); else a fresh process per n
    inprocess = _mlp_inprocess_point if quick else _mlp_inprocess
    _grow(out, "inprocess_mlp", mlp_sizes, "in-process MLP",
          lambda n: inprocess(n, J, batch, iters, per, ref(n)),
          lambda n, r: f"{r['node_iterations_per_s']} node-it/s, {r['rss_mb_per_node']} MB/node, peak "
                       f"{r['rss_mb_peak']} MB" + vs_ref(n, r))
    if skip_ray:
        out["ray_mlp"] = out["flower_cnn"] = missing("Ray run skipped (--skip-ray)")
        return out
    try:
        import ray

        from flower_dp.gossip.ray_backend import ensure_ray
    except ImportError as exc:
        out["ray_mlp"] = out["flower_cnn"] = missing("flower_dp.gossip.ray_backend", exc)
        return out
    from . import engine as this

    try:
        ray.cloudpickle.register_pickle_by_value(this)  # hosts need not import the benchmarks package
        ensure_ray(num_cpus=2)
        _grow(out, "ray_mlp", mlp_sizes, "Ray host actors MLP",
              lambda n: _mlp_ray_point(n, J, batch, iters, per, ref(n)),
              lambda n, r: f"{r['node_iterations_per_s']} node-it/s, hosts {r['hosts_rss_mb']} MB, peak "
                           f"{r['hosts_rss_mb_peak']} MB ({r['hosts_rss_mb_per_node_delta']} MB/node over empty hosts)"
                           + vs_ref(n, r))
    finally:
        ray.shutdown()
    _grow(out, "flower_cnn", cnn_sizes, "Flower SuperNodes CNN",
          lambda n: _flower_cnn_point(n, cnn_J, cnn_batch, iters),
          lambda n, r: f"{r['node_iterations_per_s']} node-it/s (segment alone {r['segment_node_iterations_per_s']}), "
                       f"Ray workers {r['workers_rss_mb']} MB, peak {r['workers_rss_mb_peak']} MB", "(flwr run) ")
    out["rss_mb_per_node_slope_inprocess_mlp"] = _slope(out["inprocess_mlp"], "rss_mb_after")
    out["hosts_mb_per_node_slope_ray_mlp"] = _slope(out["ray_mlp"], "hosts_rss_mb")
    out["hosts_mb_per_node_slope_flower_cnn"] = _slope(out["flower_cnn"], "hosts_rss_mb")
    out["workers_mb_per_node_slope_flower_cnn"] = _slope(out["flower_cnn"], "workers_rss_mb")
    return out


def scale_keys(sc: dict) -> dict:
    """The scale benchmark's top-level keys of the suite's document (see :mod:`benchmarks`)."""

    def get(kind: str, n: int, key: str):
        v = (sc.get(kind) or {}).get(str(n)) if isinstance(sc.get(kind), dict) else None
        return v.get(key) if isinstance(v, dict) else None

    def ratio(kind: str, key: str, a: int = 1024, b: int = 64):
        x, y = get(kind, a, key), get(kind, b, key)
        return round(x / y, 3) if x and y else None

    def gb(v):
        return None if v is None else round(v / 1024.0, 3)

    out = {k: sc.get(k) for k in ("max_nodes_inprocess_mlp", "max_nodes_ray_mlp", "max_nodes_flower_cnn")}
    for kind, short in (("inprocess_mlp", "mlp_inprocess"), ("ray_mlp", "mlp_ray")):
        # n = 1,024 against n = 64 alongside (alternating segments, same load); the separate runs beside it
        out[f"scale_{short}_throughput_ratio_1024_vs_64"] = get(kind, 1024, "throughput_ratio_vs_reference")
        out[f"scale_{short}_median_throughput_ratio_1024_vs_64"] = get(kind, 1024,
                                                                       "median_throughput_ratio_vs_reference")
        out[f"scale_{short}_throughput_ratio_1024_vs_64_separate_runs"] = ratio(kind, "node_iterations_per_s")
    out["scale_mlp_inprocess_rss_gb_1024"] = gb(get("inprocess_mlp", 1024, "rss_mb_peak"))
    out["scale_mlp_ray_rss_gb_1024"] = gb(get("ray_mlp", 1024, "hosts_rss_mb_peak"))
    out["scale_cnn_flower_rss_gb_64"] = gb(get("flower_cnn", 64, "workers_rss_mb_peak"))
    for kind, short, key, mem in (("inprocess_mlp", "mlp_inprocess", "node_iterations_per_s", "rss_mb_per_node"),
                                  ("ray_mlp", "mlp_ray", "node_iterations_per_s", "hosts_rss_mb_per_node"),
                                  ("flower_cnn", "cnn_flower", "node_iterations_per_s", "workers_rss_mb_per_node")):
        pts = sc.get(kind) if isinstance(sc.get(kind), dict) else {}
        out[f"scale_{short}_node_iterations_per_s"] = {n: v.get(key) for n, v in pts.items() if isinstance(v, dict)}
        out[f"scale_{short}_mb_per_node"] = {n: v.get(mem) for n, v in pts.items() if isinstance(v, dict)}
    return out


def plot_scale(sc: dict, path) -> None:
    """Node-iterations/s and MiB per node vs n (log x) of a scale result, to ``path`` (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = (("inprocess_mlp", "MLP, in-process", "o", "rss_mb_after", "rss_mb_per_node"),
              ("ray_mlp", "MLP, 2 Ray host actors", "s", "hosts_rss_mb", None),
              ("flower_cnn", "shallow CNN, Flower SuperNodes (2 host actors)", "^", "workers_rss_mb", None))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    for i, (kind, label, marker, total, delta) in enumerate(series):
        pts = sc.get(kind) if isinstance(sc.get(kind), dict) else {}
        pts = sorted((int(n), v) for n, v in pts.items() if isinstance(v, dict) and v.get("node_iterations_per_s"))
        if not pts:
            continue
        ns = [n for n, _ in pts]
        color = f"C{i}"
        a1.plot(ns, [v["node_iterations_per_s"] for _, v in pts], marker + "-", color=color, label=label)
        if kind == "flower_cnn":  # the segment on the host actors alone, without the round's messages
            a1.plot(ns, [v["segment_node_iterations_per_s"] for _, v in pts], marker + ":", color=color, alpha=0.8,
                    label=f"{label}: segment alone")
        a2.plot(ns, [v[total] / n for n, v in pts], marker + "-", color=color, label=f"{label}: total RSS / n")
        if delta:  # in-process: RSS over a process without nodes
            marg = [v[delta] for _, v in pts]
        else:  # between consecutive sizes: what one more node costs
            marg = [(b[1][total] - a[1][total]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:])]
            ns = ns[1:]
        a2.plot(ns, marg, marker + ":", color=color, alpha=0.8, label=f"{label}: marginal")
    a1.set(xscale="log", xlabel="nodes n", ylabel="node-iterations / s", title="Throughput (Dyn-D2P, 1 torch thread)")
    a1.set_ylim(bottom=0)
    k = scale_keys(sc)
    pairs = (("in-process", "scale_mlp_inprocess_throughput_ratio_1024_vs_64"),
             ("Ray", "scale_mlp_ray_throughput_ratio_1024_vs_64"))
    alongside = [f"{label}: {k[key]:.2f}" for label, key in pairs if k.get(key) is not None]
    if alongside:  # the points are separate runs (load drifts); these ratios alternate with n = 64 in one run
        a1.text(0.98, 0.03, "n = 1,024 / n = 64, alternating in one run:\n" + ", ".join(alongside),
                transform=a1.transAxes, ha="right", va="bottom", fontsize=8)
    a2.set(xscale="log", yscale="log", xlabel="nodes n", ylabel="MiB per node",
           title="Memory per node (RSS of the process / of the Ray workers)")
    for ax in (a1, a2):
        ax.set_xticks([4, 8, 16, 32, 64, 128, 256, 512, 1024])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(True, alpha=0.3)
    a2.legend(fontsize=7)
    a1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
