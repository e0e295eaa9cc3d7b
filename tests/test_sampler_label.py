"""Results name the Gaussian sampler their noise came from; reports flag push-sum runs drawn with torch's float32
sampler (cut at 5.77 std before commit 4575d7e): their eps is an ideal Gaussian's, not proven, so it is reported as
eps_heuristic, and a sweep makes such a run again instead of reusing its record."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from flower_dp.mechanisms.noise import GAUSSIAN_SAMPLER, PROVEN_SAMPLERS
from flower_dp.reproduce import rerender, sampler_label
from flower_dp.reproduce.core import FLOAT32_SAMPLER_NOTE, RunSpec, _committed_record, config_sha, unproven_sampler
from flower_dp.rng import noise_record

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def test_results_name_the_float64_sampler():
    assert GAUSSIAN_SAMPLER == "numpy-float64" and GAUSSIAN_SAMPLER in PROVEN_SAMPLERS
    assert noise_record(False)["gaussian_sampler"] == noise_record(True)["gaussian_sampler"] == GAUSSIAN_SAMPLER


def test_the_caveat_counts_private_float32_runs_only():
    recs = [{"gaussian_sampler": "torch-float32", "eps_rigorous": 1.2},
            {"gaussian_sampler": "torch-float64", "eps_rigorous": 0.8},
            {"gaussian_sampler": "torch-float32", "eps_rigorous": "inf"},  # non-private: no noise drawn
            {"gaussian_sampler": None, "eps_rigorous": 3.0}]  # Gau-LRQ: numpy float64 noise
    text = sampler_label(recs)
    assert text is not None and "1 of the 3 private runs" in text and "5.77" in text
    assert sampler_label(recs[1:]) is None


def test_a_float32_private_record_is_demoted_to_heuristic():
    rec = {"gaussian_sampler": "torch-float32", "eps_rigorous": 1.25,
           "history": [{"iter": 10, "eps_rigorous": 0.5, "acc_avg": 0.6}]}
    out = unproven_sampler(rec)
    assert out["eps_rigorous"] is None and out["eps_heuristic"] == 1.25 and out["privacy_note"] == FLOAT32_SAMPLER_NOTE
    assert out["history"] == [{"iter": 10, "eps_heuristic": 0.5, "acc_avg": 0.6}]
    assert unproven_sampler(out) == out  # idempotent
    assert rec["eps_rigorous"] == 1.25  # the input is not touched
    for kept in ({"gaussian_sampler": "torch-float64", "eps_rigorous": 1.25},  # proven
                 {"gaussian_sampler": "torch-float32", "eps_rigorous": math.inf},  # non-private: no noise drawn
                 {"gaussian_sampler": None, "eps_rigorous": 3.0}):  # Gau-LRQ: numpy float64 noise
        assert unproven_sampler(kept) == kept


def test_a_sweep_remakes_float32_private_runs_and_reuses_the_rest(tmp_path):
    spec = RunSpec(run_id="r", kind="pushsum", config={"a": 1}, labels={}, seed=0)
    base = {"run_id": "r", "status": "finished", "config_sha": config_sha(spec.config)}
    def reused(**rec):
        return _committed_record(spec, tmp_path / "r", {"r": {**base, **rec}}) is not None

    assert not reused(eps_rigorous=1.0)  # from before the field: float32
    assert not reused(gaussian_sampler="torch-float32", eps_rigorous=1.0)
    assert not reused(**unproven_sampler({"gaussian_sampler": "torch-float32", "eps_rigorous": 1.0}))
    assert reused(gaussian_sampler="torch-float64", eps_rigorous=1.0)
    assert reused(eps_rigorous=math.inf)  # non-private twin: no noise, nothing to remake
    assert reused(eps_rigorous=None, eps_heuristic=5.0, privacy_note="heuristic, no DP proof: Laplace")


def _rerendered(tmp_path: Path, folder: str, paper: str, strip: bool = False) -> tuple[str, list[dict]]:
    """Re-render a copy of a committed folder; ``strip``: as if recorded before results named their sampler."""
    out = tmp_path / folder
    out.mkdir()
    doc = json.loads((RESULTS / folder / "records.json").read_text())
    if strip:
        for r in doc["records"]:
            r.pop("gaussian_sampler", None)
            if r.get("privacy_note") == FLOAT32_SAMPLER_NOTE:
                r["eps_rigorous"] = r.pop("eps_heuristic")
                r.pop("privacy_note")
    (out / "records.json").write_text(json.dumps(doc))
    shutil.copy(RESULTS / folder / "records.csv", out / "records.csv")
    rerender(out, paper=paper, log=lambda m: None)
    return (out / "report.md").read_text(), json.loads((out / "records.json").read_text())["records"]


def test_push_sum_records_from_before_the_field_are_labelled_and_not_rigorous(tmp_path):
    text, recs = _rerendered(tmp_path, "dyn-d2p", "dyn-d2p", strip=True)
    assert "Privacy caveat" in text and "eps_heuristic" in text
    private = [r for r in recs if r.get("privacy_note") == FLOAT32_SAMPLER_NOTE]
    assert private and all(r["eps_rigorous"] is None and r["eps_heuristic"] > 0 for r in private)
    assert all(r["gaussian_sampler"] == "torch-float32" for r in recs)


def test_gau_lrq_reports_carry_no_sampler_caveat(tmp_path):
    text, recs = _rerendered(tmp_path, "gau-lrq", "gau-lrq")
    assert "Privacy caveat" not in text
    assert not any(r.get("privacy_note") == FLOAT32_SAMPLER_NOTE for r in recs)


def test_a_checkpoint_from_before_the_float64_sampler_is_not_resumed(tmp_path):
    import pytest

    from flower_dp.errors import CheckpointError
    from flower_dp.recorder import SAMPLER_REFUSAL, RunRecorder, sampler_identity

    RunRecorder(tmp_path, identity={"config": {"a": 1}}).save_checkpoint({"k": 5})  # written before the field
    now = RunRecorder(tmp_path, identity={"config": {"a": 1}, **sampler_identity()}, refusals=SAMPLER_REFUSAL)
    with pytest.raises(CheckpointError, match="torch-float32.*numpy-float64.*unproven; start the run again"):
        now.load_checkpoint()
    now.save_checkpoint({"k": 6})
    assert now.load_checkpoint()["k"] == 6


def test_a_checkpoint_of_the_torch_float64_sampler_is_proven_but_not_mixed(tmp_path):
    """A run's noise comes from one sampler: a torch-float64 checkpoint (proven) is not resumed under numpy-float64,
    and the message says why without calling that noise unproven."""
    import pytest

    from flower_dp.errors import CheckpointError
    from flower_dp.recorder import SAMPLER_REFUSAL, RunRecorder, sampler_identity

    RunRecorder(tmp_path, identity={"config": {"a": 1}, "gaussian_sampler": "torch-float64"}).save_checkpoint({"k": 5})
    now = RunRecorder(tmp_path, identity={"config": {"a": 1}, **sampler_identity()}, refusals=SAMPLER_REFUSAL)
    with pytest.raises(CheckpointError, match="torch-float64.*numpy-float64: a run's noise comes from one sampler") as e:
        now.load_checkpoint()
    assert "unproven" not in str(e.value)


def test_every_report_names_the_party_its_eps_protects_against(tmp_path):
    """A push-sum report states its eps for an out-neighbour; a Gau-LRQ report for the model observer, with the
    other parties in its own section (flower_dp.privacy.parties)."""
    from flower_dp.reproduce import PARTY_SENTENCE

    text, _ = _rerendered(tmp_path, "dyn-d2p", "dyn-d2p")
    assert PARTY_SENTENCE["push_sum"] in text and "party `out_neighbour`" in text
    text, _ = _rerendered(tmp_path, "gau-lrq", "gau-lrq")
    assert PARTY_SENTENCE["gau_lrq"] in text and "## Privacy per party" in text
    assert "another client holds the run secret these runs shared with every client" in text
