"""Results name the Gaussian sampler their noise came from; reports flag push-sum runs drawn with torch's float32
sampler (cut at 5.77 std before commit 4575d7e: their eps_rigorous is an ideal Gaussian's, not proven)."""

from __future__ import annotations

import shutil
from pathlib import Path

from flower_dp.mechanisms.noise import GAUSSIAN_SAMPLER
from flower_dp.reproduce import rerender, sampler_label
from flower_dp.rng import noise_record

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def test_results_name_the_float64_sampler():
    assert GAUSSIAN_SAMPLER == "torch-float64"
    assert noise_record(False)["gaussian_sampler"] == noise_record(True)["gaussian_sampler"] == GAUSSIAN_SAMPLER


def test_the_caveat_counts_private_float32_runs_only():
    recs = [{"gaussian_sampler": "torch-float32", "eps_rigorous": 1.2},
            {"gaussian_sampler": "torch-float64", "eps_rigorous": 0.8},
            {"gaussian_sampler": "torch-float32", "eps_rigorous": "inf"},  # non-private: no noise drawn
            {"gaussian_sampler": None, "eps_rigorous": 3.0}]  # Gau-LRQ: numpy float64 noise
    text = sampler_label(recs)
    assert text is not None and "1 of the 3 private runs" in text and "5.77" in text
    assert sampler_label(recs[1:]) is None


def _rerendered(tmp_path: Path, folder: str, paper: str) -> str:
    out = tmp_path / folder
    out.mkdir()
    for name in ("records.json", "records.csv"):
        shutil.copy(RESULTS / folder / name, out / name)
    rerender(out, paper=paper, log=lambda m: None)
    return (out / "report.md").read_text()


def test_committed_push_sum_reports_carry_the_caveat_and_gau_lrq_reports_do_not(tmp_path):
    assert "Privacy caveat" in _rerendered(tmp_path, "dyn-d2p", "dyn-d2p")
    assert "Privacy caveat" not in _rerendered(tmp_path, "gau-lrq", "gau-lrq")
