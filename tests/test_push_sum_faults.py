"""Faults under Flower: a host actor killed mid-segment, automatic restart, clean stop, resume."""

from __future__ import annotations

import json

import pytest
import torch

from flower_dp.clients.push_sum_app import build_toy_node, make_client_app
from flower_dp.errors import CheckpointError
from flower_dp.gossip import NodeFailureError, run_iteration
from flower_dp.results import load_checkpoint
from flower_dp.topology import make_topology


N, K, R = 4, 12, 4


def _spec(**node_kwargs):
    return {"builder": "toy", "n_nodes": N, "topology": "random_irregular", "topology_kwargs": {"seed": 1},
            "node_kwargs": {"dim": 8, "seed": 3, **node_kwargs}}


def _reference():
    topo = make_topology("random_irregular", N, seed=1)
    nodes = [build_toy_node(i, "cpu", topology=topo, dim=8, seed=3) for i in range(N)]
    bits, avgs = 0, []
    for k in range(K):
        bits += sum(run_iteration(nodes, k).bits_sent.values())
        if (k + 1) % R == 0:
            avgs.append((torch.stack([nd.z().double() for nd in nodes]).sum(0) / N).float())
    return avgs, bits, nodes


@pytest.mark.flower
@pytest.mark.slow
def test_killed_host_actor_restarts_from_checkpoint_or_stops_cleanly(tmp_path, caplog):
    """A node's host actor SIGKILLed at k=6 (round 2 of 3): restart from the k=4 checkpoint ends with the
    uninterrupted numbers; with max_retries=0 the run stops naming the nodes and the segment, and
    resume=True then finishes it with the same numbers."""
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from flower_dp.strategies.push_sum import PushSumStrategy

    avgs, bits, ref_nodes = _reference()
    seen: dict = {}
    server = ServerApp()

    def make(name, out, **kw):
        evals = seen.setdefault(name, {})

        def evaluate(rnd, avg):
            evals[rnd] = avg.clone()
            return {}

        return PushSumStrategy(N, kw.pop("spec"), num_iters=K, iters_per_round=R, out_dir=out, timeout_s=60,
                               evaluate_fn=evaluate, run_name=name, backend_kwargs={"num_hosts": 2}, **kw)

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            a = make("auto", tmp_path / "auto", spec=_spec(crash_at=6, crash_marker=str(tmp_path / "crash_a")))
            a.start(grid)
            seen["auto_strategy"] = a
            b = make("stop", tmp_path / "stop", spec=_spec(crash_at=6, crash_marker=str(tmp_path / "crash_b")),
                     max_retries=0)
            try:
                b.start(grid)
            except NodeFailureError as exc:
                seen["stop_error"] = exc
                seen["stop_status"] = json.loads((tmp_path / "stop" / "results.json").read_text())["status"]
            seen["stop_strategy"] = b
            c = make("stop", tmp_path / "stop", spec=_spec(), resume=True)  # same out_dir: continue at k=4
            c.start(grid)
            seen["resume_strategy"] = c
        except BaseException as exc:  # noqa: BLE001 - reported by the asserts below
            seen["error"] = exc
            raise

    run_simulation(server_app=server, client_app=make_client_app(), num_supernodes=N,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"_node_ip_address": "127.0.0.1"}})
    assert "error" not in seen, repr(seen.get("error"))

    # 1. automatic restart: the failure is named, the numbers are those of an uninterrupted run
    a = seen["auto_strategy"]
    assert len(a.failures) == 1
    f = a.failures[0]
    assert f["round"] == 2 and (f["k0"], f["k1"]) == (4, 8) and f["nodes"] in ([0, 1], [2, 3])
    assert any("restarting the host actors from the checkpoint at k=4" in r.getMessage() for r in caplog.records)
    for rnd in (1, 2, 3):
        assert torch.equal(seen["auto"][rnd], avgs[rnd - 1]), f"round {rnd} differs after the restart"
    assert a.history[-1]["bits_total"] == bits and [h["k"] for h in a.history] == [4, 8, 12]
    doc = json.loads((tmp_path / "auto" / "results.json").read_text())
    assert doc["status"] == "finished" and doc["failures"][0]["nodes"] == f["nodes"]
    final = load_checkpoint(tmp_path / "auto")
    for nd in ref_nodes:
        assert torch.equal(final["nodes"][nd.node_id]["x"], nd.x) and final["nodes"][nd.node_id]["w"] == nd.w

    # 2. max_retries=0: a clean stop naming the nodes and the segment; what came before is kept
    err = seen["stop_error"]
    assert "round 2 (segment k=4..7)" in str(err) and f"nodes {err.nodes}" in str(err) and "resume=True" in str(err)
    b = seen["stop_strategy"]
    assert [h["k"] for h in b.history] == [4] and len(b.failures) == 1 and seen["stop_status"] == "failed"

    # 3. resume=True on that folder finishes with the uninterrupted numbers
    c = seen["resume_strategy"]
    assert [h["k"] for h in c.history] == [4, 8, 12] and c.history[-1]["bits_total"] == bits
    for rnd in (2, 3):
        assert torch.equal(seen["stop"][rnd], avgs[rnd - 1])
    assert 1 in seen["stop"] and torch.equal(seen["stop"][1], avgs[0])  # round 1 ran before the stop
    doc = json.loads((tmp_path / "stop" / "results.json").read_text())
    assert doc["status"] == "finished"


def test_corrupted_checkpoint_is_never_loaded_on_resume(tmp_path):
    """A flipped byte in checkpoint.pt: resume=True refuses it (checksum) before any round runs."""
    from flower_dp.results import save_checkpoint
    from flower_dp.strategies.push_sum import PushSumStrategy

    save_checkpoint(tmp_path, {"meta": {}, "k": 4, "nodes": [], "history": [], "bits": []})
    raw = bytearray((tmp_path / "checkpoint.pt").read_bytes())
    raw[-5] ^= 0xFF
    (tmp_path / "checkpoint.pt").write_bytes(bytes(raw))
    strat = PushSumStrategy(N, _spec(), num_iters=K, iters_per_round=R, out_dir=tmp_path, resume=True)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        strat.start(grid=None)
