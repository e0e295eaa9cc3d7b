"""Running sweeps on several cores (``--jobs``), the CPU-hour estimate, and reusing finished runs (issue 15)."""

from __future__ import annotations

import json
import math
import re

import pytest

from flower_dp.experiments import config_from_dict
from flower_dp.reproduce import build_specs, get_paper, reproduce
from flower_dp.reproduce.core import _same_config, estimate_cpu_hours, run_sweep


def _smoke_specs(n: int = 3):
    """A few Dyn-D2P smoke runs in the seeded mode (so two sweeps must agree exactly)."""
    from flower_dp.reproduce import _with_noise_mode

    paper = get_paper("dyn-d2p")
    return paper, [_with_noise_mode(s, True) for s in build_specs(paper, "smoke", "table2", 1)[:n]]


@pytest.mark.slow
def test_jobs_two_gives_the_records_of_jobs_one(tmp_path):
    """Two runs at once, each in its own process, give the same records in the same order as one at a time."""
    paper, specs = _smoke_specs(3)
    serial = run_sweep(paper, specs, tmp_path / "one", log=lambda m: None)
    lines: list[str] = []
    parallel = run_sweep(paper, specs, tmp_path / "two", log=lines.append, jobs=2)
    assert [r["run_id"] for r in parallel] == [s.run_id for s in specs]
    # each run's "done in" is its own time, not counted from when it was queued: the third run waits for a worker
    done_in = {s.run_id: float(m.group(1)) for s in specs for line in lines
               if s.run_id + ":" in line and (m := re.search(r"done in (\d+) s", line))}
    assert set(done_in) == {s.run_id for s in specs}
    # counted from queueing, the third run's time would hold a whole earlier run's (its wait for a worker) on top of
    # its own build and training; its own time holds only the latter (build time grows with the machine's load)
    third = parallel[2]
    first_done = min(done_in[parallel[0]["run_id"]], done_in[parallel[1]["run_id"]])
    assert done_in[third["run_id"]] < third["wall_time_s"] + first_done, (done_in, parallel)
    assert all(done_in[r["run_id"]] >= r["wall_time_s"] - 1.0 for r in parallel), (done_in, parallel)
    for a, b in zip(serial, parallel):
        assert a["final_acc"] == b["final_acc"] and a["eps_rigorous"] == b["eps_rigorous"]
        assert [h["acc_avg"] for h in a["history"]] == [h["acc_avg"] for h in b["history"]]
    doc = json.loads((tmp_path / "two" / "records.json").read_text())
    assert [r["run_id"] for r in doc["records"]] == [s.run_id for s in specs]
    # a second parallel call reuses every finished run
    again = run_sweep(paper, specs, tmp_path / "two", log=lambda m: None, jobs=2)
    assert all(r["reused"] for r in again)


def test_jobs_below_one_is_a_clear_error(tmp_path):
    paper, specs = _smoke_specs(1)
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        run_sweep(paper, specs, tmp_path, jobs=0)


def test_estimate_measures_one_segment_and_scales_by_work(tmp_path):
    """The estimate runs one segment of a private run and extrapolates over iterations x nodes; finished runs
    cost nothing; the probe leaves no folder behind."""
    paper, specs = _smoke_specs(3)
    lines: list[str] = []
    hours = estimate_cpu_hours(paper, specs, tmp_path, log=lines.append)
    assert hours is not None and 0 < hours < 0.05, hours  # seconds of work at smoke scale
    assert "CPU hours for 3 unfinished push-sum runs" in lines[-1] and "ms per node-iteration" in lines[-1]
    assert not (tmp_path / "runs" / ".estimate-probe").exists()
    run_sweep(paper, specs, tmp_path, log=lambda m: None)
    assert estimate_cpu_hours(paper, specs, tmp_path, log=lines.append) == 0.0
    assert lines[-1].startswith("estimate: 0 CPU hours: all 3 runs are finished")


def test_estimate_only_returns_without_running(tmp_path):
    assert reproduce("dyn-d2p", scale="smoke", out=tmp_path, seeds=1, estimate="only", log=lambda m: None) is None
    assert not list((tmp_path / "runs").glob("*/results.json"))


def test_a_config_key_added_later_with_its_default_still_matches():
    """A finished run whose stored config predates a key (the default is what it ran with) is reused; a changed
    value is not."""
    _, specs = _smoke_specs(1)
    cfg = config_from_dict(specs[0].config)
    stored = cfg.to_dict()
    stored["run"].pop("debug_metrics")
    assert _same_config(stored, cfg)
    stored["run"]["num_iters"] += 1
    assert not _same_config(stored, cfg)
    assert not _same_config(None, cfg)


def test_paper_scale_of_dyn_d2p_table2_is_the_papers_grid():
    """``--scale paper``: n = 20, K = 3000, the four variants at the paper's four eps with the paper's calibration,
    the rigorous calibration for Const-D2P and Dyn-D2P, the non-private twin; 2 seeds by default."""
    paper = get_paper("dyn-d2p")
    specs = build_specs(paper, "paper", "table2", 2)
    assert len(specs) == 2 * (1 + 4 * 4 + 2 * 4)
    cfg = specs[0].config
    assert cfg["topology"]["n_nodes"] == 20 and cfg["run"]["num_iters"] == 3000
    assert cfg["data"]["dataset"] == "fashion_mnist" and cfg["model"]["name"] == "shallow_cnn"
    rigorous = {s.labels["algorithm"] for s in specs if s.labels.get("calibration") == "rigorous"}
    assert rigorous == {"Const-D2P", "Dyn-D2P"}
    assert {s.labels["eps"] for s in specs if s.labels.get("calibration") == "paper"} == {0.3, 0.7, 1.0, 3.0}
    with pytest.raises(ValueError, match="GPU only"):
        build_specs(paper, "paper", "table1", 1)


