"""Push-sum on Flower's deployment engine: a real ``flower-superlink`` and 4 ``flower-supernode`` processes on
127.0.0.1, the example app through ``flwr run`` (issue 14).  Every process is stopped in teardown.

* ``transport="relay"`` runs to the end and its nodes end bit-identical to the in-process run;
* ``transport="ray"`` (no shared Ray cluster: each ClientApp is its own process) fails before any work with an
  error naming the fix, and the ServerApp exits non-zero (``flwr run`` itself returns 0 whatever the run did:
  Flower's CLI; the run's status says failed);
* ``transport="ray"`` with the shared cluster's address in the run config (``ray-address``) starts its first
  iteration without waiting for a simulation's Ray and runs to the end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from flwr_deploy_helper import deployment
from flwr_run_helper import ray_head

APP = Path(__file__).resolve().parent.parent / "examples" / "push_sum"
N, K, R = 4, 4, 2

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_relay_runs_to_the_end_and_equals_inprocess(tmp_path):
    from flower_dp.clients.push_sum_app import toy_builder
    from flower_dp.gossip import run_iteration
    from flower_dp.results import load_checkpoint

    out = tmp_path / "out"
    with deployment(tmp_path, N) as run:
        r = run(APP, f"experiment='toy' n-nodes={N} num-iters={K} iters-per-round={R} transport='relay' out-dir='{out}'",
                timeout=800)
    assert "PUSH_SUM_DONE" in r["output"], r["output"][-4000:] + r["logs"]
    doc = json.loads((out / "results.json").read_text())
    assert doc["status"] == "finished" and doc["backend"] == "flower-relay"
    assert [row["k"] for row in doc["history"]] == [R, K] and doc["history"][-1]["bits_total"] > 0
    spec = {"builder": "toy", "n_nodes": N, "topology": "random_irregular", "topology_kwargs": {"seed": 0},
            "node_kwargs": {"dim": 16, "seed": 0}}
    ref = [toy_builder(i, spec)(i, "cpu") for i in range(N)]
    for k in range(K):
        run_iteration(ref, k)
    states = load_checkpoint(out)["nodes"]
    for nd in ref:
        assert torch.equal(states[nd.node_id]["x"], nd.x) and states[nd.node_id]["w"] == nd.w
    print(f"deployment relay: flwr run {r['wall_s']:.1f} s, timings {doc['timings']}, "
          f"{doc['timings']['gossip_s'] / K:.1f} s per iteration")


def test_ray_transport_without_a_shared_cluster_fails_fast_and_nonzero(tmp_path):
    with deployment(tmp_path, N) as run:
        r = run(APP, f"experiment='toy' n-nodes={N} num-iters={K} iters-per-round={R} transport='ray' "
                     f"out-dir='{tmp_path / 'out'}'",
                timeout=300)
    text = r["output"] + r["logs"]
    assert "transport='ray' cannot work on Flower's deployment engine" in text, text[-4000:]
    assert "transport='relay'" in text and "RAY_ADDRESS" in text
    codes = [int(c) for c in re.findall(r"Exit Code: (\d+)", text)]
    assert codes and all(c != 0 for c in codes), f"the ServerApp must exit non-zero, got exit codes {codes}"
    if r["status"].strip().startswith("{"):
        assert "fail" in r["status"].lower(), r["status"]
    assert "PUSH_SUM_DONE" not in r["output"]
    print(f"deployment ray (no shared cluster): failed after {r['wall_s']:.1f} s of flwr run")


def test_ray_transport_with_the_address_in_the_run_config_starts_without_a_wait(tmp_path):
    """A Ray head on 127.0.0.1; the ServerApp and every SuperNode's node join it through the run config's
    ray-address (no RAY_ADDRESS anywhere): no wait for a simulation's Ray; the first iteration starts as soon as
    the processes are up: 25.3-26.9 s after `flwr run` on an otherwise idle 2-core machine (3 runs, 2026-11-28;
    the median run: 10.8 s until the strategy starts, 1.2 s to join Ray and create the hosts, 14.2 s for 4
    flwr-clientapp and node worker starts that join Ray without importing torch, replies pulled every 0.1 s).
    The bound below catches a 120 s wait coming back."""
    out = tmp_path / "out"
    with ray_head() as address, deployment(tmp_path, N) as run:
        r = run(APP, f"experiment='toy' n-nodes={N} num-iters={K} iters-per-round={R} transport='ray' "
                     f"ray-address='{address}' out-dir='{out}'", timeout=400)
    assert "PUSH_SUM_DONE" in r["output"], r["output"][-4000:] + r["logs"]
    doc = json.loads((out / "results.json").read_text())
    assert doc["status"] == "finished" and doc["backend"] == "flower-ray" and [h["k"] for h in doc["history"]] == [R, K]
    tm = doc["timings"]
    # from `flwr run` to the first iteration, at most: its wall time less the strategy's time after that point
    first = r["wall_s"] - (doc["wall_time_s"] - tm["first_segment_start_s"])
    print(f"deployment ray with ray-address: first iteration at most {first:.1f} s after flwr run "
          f"(strategy: backend {tm['backend_start_s']:.1f} s, register {tm['register_first_round_s']:.1f} s, "
          f"first segment at {tm['first_segment_start_s']:.1f} s); flwr run {r['wall_s']:.1f} s")
    assert "wait_for_ray_s" not in tm and tm["backend_start_s"] < 30 and first < 110, tm
