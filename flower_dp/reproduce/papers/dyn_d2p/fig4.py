"""Dyn-D2P Fig. 4: Dyn-D2P's final accuracy over a grid of 1/rho_c x 1/rho_mu, against Const-D2P at the same eps."""

from __future__ import annotations

from pathlib import Path

from ...core import Claim, Table, acc_pm, cells_of, fmt, group_records, new_axes, pick, savefig
from .._common import md_table, pushsum_spec
from ._shared import CLIP, DELTA, SETTINGS, _differences_tables

#: Fig. 4: Dyn-D2P's final accuracy over a grid of 1/rho_c x 1/rho_mu, against Const-D2P at the same eps
FIG4_INV = {"smoke": (0.2, 0.8), "ci": (0.2, 0.5, 0.8), "full": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)}
FIG4_EPS = {"smoke": (1.0,), "ci": (1.0,), "full": (0.3, 1.0, 3.0)}


def _build_fig4(scale: str, seeds: list[int]):
    s = SETTINGS["table2"][scale]
    common = dict(num_iters=s["K"], eval_every=s["eval_every"], n_nodes=s["n"], model=s["model"],
                  topology="exp_one_peer", algorithm="dyn_d2p", dataset=s["dataset"],
                  samples_per_node=s["samples_per_node"], test_samples=s["test_samples"])
    base = dict(batch_size=s["B"], lr=s["lr"], delta=DELTA, calibration="rigorous", **CLIP["table2"])
    specs = []
    for seed in seeds:
        for eps in FIG4_EPS[scale]:
            specs.append(pushsum_spec(f"fig4-const-eps{eps:g}", {"algorithm": "Const-D2P", "eps": eps,
                                                                 "inv_rho_c": "-", "inv_rho_mu": "-"}, seed=seed,
                                      params={**base, "variant": "const", "epsilon": eps}, **common))
            for ic in FIG4_INV[scale]:
                for im in FIG4_INV[scale]:
                    specs.append(pushsum_spec(
                        f"fig4-dyn-eps{eps:g}-c{ic:g}-mu{im:g}", {"algorithm": "Dyn-D2P", "eps": eps, "inv_rho_c": ic,
                                                                  "inv_rho_mu": im}, seed=seed,
                        params={**base, "variant": "dyn", "epsilon": eps, "rho_c": 1 / ic, "rho_mu": 1 / im}, **common))
    return specs


def _claims_fig4(records, scale: str) -> list[Claim]:
    groups = group_records(records)
    claims = []
    for eps in sorted({g["eps"] for g in groups}):
        const = pick(groups, algorithm="Const-D2P", eps=eps)
        dyn = [g for g in groups if g["algorithm"] == "Dyn-D2P" and g["eps"] == eps]
        if const is None or not dyn:
            continue
        accs = [g["final_acc"] for g in dyn]
        worst = min(dyn, key=lambda g: g["final_acc"])
        claims.append(Claim(f"eps = {eps:g}: Dyn-D2P beats Const-D2P at every (rho_c, rho_mu) of the grid",
                            bool(min(accs) > const["final_acc"]),
                            f"{sum(a > const['final_acc'] for a in accs)}/{len(accs)} grid points above; Dyn-D2P "
                            f"{fmt(min(accs))} (1/rho_c {worst['inv_rho_c']:g}, 1/rho_mu {worst['inv_rho_mu']:g}) to "
                            f"{fmt(max(accs))} vs Const-D2P {fmt(const['final_acc'])}",
                            cells=cells_of(("Const-D2P", const), ("Dyn-D2P, worst grid point", worst))))
        spread = max(accs) - min(accs)
        claims.append(Claim(f"eps = {eps:g}: Dyn-D2P is robust to rho_c, rho_mu (accuracy spread over the grid "
                            "smaller than its gain over Const-D2P)", bool(spread < min(accs) - const["final_acc"]),
                            f"spread {spread:.3f} over {len(dyn)} grid points; smallest gain "
                            f"{min(accs) - const['final_acc']:+.3f}"))
    return claims


def _render_fig4(records, scale: str, out: Path):
    import numpy as np

    groups = group_records(records)
    inv = FIG4_INV[scale]
    eps_grid = sorted({g["eps"] for g in groups})
    s = SETTINGS["table2"][scale]
    lines = [f"## Fig. 4: Dyn-D2P final accuracy over 1/rho_c x 1/rho_mu (shallow CNN, n = {s['n']}, K = {s['K']}, "
             "rigorous calibration)", "", "The paper (heat maps only) finds the accuracy nearly flat over the grid "
             "and always above Const-D2P.", ""]
    fig, axes = new_axes(len(eps_grid))
    for ax, eps in zip(axes, eps_grid):
        const = pick(groups, algorithm="Const-D2P", eps=eps)
        grid = np.full((len(inv), len(inv)), np.nan)
        for i, ic in enumerate(inv):
            for j, im in enumerate(inv):
                g = pick(groups, algorithm="Dyn-D2P", eps=eps, inv_rho_c=ic, inv_rho_mu=im)
                if g is not None:
                    grid[i, j] = g["final_acc"]
        lines += [f"### eps = {eps:g} (Const-D2P: {acc_pm(const)})", ""]
        lines += md_table(["1/rho_c \\ 1/rho_mu"] + [f"{im:g}" for im in inv],
                          [[f"{ic:g}"] + [fmt(v) for v in grid[i]] for i, ic in enumerate(inv)]) + [""]
        im_ = ax.imshow(grid, origin="lower", cmap="viridis", vmin=np.nanmin(grid) - 0.02, vmax=np.nanmax(grid) + 0.02)
        ax.set_xticks(range(len(inv)), [f"{v:g}" for v in inv])
        ax.set_yticks(range(len(inv)), [f"{v:g}" for v in inv])
        for i in range(len(inv)):
            for j in range(len(inv)):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7, color="w")
        ax.figure.colorbar(im_, ax=ax, fraction=0.046)
        ax.set_xlabel("1/rho_mu")
        ax.set_ylabel("1/rho_c")
        ax.set_title(f"Dyn-D2P, eps {eps:g} (Const-D2P {fmt(const['final_acc']) if const else '-'})", fontsize=9)
    return lines, [savefig(fig, out, "accuracy_grid.png")]


def _fig4_differences(scale: str) -> list[str]:
    return _differences_tables("table2", scale)[:1] + [
        f"Grid 1/rho_c, 1/rho_mu in {{{', '.join(f'{v:g}' for v in FIG4_INV[scale])}}} at eps "
        f"{', '.join(f'{e:g}' for e in FIG4_EPS[scale])} (the paper: 0.1 ... 0.8 at several eps, on both models).",
        "calibration = rigorous: every grid point spends exactly the target eps under the PLD accountant.",
    ]


TABLE = Table("Fig. 4, Dyn-D2P over a grid of rho_c, rho_mu vs Const-D2P", _build_fig4, _claims_fig4, _render_fig4,
              _fig4_differences)
