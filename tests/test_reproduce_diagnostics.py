"""The diagnostic reproduction tables: per-node evaluation (PartPSP), the aligned and pattern tables' knobs, the
Dyn-D2P clip-scale table and its gradient-norm logger, the DP-CSGP diagnostic and its clip-only twin."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flower_dp.reproduce import get_paper


def _specs(paper: str, table: str, scale: str = "full"):
    return get_paper(paper).build_runs(scale, table, [0])


# ------------------------------------------------------------------------------------------ per-node evaluation

def _tiny_partpsp_nodes(label: str):
    from flower_dp.experiments import config_from_dict
    from flower_dp.experiments.runner import build_experiment
    from flower_dp.reproduce.papers.partpsp.aligned import aligned_spec

    spec = aligned_spec("smoke", 0, label, 3.0, "2-Out", figure="test")
    nodes, _, _, (x, y), model, _ = build_experiment(config_from_dict(spec.config))
    g = torch.Generator().manual_seed(1)
    for n in nodes:  # nodes that disagree, in the shared part and the heads
        n.x = n.x + 0.1 * torch.randn(n.x.shape, generator=g)
        n.w = n.w * (1.0 + 0.5 * torch.rand((), generator=g))
        if hasattr(n, "l") and n.l.numel():
            n.l = n.l + 0.1 * torch.randn(n.l.shape, generator=g)
    return nodes, x, y, model


def test_node_eval_equals_a_hand_loop_on_partpsp1():
    """Each node's accuracy on (the exact mean of the nodes' shared z) + (its own head), by hand."""
    from flower_dp.experiments.runner import evaluate_params
    from flower_dp.reproduce.node_eval import node_eval_accuracies

    nodes, x, y, model = _tiny_partpsp_nodes("PartPSP-1")
    shared = sum(n.z().double() for n in nodes) / len(nodes)
    want = []
    for n in nodes:
        full = n.eval_params().clone()
        full[n.shared_idx] = shared.float()
        assert torch.equal(full[n.local_idx], n.l)
        want.append(evaluate_params(model, full, x, y)[0])
    got = node_eval_accuracies(nodes, lambda flat: evaluate_params(model, flat, x, y)[0])
    assert got == pytest.approx(want, abs=0)
    assert len(set(np.round(got, 6))) > 1  # the heads differ, so do the nodes' accuracies


def test_node_eval_of_a_fully_shared_model_is_the_network_average():
    from flower_dp.experiments.runner import InProcessBackend, evaluate_params
    from flower_dp.reproduce.node_eval import node_eval_accuracies

    nodes, x, y, model = _tiny_partpsp_nodes("SGPDP")
    got = node_eval_accuracies(nodes, lambda flat: evaluate_params(model, flat, x, y)[0])
    avg = evaluate_params(model, InProcessBackend(nodes, receivers=None).network_average(), x, y)[0]
    assert got == pytest.approx([avg] * len(nodes), abs=1e-6)


def test_node_eval_lands_in_the_record(tmp_path):
    """A node_eval run writes acc_node_eval (the mean of its per-node accuracies) into its record; a reused run
    keeps it."""
    from flower_dp.reproduce.core import _run_pushsum, record_from_doc
    from flower_dp.reproduce.papers.partpsp.aligned import aligned_spec

    spec = aligned_spec("smoke", 0, "PartPSP-1", 3.0, "2-Out", figure="test", rounds=4)
    doc = _run_pushsum(spec, tmp_path / "run", "inprocess")
    rec = record_from_doc(spec, doc)
    per = rec["acc_node_eval_per_node"]
    assert len(per) == spec.config["topology"]["n_nodes"]
    assert rec["acc_node_eval"] == pytest.approx(float(np.mean(per)))
    again = _run_pushsum(spec, tmp_path / "run", "inprocess")
    assert again.get("_reused") and again["extra_record"]["acc_node_eval"] == rec["acc_node_eval"]


# ---------------------------------------------------------------------------------------------- table knobs

def test_table2_aligned_builds_the_authors_settings():
    from flower_dp.reproduce.papers.partpsp.aligned import ALIGNED_TOPOS

    specs = _specs("partpsp", "table2-aligned")
    assert len(specs) == 3 * (len(ALIGNED_TOPOS["full"]) * 2 + 1)  # 3 algorithms x (graphs x b1, b3) + NoDP
    for s in specs:
        p = s.config["algorithm"]["params"]
        assert s.node_eval
        assert s.config["data"]["scaling"] == "unit"
        assert p["sync_period"] == 4 and p["decay_at"] == [240, 540]
        assert s.config["run"]["num_iters"] == 720
    committed = _specs("partpsp", "table2")
    assert not any(s.node_eval or s.config["data"].get("scaling") for s in committed)  # table2 as committed


def test_pattern_diag_pairs_differ_in_one_factor():
    specs = _specs("partpsp", "pattern-diag")
    by = {}
    for s in specs:
        lab = s.labels
        by.setdefault((lab["algorithm"], lab["b"], lab["length"]), {})[lab["scaling"]] = s
    pairs = [v for v in by.values() if len(v) == 2]
    assert len(pairs) == 4  # PartPSP-2 at b1, b3; SGPDP at b3; PartPSP-1 at Table 3's b5 on 2-Out
    for pair in pairs:
        a, b = pair["standard"].config, pair["unit"].config
        assert "scaling" not in a["data"] and b["data"]["scaling"] == "unit"
        strip = lambda c: {**c, "run": {**c["run"], "name": ""}, "data": {k: v for k, v in c["data"].items()
                                                                          if k != "scaling"}}
        assert strip(a) == strip(b)
        assert "decay_at" not in a["algorithm"]["params"] and a["algorithm"]["params"]["sync_period"] == 5
    one = [s for s in specs if s.labels["length"] == "one epoch"]
    assert len(one) == 1 and one[0].config["run"]["num_iters"] == 60


def test_clip_scale_table_runs_the_scaled_bounds():
    from flower_dp.reproduce.papers.dyn_d2p._shared import CLIP
    from flower_dp.reproduce.papers.dyn_d2p.clip_scale import CLIP_SCALE, K_CLIP, SMALL_CLIP, SMALL_MODEL

    specs = _specs("dyn-d2p", "clip-scale")
    push = [s for s in specs if s.kind == "pushsum"]
    norms = [s for s in specs if s.kind == "gradnorm"]
    assert len(norms) == 4 and {s.config["clip"] for s in norms} == {None, 1.5, 1.5 * CLIP_SCALE}
    for s in push:
        p, lab = s.config["algorithm"]["params"], s.labels
        assert p["lr"] == 0.03 and s.config["run"]["num_iters"] == K_CLIP["full"]
        if lab["bounds"] == "scaled":
            want = SMALL_CLIP if lab["model"] == SMALL_MODEL else {k: v * CLIP_SCALE for k, v in CLIP["table2"].items()}
            assert (p["clip0"], p["clip_bar"]) == (want["clip0"], want["clip_bar"])
        elif lab["bounds"] == "paper":
            assert (p["clip0"], p["clip_bar"]) == (4.0, 1.5)
    cells = {(s.labels["algorithm"], s.labels["eps"], s.labels["calibration"]) for s in push
             if s.labels["bounds"] == "scaled" and s.labels["model"] != SMALL_MODEL}
    for alg in ("Const-D2P", "Dyn-D2P"):
        for eps in (0.3, 3.0):
            for cal in ("paper", "rigorous"):
                assert (alg, eps, cal) in cells
        assert (alg, math.inf, "clip only") in cells


def test_dp_csgp_diag_modes_and_the_clip_only_plan():
    from clients.dp_csgp import DPCSGPParams, prepare_dp_csgp

    specs = _specs("dp-csgp", "diag")
    modes = {s.labels["mode"]: s.config["algorithm"]["params"] for s in specs}
    assert modes["clip only"]["clip_only"] and modes["nonprivate"]["nonprivate"]
    assert {s.config["algorithm"]["params"]["lr"] for s in specs} == {0.01, 0.1}
    kw = dict(n_nodes=2, samples_per_node=[600, 600], num_iters=5, dim=10, seed=0)
    priv = prepare_dp_csgp(DPCSGPParams(epsilon=0.5, G=0.5), **kw)
    twin = prepare_dp_csgp(DPCSGPParams(epsilon=0.5, G=0.5, clip_only=True), **kw)
    assert np.all(np.asarray(priv.noise_std) > 0) and np.all(np.asarray(twin.noise_std) == 0)
    assert np.all(np.asarray(twin.clip) == 0.5) and all(math.isinf(e) for e in twin.eps_paper)
    assert DPCSGPParams(clip_only=True, nonprivate=True).problems()


# ------------------------------------------------------------------------------------------ gradient norms

def test_gradient_norms_match_a_per_sample_loop():
    from flower_dp.models import cross_entropy_loss
    from flower_dp.reproduce.papers.dyn_d2p.clip_scale import gradient_norms

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    x, y = torch.randn(8, 1, 3, 4), torch.randint(0, 3, (8,))
    per = []
    for i in range(8):
        model.zero_grad()
        cross_entropy_loss(model(x[i:i + 1]), y[i:i + 1]).backward()
        per.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    norms = torch.stack(per).norm(dim=1).numpy()
    got = gradient_norms(model, x, y, batch=4, chunk=3)
    assert got["grad_norm_sample_median"] == pytest.approx(np.median(norms), rel=1e-5)
    assert got["grad_norm_sample_max"] == pytest.approx(norms.max(), rel=1e-5)
    assert got["grad_norm_sample_p90"] == pytest.approx(np.percentile(norms, 90), rel=1e-5)
    batch = []  # the batch-mean gradient is the ordinary gradient of the batch's mean loss
    for i in (0, 4):
        model.zero_grad()
        cross_entropy_loss(model(x[i:i + 4]), y[i:i + 4]).backward()
        batch.append(float(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()))
    assert got["grad_norm_batch_mean"] == pytest.approx(np.mean(batch), rel=1e-5)


def test_train_with_gradient_norms_logs_and_clips():
    from flower_dp.reproduce.papers.dyn_d2p.clip_scale import train_with_gradient_norms

    class Data:
        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.x, self.y = torch.randn(n, 1, 3, 4, generator=g), torch.randint(0, 3, (n,), generator=g)

    def run(clip):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
        rows = train_with_gradient_norms(model, Data(64, 1), Data(32, 2), steps=6, every=3, batch=8, lr=0.5,
                                         clip=clip, probe=16, seed=0)
        return rows, torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    rows, free = run(None)
    assert [r["k"] for r in rows] == [0, 3, 6] and all(0 <= r["acc_avg"] <= 1 for r in rows)
    assert rows[0]["grad_norm_sample_median"] > 0
    _, huge = run(1e9)  # a bound no gradient reaches: the same steps as unclipped SGD
    assert torch.allclose(free, huge, atol=1e-5)
    _, tight = run(1e-3)  # each step moves the model by at most lr * C
    torch.manual_seed(0)
    start = torch.cat([p.detach().reshape(-1) for p in torch.nn.Sequential(torch.nn.Flatten(),
                                                                           torch.nn.Linear(12, 3)).parameters()])
    assert float((tight - start).norm()) <= 6 * 0.5 * 1e-3 + 1e-6


def test_gradnorm_runner_records_keep_their_norms(tmp_path):
    """A gradnorm run's record keeps its gradient-norm history (flagged as released statistics, so a re-render does
    not strip it), and a second call reuses the run."""
    from flower_dp.reproduce.core import record_from_doc
    from flower_dp.reproduce.papers.dyn_d2p.clip_scale import run_gradnorm

    spec = next(s for s in _specs("dyn-d2p", "clip-scale", "smoke") if s.kind == "gradnorm")
    doc = run_gradnorm(spec, tmp_path / "g", "inprocess")
    rec = record_from_doc(spec, doc)
    assert rec["uncharged_statistics_released"]
    assert [h["k"] for h in rec["history"]] == [0, 2, 4]
    assert all(h["grad_norm_sample_median"] > 0 and h["grad_norm_batch_mean"] > 0 for h in rec["history"])
    assert run_gradnorm(spec, tmp_path / "g", "inprocess").get("_reused")


# ------------------------------------------------------------------------------------------ computed verdicts

def _records(paper: str, table: str, acc: dict[str, float], scale: str = "full", **extra):
    """One record per run of the table whose id is in ``acc``, with that final accuracy (and ``extra`` fields)."""
    return [{"run_id": s.run_id, "seed": 0, "labels": dict(s.labels), "final_acc": acc[s.run_id], **extra}
            for s in _specs(paper, table, scale) if s.run_id in acc]


_CLIP_ACC = {"clipscale-nonprivate-s0": 0.817, "clipscale-lenet-nonprivate-s0": 0.755,
             "clipscale-const-eps0.3-paper-scaled-s0": 0.692, "clipscale-dyn-eps0.3-paper-scaled-s0": 0.645,
             "clipscale-const-eps0.3-paper-paper-s0": 0.661, "clipscale-dyn-eps0.3-paper-paper-s0": 0.717,
             "clipscale-lenet-const-eps0.3-paper-scaled-s0": 0.659, "clipscale-lenet-dyn-eps0.3-paper-scaled-s0": 0.725}


def test_clip_scale_verdict_counts_a_drop_as_a_move():
    """Scaling the bounds that costs Dyn-D2P 0.072 is shown, not ruled out; a change within MOVES is ruled out."""
    from flower_dp.reproduce.papers.dyn_d2p.clip_scale import MOVES, verdict

    text = verdict(_records("dyn-d2p", "clip-scale", _CLIP_ACC), "full")
    shown, ruled_out = text.split("ruled out")
    assert "Dyn-D2P: clip bounds x7 0.717 -> 0.645 (-0.072)" in shown
    assert "Const-D2P: the smaller model" in ruled_out  # gaps 0.125 vs 0.096: 0.029 <= 0.03
    assert "Dyn-D2P minus Const-D2P at eps 0.3" in text and "the paper's +39.5" in text
    assert "No eps 0.3 cell comes within 0.03 of the paper's" in text and "stays open" in text
    near = dict(_CLIP_ACC, **{"clipscale-dyn-eps0.3-paper-paper-s0": 0.84})
    assert "Within 0.03 of the paper's eps 0.3 accuracy: Dyn-D2P 0.840 (shallow_cnn, paper bounds" in verdict(
        _records("dyn-d2p", "clip-scale", near), "full")
    flat = dict(_CLIP_ACC, **{"clipscale-dyn-eps0.3-paper-scaled-s0": 0.717 - MOVES / 2})
    assert "Dyn-D2P: clip bounds x7" in verdict(_records("dyn-d2p", "clip-scale", flat), "full").split("ruled out")[1]
    assert verdict([], "full").startswith("Verdict: open")


def test_pattern_verdict_names_what_the_inputs_explain():
    from flower_dp.reproduce.papers.partpsp.aligned import verdict_pattern

    ids = [s.run_id for s in _specs("partpsp", "pattern-diag")]
    acc = {i: (0.80 if "partpsp_2" in i.lower() or "partpsp-2" in i.lower() else 0.09) for i in ids}
    unit = [i for i in ids if "unit" in i]
    acc.update({i: acc[i] - 0.05 for i in unit})
    text = verdict_pattern(_records("partpsp", "pattern-diag", acc), "full")
    assert "explains at most 9%" in text and "(not the cause)" in text
    assert "70.6 vs 67.7 % at b = 5, 2-Out, 68.6 vs 34.1 % at b = 3, 4-Out" in text and "is MNIST's" in text
    assert "near chance at every length" in text
    acc.update({i: 0.5 for i in ids if "sgpdp" in i.lower() and "unit" in i})
    assert "not near chance" in verdict_pattern(_records("partpsp", "pattern-diag", acc), "full")


def test_pattern_verdict_sets_partpsp1s_table3_sensitivity_beside_the_authors_log():
    from flower_dp.reproduce.papers.partpsp.aligned import verdict_pattern

    ids = [s.run_id for s in _specs("partpsp", "pattern-diag")]
    recs = _records("partpsp", "pattern-diag", {i: 0.7 if "unit" in i else 0.6 for i in ids})
    for r in recs:
        r["history"] = [{"k": 1, "sensitivity_real": 20.0 if r["labels"]["scaling"] == "unit" else 80.0}]
    text = verdict_pattern(recs, "full")
    assert ("PartPSP-1 at Table 3's b = 5 on 2-Out: [0, 1] inputs +0.100 (0.600 -> 0.700) with mean real "
            "sensitivity 80.0 -> 20.0 (the authors' released log: 18.4 at 88.50 % on MNIST)") in text, text


def test_pattern_verdict_weighs_the_authors_noise_scale_from_the_logged_sensitivities():
    """The estimate / real ratio and the noise-std ratio come from the runs' history rows."""
    from flower_dp.reproduce.papers.partpsp.aligned import verdict_pattern

    ids = [s.run_id for s in _specs("partpsp", "pattern-diag")]
    recs = _records("partpsp", "pattern-diag", {i: 0.8 if "PartPSP-2" in i else 0.09 for i in ids})
    for r in recs:
        big = r["labels"]["b"] == "b1"
        r["history"] = [{"k": k, "sensitivity_real": 100.0, "sensitivity_est": 120.0 + k,
                         "noise_std": 50.0 if big else 1.0} for k in (1, 2, 3)]
    text = verdict_pattern(recs, "full")
    assert "estimate / real 1.22-1.22 (median per run)" in text, text
    assert "mean noise std differs 50x, end within 0.000" in text and "1.2x larger does not explain" in text
    del_hist = [{k: v for k, v in r.items() if k != "history"} for r in recs]
    assert "estimate / real" not in verdict_pattern(del_hist, "full")


