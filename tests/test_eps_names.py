"""Names that do not lie (issue 12 item 4): ``eps_rigorous`` only for mechanisms whose proof the accountant implements.

The DPPS family (PartPSP, SGPDP, PEDFL: Laplace noise scaled to a data-dependent sensitivity estimate broadcast
in the clear) and BQ-SGD (binomial noise matched by variance to the Gaussian) have no DP proof: their number is
``eps_heuristic`` with a ``privacy_note``, and ``eps_rigorous`` is null (present, None) everywhere: node privacy
reports, plan summaries, Gau-LRQ results, reproduction records, re-rendered reports.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flower_dp.clients import registry

from test_budget_every_algorithm import CASES

HEURISTIC = {"partpsp", "sgpdp", "pedfl"}
ALL_CASES = {**CASES, "sgp": ({}, "logreg", "exp_one_peer")}
N, K, J = 4, 3, 16


def _run(case, tmp_path):
    """A small synthetic run of ``case`` (as tests/test_budget_every_algorithm.py builds them): (plan, RunResult)."""
    from flower_dp.experiments import config_from_dict, run_experiment
    from flower_dp.experiments.runner import build_experiment

    params, model, topo = ALL_CASES[case]
    algo = "dyn_d2p" if case == "const_d2p" else case
    cfg = config_from_dict({
        "run": {"name": case, "seed": 0, "num_iters": K, "eval_every": K, "progress": False},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": J, "test_samples": 50},
        "model": {"name": model},
        "topology": {"name": topo, "n_nodes": N},
        "algorithm": {"name": algo, "params": {"lr": 0.05, "batch_size": 4, **params}},
    })
    _, plan, *_ = build_experiment(cfg)
    return plan, run_experiment(cfg, out_dir=tmp_path)


def test_every_registry_algorithm_is_covered():
    assert {("dyn_d2p" if c == "const_d2p" else c) for c in ALL_CASES} == set(registry.ALGORITHMS)


@pytest.mark.parametrize("case", sorted(ALL_CASES))
def test_privacy_report_is_rigorous_xor_heuristic(case, tmp_path):
    """Every algorithm: a finite eps_rigorous for a private proven mechanism (inf when nothing is charged), or
    eps_heuristic with a note and eps_rigorous None for the DPPS family; never both, never a heuristic number
    under the rigorous name (node report, planned values, plan summary)."""
    plan, res = _run(case, tmp_path)
    nodes = res.nodes
    heuristic = plan.algorithm in HEURISTIC
    assert plan.heuristic == heuristic and plan.eps_key == ("eps_heuristic" if heuristic else "eps_rigorous")
    summary = plan.summary()
    for nd in nodes:
        rep = nd.privacy_report()
        assert (rep.get("eps_rigorous") is not None) != (rep.get("eps_heuristic") is not None), rep
        assert "eps_rigorous" in rep  # null, not absent: one shape for every consumer
        if heuristic:
            assert rep["eps_rigorous"] is None and "eps_rigorous_planned" not in rep
            assert math.isfinite(rep["eps_heuristic"]) and rep["eps_heuristic"] > 0
            assert rep["eps_heuristic_planned"] == pytest.approx(plan.eps_heuristic[nd.node_id])
            assert "no DP proof" in rep["privacy_note"] and "sensitivity" in rep["privacy_note"]
        elif plan.private:
            assert math.isfinite(rep["eps_rigorous"]) and rep["eps_rigorous"] > 0
            assert "eps_heuristic" not in rep and "privacy_note" not in rep
        else:
            assert math.isinf(rep["eps_rigorous"])
    written = json.loads((tmp_path / "results.json").read_text())["privacy"]
    assert [p.get("eps_rigorous") is None for p in written["per_node"]] == [heuristic] * N
    if heuristic:
        assert summary["eps_rigorous"] is None and "eps_heuristic" in summary and "privacy_note" in summary
        assert all(v is None for v in plan.eps_rigorous) and written["plan"]["eps_rigorous"] is None
        assert res.eps_rigorous_max is None and res.eps_heuristic_max > 0
    else:
        assert summary["eps_rigorous"] is not None and "eps_heuristic" not in summary


def test_heuristic_budget_truncation_is_named_heuristic():
    """budget_epsilon on a DPPS plan still truncates K (on the heuristic eps) and says so; eps_rigorous stays None."""
    params, *_ = CASES["partpsp"]
    kw = dict(n_nodes=N, samples_per_node=[J] * N, num_iters=40, dim=12, seed=0)
    full = registry.prepare("partpsp", {**params, "model_name": "logreg"}, **kw)
    cut = registry.prepare("partpsp", {**params, "model_name": "logreg", "budget_epsilon": 0.5 * full.eps_planned(0)}, **kw)
    assert 0 < cut.num_iters < 40 and all(v is None for v in cut.eps_rigorous)
    assert cut.eps_planned(0) <= 0.5 * full.eps_planned(0) * (1 + 1e-9)
    note = next(w for w in cut.warnings if "budget hard stop" in w)
    assert "heuristic eps" in note and "rigorous" not in note
    off = registry.ablate(cut)
    assert all(v is None for v in off.eps_rigorous) and math.isinf(off.eps_heuristic[0])


def test_bq_sgd_result_has_no_rigorous_eps(tmp_path):
    """BQ-SGD (variance-matched binomial noise): eps_rigorous None in the result, every round and the privacy block;
    eps_heuristic carries the Gaussian's eps with the note.  A proven method (Gau-SGD) at the same z: eps_rigorous."""
    from flower_dp.experiments.gau_lrq import run_table

    small = dict(num_clients=6, clients_per_round=2, num_rounds=2, local_steps=1, dataset="synthetic_fashion_mnist",
                 model="logreg", per_class=3, test_samples=100, lr=0.1, noise_multiplier=1.0)
    table = run_table(tmp_path, methods=("bq-sgd", "gau-sgd"), **small)
    bq = json.loads((tmp_path / "bq-sgd" / "results.json").read_text())
    gau = json.loads((tmp_path / "gau-sgd" / "results.json").read_text())
    assert bq["eps_rigorous"] is None and bq["eps_heuristic"] > 0 and "no DP proof" in bq["privacy_note"]
    assert "variance" in bq["privacy_note"]
    assert all(r["eps_rigorous"] is None and r["eps_heuristic"] > 0 for r in bq["rounds"])
    assert bq["privacy"]["eps_rigorous_plan"] is None and bq["privacy"]["eps_heuristic_plan"] > 0
    assert gau["eps_rigorous"] == pytest.approx(bq["eps_heuristic"]) and "eps_heuristic" not in gau
    rows = {r["method"]: r for r in table["rows"]}
    assert rows["bq-sgd"]["eps_rigorous"] is None and rows["bq-sgd"]["eps_heuristic"] == bq["eps_heuristic"]
    bq_line = next(line for line in table["markdown"].splitlines() if line.startswith("| BQ-SGD"))
    assert "heuristic" in bq_line


