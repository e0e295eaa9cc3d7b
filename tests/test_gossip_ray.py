"""The Ray host-actor backend: bit-identical to the in-process loop, clear timeouts, Ray clusters."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch
from state_compare import first_difference

from flower_dp.clients.push_sum_app import build_toy_node
from flower_dp.errors import GossipTimeoutError
from flower_dp.gossip import run_iteration
from flower_dp.gossip.ray_backend import RayGossipBackend, host_of
from flower_dp.topology import make_topology

pytestmark = pytest.mark.flower

N = 8


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from flower_dp.gossip.ray_backend import ensure_ray

    if not ray.is_initialized():
        ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


def _inprocess(factory, n, segments):
    nodes = [factory(i, "cpu") for i in range(n)]
    for nd in nodes:
        nd.setup()
    bits = torch.zeros(n, dtype=torch.int64)
    metrics = {i: [] for i in range(n)}
    for k0, k1 in segments:
        for k in range(k0, k1):
            log = run_iteration(nodes, k)
            for i, b in log.bits_sent.items():
                bits[i] += b
            for nd in nodes:
                metrics[nd.node_id].append(nd.last_metrics())
    return nodes, bits, metrics


def test_host_placement_is_contiguous_and_balanced():
    """Node i goes to host i*H//n: contiguous blocks whose sizes differ by at most one."""
    hosts = [host_of(i, 8, 3) for i in range(8)]
    assert hosts == sorted(hosts) and set(hosts) == {0, 1, 2}
    sizes = [hosts.count(h) for h in range(3)]
    assert max(sizes) - min(sizes) <= 1


def test_ray_hosts_bit_identical_to_inprocess(ray_local):
    """n = 8 on an irregular digraph with a reduce step: states, bits, metrics equal bit for bit."""
    topo = make_topology("random_irregular", N, seed=3)
    factory = functools.partial(build_toy_node, topology=topo, dim=32, seed=11)
    segments = [(0, 5), (5, 12)]
    ref_nodes, ref_bits, ref_metrics = _inprocess(factory, N, segments)
    be = RayGossipBackend(N, factory, num_hosts=3, timeout_s=30)
    try:
        be.setup()
        bits = torch.zeros(N, dtype=torch.int64)
        metrics = {i: [] for i in range(N)}
        for k0, k1 in segments:
            res = be.run_segment(k0, k1)
            bits += torch.as_tensor(res.bits_sent)
            for i, rows in res.metrics.items():
                metrics[i].extend(rows)
            assert len(res.reduced) == k1 - k0 and all("G" in r for r in res.reduced)
        states = be.state_dicts()
        for nd in ref_nodes:
            assert torch.equal(states[nd.node_id]["x"], nd.x), f"node {nd.node_id} differs"
            assert states[nd.node_id]["w"] == nd.w
        assert torch.equal(bits, ref_bits)
        assert metrics == ref_metrics
        # push-sum weight mass is conserved exactly enough and the graph is irregular
        assert sum(s["w"] for s in states.values()) == pytest.approx(N, abs=1e-12)
        assert len({round(s["w"], 9) for s in states.values()}) > 1
        avg = be.network_average()
        ref = torch.stack([nd.z().double() for nd in ref_nodes]).sum(0) / N
        assert torch.equal(avg, ref.float())
        # loading states moves nodes back: rerunning the last segment from a checkpoint gives the same bits
        be.load_state_dicts(states)
        assert torch.equal(be.state_dicts()[0]["x"], states[0]["x"])
    finally:
        be.shutdown()


def test_stalled_node_gives_clear_timeout_not_a_hang(ray_local):
    """A node stuck past timeout_s: the others raise GossipTimeoutError naming it and k, quickly."""
    topo = make_topology("exp_one_peer", 4)
    factory = functools.partial(build_toy_node, topology=topo, dim=4, use_reduce=False, stall_at=2, stall_s=4.0)

    def stalling(i, device):
        return factory(i, device) if i == 3 else build_toy_node(i, device, topology=topo, dim=4, use_reduce=False)

    be = RayGossipBackend(4, stalling, num_hosts=2, timeout_s=1.0)
    try:
        be.setup()
        t0 = time.perf_counter()
        with pytest.raises(GossipTimeoutError) as info:
            be.run_segment(0, 5)
        elapsed = time.perf_counter() - t0
        msg = str(info.value)
        assert "k=2" in msg and "nodes [2, 3]" in msg and "got none" in msg and "timeout_s" in msg
        assert elapsed < 4.0 + 5.0
    finally:
        be.shutdown()


