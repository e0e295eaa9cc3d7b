"""The in-process runner: complete results files, resume == uninterrupted, NaN stops cleanly."""

from __future__ import annotations

import json

import pytest
import torch

import flower_dp.experiments.runner as runner_mod
from flower_dp.errors import NonFiniteError
from flower_dp.experiments import config_from_dict, run_experiment


def _cfg(reproducible=False, **algo):
    params = {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4, "batch_size": 8, "lr": 0.1, "accountant": "rdp"}
    params.update(algo)
    return config_from_dict({
        "run": {"name": "t", "seed": 1, "num_iters": 6, "eval_every": 3, "progress": False,
                "reproducible": reproducible},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 64, "test_samples": 200},
        "model": {"name": "logreg"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": "dyn_d2p", "params": params},
    })


def test_results_file_complete(tmp_path):
    res = run_experiment(_cfg(), out_dir=tmp_path)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "finished" and doc["info"]["synthetic_data"] is True
    assert [row["k"] for row in doc["history"]] == [3, 6]
    assert len(doc["privacy"]["per_node"]) == 4
    for p in doc["privacy"]["per_node"]:
        assert 0 < p["eps_rigorous"] <= 4.0 + 1e-9 and "eps_paper" in p
    assert len(doc["bits_sent_per_node"]) == 4 and doc["versions"]["torch"]
    assert (tmp_path / "history.csv").read_text().startswith("k,acc_avg")
    assert res.final_accuracy == doc["history"][-1]["acc_avg"]


def test_resume_gives_the_numbers_of_an_uninterrupted_run(tmp_path, monkeypatch):
    # resume == uninterrupted holds in the seeded simulation mode (secret mode: tests/test_secret_noise.py)
    full = run_experiment(_cfg(reproducible=True), out_dir=tmp_path / "full")
    real_eval = runner_mod.evaluate_params
    calls = {"n": 0}

    def crash_on_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated stop")
        return real_eval(*args, **kwargs)

    monkeypatch.setattr(runner_mod, "evaluate_params", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(_cfg(reproducible=True), out_dir=tmp_path / "cut")
    monkeypatch.setattr(runner_mod, "evaluate_params", real_eval)
    partial = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert partial["status"] == "running" and len(partial["history"]) == 1  # results so far stay valid
    resumed = run_experiment(_cfg(reproducible=True), out_dir=tmp_path / "cut", resume=True)
    assert resumed.history == full.history
    # the training CPU time carries over the stop: it only grows, and it never enters the history
    done = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert done["train_cpu_s"] >= partial["train_cpu_s"] > 0 and "train_cpu_s" not in done["history"][-1]
    for a, b in zip(full.nodes, resumed.nodes):
        assert torch.equal(a.x, b.x) and a.w == b.w


def test_nan_stops_the_run_with_results_saved(tmp_path):
    with pytest.raises(NonFiniteError):
        run_experiment(_cfg(lr=3e38, variant="nonprivate"), out_dir=tmp_path)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "failed" and doc["error"]


def test_nan_mid_run_names_node_and_step_after_saving_the_segments_before(tmp_path, monkeypatch):
    """Node 2's parameters turn NaN before k = 4: the run stops at k = 4 naming node 2; the k = 3 segment is saved."""
    real = runner_mod.run_iteration

    def poisoned(nodes, k, **kw):
        if k == 4:
            nodes[2].x[0] = float("nan")
        return real(nodes, k, **kw)

    monkeypatch.setattr(runner_mod, "run_iteration", poisoned)
    with pytest.raises(NonFiniteError) as info:
        run_experiment(_cfg(), out_dir=tmp_path)
    assert (info.value.node, info.value.step) == (2, 4)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "failed" and "node 2 at k=4" in doc["error"]
    assert [row["k"] for row in doc["history"]] == [3]


def test_dpps_one_out_is_connected_by_its_sync_rounds(tmp_path):
    """DPPS Fig. 4's 1-Out graph (self-loops only) is valid with sync rounds; without them it is refused clearly."""
    base = {"run": {"name": "t", "seed": 0, "num_iters": 4, "eval_every": 4, "progress": False},
            "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 32, "test_samples": 100},
            "model": {"name": "partpsp_mlp"}, "topology": {"name": "d_out", "n_nodes": 4, "deg": 1}}
    params = {"b": 5.0, "split": "partpsp1", "batch_size": 8, "sync_period": 2}
    res = run_experiment(config_from_dict({**base, "algorithm": {"name": "partpsp", "params": params}}),
                         out_dir=tmp_path / "ok")
    assert res.status == "finished"
    with pytest.raises(ValueError, match="not strongly connected"):
        run_experiment(config_from_dict({**base, "algorithm": {"name": "partpsp",
                                                               "params": {**params, "sync_period": 0}}}))
