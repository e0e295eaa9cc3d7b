"""One push-sum iteration protocol (issue 13): every backend runs ``run_protocol_iteration``.

The in-process loop, the Ray host actors (their body, stepped here in threads without Ray) and the relay backend
(over a send function that calls the node-side handler directly) each go through the one shared function, and give
the same numbers bit for bit.
"""

from __future__ import annotations

import ast
import functools
import threading
import types
from pathlib import Path

import pytest
import torch

from flower_dp.clients.push_sum_app import build_toy_node
from flower_dp.gossip import protocol, run_iteration
from flower_dp.gossip.ray_host import _Host
from flower_dp.gossip.relay import RelayGossipBackend, handle_relay_request

ROOT = Path(__file__).resolve().parents[1]
N, K = 5, 6


def _factory(use_reduce: bool):
    return functools.partial(build_toy_node, n_nodes=N, topology_name="exp_one_peer", use_reduce=use_reduce)


def _states(nodes) -> list[tuple[list[float], float]]:
    return [(nd.x.tolist(), float(nd.w)) for nd in nodes]


@pytest.fixture
def counted(monkeypatch):
    """Count the shared function's reduce and route calls (module globals of flower_dp.gossip.protocol)."""
    calls = {"reduce": 0, "route": 0}
    real_reduce, real_route = protocol.reduce_contributions, protocol.route_shares

    def reduce(*a, **kw):
        calls["reduce"] += 1
        return real_reduce(*a, **kw)

    def route(*a, **kw):
        calls["route"] += 1
        return real_route(*a, **kw)

    monkeypatch.setattr(protocol, "reduce_contributions", reduce)
    monkeypatch.setattr(protocol, "route_shares", route)
    return calls


def _inprocess(use_reduce: bool):
    nodes = [_factory(use_reduce)(i, "cpu") for i in range(N)]
    bits = [0] * N
    for k in range(K):
        for i, b in run_iteration(nodes, k).bits_sent.items():
            bits[i] += b
    return _states(nodes), bits


@pytest.mark.parametrize("use_reduce", [True, False])
def test_relay_backend_goes_through_the_shared_function(counted, use_reduce):
    ref, ref_bits = _inprocess(use_reduce)
    assert counted == {"reduce": K, "route": K}
    nodes = {i: _factory(use_reduce)(i, "cpu") for i in range(N)}
    actions = []

    def send(action, k, per_node):
        actions.append(action)
        return {i: handle_relay_request(nodes[i], action, k, req) for i, req in per_node.items()}

    be = RelayGossipBackend(N, send, keep_states=True)
    seg = be.run_segment(0, K)
    assert counted == {"reduce": 2 * K, "route": 2 * K}
    # one contribute round per iteration, a step round only when the nodes contribute, one flush
    assert actions == (["contribute", "step"] if use_reduce else ["contribute"]) * K + ["flush"]
    assert _states(nodes[i] for i in range(N)) == ref
    assert seg.bits_sent.tolist() == ref_bits
    assert set(be.state_dicts()) == set(range(N))


def test_ray_host_body_goes_through_the_shared_function(counted):
    """Two host bodies (the class Ray wraps), wired by direct calls instead of actor handles, in two threads."""
    ref, ref_bits = _inprocess(True)
    placement = {0: [0, 1, 2], 1: [3, 4]}
    threads = torch.get_num_threads()
    hosts = [_Host(h, placement, timeout_s=60.0, threads=threads, want_gpu=False) for h in placement]
    for h, host in enumerate(hosts):
        host.connect({g: types.SimpleNamespace(deliver=types.SimpleNamespace(remote=hosts[g].deliver))
                      for g in placement})
        for i in placement[h]:
            host.add_node(i, _factory(True))
            host.nodes[i].setup()
    out: dict[int, dict] = {}
    errors: list[BaseException] = []

    def run(h):
        try:
            out[h] = hosts[h].run_segment(0, K)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(h,)) for h in placement]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    assert not errors, errors
    assert counted == {"reduce": K + 2 * K, "route": K + 2 * K}  # in-process, then K per host
    nodes = {i: nd for host in hosts for i, nd in host.nodes.items()}
    assert _states(nodes[i] for i in range(N)) == ref
    bits = {i: b for h in out for i, b in out[h]["bits"].items()}
    assert [bits[i] for i in range(N)] == ref_bits
    assert out[0]["reduced"] == out[1]["reduced"]


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def test_only_the_protocol_reduces_and_routes():
    """No backend reduces contributions, checks or routes shares itself: only flower_dp/gossip/protocol.py does."""
    owners: dict[str, list[str]] = {}
    for folder in ("flower_dp", "strategies", "clients"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in {"reduce_contributions", "route_shares", "check_routing"} & _calls(path):
                owners.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert owners == {name: ["flower_dp/gossip/protocol.py"]
                      for name in ("reduce_contributions", "route_shares", "check_routing")}
    for backend in ("inprocess.py", "ray_host.py", "relay.py"):
        assert "run_protocol_iteration" in _calls(ROOT / "flower_dp" / "gossip" / backend), backend