def test_unregistered_nodes_are_named(ray_local):
    """Registering only some nodes: waiting for the rest fails fast, naming them and the fix."""
    topo = make_topology("directed_ring", 4)
    be = RayGossipBackend(4, num_hosts=2, timeout_s=0.5)
    try:
        be.register(0, functools.partial(build_toy_node, topology=topo))
        with pytest.raises(GossipTimeoutError, match=r"nodes \[1, 2, 3\] were not registered.*num-supernodes"):
            be.setup()
    finally:
        be.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CLUSTER_SCRIPT = textwrap.dedent(
    """
    import functools, sys, torch
    from flower_dp.clients.push_sum_app import build_toy_node
    from flower_dp.gossip import run_iterations
    from flower_dp.gossip.ray_backend import RayGossipBackend
    from flower_dp.topology import make_topology
    import ray
    topo = make_topology("random_irregular", 8, seed=5)
    f = functools.partial(build_toy_node, topology=topo, dim=8, seed=2)
    ref = [f(i, "cpu") for i in range(8)]
    run_iterations(ref, 0, 6)
    be = RayGossipBackend(8, f, num_hosts=2, address="auto", timeout_s=30)
    assert ray.get_runtime_context().gcs_address.endswith(sys.argv[1]), ray.get_runtime_context().gcs_address
    be.setup(); be.run_segment(0, 6)
    st = be.state_dicts()
    ok = all(torch.equal(st[n.node_id]["x"], n.x) and st[n.node_id]["w"] == n.w for n in ref)
    print("CLUSTER_OK" if ok else "CLUSTER_MISMATCH")
    """
)


def test_existing_ray_cluster_via_ray_address():
    """`ray start --head` then RAY_ADDRESS: the backend joins the cluster and matches in-process.

    The head runs with ``--block`` in its own process group, which the test kills at the end:
    ``ray stop`` would also stop every other Ray instance of this user on the machine.
    """
    ray_bin = str(Path(sys.executable).with_name("ray"))
    assert os.path.exists(ray_bin), f"no ray CLI next to {sys.executable}"
    port = _free_port()
    env = dict(os.environ, RAY_ADDRESS=f"127.0.0.1:{port}")
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths are length-limited
    start = [ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
             "--include-dashboard=false", "--num-cpus=2", f"--temp-dir={temp}", "--disable-usage-stats"]
    head = subprocess.Popen(start, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        script = Path(temp) / "cluster_run.py"
        script.write_text(_CLUSTER_SCRIPT)
        deadline = time.monotonic() + 90
        while True:  # the head takes a few seconds to come up
            out = subprocess.run([sys.executable, str(script), str(port)], env=env, capture_output=True, text=True,
                                 timeout=180)
            if "CLUSTER_OK" in out.stdout or time.monotonic() > deadline or head.poll() is not None:
                break
            time.sleep(2)
        assert "CLUSTER_OK" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        time.sleep(1)
        try:  # anything of that session still alive
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp, ignore_errors=True)


DP = dict(epsilon=2.0, delta=1e-4)
REAL_CASES = [
    ("dyn_d2p", dict(lr=0.1, batch_size=8, variant="dyn", **DP), "random_irregular", "logreg"),
    ("dp_csgp", dict(lr=0.1, batch_size=8, G=1.0, compressor="rand_0.5", gamma_c=0.5, **DP), "random_irregular", "logreg"),
    ("partpsp", dict(lr=0.1, batch_size=8, gamma_n=1e-3, b=5.0, sync_period=3), "exp_one_peer", "partpsp_mlp"),
]
_G = dict(G=2.0, **DP)
# the other registry algorithms (issue 5: every decentralized algorithm on Ray == in-process)
REAL_CASES += [pytest.param(*c, marks=pytest.mark.slow, id=c[0]) for c in [
    ("sgp", dict(lr=0.1, batch_size=8), "random_irregular", "logreg"),
    ("privsgp_vr", dict(lr=0.05, batch_size=8, **_G), "random_irregular", "logreg"),
    ("privsgp", dict(lr=0.05, batch_size=8, **_G), "random_irregular", "logreg"),
    ("dp2_sgd", dict(lr=0.05, batch_size=8, **_G), "undirected_ring", "logreg"),
    ("adp2_sgd", dict(lr=0.05, batch_size=8, **_G), "undirected_ring", "logreg"),
    ("sgpdp", dict(lr=0.1, batch_size=8, gamma_n=1e-3, b=5.0, sync_period=3), "exp_one_peer", "partpsp_mlp"),
    ("pedfl", dict(lr=0.1, batch_size=8, gamma_n=1e-3, b=5.0), "exp_one_peer", "partpsp_mlp"),
]]


