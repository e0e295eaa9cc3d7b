"""A stop on request (``FLOWER_DP_STOP_FILE``, ``touch OUT/STOP`` for a sweep) loses nothing and charges nothing twice.

A run killed mid-segment is resumed from its last checkpoint with the segment after it charged again (secret mode:
``charge_replay``), since part of it may have been sent.  A run asked to stop finishes its segment, writes the
checkpoint and runs nothing after it, so the resumed run spends exactly the eps of an uninterrupted one.
"""

from __future__ import annotations

import json

import pytest

from flower_dp.experiments import config_from_dict, run_experiment
from flower_dp.experiments.runner import CLEAN_STOP_NAME, STOP_FILE_ENV, stop_requested
from flower_dp.recorder import FINISHED, STOPPED


def _cfg(num_iters: int = 6):
    params = {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4, "batch_size": 8, "lr": 0.1, "accountant": "rdp"}
    return config_from_dict({
        "run": {"name": "t", "seed": 1, "num_iters": num_iters, "eval_every": 2, "progress": False,
                "reproducible": False},  # secret mode: the mode where a replayed segment is charged again
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 64, "test_samples": 200},
        "model": {"name": "logreg"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": "dyn_d2p", "params": params},
    })


def test_a_stop_request_ends_the_run_at_its_segment_and_the_resume_charges_nothing_twice(tmp_path, monkeypatch):
    full = run_experiment(_cfg(), out_dir=tmp_path / "full")
    stop = tmp_path / "STOP"
    monkeypatch.setenv(STOP_FILE_ENV, str(stop))
    assert not stop_requested()
    stop.touch()
    assert stop_requested()
    cut = run_experiment(_cfg(), out_dir=tmp_path / "cut")
    assert cut.status == STOPPED and [h["k"] for h in cut.history] == [2]  # the first segment, then the stop
    doc = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert doc["status"] == "stopped" and (tmp_path / "cut" / "checkpoint.pt").is_file()
    assert json.loads((tmp_path / "cut" / CLEAN_STOP_NAME).read_text()) == {"k": 2}

    stop.unlink()
    resumed = run_experiment(_cfg(), out_dir=tmp_path / "cut", resume=True)
    assert resumed.status == FINISHED and [h["k"] for h in resumed.history] == [2, 4, 6]
    assert not (tmp_path / "cut" / CLEAN_STOP_NAME).exists()  # consumed by the resume
    assert resumed.eps_rigorous_max == pytest.approx(full.eps_rigorous_max, rel=1e-12)


def test_a_resume_without_the_clean_stop_record_charges_the_replayed_segment(tmp_path, monkeypatch):
    """The same stopped run, its record gone (as after a crash or a kill): the segment after the checkpoint is
    charged a second time, so its eps is above the uninterrupted run's."""
    full = run_experiment(_cfg(), out_dir=tmp_path / "full")
    monkeypatch.setenv(STOP_FILE_ENV, str(tmp_path / "STOP"))
    (tmp_path / "STOP").touch()
    run_experiment(_cfg(), out_dir=tmp_path / "cut")
    (tmp_path / "STOP").unlink()
    (tmp_path / "cut" / CLEAN_STOP_NAME).unlink()
    resumed = run_experiment(_cfg(), out_dir=tmp_path / "cut", resume=True)
    assert resumed.eps_rigorous_max > full.eps_rigorous_max * (1 + 1e-6)


def test_a_record_of_another_iteration_is_not_trusted(tmp_path, monkeypatch):
    """A clean-stop record must name the checkpoint's own iteration; any other is ignored (and removed)."""
    full = run_experiment(_cfg(), out_dir=tmp_path / "full")
    monkeypatch.setenv(STOP_FILE_ENV, str(tmp_path / "STOP"))
    (tmp_path / "STOP").touch()
    run_experiment(_cfg(), out_dir=tmp_path / "cut")
    (tmp_path / "STOP").unlink()
    (tmp_path / "cut" / CLEAN_STOP_NAME).write_text('{"k": 4}')
    resumed = run_experiment(_cfg(), out_dir=tmp_path / "cut", resume=True)
    assert resumed.eps_rigorous_max > full.eps_rigorous_max * (1 + 1e-6)
    assert not (tmp_path / "cut" / CLEAN_STOP_NAME).exists()


def test_a_fresh_start_removes_an_old_record(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / CLEAN_STOP_NAME).write_text('{"k": 0}')
    res = run_experiment(_cfg(num_iters=2), out_dir=out)
    assert res.status == FINISHED and not (out / CLEAN_STOP_NAME).exists()


def test_touch_stop_ends_a_sweep_and_the_same_call_goes_on(tmp_path):
    """``touch OUT/STOP``: the running run stops at its segment, no other starts, the records written so far stand;
    the same call removes the old request and finishes every run, the stopped one resumed without a double charge."""
    from flower_dp.reproduce import _with_noise_mode, build_specs, get_paper
    from flower_dp.reproduce.core import STOP_NAME, run_sweep

    paper = get_paper("dyn-d2p")
    specs = [_with_noise_mode(s, False) for s in build_specs(paper, "smoke", "table2", 1)[1:3]]  # two private runs
    out = tmp_path / "sweep"
    out.mkdir()
    (out / STOP_NAME).touch()
    lines: list[str] = []
    # an old request is removed when a sweep starts: make a new one while the first run runs
    import flower_dp.experiments.runner as runner_mod

    real = runner_mod.stop_requested
    calls = {"n": 0}

    def stop_after_first_segment():  # call 1: before the first run starts; call 2: at the end of its first segment
        calls["n"] += 1
        if calls["n"] >= 2:
            (out / STOP_NAME).touch()
        return real()

    runner_mod.stop_requested = stop_after_first_segment
    try:
        first = run_sweep(paper, specs, out, log=lines.append)
    finally:
        runner_mod.stop_requested = real
    assert any("removed" in m and "STOP" in m for m in lines)
    assert any("stopped on request at k =" in m for m in lines), lines
    assert first == [] and not (out / "records.json").exists()  # nothing finished: nothing to record yet
    run_dir = out / "runs" / specs[0].run_id
    assert json.loads((run_dir / "results.json").read_text())["status"] == "stopped"
    assert (run_dir / CLEAN_STOP_NAME).is_file()
    assert not (out / "runs" / specs[1].run_id / "results.json").exists()  # never started

    again = run_sweep(paper, specs, out, log=lines.append)
    assert [r["run_id"] for r in again] == [s.run_id for s in specs]
    assert all(r["status"] == "finished" for r in again) and not (run_dir / CLEAN_STOP_NAME).exists()
    fresh = run_sweep(paper, specs[:1], tmp_path / "fresh", log=lambda m: None)
    assert again[0]["eps_rigorous"] == pytest.approx(fresh[0]["eps_rigorous"], rel=1e-12)
