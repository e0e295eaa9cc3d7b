"""PrivSGP-VR's ResNet-18 / CIFAR-10 twins of Figs. 6 / 8 / 9 / 10: the paper's Figs. 1 / 3 / 4 / 5 (full scale
only; smoke runs the same grids on a synthetic CIFAR-shaped task).  Their settings are the ``cifar-<scale>``
entries of the shared grids; the builders, claims and reports are the MNIST figures'."""

from __future__ import annotations

from pathlib import Path

from ...core import Table, acc_pm, fmt, group_records, new_axes, savefig
from .._common import full_scale_only, md_table, plot_curves
from ._shared import SETTINGS
from .fig6 import _build_speedup, _claims_speedup, _render_speedup
from .fig8 import _build_tradeoff, _claims_tradeoff, _render_tradeoff
from .headline import _build_main, _claims_main, _render_main

_CIFAR_COST = {"fig1": "ResNet-18 on CIFAR-10 with up to 64 nodes", "fig3": "21 ResNet-18 / CIFAR-10 runs of up to "
               "12,500 iterations", "fig4": "ResNet-18 on CIFAR-10 for 3,000 iterations, twice",
               "fig5": "three ResNet-18 / CIFAR-10 runs of 3,000 iterations"}


def _cifar(table: str, scale: str) -> str:
    full_scale_only({"smoke": 1, "full": 1}, scale, "privsgp-vr", table, _CIFAR_COST[table])
    return f"cifar-{scale}"


def _render_vr(records, scale: str, out: Path):
    s = SETTINGS[scale]
    groups = group_records(records)
    lines = [f"## Fig. 4: VR vs no VR at equal noise (sigma^2 = {s['sigma2']:g}), K = {s['vr_K']}, n = {s['n']}, "
             f"{s['model']} on {s['dataset']}", ""]
    lines += md_table(["algorithm", "accuracy", "test loss", "eps rigorous"],
                      [[g["algorithm"], acc_pm(g), fmt(g["final_loss"]), fmt(g["eps_rigorous"])] for g in groups])
    fig, axes = new_axes(1)
    plot_curves(axes[0], records, label_key="algorithm", title="VR vs no VR, equal noise")
    return lines, [savefig(fig, out, "accuracy_vs_iteration.png")]


def _cifar_differences(table: str, scale: str) -> list[str]:
    s = SETTINGS[_cifar(table, scale)]
    out = [f"ResNet-18 with GroupNorm (d = 11,173,962, as the paper's), blocks of b = {s['block']} samples for the VR "
           "table, constant lr for every K (the paper does not report its step size)."]
    if s["dataset"] != "cifar10":
        out.insert(0, "Smoke scale: a synthetic CIFAR-shaped task and a linear model: the pipeline, not the claims.")
    return out


def _cifar_tables() -> dict[str, Table]:
    def vr_only(scale, seeds):
        return [r for r in _build_main(_cifar("fig4", scale), "headline", seeds) if r.labels["figure"] == "fig9"]

    return {
        "fig1": Table("Fig. 1, linear speedup on ResNet-18 / CIFAR-10 (full scale)",
                      lambda scale, seeds: _build_speedup(_cifar("fig1", scale), seeds),
                      lambda records, scale: _claims_speedup(records),
                      lambda records, scale, out: _render_speedup(records, _cifar("fig1", scale), out),
                      lambda scale: _cifar_differences("fig1", scale)),
        "fig3": Table("Fig. 3, privacy-utility trade-off on ResNet-18 / CIFAR-10 (full scale)",
                      lambda scale, seeds: _build_tradeoff(_cifar("fig3", scale), seeds),
                      lambda records, scale: _claims_tradeoff(records),
                      lambda records, scale, out: _render_tradeoff(records, _cifar("fig3", scale), out),
                      lambda scale: _cifar_differences("fig3", scale)),
        "fig4": Table("Fig. 4, VR vs no VR on ResNet-18 / CIFAR-10 (full scale)", vr_only,
                      lambda records, scale: _claims_main(records, "headline", _cifar("fig4", scale)),
                      lambda records, scale, out: _render_vr(records, _cifar("fig4", scale), out),
                      lambda scale: _cifar_differences("fig4", scale)),
        "fig5": Table("Fig. 5, PrivSGP-VR vs DP2-SGD vs A(DP)2SGD on ResNet-18 / CIFAR-10 (full scale)",
                      lambda scale, seeds: _build_main(_cifar("fig5", scale), "fig10", seeds),
                      lambda records, scale: _claims_main(records, "fig10", _cifar("fig5", scale)),
                      lambda records, scale, out: _render_main(records, "fig10", _cifar("fig5", scale), out),
                      lambda scale: _cifar_differences("fig5", scale)),
    }


TABLES = _cifar_tables()