@pytest.mark.parametrize("algorithm,params,topo_name,model", REAL_CASES,
                         ids=[c[0] if isinstance(c, tuple) else c.id for c in REAL_CASES])
def test_real_algorithms_bit_identical_on_ray(ray_local, algorithm, params, topo_name, model):
    """Dyn-D2P, DP-CSGP (rand_a) and PartPSP (reduce step): Ray hosts == in-process, every state tensor."""
    from flower_dp.clients import registry
    from flower_dp.clients.push_sum_app import build_plan_node
    from flower_dp.models import build_model

    torch.set_num_threads(1)
    n, K, J = 8, 6, 16
    g = torch.Generator().manual_seed(0)
    if model == "logreg":
        model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
        data = [(torch.randn(J, 5, generator=g), torch.randint(0, 2, (J,), generator=g)) for _ in range(n)]
    else:
        model_fn = functools.partial(build_model, "partpsp_mlp", seed=0)
        data = [(torch.randn(J, 1, 28, 28, generator=g), torch.randint(0, 10, (J,), generator=g)) for _ in range(n)]
    topo = make_topology(topo_name, n, **({"seed": 2} if topo_name == "random_irregular" else {}))
    dim = sum(p.numel() for p in model_fn().parameters())
    plan = registry.prepare(algorithm, params, n_nodes=n, samples_per_node=[J] * n, num_iters=K, dim=dim, seed=1,
                            reproducible=True)  # bit-identical backends: the seeded simulation mode
    factory = functools.partial(build_plan_node, plan=plan, topology=registry.topology_for(plan, topo),
                                model_fn=model_fn, data=data)
    ref, ref_bits, ref_metrics = _inprocess(factory, n, [(0, 2), (2, K)])
    be = RayGossipBackend(n, factory, nodes_per_host=3, timeout_s=60)
    try:
        be.setup()
        # debug_metrics: every statistic comes back, so all of them can be compared (the default releases only public ones)
        r1, r2 = be.run_segment(0, 2, debug_metrics=True), be.run_segment(2, K, debug_metrics=True)
        states = be.state_dicts()
        for nd in ref:
            bad = first_difference(nd.state_dict(), states[nd.node_id])
            assert bad is None, f"{algorithm}: node {nd.node_id} differs at {bad}"
        assert torch.equal(torch.as_tensor(r1.bits_sent + r2.bits_sent), ref_bits)
        assert {i: r1.metrics[i] + r2.metrics[i] for i in range(n)} == ref_metrics
        reports = be.call("privacy_report")
        assert first_difference(reports[0], ref[0].privacy_report()) is None  # NaN-aware (eps_paper may be NaN)
    finally:
        be.shutdown()


def test_gpu_share_falls_back_to_cpu_with_a_log_line(ray_local, caplog):
    """num_gpus_per_host > 0 on a Ray cluster without GPUs: one log line, hosts on CPU, same numbers."""
    import logging

    import ray

    topo = make_topology("random_irregular", 4, seed=1)
    factory = functools.partial(build_toy_node, topology=topo, dim=4, seed=1)
    has_gpu = bool(ray.cluster_resources().get("GPU", 0))
    with caplog.at_level(logging.WARNING, logger="flower_dp.gossip.ray_backend"):
        be = RayGossipBackend(4, factory, num_hosts=2, num_gpus_per_host=0.5, timeout_s=30)
    try:
        if has_gpu:
            assert be.devices == ["cuda", "cuda"]
        else:
            assert be.devices == ["cpu", "cpu"] and be.num_gpus_per_host == 0.0
            assert any("has no GPU; falling back to CPU for all 2 host actors" in r.getMessage() for r in caplog.records)
        be.setup()
        be.run_segment(0, 3)
        ref, _, _ = _inprocess(factory, 4, [(0, 3)])
        states = be.state_dicts()
        for nd in ref:
            torch.testing.assert_close(states[nd.node_id]["x"], nd.x, rtol=0, atol=0 if not has_gpu else 1e-6)
    finally:
        be.shutdown()