def test_gau_lrq_estimate_times_one_round_and_scales_by_rounds(tmp_path):
    """Gau-LRQ runs are not push-sum runs: the estimate times one round of the first unfinished run and counts
    every run's rounds (Local SGD's extra rounds included); the probe leaves nothing behind."""
    paper = get_paper("gau-lrq")
    specs = build_specs(paper, "smoke", "table4", 1)
    cut, work = paper.estimators["gau_lrq"]
    assert cut(specs[0].config)["num_rounds"] == 1 and work(specs[0].config) == specs[0].config["num_rounds"]
    lines: list[str] = []
    hours = estimate_cpu_hours(paper, specs, tmp_path, log=lines.append)
    assert hours is not None and 0 < hours < 0.5, hours
    assert f"CPU hours for {len(specs)} unfinished gau_lrq runs" in lines[-1], lines
    assert not (tmp_path / "runs" / ".estimate-probe").exists()
    assert not list((tmp_path / "runs").glob("*/results.json"))
    run_sweep(paper, specs[:2], tmp_path, log=lambda m: None)  # finished Gau-LRQ runs cost nothing
    assert estimate_cpu_hours(paper, specs, tmp_path, log=lines.append) > 0
    assert f"for {len(specs) - 2} unfinished gau_lrq runs" in lines[-1], lines[-1]


def test_a_fresh_clone_reuses_committed_records_and_reruns_only_what_changed(tmp_path):
    """``runs/`` is git-ignored, ``records.json`` is committed: after the run folders are gone (a new session's
    clone), a finished run is reused from its committed record when the record was made from the same config
    (``config_sha``), and run again when the config changed or the record predates the fingerprint."""
    import dataclasses
    import shutil

    from flower_dp.reproduce.core import config_sha

    paper, specs = _smoke_specs(2)
    first = run_sweep(paper, specs, tmp_path, log=lambda m: None)
    assert [r["config_sha"] for r in first] == [config_sha(s.config) for s in specs]
    shutil.rmtree(tmp_path / "runs")  # what a fresh clone has: the committed records only
    again = run_sweep(paper, specs, tmp_path, log=lambda m: None)
    assert all(r["reused"] for r in again)
    assert [r["final_acc"] for r in again] == [r["final_acc"] for r in first]
    assert [r["cpu_time_s"] for r in again] == [r["cpu_time_s"] for r in first]
    assert not list((tmp_path / "runs").glob("*/results.json"))  # nothing was run
    # an unfinished local run of the same config (a cut sweep's leftover) does not beat the finished record
    (tmp_path / "runs" / specs[0].run_id / "results.json").write_text(json.dumps({"status": "running"}))
    left = run_sweep(paper, specs, tmp_path, log=lambda m: None)
    assert all(r["reused"] for r in left) and [r["final_acc"] for r in left] == [r["final_acc"] for r in first]
    # a changed config is not the committed record's run: it runs again (and so does a record without a sha)
    changed = dataclasses.replace(specs[0], config={**specs[0].config,
                                                    "run": {**specs[0].config["run"], "num_iters": 9}})
    doc = json.loads((tmp_path / "records.json").read_text())
    doc["records"][1].pop("config_sha")
    (tmp_path / "records.json").write_text(json.dumps(doc))
    third = run_sweep(paper, [changed, specs[1]], tmp_path, log=lambda m: None)
    assert not any(r["reused"] for r in third)
    assert third[0]["num_iters"] == 9


def test_float32_records_are_made_again_last_and_kept_until_then(tmp_path, monkeypatch):
    """A committed record whose noise came from torch's float32 sampler is made again (its eps is not proven), but
    after every missing run, and records.json keeps it until then: a sweep stopped half-way loses no result."""
    import shutil

    from flower_dp.reproduce import core

    paper, specs = _smoke_specs(3)
    run_sweep(paper, specs, tmp_path, log=lambda m: None)
    doc = json.loads((tmp_path / "records.json").read_text())
    assert math.isfinite(doc["records"][1]["eps_rigorous"])  # a private run
    doc["records"][1]["gaussian_sampler"] = "torch-float32"  # as made before the float64 sampler
    doc["records"] = doc["records"][:2]  # the third run is missing (a fresh clone of an unfinished sweep)
    (tmp_path / "records.json").write_text(json.dumps(doc))
    shutil.rmtree(tmp_path / "runs")
    calls, seen = [], []
    real = core._run_one

    def spy(paper_, spec, run_dir, backend, device=None):
        calls.append(spec.run_id)
        seen.append([r["run_id"] for r in json.loads((tmp_path / "records.json").read_text())["records"]])
        return real(paper_, spec, run_dir, backend, device)

    monkeypatch.setattr(core, "_run_one", spy)
    again = run_sweep(paper, specs, tmp_path, log=lambda m: None)
    assert calls == [specs[2].run_id, specs[1].run_id]  # the missing run first, the re-make last
    assert seen[0] == [specs[0].run_id, specs[1].run_id]  # the float32 record stays until it is made again
    assert again[0]["reused"] and not again[1]["reused"] and again[1]["gaussian_sampler"] == "numpy-float64"
