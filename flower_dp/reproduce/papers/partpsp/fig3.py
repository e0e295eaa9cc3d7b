"""PartPSP Fig. 3: real average sensitivity (RAS) by d-Out degree and the number of shared layers."""

from __future__ import annotations

from pathlib import Path

from ...core import Claim, Table, fmt, new_axes, savefig
from .._common import md_table, style
from ._shared import SETTINGS, _differences_table2, _params, _ras, partpsp_spec

#: RAS (mean real sensitivity) by d-Out degree and shared layers: MLP, C' .95, lambda .55, sync 4, clip 200
FIG3_DEG = {"smoke": (2, 4), "ci": (2, 4, 6, 8, 10), "full": (2, 3, 4, 5, 6, 7, 8, 9, 10)}
FIG3_SPLITS = {"1 layer": ("partpsp", "partpsp1"), "2 layers": ("partpsp", "partpsp2"), "3 layers (full)": ("sgpdp", "all")}
PAPER_FIG3 = {"1 layer": {2: 50.2, 4: 35.1, 6: 24.4, 8: 14.5, 10: 5.7},
              "2 layers": {2: 91.5, 4: 61.5, 6: 42.0, 8: 21.9, 10: 2.4},
              "3 layers (full)": {2: 1470, 4: 1006, 6: 634, 8: 322, 10: 16.4}}


def _build_fig3(scale: str, seeds: list[int]):
    s = SETTINGS[scale]
    rounds = s["fig2_rounds"]
    specs = []
    for seed in seeds:
        for label, (alg, split) in FIG3_SPLITS.items():
            for d in FIG3_DEG[scale]:
                specs.append(partpsp_spec(
                    f"fig3-{split}-d{d}", {"figure": "fig3", "shared": label, "degree": d}, seed=seed,
                    num_iters=rounds, eval_every=max(1, rounds // 4), n_nodes=s["n"], model="partpsp_mlp",
                    dataset="fashion_mnist", samples_per_node=s["samples_per_node"], test_samples=s["test_samples"],
                    topology="d_out", topology_kwargs={"deg": d}, algorithm=alg, checkpoint=False,
                    params=_params(alg, split, b=5.0, sync_period=4, clip_l1=200.0, sensitivity="real")))
    return specs


def _claims_fig3(records) -> list[Claim]:
    claims = []
    per_key: dict[tuple, list[float]] = {}
    for r in records:
        per_key.setdefault((r["labels"]["shared"], r["labels"]["degree"]), []).append(_ras(r))
    ras = {k: sum(v) / len(v) for k, v in per_key.items()}
    degs = sorted({d for _, d in ras})
    for label in FIG3_SPLITS:
        vals = [ras[(label, d)] for d in degs if (label, d) in ras]
        claims.append(Claim(f"RAS falls as the degree grows ({label})", all(a > b for a, b in zip(vals, vals[1:])),
                            ", ".join(f"d={d}: {fmt(v)}" for d, v in zip(degs, vals)),
                            cells=tuple((f"d={d}", tuple(per_key[(label, d)])) for d in degs if (label, d) in per_key),
                            ordered=True))
    for d in degs:
        vals = [ras.get((label, d), float("nan")) for label in FIG3_SPLITS]
        claims.append(Claim(f"sharing more layers gives a larger RAS (d = {d})", all(a < b for a, b in zip(vals, vals[1:])),
                            ", ".join(f"{label}: {fmt(v)}" for label, v in zip(FIG3_SPLITS, vals)),
                            cells=tuple((label, tuple(per_key[(label, d)])) for label in FIG3_SPLITS
                                        if (label, d) in per_key), ordered=True))
    return claims


def _render_fig3(records, scale: str, out: Path):
    s = SETTINGS[scale]
    degs = sorted({r["labels"]["degree"] for r in records})
    lines = [f"## Fig. 3: real average sensitivity (RAS) by d-Out degree and shared layers (MLP, N = {s['n']}, "
             f"{s['fig2_rounds']} rounds, b = 5, sync 4, L1 clip 200)", "", "Ours / the paper's released logs (MNIST).", ""]
    rows = []
    fig, axes = new_axes(1)
    for label in FIG3_SPLITS:
        vals = []
        for d in degs:
            rs = [r for r in records if r["labels"]["shared"] == label and r["labels"]["degree"] == d]
            vals.append(sum(_ras(r) for r in rs) / len(rs) if rs else float("nan"))
        rows.append([label] + [f"{fmt(v)} / {PAPER_FIG3[label].get(d, '-')}" for d, v in zip(degs, vals)])
        axes[0].plot(degs, vals, marker="o", label=label)
    axes[0].set_yscale("log")
    style(axes[0], xlabel="d-Out degree", ylabel="RAS (mean real sensitivity)", title="RAS vs degree")
    lines += md_table(["shared"] + [f"d = {d}" for d in degs], rows)
    return lines, [savefig(fig, out, "ras_vs_degree.png")]


TABLE = Table("Fig. 3, real average sensitivity by d-Out degree and shared layers", _build_fig3,
              lambda records, scale: _claims_fig3(records), _render_fig3,
              lambda scale: _differences_table2("fig3", scale)[:1])