def test_reproduce_records_and_rerender_rename_heuristic_eps(tmp_path):
    """A records.json written before the rename (DPPS and BQ-SGD numbers under eps_rigorous): the re-render
    (no run repeated, no runs/ folder) gives them eps_heuristic + note and eps_rigorous null, in records,
    records.csv, summary.csv and the report; proven records keep eps_rigorous."""
    from flower_dp import results as rio
    from flower_dp.reproduce import rerender
    from flower_dp.reproduce.core import group_records, migrate_record

    hist = [{"k": 0, "acc_avg": 0.1, "bits_total": 0.0, "eps_rigorous": 0.0},
            {"k": 2, "acc_avg": 0.5, "bits_total": 10.0, "eps_rigorous": 7.0, "loss": 1.0}]
    base = {"seed": 0, "status": "finished", "num_iters": 2, "final_acc": 0.5, "best_acc": 0.5, "final_loss": 1.0,
            "bits_total": 10.0, "eps_paper": 1.0, "delta": 1e-5, "dataset": "fashion_mnist", "synthetic_data": False,
            "backend": "inprocess", "wall_time_s": 1.0, "train_cpu_s": "nan", "reused": True, "cpu_time_s": 1.0}
    bq = {"run_id": "table4-bq-sgd-s0", **base, "eps_rigorous": 7.0,
          "labels": {"table": "table4", "algorithm": "BQ-SGD", "N": 400}, "history": hist}
    gau = {"run_id": "table4-gau-sgd-s0", **base, "eps_rigorous": 7.0,
           "labels": {"table": "table4", "algorithm": "Gau-SGD", "N": 400}, "history": hist}
    m = migrate_record(bq)
    assert m["eps_rigorous"] is None and m["eps_heuristic"] == 7.0 and "variance" in m["privacy_note"]
    assert "eps_rigorous" not in m["history"][1] and m["history"][1]["eps_heuristic"] == 7.0
    assert migrate_record(m) == m and migrate_record(gau) == gau  # idempotent; proven records untouched
    g = {x["algorithm"]: x for x in group_records([m, migrate_record(gau)])}
    assert g["BQ-SGD"]["eps_rigorous"] is None and g["BQ-SGD"]["eps_heuristic"] == 7.0
    assert g["Gau-SGD"]["eps_rigorous"] == 7.0 and "eps_heuristic" not in g["Gau-SGD"]

    meta = {"threads": 1, "paper": "gau-lrq", "title": "t", "table": "table4", "scale": "ci", "backend": "inprocess",
            "seeds": 1, "command": "flower-dp reproduce gau-lrq", "machine": "m", "versions": {}}
    rio.write_json(tmp_path / "records.json", {"meta": meta, "records": [gau, bq]})
    rep = rerender(tmp_path, paper="gau-lrq", log=lambda *_: None)
    doc = json.loads((tmp_path / "records.json").read_text())
    by = {r["labels"]["algorithm"]: r for r in doc["records"]}
    assert by["BQ-SGD"]["eps_rigorous"] is None and by["BQ-SGD"]["eps_heuristic"] == 7.0
    assert by["Gau-SGD"]["eps_rigorous"] == 7.0 and "eps_heuristic" not in by["Gau-SGD"]
    assert all("loss" not in h for r in doc["records"] for h in r["history"])  # uncharged statistics stay out
    report = rep.report_path.read_text()
    assert "Re-rendered from `records.json`" in report and "eps heuristic (no DP proof)" in report
    bq_row = next(line for line in report.splitlines() if line.startswith("| BQ-SGD"))
    assert bq_row.split("|")[6].strip() == "-" and bq_row.split("|")[7].strip() == "7.000"
    csv_head = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    assert "eps_heuristic" in csv_head and "eps_rigorous" in csv_head
    with pytest.raises(Exception, match="not 'partpsp'"):
        rerender(tmp_path, paper="partpsp", log=lambda *_: None)

    def reaccount(records):  # the re-accounting hook: sees each run's config, returns the records to render
        assert all(r["config"]["method"] in ("gau-sgd", "bq-sgd") for r in records)
        return [dict(r, eps_rigorous=6.5) if r["eps_rigorous"] is not None else r for r in records]

    rerender(tmp_path, transform=reaccount, log=lambda *_: None)
    doc = json.loads((tmp_path / "records.json").read_text())
    by = {r["labels"]["algorithm"]: r for r in doc["records"]}
    assert by["Gau-SGD"]["eps_rigorous"] == 6.5 and by["BQ-SGD"]["eps_rigorous"] is None
    assert all("config" not in r for r in doc["records"])  # the configs are lent to the hook, not stored