def test_table3_verdict_weighs_the_noise_against_the_noise_free_run():
    """Gau-LRQ Table III: the z ratio across N (ours and the paper's) and whether the private cells sit within
    T3_NOISE_LIMITED of the noise-free control decide the verdict."""
    from flower_dp.reproduce.papers.gau_lrq import T3_CONTROL, verdict_table3

    ids = [s.run_id for s in _specs("gau-lrq", "table3")]
    z = {960: 2.8, 1920: 2.0, 3840: 1.6, 5760: 1.4}
    recs = _records("gau-lrq", "table3", {i: 0.78 for i in ids})
    for r in recs:
        r["z_first"] = z.get(r["labels"]["N"], float("nan")) if r["labels"]["algorithm"] != T3_CONTROL else 0.0
    ctrl = next(r for r in recs if r["labels"]["algorithm"] == T3_CONTROL)
    ctrl["final_acc"] = 0.80
    text = verdict_table3(recs)
    assert "noise multiplier 2.800 -> 1.400 (2.0x), the paper's closed form 1.414 -> 0.236 (6.0x)" in text, text
    assert "within 0.020 of it" in text and "not noise-limited" in text and "87.1 -> 97.5 %" in text
    ctrl["final_acc"] = 0.90
    assert "up to 0.120 above the private cells" in verdict_table3(recs)
    ctrl["final_acc"] = 0.77
    assert "every private cell is at or above it (by 0.010 at least)" in verdict_table3(recs)
    assert verdict_table3([r for r in recs if r["labels"]["N"] == 960]).startswith("Verdict: open")


