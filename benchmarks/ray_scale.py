"""Scale on two raylets: the largest two-layer-net network the Ray engine runs on two raylets of this machine.

``python -m benchmarks.ray_scale [--sizes 256 1024 ...] [--budget-s S] [--max-gib G] [--out FILE] [--latest FILE]``

A cluster started as a user starts one: ``ray start --head`` and a second ``ray start --address=HEAD:PORT`` (one
CPU each, 127.0.0.1, own ports, a private temporary folder; each raylet's processes in a process group of their
own, killed at the end, also on an error, a timeout or SIGTERM).  For each n in turn (256, 1,024, 2,048, 4,096,
8,192, 10,000 by default): n two-layer-net (``mlp_2layer``, 101,770 parameters) Dyn-D2P nodes on the exp graph,
64 synthetic Fashion-MNIST-shaped samples each, batch 32, on 2 host actors of
:class:`flower_dp.gossip.ray_backend.RayGossipBackend` (``STRICT_SPREAD``: one host per raylet), then the same
network in-process (:func:`flower_dp.gossip.run_iterations`) in a fresh Python process.  Each side builds its
nodes, fills the exp graph's mixing-matrix cache (every phase, as a run of one period or more does), runs 1
warm-up iteration and times ``iters`` (default 2) in one segment.

Memory: Ray: the summed RSS (and PSS) of every Ray worker process under the two raylets (the 2 host actors and
any idle worker), and that of the 2 hosts before their nodes were registered; in-process: the child's RSS over a
process without nodes.  Per node = total / n.  The exp graph's matrices are dense (``period * n^2 * 8`` bytes
in each process that holds the graph: 12 phases of 128 MiB at n = 4,096), so the total grows faster than n.

Stops at the first n that fails, or whose projected total (the last size's memory without its matrices, times
the ratio of sizes, plus the matrices of the new size) exceeds ``--max-gib`` (default 20) or the memory this
machine has available, or whose projected time does not fit in ``--budget-s``.  What was measured so far is
written after every point (``--out``), so a run stopped by a timeout keeps its sizes.  ``--latest`` merges the
headline keys (``max_nodes_two_raylets_mlp``, ``scale_mlp_two_raylets_*``) into the suite's document.

``run(quick=True)`` (the suite's ``--quick``, the smoke test): one raylet of 2 CPUs (``ray start --head``
only; the second raylet's join is what tests/test_ray_cluster.py checks), n = 4, 1 timed iteration, the
in-process side in this process.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import PeakSampler, current_rss_mb, missing, proc_memory_mb, ray_worker_pids

__all__ = ["SIZES", "run", "latest_keys", "start_cluster", "stop_cluster", "dense_topology_mib", "main"]

#: node counts tried in turn (the first that fails or would not fit ends the series)
SIZES = (256, 1024, 2048, 4096, 8192, 10000)
QUICK_SIZES = (4,)
#: per-node data and batch (as the suite's scale benchmark)
SAMPLES_PER_NODE, BATCH = 64, 32

#: ``ray start`` for a second raylet on this machine's loopback.  Ray keeps a node on 127.0.0.1 only in its
#: macOS/Windows mode (flower_dp._ray_local), where ``ray start --address`` refuses to add a node; this lifts that
#: one refusal and keeps the given --node-ip-address (on separate machines a plain ``ray start --address`` is it)
_LOOPBACK_WORKER = """
import sys
import ray._private.ray_constants as constants
import ray._private.services as services
constants.ENABLE_RAY_CLUSTER = True
services.resolve_ip_for_localhost = lambda host: host
from ray.scripts.scripts import main
sys.argv = ["ray", *sys.argv[1:]]
main()
"""


def _log(msg: str) -> None:
    print(f"[bench ray_scale] {msg}", file=sys.stderr, flush=True)


def dense_topology_mib(n: int) -> float:
    """MiB of the exp graph's cached mixing matrices in one process: ``period * n^2 * 8`` bytes (float64, dense)."""
    from flower_dp.topology import exp_one_peer

    return exp_one_peer(n).period * n * n * 8 / 2**20 if n > 1 else 0.0


