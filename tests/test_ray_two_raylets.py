"""Across Ray nodes: the host-actor backend on a two-raylet Ray cluster built on this machine.

``ray.cluster_utils.Cluster`` starts two raylets on 127.0.0.1 (loopback, no dashboard), each
declaring one GPU.  No CUDA is needed: Ray only hands out GPU ids, so asking each host actor for a
whole GPU forces one host onto each raylet.  The nodes compute on the CPU (``device="cpu"``), and
a push-sum run in the reproducible (seeded) noise mode must give the same numbers bit for bit as
the in-process loop (same seed, same config -> same numbers on every backend, CPU).
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import sys
import tempfile

import pytest
import torch
from state_compare import first_difference

from flower_dp.gossip import run_iteration
from flower_dp.gossip.ray_backend import RayGossipBackend
from flower_dp.topology import make_topology

pytestmark = pytest.mark.flower

N_RAYLETS = 2


@pytest.fixture(scope="module")
def two_raylets(request):
    """A Ray cluster of two raylets on 127.0.0.1, one (fake) GPU and one CPU each; the driver connected.

    The finalizer disconnects the driver, stops both raylets (their processes only: ``ray stop``
    would stop every Ray instance of this user on the machine) and removes the temp dir.
    """
    import ray
    from ray.cluster_utils import Cluster

    from flower_dp._ray_local import use_loopback

    use_loopback()
    if ray.is_initialized():
        ray.shutdown()
    # workers inherit the environment, not this process's sys.path (as flower_dp.gossip.ray_backend.ensure_ray does)
    old_pythonpath = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + ([old_pythonpath] if old_pythonpath else []))
    temp = tempfile.mkdtemp(prefix="r2", dir="/tmp")  # short: Ray's socket paths are length-limited
    cluster = Cluster(shutdown_at_exit=True)

    def finalize():
        try:
            ray.shutdown()
        finally:
            try:
                cluster.shutdown()
            finally:
                shutil.rmtree(temp, ignore_errors=True)
                if old_pythonpath is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = old_pythonpath

    request.addfinalizer(finalize)
    for _ in range(N_RAYLETS):
        cluster.add_node(num_cpus=1, num_gpus=1, node_ip_address="127.0.0.1", include_dashboard=False, temp_dir=temp)
    cluster.wait_for_nodes(timeout=60)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    alive = [nd for nd in ray.nodes() if nd["Alive"]]
    assert len(alive) == N_RAYLETS and all(nd["NodeManagerAddress"] == "127.0.0.1" for nd in alive), alive
    assert ray.cluster_resources().get("GPU") == N_RAYLETS
    return {nd["NodeID"] for nd in alive}


def _prepare_reproducible(algorithm, params, **kw):
    """``registry.prepare`` in the seeded simulation mode (the only mode where backends can agree bit for bit)."""
    from flower_dp.clients import registry

    if "reproducible" in inspect.signature(registry.prepare).parameters:
        kw["reproducible"] = True  # default: secret per-node noise from OS entropy, different in every process
    return registry.prepare(algorithm, params, **kw)


def _tensors_on(obj, found=None):
    """Device types of every tensor in a nested state."""
    found = set() if found is None else found
    if isinstance(obj, torch.Tensor):
        found.add(obj.device.type)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors_on(v, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors_on(v, found)
    return found


DP = dict(epsilon=2.0, delta=1e-4)
CASES = [
    ("dyn_d2p", dict(lr=0.1, batch_size=8, variant="dyn", **DP)),
    ("dp_csgp", dict(lr=0.1, batch_size=8, G=1.0, compressor="rand_0.5", gamma_c=0.5, **DP)),
]


@pytest.mark.parametrize("algorithm,params", CASES, ids=[c[0] for c in CASES])
def test_hosts_on_both_raylets_bit_identical_to_inprocess(two_raylets, algorithm, params):
    """One host per raylet (each asks for a whole GPU), each with its own GPU id, nodes on the CPU;
    states, bits, metrics, privacy reports and the network average equal the in-process run bit for bit."""
    from flower_dp.clients import registry
    from flower_dp.clients.push_sum_app import build_plan_node
    from flower_dp.models import build_model

    torch.set_num_threads(1)
    n, K, J = 6, 6, 16
    g = torch.Generator().manual_seed(0)
    model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
    data = [(torch.randn(J, 5, generator=g), torch.randint(0, 2, (J,), generator=g)) for _ in range(n)]
    topo = make_topology("random_irregular", n, seed=2)
    dim = sum(p.numel() for p in model_fn().parameters())
    plan = _prepare_reproducible(algorithm, params, n_nodes=n, samples_per_node=[J] * n, num_iters=K, dim=dim, seed=1)
    factory = functools.partial(build_plan_node, plan=plan, topology=registry.topology_for(plan, topo),
                                model_fn=model_fn, data=data)

    ref = [factory(i, "cpu") for i in range(n)]
    for nd in ref:
        nd.setup()
    ref_bits = [0] * n
    ref_metrics = {i: [] for i in range(n)}
    for k in range(K):
        for i, b in run_iteration(ref, k).bits_sent.items():
            ref_bits[i] += int(b)
        for nd in ref:
            ref_metrics[nd.node_id].append(nd.last_metrics())

    be = RayGossipBackend(n, factory, num_hosts=N_RAYLETS, num_gpus_per_host=1, device="cpu", timeout_s=60)
    try:
        # (a) placement: one host on each raylet, each holding its own GPU id; nodes on the CPU
        info = be.host_info()
        assert [h["host"] for h in info] == list(range(N_RAYLETS))
        assert {h["ray_node_id"] for h in info} == two_raylets, info
        assert all(len(h["gpu_ids"]) == 1 for h in info), info  # Ray's assignment (fake GPUs: each raylet's GPU 0)
        assert len({(h["ray_node_id"], h["gpu_ids"][0]) for h in info}) == N_RAYLETS, info
        assert be.devices == ["cpu"] * N_RAYLETS and all(h["device"] == "cpu" for h in info)
        # (b) the numbers: two segments, so node state also persists on its raylet between segments
        be.setup()
        r1, r2 = be.run_segment(0, 2, debug_metrics=True), be.run_segment(2, K, debug_metrics=True)
        states = be.state_dicts()
        for nd in ref:
            assert _tensors_on(states[nd.node_id]) == {"cpu"}
            bad = first_difference(nd.state_dict(), states[nd.node_id])
            assert bad is None, f"{algorithm}: node {nd.node_id} differs at {bad}"
        assert [int(b) for b in r1.bits_sent + r2.bits_sent] == ref_bits
        assert {i: r1.metrics[i] + r2.metrics[i] for i in range(n)} == ref_metrics
        reports = be.call("privacy_report")
        for nd in ref:
            assert first_difference(reports[nd.node_id], nd.privacy_report()) is None
        avg = be.network_average()
        ref_avg = (torch.stack([nd.eval_params().double() for nd in ref]).sum(0) / n).float()
        assert torch.equal(avg, ref_avg)
    finally:
        be.shutdown()


def test_assigned_gpu_id_alone_does_not_move_nodes_to_cuda(two_raylets):
    """Default device with a GPU share: CUDA only where torch has it; otherwise CPU, and the GPU ids still place the hosts."""
    from flower_dp.clients.push_sum_app import build_toy_node

    topo = make_topology("exp_one_peer", 4)
    be = RayGossipBackend(4, functools.partial(build_toy_node, topology=topo, dim=4, seed=1), num_hosts=N_RAYLETS,
                          num_gpus_per_host=1, timeout_s=30)
    try:
        info = be.host_info()
        assert {h["ray_node_id"] for h in info} == two_raylets
        if not torch.cuda.is_available():
            assert be.devices == ["cpu"] * N_RAYLETS
            be.setup()
            be.run_segment(0, 2)
    finally:
        be.shutdown()
