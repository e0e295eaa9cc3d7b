"""PrivSGP-VR Figs. 1 / 6: linear speedup in the number of nodes n at constant noise."""

from __future__ import annotations

import math
from pathlib import Path

from ...core import Claim, Table, acc_pm, cells_of, fmt, group_records, new_axes, savefig
from .._common import md_table, plot_curves, pushsum_spec
from ._shared import DELTA, MODEL, SETTINGS, _common, differences

#: linear speedup at a constant noise sigma^2 = 0.01 (not privacy calibrated), J fixed per node
SPEEDUP_N = {"smoke": (2, 4), "ci": (5, 10, 20), "full": (25, 50, 100),
             "cifar-full": (8, 16, 32, 64), "cifar-smoke": (2, 4)}


def _build_speedup(scale: str, seeds: list[int]):
    s = SETTINGS[scale]
    K = s["vr_K"]
    base = dict(batch_size=s["block"], G=s["G"], lr=s["lr"], delta=DELTA, noise_std=math.sqrt(s.get("sigma2", 0.01)))
    return [pushsum_spec(f"fig6-n{n}", {"figure": "fig6", "n": n, "K": K}, seed=seed, num_iters=K,
                         eval_every=max(1, K // 4), topology="exp_one_peer", algorithm="privsgp_vr", checkpoint=False,
                         params=base, **dict(_common(s), n_nodes=n))
            for seed in seeds for n in SPEEDUP_N[scale]]


def _loss_at(rec, k: int) -> float:
    for h in rec.get("history", []):
        if int(h["k"]) == k:
            return float(h["test_loss_avg"])
    return float("nan")


def _claims_speedup(records) -> list[Claim]:
    gs = sorted(group_records(records), key=lambda g: g["n"])
    claims = [Claim("more nodes reach a lower test loss in the same K (sigma^2 = 0.01)",
                    all(a["final_loss"] > b["final_loss"] for a, b in zip(gs, gs[1:])),
                    ", ".join(f"n={g['n']}: loss {fmt(g['final_loss'])}" for g in gs),
                    cells=cells_of(*((f"n={g['n']}", g) for g in gs), key="final_loss"), ordered=True)]
    for a, b in zip(gs, gs[1:]):
        if b["n"] != 2 * a["n"]:
            continue
        K = int(a["K"])
        la = sum(r["final_loss"] for r in a["records"]) / len(a["records"])
        lb = sum(_loss_at(r, K // 2) for r in b["records"]) / len(b["records"])
        claims.append(Claim(f"linear speedup: n = {b['n']} at K/2 = {K // 2} is as good as n = {a['n']} at K = {K}",
                            bool(lb <= 1.05 * la), f"test loss {fmt(lb)} vs {fmt(la)}"))
    return claims


def _render_speedup(records, scale: str, out: Path):
    gs = sorted(group_records(records), key=lambda g: g["n"])
    s = SETTINGS[scale]
    lines = [f"## Figs. 1 / 6 analogue: linear speedup at constant noise sigma^2 = {s.get('sigma2', 0.01):g} "
             f"({s.get('model', MODEL)} on {s.get('dataset', 'fashion_mnist')}, J = {s['J']} per node, blocks of "
             f"{s['block']})", "",
             "The paper (curves only): doubling n reaches the same loss in about half the iterations.", ""]
    lines += md_table(["n", "K", "accuracy", "test loss"], [[str(g["n"]), str(g["K"]), acc_pm(g), fmt(g["final_loss"])]
                                                           for g in gs])
    fig, axes = new_axes(2)
    plot_curves(axes[0], records, label_key="n", y="test_loss_avg", title="test loss vs iteration")
    plot_curves(axes[1], records, label_key="n", title="accuracy vs iteration")
    return lines, [savefig(fig, out, "speedup.png")]


TABLE = Table("Figs. 1/6, linear speedup in n at constant noise", _build_speedup,
              lambda records, scale: _claims_speedup(records), _render_speedup,
              lambda scale: differences("fig6", scale))