def _free_port() -> int:
    from flower_dp.experiments.flower_run import free_port

    return free_port()


def _raylet(args: list[str], env: dict[str, str], *, head: bool, num_cpus: int, log: Path) -> subprocess.Popen:
    ports = [f"--node-manager-port={_free_port()}", f"--object-manager-port={_free_port()}",
             f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
             f"--runtime-env-agent-port={_free_port()}", f"--metrics-export-port={_free_port()}"]
    cmd = [str(Path(sys.executable).parent / "ray")] if head else [sys.executable, "-c", _LOOPBACK_WORKER]
    return subprocess.Popen([*cmd, "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
                             "--disable-usage-stats", *ports, *args],
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    code = (f"import ray; ray.init(address={address!r}, log_to_driver=False); "
            "print('ALIVE', sum(1 for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("ALIVE ")]
    return int(lines[0].split()[1]) if lines else 0


def start_cluster(raylets: int = 2, num_cpus: int = 1) -> dict:
    """``{"address", "procs", "temp", "env"}``: ``ray start --head`` and ``raylets - 1`` more ``ray start
    --address`` on 127.0.0.1, ``num_cpus`` each; stopped by :func:`stop_cluster` (also here, on failure)."""
    from flower_dp._ray_local import use_loopback

    use_loopback()  # this driver too: Ray would otherwise turn 127.0.0.1 into the routable address
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # 0700; short: Ray's socket paths are length-limited
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    root = str(Path(__file__).resolve().parents[1])  # the hosts unpickle benchmarks.* node factories
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([root] + [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]))
    port = _free_port()
    cluster = {"address": f"127.0.0.1:{port}", "procs": [], "temp": temp, "env": env}
    try:
        cluster["procs"].append(_raylet(["--head", f"--port={port}", f"--ray-client-server-port={_free_port()}",
                                         "--include-dashboard=false", f"--temp-dir={temp}"], env, head=True,
                                        num_cpus=num_cpus, log=Path(temp) / "head.log"))
        deadline = time.monotonic() + 120
        while True:  # the GCS port answers once the head is up
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or cluster["procs"][0].poll() is not None:
                    raise RuntimeError("the Ray head did not start; its output:\n"
                                       + (Path(temp) / "head.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        for r in range(1, raylets):
            for attempt in range(3):  # on a loaded machine a raylet may time out registering (Ray gives it 45 s)
                log = Path(temp) / f"worker{r}-{attempt}.log"
                worker = _raylet([f"--address={cluster['address']}"], env, head=False, num_cpus=num_cpus, log=log)
                cluster["procs"].append(worker)
                deadline = time.monotonic() + 300
                while worker.poll() is None and time.monotonic() < deadline \
                        and _alive_nodes(cluster["address"], env) < r + 1:
                    time.sleep(1)
                if worker.poll() is None and _alive_nodes(cluster["address"], env) == r + 1:
                    break
                _kill_group(worker)
            else:
                raise RuntimeError(f"raylet {r + 1} did not join in 3 attempts; its output:\n"
                                   + log.read_text()[-3000:])
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def _kill_group(proc: subprocess.Popen) -> None:
    from flower_dp.experiments.flower_run import kill_group

    kill_group(proc)


def stop_cluster(cluster: dict) -> None:
    """Disconnect, kill every raylet's process group (SIGTERM, then SIGKILL) and remove the temporary folder."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    finally:
        for proc in reversed(cluster["procs"]):
            _kill_group(proc)
        shutil.rmtree(cluster["temp"], ignore_errors=True)


def _groups_alive(cluster: dict) -> list[int]:
    """Process groups of the cluster's raylets that still have a process."""
    alive = []
    for proc in cluster["procs"]:
        try:
            os.killpg(proc.pid, 0)
            alive.append(proc.pid)
        except ProcessLookupError:
            pass
    return alive


def _workers_memory(roots: list[int], host_pids: list[int]) -> dict:
    """Summed RSS / PSS (MiB) of every Ray worker process under the raylets ``roots``, and of the host actors."""
    workers: dict[int, str] = {}
    for r in roots:
        workers.update(ray_worker_pids(r))
    allm = [proc_memory_mb(p, pss=True) for p in workers]
    hosts = [proc_memory_mb(p, pss=True) for p in host_pids]
    return {"workers_rss_mb": round(sum(m.get("rss", 0.0) for m in allm), 1),
            "workers_pss_mb": round(sum(m.get("pss", 0.0) for m in allm), 1),
            "hosts_rss_mb": round(sum(m.get("rss", 0.0) for m in hosts), 1),
            "hosts_hwm_mb": round(sum(m.get("hwm", 0.0) for m in hosts), 1),
            "workers": sorted(workers.values())}


def _fill_matrices(topology, node) -> int:
    """Every phase of ``topology`` into its cache in this process (the host's copy is the nodes' shared one)."""
    for k in range(topology.period):
        topology.matrix(k)
    return topology.period


def _mlp_factory(n: int, iters: int):
    from flower_dp.topology import make_topology

    from . import engine

    plan = engine._plan_for(n, "mlp_2layer", SAMPLES_PER_NODE, iters, batch=BATCH)
    topo = make_topology("exp", n)  # one for every node; pickled with each factory, one object per host
    return functools.partial(engine.build_node, plan=plan, model_name="mlp_2layer", J=SAMPLES_PER_NODE,
                             topology=topo), topo


def _ray_point(cluster: dict, n: int, iters: int) -> dict:
    """n MLP nodes on 2 host actors, one per raylet (STRICT_SPREAD when there are 2 raylets)."""
    import ray

    from flower_dp.gossip.ray_backend import RayGossipBackend

    from . import engine
    from . import ray_scale as this

    t0 = time.perf_counter()
    two = len(cluster["procs"]) > 1
    be = RayGossipBackend(n, None, num_hosts=2, address=cluster["address"], timeout_s=1800,
                          placement="STRICT_SPREAD" if two else None)
    for mod in (engine, this):  # the hosts need not import the benchmarks package
        ray.cloudpickle.register_pickle_by_value(mod)
    roots = [p.pid for p in cluster["procs"]]
    try:
        info = be.host_info()
        pids = [h["pid"] for h in info]
        empty = _workers_memory(roots, pids)
        sampler = PeakSampler(lambda: _workers_memory(roots, [])["workers_rss_mb"], period_s=0.5)
        factory, topo = _mlp_factory(n, iters + 1)
        be.register_all(factory)
        be.setup()
        be.apply(functools.partial(_fill_matrices, topo), [h["nodes"][0] for h in be.host_info()])
        build_s = time.perf_counter() - t0
        be.run_segment(0, 1)  # warm-up
        seg = be.run_segment(1, 1 + iters).wall_time_s
        peak = sampler.stop()
        after = _workers_memory(roots, pids)
        info = be.host_info()
    finally:
        be.shutdown()
    total = after["workers_rss_mb"]
    return {"n": n, "iterations": iters, "build_s": round(build_s, 2), "segment_s": round(seg, 3),
            "node_iterations_per_s": round(n * iters / seg, 2),
            "ray_nodes_of_hosts": len({h["ray_node_id"] for h in info}),
            "hosts": [{"ray_node_id": h["ray_node_id"], "nodes": len(h["nodes"])} for h in info],
            "memory_empty_hosts": empty, "memory_after": after, "workers_rss_mb_peak": round(peak, 1),
            "rss_mb": total, "rss_mb_per_node": round(total / n, 3),
            "rss_mb_per_node_over_empty_hosts": round((after["hosts_rss_mb"] - empty["hosts_rss_mb"]) / n, 3),
            "driver_rss_mb": round(current_rss_mb(), 1), "topology_mb_per_process": round(dense_topology_mib(n), 1)}


def _inprocess_point(n: int, iters: int) -> dict:
    """n MLP nodes in this process (run it in a fresh one): build, fill the matrices, 1 warm-up, ``iters`` timed."""
    import torch

    from flower_dp.gossip import run_iterations

    from . import engine

    torch.set_num_threads(1)
    warm = engine._mlp_nodes(2, SAMPLES_PER_NODE, BATCH, 1)  # lazy imports, first-call allocations
    run_iterations(warm, 0, 1)
    del warm
    rss0 = current_rss_mb()
    sampler = PeakSampler(current_rss_mb, period_s=0.5)
    t0 = time.perf_counter()
    factory, topo = _mlp_factory(n, iters + 1)
    nodes = [factory(i, "cpu") for i in range(n)]
    for nd in nodes:
        nd.setup()
    _fill_matrices(topo, None)
    build_s = time.perf_counter() - t0
    run_iterations(nodes, 0, 1)
    t1 = time.perf_counter()
    run_iterations(nodes, 1, 1 + iters)
    seg = time.perf_counter() - t1
    rss = current_rss_mb()
    peak = sampler.stop()
    return {"n": n, "iterations": iters, "build_s": round(build_s, 2), "segment_s": round(seg, 3),
            "node_iterations_per_s": round(n * iters / seg, 2), "rss_mb_base": round(rss0, 1),
            "rss_mb": round(rss, 1), "rss_mb_peak": round(peak, 1), "rss_mb_per_node": round(rss / n, 3),
            "rss_mb_per_node_over_base": round((rss - rss0) / n, 3),
            "topology_mb_per_process": round(dense_topology_mib(n), 1)}


def _point_main() -> None:
    """Child process entry: ``_inprocess_point(n, iters)`` from argv, its JSON on the last stdout line."""
    n, iters = int(sys.argv[1]), int(sys.argv[2])
    print(json.dumps(_inprocess_point(n, iters)), flush=True)


def _inprocess_child(n: int, iters: int, timeout_s: float) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    code = f"import sys; sys.path.insert(0, {root!r}); from benchmarks.ray_scale import _point_main; _point_main()"
    proc = subprocess.Popen([sys.executable, "-c", code, str(n), str(iters)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"the in-process n={n} child exited with {proc.returncode}: {err.strip()[-800:]}")
    return json.loads(out.strip().splitlines()[-1])


def _mem_available_mib() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return float("inf")


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _projected_mib(prev: dict, n: int, processes: int) -> float:
    """Memory at ``n`` from the measured point ``prev``: what is not the matrices scales with n, the dense
    matrices with ``n^2`` (``processes`` copies)."""
    matrices_prev = processes * prev["topology_mb_per_process"]
    return max(0.0, prev["rss_mb"] - matrices_prev) * n / prev["n"] + processes * dense_topology_mib(n)


def run(quick: bool = False, *, skip_ray: bool = False, sizes=None, iters: int | None = None,
        budget_s: float | None = None, max_gib: float = 20.0, out_path: Path | None = None) -> dict:
    """The two-raylet and in-process series (see the module docstring); ``out_path``: written after each point."""
    if skip_ray:
        return missing("Ray run skipped (--skip-ray)")
    try:
        import ray  # noqa: F401

        import flower_dp.gossip.ray_backend  # noqa: F401
    except ImportError as exc:
        return missing("flower_dp.gossip.ray_backend", exc)
    sizes = tuple(sizes or (QUICK_SIZES if quick else SIZES))
    iters = int(iters or (1 if quick else 2))
    raylets = 1 if quick else 2
    t_start = time.perf_counter()
    out: dict = {"config": {"model": "mlp_2layer", "algorithm": "dyn_d2p", "topology": "exp",
                            "samples_per_node": SAMPLES_PER_NODE, "batch": BATCH, "warmup_iterations": 1,
                            "timed_iterations": iters, "raylets": raylets, "cpus_per_raylet": 2 if quick else 1,
                            "num_hosts": 2, "data": "synthetic (timing only)", "max_gib": max_gib,
                            "budget_s": budget_s, "sizes": list(sizes)},
                 "two_raylets": {}, "inprocess": {}, "max_nodes_two_raylets_mlp": None,
                 "max_nodes_inprocess_mlp": None, "stopped": None,
                 "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_avg_start": _load(),
                 "mem_available_gib_start": round(_mem_available_mib() / 1024, 1)}

    def save() -> None:
        out["wall_s"] = round(time.perf_counter() - t_start, 1)
        out["load_avg_end"] = _load()
        if out_path is not None:
            Path(out_path).write_text(json.dumps(out, indent=2) + "\n")

    def left() -> float:
        return float("inf") if budget_s is None else budget_s - (time.perf_counter() - t_start)

    from flower_dp.experiments.flower_run import sigterm_raises

    with sigterm_raises():  # `timeout` sends SIGTERM: the finally below still stops the raylets
        cluster = start_cluster(raylets, num_cpus=2 if quick else 1)
        out["cluster_start_s"] = round(time.perf_counter() - t_start, 1)
        out["raylet_process_groups"] = [p.pid for p in cluster["procs"]]  # to stop by hand if this process is killed
        save()
        try:
            prev_cost, prev = None, None
            for n in sizes:
                if prev is not None:
                    # the driver holds the (checked) graph too while the hosts run
                    need = {"two_raylets": _projected_mib(prev["two_raylets"], n, 2) + dense_topology_mib(n),
                            "inprocess": _projected_mib(prev["inprocess"], n, 1)}
                    cap = min(max_gib * 1024, _mem_available_mib() - 1024)
                    if max(need.values()) > cap:
                        out["stopped"] = (f"n={n} not started: projected {need['two_raylets'] / 1024:.1f} GiB on two "
                                          f"raylets (their workers and this driver), {need['inprocess'] / 1024:.1f} GiB in-process, over the cap of "
                                          f"{cap / 1024:.1f} GiB")
                        break
                    est = prev_cost * (n / prev["n"]) ** 1.2
                    if est > left():
                        out["stopped"] = f"n={n} not started: about {est:.0f} s needed, {left():.0f} s of budget left"
                        break
                t0 = time.perf_counter()
                _log(f"n={n}: two raylets ...")
                try:
                    r = _ray_point(cluster, n, iters)
                except Exception as exc:  # noqa: BLE001 -- the largest n that ran is the figure
                    out["two_raylets"][str(n)] = missing(f"n={n} failed", exc)
                    out["stopped"] = f"n={n} failed on two raylets: {type(exc).__name__}: {exc}"
                    save()
                    break
                out["two_raylets"][str(n)] = r
                out["max_nodes_two_raylets_mlp"] = n
                _log(f"  {r['node_iterations_per_s']} node-it/s, Ray workers {r['rss_mb']} MiB "
                     f"({r['rss_mb_per_node']} MiB/node), build {r['build_s']} s")
                save()
                _log(f"n={n}: in-process ...")
                try:
                    q = _inprocess_point(n, iters) if quick else _inprocess_child(n, iters, max(60.0, min(left(), 3600.0)))
                except Exception as exc:  # noqa: BLE001
                    out["inprocess"][str(n)] = missing(f"n={n} failed", exc)
                    out["stopped"] = f"n={n} failed in-process: {type(exc).__name__}: {exc}"
                    save()
                    break
                out["inprocess"][str(n)] = q
                out["max_nodes_inprocess_mlp"] = n
                r["throughput_ratio_vs_inprocess"] = round(r["node_iterations_per_s"] / q["node_iterations_per_s"], 3)
                _log(f"  {q['node_iterations_per_s']} node-it/s, {q['rss_mb']} MiB ({q['rss_mb_per_node']} MiB/node); "
                     f"two raylets / in-process {r['throughput_ratio_vs_inprocess']}")
                prev_cost, prev = time.perf_counter() - t0, {"n": n, "two_raylets": r, "inprocess": q}
                save()
            else:
                out["stopped"] = "every size ran"
        except (KeyboardInterrupt, SystemExit) as exc:
            out["stopped"] = f"interrupted ({type(exc).__name__}) during the run"
            save()
            raise
        finally:
            stop_cluster(cluster)
            out["raylet_groups_left"] = _groups_alive(cluster)
            save()
    out["value"] = out["max_nodes_two_raylets_mlp"]
    return out


def latest_keys(doc: dict) -> dict:
    """The headline keys of a result for the suite's document (``docs/benchmarks/latest.json``)."""
    def series(side: str, key: str, scale: float = 1.0, nd: int = 3) -> dict:
        pts = doc.get(side) if isinstance(doc.get(side), dict) else {}
        return {n: round(v[key] / scale, nd) for n, v in pts.items() if isinstance(v, dict) and v.get(key) is not None}

    def marginal(side: str) -> dict:  # MiB one more node costs, between consecutive sizes
        pts = sorted((int(n), v["rss_mb"]) for n, v in (doc.get(side) or {}).items()
                     if isinstance(v, dict) and v.get("rss_mb") is not None)
        return {str(b): round((mb - ma) / (b - a), 3) for (a, ma), (b, mb) in zip(pts, pts[1:])}

    return {"max_nodes_two_raylets_mlp": doc.get("max_nodes_two_raylets_mlp"),
            "scale_mlp_two_raylets_marginal_mb_per_node": marginal("two_raylets"),
            "scale_mlp_two_raylets_inprocess_marginal_mb_per_node": marginal("inprocess"),
            "scale_mlp_two_raylets_rss_gb": series("two_raylets", "rss_mb", 1024.0),
            "scale_mlp_two_raylets_mb_per_node": series("two_raylets", "rss_mb_per_node"),
            "scale_mlp_two_raylets_node_iterations_per_s": series("two_raylets", "node_iterations_per_s", nd=2),
            "scale_mlp_two_raylets_inprocess_rss_gb": series("inprocess", "rss_mb", 1024.0),
            "scale_mlp_two_raylets_inprocess_mb_per_node": series("inprocess", "rss_mb_per_node"),
            "scale_mlp_two_raylets_inprocess_node_iterations_per_s": series("inprocess", "node_iterations_per_s",
                                                                            nd=2),
            "scale_mlp_two_raylets_throughput_ratio_vs_inprocess": series("two_raylets",
                                                                          "throughput_ratio_vs_inprocess"),
            "scale_mlp_two_raylets_stopped": doc.get("stopped")}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.ray_scale", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None, help=f"node counts in turn (default {SIZES})")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per point (default 2)")
    p.add_argument("--budget-s", type=float, default=None, help="no new size whose projected time does not fit")
    p.add_argument("--max-gib", type=float, default=20.0, help="no new size projected above this (default 20)")
    p.add_argument("--quick", action="store_true", help="one raylet, n = 4, 1 iteration (a smoke test)")
    p.add_argument("--out", type=Path, default=None, help="the result, rewritten after every point")
    p.add_argument("--latest", type=Path, default=None, help="merge the headline keys into this suite document")
    a = p.parse_args(argv)
    for name in ("iters", "budget_s", "max_gib"):
        v = getattr(a, name)
        if v is not None and v <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {v}")
    if a.sizes and min(a.sizes) < 2:
        p.error(f"--sizes must be >= 2 nodes each, got {a.sizes}")
    doc = run(a.quick, sizes=a.sizes, iters=a.iters, budget_s=a.budget_s, max_gib=a.max_gib, out_path=a.out)
    doc["command"] = "python -m benchmarks.ray_scale " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.out is not None:
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
    keys = latest_keys(doc)
    print(json.dumps(keys, indent=1))
    if a.latest is not None:
        latest = json.loads(a.latest.read_text())
        latest.update(keys)
        latest["two_raylets_command"] = doc["command"]
        latest["two_raylets_date_utc"] = doc["date_utc"]
        a.latest.write_text(json.dumps(latest, indent=2, default=str) + "\n")
        print(f"merged into {a.latest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