def test_runner_results_and_record_of_a_dpps_run(tmp_path):
    """The in-process runner's results.json, RunResult and the reproduce record of a DPPS run: heuristic only."""
    from flower_dp.experiments import config_from_dict, run_experiment
    from flower_dp.reproduce.core import RunSpec, record_from_doc

    params, model, topo = CASES["pedfl"]
    cfg = {"run": {"name": "p", "seed": 0, "num_iters": 2, "eval_every": 2, "progress": False},
           "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 16, "test_samples": 50},
           "model": {"name": model}, "topology": {"name": topo, "n_nodes": N},
           "algorithm": {"name": "pedfl", "params": {"lr": 0.05, "batch_size": 4, **params}}}
    res = run_experiment(config_from_dict(cfg), out_dir=tmp_path)
    assert res.eps_rigorous_max is None and res.eps_heuristic_max > 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert all(p["eps_rigorous"] is None and p["eps_heuristic"] > 0 for p in doc["privacy"]["per_node"])
    assert doc["privacy"]["plan"]["eps_rigorous"] is None
    rec = record_from_doc(RunSpec("p", {"algorithm": "PEDFL"}, cfg), doc)
    assert rec["eps_rigorous"] is None and rec["eps_heuristic"] == pytest.approx(res.eps_heuristic_max)
    assert "no DP proof" in rec["privacy_note"]
    assert np.isfinite(rec["eps_heuristic"])


def test_gau_lrq_float32_layers_have_no_rigorous_eps():
    """layer_dtype='float32' draws the LRQ layers from 24-bit uniforms (half-width cut near 5.77 sigma): the decoded
    error is not the exact Gaussian the accountant charges, so its eps is eps_heuristic, and Flower's accountant (which
    would call it a guarantee) is refused; the float64 default stays rigorous."""
    from flower_dp.strategies.gau_lrq import FLOAT32_LAYER_NOTE, GauLRQ

    kw = dict(num_clients=6, clients_per_round=2, num_rounds=2, clip=1.0, epsilon=3.0, delta=1e-5, secret=bytes(32))
    f32 = GauLRQ(layer_dtype="float32", **kw)
    assert f32.heuristic_note == FLOAT32_LAYER_NOTE and "5.77" in FLOAT32_LAYER_NOTE
    assert f32._eps_fields(1.5) == {"eps_rigorous": None, "eps_heuristic": 1.5}
    assert GauLRQ(**kw).heuristic_note is None and GauLRQ(**kw)._eps_fields(1.5) == {"eps_rigorous": 1.5}
    assert GauLRQ(layer_dtype="float32", method="gaussian", **kw).heuristic_note is None  # numpy float64 noise

    class _Acc:  # only .config is read before the refusal
        config = None

    with pytest.raises(ValueError, match="layer_dtype='float32'"):
        GauLRQ(layer_dtype="float32", accountant=_Acc(), **kw)
