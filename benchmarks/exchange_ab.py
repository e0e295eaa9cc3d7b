"""A/B in one run of the host actors' exchange (not part of the suite; docs/benchmarks/README.md, "Engine overhead,
second look"): ``python -m benchmarks.exchange_ab [ROUNDS]`` from the checkout.

One segment (n = 16 shallow-CNN Dyn-D2P nodes, one epoch = 4 iterations, 2 host actors, reproducible mode) with
the old exchange (contribution barrier every iteration, shares pickled as torch tensors, node work on any thread of
the actor's pool), without the barrier only, with the new exchange, and the same segment in-process; every
variant starts from the same states, in rotating order, ROUNDS times (default 5).  The old behaviour is patched
into the running host actors (``__ray_call__``), so this script follows the internals of
:mod:`flower_dp.gossip.ray_host`.  Prints each segment's seconds and a JSON summary, with whether every variant's
states equal the in-process ones bit for bit.
"""
import functools
import json
import statistics
import sys
import time

import ray
import torch

from flower_dp.clients.push_sum_app import plan_spec
from flower_dp.gossip import run_iterations
from flower_dp.gossip.ray_backend import RayGossipBackend, ensure_ray

from . import engine

VARIANTS = ["old", "no_barrier_only", "new", "inprocess"]


def set_variant(self, name):
    """Runs inside a host actor (__ray_call__): patch the module to the old or new exchange."""
    from flower_dp.gossip import ray_host as rh

    if not hasattr(rh, "_orig"):
        rh._orig = (rh._pack, rh._unpack, rh._HostPhases.contribute, rh._Host._on_nodes)

        def old_contribute(ph, k):  # the old all-gather: wait for the others' contributions every iteration
            host = ph.host
            contribs = {i: host.nodes[i].contribute(k) for i in ph.node_ids}
            if host.peers:
                host._broadcast("c", k, {h: contribs for h in host.peers})
                for part in host._gather("c", k).values():
                    contribs.update(part)
            return contribs

        def old_on_nodes(host, fn, *args):  # the calling pool thread, under the lock
            with host.node_lock:
                return fn(*args)

        rh._old = (lambda s: s, lambda s, device: s, old_contribute, old_on_nodes)
    new, old = rh._orig, rh._old
    pick = {"old": old, "new": new, "no_barrier_only": (old[0], old[1], new[2], old[3])}[name]
    rh._pack, rh._unpack, rh._HostPhases.contribute, rh._Host._on_nodes = pick
    return name


def main() -> None:
    torch.set_num_threads(1)
    n, J, batch = 16, 128, 32
    iters = J // batch
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    params = {"variant": "dyn", "epsilon": 2.0, "delta": 1e-5, "batch_size": batch, "lr": 0.05}
    spec = plan_spec("dyn_d2p", params, n_nodes=n, model_fn=engine._shallow_cnn, samples_per_node=J,
                     num_iters=2 * iters, topology="exp", reproducible=True)
    factory = functools.partial(engine._spec_node, spec=spec, J=J)
    ray.cloudpickle.register_pickle_by_value(engine)
    ensure_ray(num_cpus=2)
    times: dict = {v: [] for v in VARIANTS}
    results: dict = {}
    nodes = [factory(i, "cpu") for i in range(n)]
    for nd in nodes:
        nd.setup()
    try:
        be = RayGossipBackend(n, factory, num_hosts=2, timeout_s=600)
        be.setup()
        be.run_segment(0, iters)  # warm-up; every timed segment below starts from these states: the same work
        snap = be.state_dicts()
        k = iters
        for r in range(reps):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for name in order:
                if name == "inprocess":
                    for i, nd in enumerate(nodes):
                        nd.load_state_dict(snap[i])
                    t0 = time.perf_counter()
                    run_iterations(nodes, k, k + iters)
                    dt = time.perf_counter() - t0
                    results[name] = {i: nd.state_dict()["x"] for i, nd in enumerate(nodes)}
                else:
                    ray.get([a.__ray_call__.remote(set_variant, name) for a in be.hosts])
                    be.load_state_dicts(snap)
                    dt = be.run_segment(k, k + iters).wall_time_s
                    results[name] = {i: st["x"] for i, st in be.state_dicts().items()}
                times[name].append(dt)
                print(r, name, round(dt, 3), flush=True)
        same = all(torch.equal(results[v][i], results["inprocess"][i]) for v in VARIANTS for i in range(n))
        be.shutdown()
    finally:
        ray.shutdown()
    out = {v: {"min": round(min(t), 3), "median": round(statistics.median(t), 3), "all": [round(x, 3) for x in t]}
           for v, t in times.items()}
    for v in ("old", "no_barrier_only", "new"):
        out[v]["ratio_to_inprocess_min"] = round(out[v]["min"] / out["inprocess"]["min"], 3)
        out[v]["ratio_to_inprocess_median"] = round(out[v]["median"] / out["inprocess"]["median"], 3)
    out["new_over_old_min"] = round(out["new"]["min"] / out["old"]["min"], 3)
    out["new_over_old_median"] = round(out["new"]["median"] / out["old"]["median"], 3)
    out["every_variant_equals_inprocess_bitwise"] = bool(same)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