def test_a_report_names_the_runs_without_a_record(tmp_path):
    """A cut sweep's report lists each run of the table that has no record, and the index counts them."""
    import json
    from pathlib import Path

    from flower_dp.reproduce import missing_runs, rerender
    from flower_dp.reproduce.cli import write_index

    doc = json.loads((Path(__file__).resolve().parent.parent / "docs" / "results" / "partpsp-pattern-diag-paper"
                      / "records.json").read_text())
    ids = [r["run_id"] for r in doc["records"]]
    assert missing_runs(get_paper("partpsp"), doc["meta"], doc["records"]) == []
    dropped = [s.run_id for s in _specs("partpsp", "pattern-diag") if s.run_id in ids][1:3]
    doc["records"] = [r for r in doc["records"] if r["run_id"] not in dropped]
    assert missing_runs(get_paper("partpsp"), doc["meta"], doc["records"]) == dropped
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "records.json").write_text(json.dumps(doc))
    rerender(tmp_path / "t", log=lambda m: None)
    report = (tmp_path / "t" / "report.md").read_text()
    assert f"**Incomplete: 2 of the {len(ids)} runs of this table have no record** ({', '.join(dropped)})" in report
    index = write_index(tmp_path).read_text()
    assert f"| {len(ids) - 2} (2 not run) |" in index
