"""The noise-binds tables (issue 41): every paper's cells and claims fit together, the claims are decided by the
tests of flower_dp.reproduce.stats on known numbers, and the index's scoreboard counts their categories."""

import json

import numpy as np
import pytest

from flower_dp.reproduce import build_specs, get_paper
from flower_dp.reproduce.cli import scoreboard, write_index
from flower_dp.reproduce.papers import noise_binds as nb

TABLES = [("dp-csgp", "noise-binds", nb._dp_csgp_cells, nb._dp_csgp_tests),
          ("privsgp-vr", "noise-binds", nb._privsgp_vr_cells, nb._privsgp_vr_tests),
          ("dyn-d2p", "noise-binds", nb._dyn_d2p_cells, nb._dyn_d2p_tests),
          ("dyn-d2p", "k-map", nb._kmap_cells, nb._kmap_tests),
          ("partpsp", "noise-binds", nb._partpsp_cells, nb._partpsp_tests),
          ("gau-lrq", "noise-binds", nb._gau_lrq_cells, nb._gau_lrq_tests)]


@pytest.mark.parametrize("paper,table,cells,tests", TABLES)
@pytest.mark.parametrize("scale", ["smoke", "full"])
def test_cells_and_claims_fit_together(paper, table, cells, tests, scale):
    specs = build_specs(get_paper(paper), "paper" if scale == "full" else scale, table, 5)
    ids = [s.run_id for s in specs]
    assert len(ids) == len(set(ids))
    cs = cells(scale)
    keys = {c.key for c in cs}
    assert len(keys) == len(cs)
    assert len(specs) == 5 * len(cs) and all(s.labels["cell"] in keys for s in specs)
    for c in cs:
        assert set(c.twin_of) <= keys
        assert {s.seed for s in specs if s.labels["cell"] == c.key} == set(range(5))
    for t in tests(scale):
        assert t.kind in ("beats", "equiv", "construction")
        assert set(t.a) | set(t.b) <= keys, t.name
    if table == "noise-binds":  # every noise-binds table has a noise-free twin
        assert any(c.twin_of for c in cs)


def _records(cells, values):
    """Fake finished records: cell key -> per-seed accuracies."""
    out = []
    for c in cells:
        for seed, acc in enumerate(values[c.key]):
            eps = c.labels.get("eps")
            out.append({"labels": dict(c.labels), "seed": seed, "final_acc": float(acc), "bits_total": 1e6,
                        "eps_rigorous": None if eps is None or eps == float("inf") else float(eps) * 0.999})
    return out


def test_dyn_d2p_claims_on_known_numbers():
    cells = nb._dyn_d2p_cells("smoke")
    jitter = np.array([0.004, -0.003, 0.002, -0.001, 0.0])
    values = {"Const-D2P-clip-only": 0.80 + jitter, "Dyn-D2P-clip-only": 0.82 + jitter,
              "Const-D2P-eps0.3": 0.60 + jitter, "Dyn-D2P-eps0.3": 0.66 + jitter[::-1],  # +0.06: a clear win
              "Const-D2P-eps3": 0.70 + jitter, "Dyn-D2P-eps3": 0.70 + jitter[::-1] * 0.5}  # equal: no 1-point win
    claims = get_paper("dyn-d2p").check_claims(_records(cells, values), "noise-binds", "smoke")
    by = {c.name: c for c in claims}
    assert by["Dyn-D2P beats Const-D2P at eps 0.3"].category == "substantive pass"
    assert by["Dyn-D2P beats Const-D2P at eps 3"].category == "substantive fail"
    assert by["Const-D2P: accuracy rises with eps (0.3 -> 3)"].passed is True
    regime = [c for c in claims if c.category == "regime"]
    assert len(regime) == 4 and all(c.passed for c in regime)
    assert by["(ours) the rigorous calibration meets every target eps"].category == "by construction"
    assert by["(ours) the rigorous calibration meets every target eps"].passed is True


def test_dp_csgp_equivalence_claims_on_known_numbers():
    cells = nb._dp_csgp_cells("smoke")
    base = np.array([0.55, 0.53, 0.56, 0.54, 0.55])
    values = {"DP2-SGD-clip-only": base + 0.2, "DP2-SGD-eps0.5": base, "rand50-eps0.5": base + [0.003, -0.002, 0.001,
                                                                                                0.0, -0.001],
              "DP2-SGD-eps0.2": base - 0.1}
    claims = get_paper("dp-csgp").check_claims(_records(cells, values), "noise-binds", "smoke")
    by = {c.name: c for c in claims}
    eq = by["rand50 reaches DP2-SGD's accuracy at eps 0.5 (comparable within 0.02)"]
    assert eq.category == "substantive pass" and "TOST" in eq.test
    values["rand50-eps0.5"] = base - 0.1
    by = {c.name: c for c in get_paper("dp-csgp").check_claims(_records(cells, values), "noise-binds", "smoke")}
    assert by["rand50 reaches DP2-SGD's accuracy at eps 0.5 (comparable within 0.02)"].category == "substantive fail"
    assert by["DP2-SGD: accuracy falls as eps falls (0.5 -> 0.2)"].category == "substantive pass"
    # bits are equal in the fake records: the arithmetic claim fails, and is counted apart
    assert by["rand50 sends fewer bits than DP2-SGD"].category == "by construction"


def test_too_few_seeds_is_incomplete_not_a_verdict():
    cells = nb._dyn_d2p_cells("smoke")
    recs = [r for r in _records(cells, {c.key: [0.5] * 5 for c in cells}) if r["seed"] == 0]
    claims = get_paper("dyn-d2p").check_claims(recs, "noise-binds", "smoke")
    assert {c.category for c in claims if c.category not in ("by construction", "regime")} == {"incomplete"}
    assert all(c.passed is None for c in claims if c.category == "incomplete")


def test_scoreboard_counts_categories(tmp_path):
    folder = tmp_path / "dyn-d2p-noise-binds"
    folder.mkdir()
    cats = ["substantive pass", "substantive pass", "substantive fail", "by construction", "not discriminating",
            "regime"]
    claims = [{"name": f"c{i}", "passed": c != "substantive fail", "detail": "", "discriminates": None,
               "discrimination": "", "category": c} for i, c in enumerate(cats)]
    (folder / "claims.json").write_text(json.dumps({"meta": {"paper": "dyn-d2p"}, "claims": claims}))
    lines = scoreboard(tmp_path)
    row = [x for x in lines if x.startswith("| dyn-d2p |")]
    assert row and row[0].startswith("| dyn-d2p | 2 | 1 | 1 | 1 | 1/1 |")
    assert "Scoreboard" in write_index(tmp_path).read_text()
