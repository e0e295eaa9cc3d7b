"""Faults under Flower: a host actor killed mid-segment, automatic restart, clean stop, resume; a corrupted
checkpoint refused.

The Flower runs go through one ``flwr run`` of :data:`SERVER`; it saves what each strategy saw
(:func:`flwr_run_helper.save_strategy`) and the stop's error for the test to check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.clients.push_sum_app import build_toy_node
from flower_dp.errors import CheckpointError
from flower_dp.gossip import NodeFailureError, run_iteration
from flower_dp.results import load_checkpoint
from flower_dp.topology import make_topology

from flwr_run_helper import load_strategy, run_test_app, save_strategy, saving_errors

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


#: three strategy runs into ``out-dir``: ``auto`` (a host actor killed at k=6, restarted from the checkpoint),
#: ``stop`` (the same kill with max_retries=0) and ``resume`` (resume=True of the stopped run's folder); each
#: leaves what its strategy saw, or its traceback, for the test
SERVER = ServerApp()


@SERVER.main()
def _main(grid: Grid, context: Context) -> None:
    from flower_dp.strategies.push_sum import PushSumStrategy

    out = Path(str(context.run_config["out-dir"]))
    averages: dict[str, dict] = {}

    def make(name, run_dir, **kw):
        evals = averages.setdefault(name, {})

        def evaluate(rnd, avg):
            evals[rnd] = avg.clone()
            return {}

        return PushSumStrategy(N, kw.pop("spec"), num_iters=K, iters_per_round=R, out_dir=run_dir, timeout_s=60,
                               evaluate_fn=evaluate, run_name=name, backend_kwargs={"num_hosts": 2}, **kw)

    with saving_errors(out / "auto-strategy"):
        a = make("auto", out / "auto", spec=_spec(crash_at=6, crash_marker=str(out / "crash_a")))
        a.start(grid)
        save_strategy(out / "auto-strategy", a, averages=averages["auto"])
    with saving_errors(out / "stop-strategy"):
        b = make("stop", out / "stop", spec=_spec(crash_at=6, crash_marker=str(out / "crash_b")), max_retries=0)
        try:
            b.start(grid)
        except NodeFailureError as exc:
            status = json.loads((out / "stop" / "results.json").read_text())["status"]
            save_strategy(out / "stop-strategy", b, error=str(exc), error_nodes=exc.nodes, status=status)
        else:
            raise AssertionError("the run with max_retries=0 finished although its host actor was killed")
    with saving_errors(out / "resume-strategy"):
        c = make("stop", out / "stop", spec=_spec(), resume=True)  # same out_dir: continue at k=4
        c.start(grid)
        save_strategy(out / "resume-strategy", c, averages=averages["stop"])  # rounds 1 (of b), 2 and 3


@pytest.mark.flower
@pytest.mark.slow
def test_killed_host_actor_restarts_from_checkpoint_or_stops_cleanly(tmp_path):
    """A node's host actor SIGKILLed at k=6 (round 2 of 3): restart from the k=4 checkpoint ends with the
    uninterrupted numbers; with max_retries=0 the run stops naming the nodes and the segment, and
    resume=True then finishes it with the same numbers."""
    avgs, bits, ref_nodes = _reference()
    run = run_test_app("test_push_sum_faults:SERVER", tmp_path, num_supernodes=N,
                       run_config={"out-dir": str(tmp_path)})

    # 1. automatic restart: the failure is named, the numbers are those of an uninterrupted run
    a = load_strategy(tmp_path / "auto-strategy", run)
    assert len(a.failures) == 1
    f = a.failures[0]
    assert f["round"] == 2 and (f["k0"], f["k1"]) == (4, 8) and f["nodes"] in ([0, 1], [2, 3])
    assert "restarting the host actors from the checkpoint at k=4" in run.text, run.tail()
    for rnd in (1, 2, 3):
        assert torch.equal(a.averages[rnd], avgs[rnd - 1]), f"round {rnd} differs after the restart"
    assert a.history[-1]["bits_total"] == bits and [h["k"] for h in a.history] == [4, 8, 12]
    doc = json.loads((tmp_path / "auto" / "results.json").read_text())
    assert doc["status"] == "finished" and doc["failures"][0]["nodes"] == f["nodes"]
    final = load_checkpoint(tmp_path / "auto")
    for nd in ref_nodes:
        assert torch.equal(final["nodes"][nd.node_id]["x"], nd.x) and final["nodes"][nd.node_id]["w"] == nd.w

    # 2. max_retries=0: a clean stop naming the nodes and the segment; what came before is kept
    b = load_strategy(tmp_path / "stop-strategy", run)
    assert "round 2 (segment k=4..7)" in b.error and f"nodes {b.error_nodes}" in b.error and "resume=True" in b.error
    assert [h["k"] for h in b.history] == [4] and len(b.failures) == 1 and b.status == "failed"

    # 3. resume=True on that folder finishes with the uninterrupted numbers
    c = load_strategy(tmp_path / "resume-strategy", run)
    assert [h["k"] for h in c.history] == [4, 8, 12] and c.history[-1]["bits_total"] == bits
    for rnd in (2, 3):
        assert torch.equal(c.averages[rnd], avgs[rnd - 1])
    assert 1 in c.averages and torch.equal(c.averages[1], avgs[0])  # round 1 ran before the stop
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
