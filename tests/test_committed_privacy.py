"""Every committed result calls a number ``eps_rigorous`` only if it is proven for the noise the run drew: a private
push-sum record names a proven Gaussian sampler (``gaussian_sampler`` proven, ``is_proven_sampler``: torch-float64,
numpy-float64, torch-cuda-float64 or a "+" of them); one drawn with torch's float32 sampler (cut at 5.77 std) carries ``eps_heuristic`` with the note instead, and its report says so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flower_dp.mechanisms.noise import is_proven_sampler
from flower_dp.reproduce import build_specs, get_paper
from flower_dp.reproduce.core import FLOAT32_SAMPLER_NOTE

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
FOLDERS = sorted(p.parent.name for p in RESULTS.glob("*/records.json"))


def _finite(v) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


@pytest.mark.parametrize("folder", FOLDERS)
def test_committed_rigorous_eps_is_proven_for_the_noise_drawn(folder):
    doc = json.loads((RESULTS / folder / "records.json").read_text())
    meta = doc["meta"]
    specs = build_specs(get_paper(meta["paper"]), meta["scale"], meta["table"], int(meta.get("seeds", 1)))
    kinds = {sp.run_id: sp.kind for sp in specs}
    report = (RESULTS / folder / "report.md").read_text()
    for r in doc["records"]:
        if kinds.get(r["run_id"]) != "pushsum":
            continue  # Gau-LRQ: numpy float64 noise, never cut
        if _finite(r.get("eps_rigorous")):
            assert is_proven_sampler(r.get("gaussian_sampler")), (folder, r["run_id"], r.get("gaussian_sampler"))
        if r.get("privacy_note") == FLOAT32_SAMPLER_NOTE:
            assert r.get("eps_rigorous") is None and "Privacy caveat" in report, (folder, r["run_id"])
