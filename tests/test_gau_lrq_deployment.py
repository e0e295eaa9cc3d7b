"""Gau-LRQ on Flower's deployment engine: a real ``flower-superlink`` and 4 ``flower-supernode`` processes on
127.0.0.1 (``--node-config "partition-id=i num-partitions=4 lrq-key-file='.../client-i.key'"``: each SuperNode gets
only its own key, exported with ``flower-dp lrq-keys`` as docs/flower.md says), the example app ``examples/gau_lrq``
through ``flwr run`` to the end.  Every process is stopped in teardown (tests/flwr_deploy_helper.py).

B = N = 4: every round trains every SuperNode, so ``received == 4`` in every round means that all four took part
(the strategy rejects a partition id seen twice in a round).  z is fixed and the budget is set above what the
rounds cost: the run completes, eps_rigorous grows per round and stays within the budget.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from flwr_deploy_helper import deployment

APP = Path(__file__).resolve().parent.parent / "examples" / "gau_lrq"
N, K, Z, EPS, DELTA = 4, 3, 0.3, 200.0, 1e-5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_gau_lrq_example_runs_to_the_end_on_the_deployment_engine(tmp_path):
    from flower_dp.privacy.gau_lrq import client_level_epsilon

    from flower_dp.cli import main
    from flower_dp.mechanisms.gau_lrq_codec import create_secret_file

    out, secret_file, keys = tmp_path / "out", tmp_path / "lrq.secret", tmp_path / "keys"
    create_secret_file(secret_file)  # the server's master secret; the SuperNodes get one exported key each
    assert main(["lrq-keys", "--secret-file", str(secret_file), "--num-clients", str(N), "--out", str(keys)]) == 0
    run_config = (f"num-clients={N} clients-per-round={N} num-rounds={K} local-steps=16 lr=0.05 per-class=20 "
                  f"test-samples=500 noise-multiplier={Z} epsilon={EPS} delta={DELTA} "
                  f"out-dir='{out}' lrq-secret-file='{secret_file}' lrq-key-dir=''")
    with deployment(tmp_path, N, node_config=lambda i: f"lrq-key-file='{keys / f'client-{i}.key'}'") as run:
        r = run(APP, run_config, timeout=800)
    text = r["output"] + r["logs"]

    # the run finished: the app's results file says so, and so do Flower's log and run status
    res = out / "lrq" / "results.json"
    assert res.is_file(), text[-6000:]
    doc = json.loads(res.read_text())
    assert doc["stop_reason"] == "completed" and doc["rounds_completed"] == K, (doc["stop_reason"], text[-4000:])
    assert doc["config"]["N"] == doc["config"]["B"] == N and doc["config"]["K"] == K
    assert doc["run"]["dataset"] == "fashion_mnist" and doc["run"]["model"] == "lenet"
    assert f"[ROUND {K}/{K}]" in r["output"], r["output"][-4000:]
    assert r["rc"] == 0, text[-4000:]
    codes = [int(c) for c in re.findall(r"Exit Code: (\d+)", text)]
    assert all(c == 0 for c in codes), f"a Flower process exited non-zero: {codes}\n{text[-4000:]}"
    assert r["run_id"] and r["status"].strip().startswith("{"), (r["run_id"], r["status"])
    runs = json.loads(r["status"])["runs"]
    assert [run["status"] for run in runs] == ["finished:completed"], r["status"]

    # every SuperNode trained in every round and every reply decoded (no drop, no failure)
    for rec in doc["rounds"]:
        assert rec["sampled"] == rec["received"] == N and rec["dropped"] == rec["failed"] == 0, rec
        assert rec["bytes_payload"] > 0 and 0 < rec["bits_per_coord"] <= 8, rec
    node_logs = sorted((tmp_path / "flwr_home").glob("supernode*.log"))
    assert len(node_logs) == N
    for log in node_logs:  # each SuperNode answered GauLRQ's probe (a train message) and K train messages
        log_text = log.read_text()
        assert f"[RUN {r['run_id']}]" in log_text, log_text[-2000:]
        assert log_text.count("Receiving: train message") == log_text.count("Sending: train message") == K + 1, \
            f"{log.name}:\n{log_text[-2000:]}"

    # eps_rigorous reported per round, increasing, equal to the accountant's value and within the budget
    eps = doc["eps_rigorous_per_round"]
    want = [client_level_epsilon(np.full(k, Z), DELTA, B=N, N=N) for k in range(1, K + 1)]
    assert len(eps) == K and all(0 < a < b for a, b in zip(eps, eps[1:]))
    assert eps == pytest.approx(want, rel=1e-9)
    assert doc["eps_rigorous"] == eps[-1] <= EPS
    assert all(rec["eps_paper"] > 0 for rec in doc["rounds"])

    # the model learned: server-side accuracy after every round is a number, the last above the initial model's
    acc = doc["accuracy_per_round"]
    assert len(acc) == K + 1 and all(isinstance(a, float) and 0 <= a <= 1 for a in acc), acc
    assert acc[-1] > acc[0], acc

    # the secret never leaves its file, nor does any key
    secret = secret_file.read_bytes()
    assert len(secret) >= 16 and secret.hex() not in res.read_text() and secret.hex() not in text
    assert not any((keys / f"client-{i}.key").read_text().split()[-1] in text for i in range(N))

    print(f"deployment Gau-LRQ: flwr run {r['wall_s']:.1f} s for {K} rounds on {N} SuperNodes "
          f"(accuracy {acc[0]:.3f} -> {acc[-1]:.3f}, eps_rigorous {eps[-1]:.2f} <= {EPS})")
