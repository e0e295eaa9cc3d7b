"""The run recorder: ``flower_dp.recorder.RunRecorder`` writes results and checkpoints for the run engine
(:mod:`flower_dp.engine`, which serves the runner, ``PushSumStrategy`` and ``GauLRQ``), and refuses a checkpoint of
another run or a corrupted one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from flower_dp import results as rio
from flower_dp.errors import CheckpointError
from flower_dp.recorder import FAILED, FINISHED, RUNNING, STATUSES, STOPPED, STOPPED_BY_BUDGET, RunRecorder

ROOT = Path(__file__).resolve().parents[1]


def test_status_values():
    assert STATUSES == (RUNNING, FINISHED, STOPPED_BY_BUDGET, FAILED, STOPPED)
    assert STATUSES == ("running", "finished", "stopped_by_budget", "failed", "stopped")


def test_writes_results_and_history_atomically(tmp_path, monkeypatch):
    rec = RunRecorder(tmp_path / "run", identity={"config": {"a": 1}})
    replaced = []
    real = os.replace
    monkeypatch.setattr(rio.os, "replace", lambda a, b: (replaced.append((Path(a).name, Path(b).name)), real(a, b)))
    rows = [{"k": 2, "acc_avg": 0.5}, {"k": 4, "acc_avg": float("nan")}]
    rec.write({"status": RUNNING, "history": rows}, rows)
    # each file went through a temporary name in the same folder and a rename
    assert [b for _, b in replaced] == ["results.json", "history.csv"]
    assert all(a.startswith(f".{b}.") and a.endswith(".tmp") for a, b in replaced)
    assert json.loads((tmp_path / "run" / "results.json").read_text()) == {
        "status": "running", "history": [{"k": 2, "acc_avg": 0.5}, {"k": 4, "acc_avg": "nan"}]}
    assert (tmp_path / "run" / "history.csv").read_text().splitlines() == ["k,acc_avg", "2,0.5", "4,nan"]
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ValueError, match="status"):
        rec.write({"status": "done"})
    rec.write({"rounds": []})  # no status (GauLRQ) and no rows: results.json only
    assert json.loads((tmp_path / "run" / "results.json").read_text()) == {"rounds": []}


def test_without_out_dir_nothing_is_written(tmp_path):
    rec = RunRecorder(None, identity={"meta": {}})
    assert rec.out_dir is None and not rec.checkpoint
    rec.write({"status": FINISHED}, [])
    assert rec.save_checkpoint({"k": 1}) is None
    with pytest.raises(CheckpointError):
        rec.load_checkpoint()


def test_checkpoint_round_trip_is_stamped_with_the_identity(tmp_path):
    rec = RunRecorder(tmp_path, identity={"config": {"seed": 1}})
    rec.save_checkpoint({"k": 4, "bits": [1, 2], "x": np.arange(3.0)})
    ck = RunRecorder(tmp_path, identity={"config": {"seed": 1}}).load_checkpoint()
    assert list(ck)[:2] == ["config", "k"] and ck["k"] == 4
    np.testing.assert_array_equal(ck["x"], np.arange(3.0))
    assert rio.load_checkpoint(tmp_path)["config"] == {"seed": 1}  # the same file format (FLOWERDP-CKPT2)
    assert (tmp_path / "checkpoint.pt").read_bytes().startswith(b"FLOWERDP-CKPT2\n")
    off = RunRecorder(tmp_path / "off", identity={"config": {}}, checkpoint=False)
    assert off.save_checkpoint({"k": 1}) is None and not (tmp_path / "off" / "checkpoint.pt").exists()


def test_checkpoint_of_a_different_config_is_refused(tmp_path):
    RunRecorder(tmp_path, identity={"meta": {"n": 4}}).save_checkpoint({"k": 2})
    with pytest.raises(CheckpointError, match=r"different run \(\{'n': 4\}\), got \{'n': 5\}"):
        RunRecorder(tmp_path, identity={"meta": {"n": 5}}).load_checkpoint()
    mine = RunRecorder(tmp_path, identity={"meta": {"n": 5}},
                       refusals={"meta": lambda where, got, want: f"{where}: other config {got} != {want}"})
    with pytest.raises(CheckpointError, match="other config"):
        mine.load_checkpoint()
    # an upgrade hook fills in what older checkpoints lack before the check
    RunRecorder(tmp_path, identity={"meta": {"n": 5}}).load_checkpoint(upgrade=lambda ck: ck["meta"].update(n=5))


def test_corrupted_checkpoint_is_refused(tmp_path):
    rec = RunRecorder(tmp_path, identity={"meta": {}})
    rec.save_checkpoint({"k": 2, "nodes": [np.ones(8)]})
    raw = bytearray((tmp_path / "checkpoint.pt").read_bytes())
    raw[-5] ^= 0xFF
    (tmp_path / "checkpoint.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        rec.load_checkpoint()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        RunRecorder(tmp_path / "empty", identity={"meta": {}}).load_checkpoint()


@pytest.mark.parametrize("path", ["flower_dp/experiments/runner.py", "strategies/push_sum.py",
                                  "strategies/gau_lrq.py"])
def test_the_three_run_lifecycles_go_through_the_recorder(path):
    src = (ROOT / path).read_text()
    assert "RunRecorder(" in src and ("from flower_dp.recorder import" in src or "from ..recorder import" in src)
    for direct in ("save_checkpoint(self.out", "rio.save_checkpoint", "rio.load_checkpoint", "rio.write_json",
                   "rio.write_csv", "write_json(", "write_csv(", "ensure_writable_dir", "load_checkpoint(self.out"):
        assert direct not in src, f"{path} writes its run files itself ({direct})"


def test_completed_status_rule():
    """A run that ran its plan's K: fewer iterations than requested is a budget stop, as many or more (PrivSGP-VR's
    K* above the request) is finished."""
    from flower_dp.engine import completed_status

    assert completed_status(40, 40) == FINISHED
    assert completed_status(17, 40) == STOPPED_BY_BUDGET
    assert completed_status(3120, 40) == FINISHED
    assert completed_status(1, 2) == STOPPED_BY_BUDGET


def test_privsgp_vr_k_star_above_the_request_is_finished(tmp_path):
    """PrivSGP-VR's K* (eq. 12) may exceed the requested K: the runner runs K* and calls the run finished."""
    from flower_dp.clients.builder import build_parts
    from flower_dp.experiments import config_from_dict, run_experiment
    from flower_dp.privacy import paper

    def cfg(kstar_a: float, num_iters: int = 4):
        params = {"lr": 0.05, "batch_size": 8, "G": 2.0, "epsilon": 4.0, "delta": 1e-4, "accountant": "rdp",
                  "calibration": "paper", "c2": 0.3724, "kstar_A": kstar_a, "kstar_L": 1.0}
        return config_from_dict({
            "run": {"name": "kstar", "seed": 0, "num_iters": num_iters, "eval_every": 3, "progress": False},
            "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 64, "test_samples": 50},
            "model": {"name": "logreg"}, "topology": {"name": "exp_one_peer", "n_nodes": 2},
            "algorithm": {"name": "privsgp_vr", "params": params}})

    d = build_parts(cfg(1.0)).dim
    unit = paper.k_star_privsgp_vr(4.0, 1e-4, J=64, n_nodes=2, A=1.0, L=1.0, d=d, G=2.0, c2=0.3724)
    res = run_experiment(cfg(6 / unit), out_dir=tmp_path)  # K* = 6 > 4 requested
    doc = json.loads((tmp_path / "results.json").read_text())
    assert (doc["num_iters"], doc["num_iters_requested"]) == (6, 4) and res.history[-1]["k"] == 6
    assert res.status == doc["status"] == FINISHED
