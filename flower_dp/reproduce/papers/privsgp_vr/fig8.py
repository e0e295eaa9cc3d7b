"""PrivSGP-VR Figs. 3 / 8: the privacy-utility trade-off, accuracy at K*(eps) and at two other K for each eps."""

from __future__ import annotations

from pathlib import Path

from ...core import Claim, Table, acc_pm, cells_of, fmt, group_records, new_axes, pick, savefig
from .._common import md_table, plot_acc_vs, pushsum_spec
from ._shared import C2, DELTA, SETTINGS, _common, differences

#: the privacy/utility trade-off: for each eps, K*(eps) = K*(1) eps^2 (homogeneous budgets) and two other K
TRADEOFF_EPS = {"smoke": (0.6, 1.0), "ci": (0.4, 1.0, 1.6), "full": (0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6),
                "cifar-full": (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0), "cifar-smoke": (2.0, 3.0)}
TRADEOFF_K = (0.5, 1.0, 2.0)


def _build_tradeoff(scale: str, seeds: list[int]):
    from . import k_star  # the package's k_star at call time: replacing privsgp_vr.k_star (tests do) reaches here

    s = SETTINGS[scale]
    K1, _ = k_star(scale)
    base = dict(batch_size=s["block"], G=s["G"], lr=s["lr"], delta=DELTA, calibration="paper", c2=C2)
    specs = []
    for seed in seeds:
        for eps in TRADEOFF_EPS[scale]:
            k_eps = K1 * eps ** 2 * (s["eps"] ** -2)
            for r in TRADEOFF_K:
                K = int(max(s["k_min"], round(r * k_eps)))
                specs.append(pushsum_spec(
                    f"fig8-eps{eps:g}-x{r:g}", {"figure": "fig8", "eps": eps, "K_over_Kstar": r, "K": K,
                                                "K_star": round(k_eps, 1)},
                    seed=seed, num_iters=K, eval_every=max(1, K // 4), topology="exp_one_peer", algorithm="privsgp_vr",
                    params={**base, "epsilon": eps}, **_common(s)))
    return specs


def _claims_tradeoff(records) -> list[Claim]:
    groups = group_records(records)
    eps_grid = sorted({g["eps"] for g in groups})
    at_star = [pick(groups, eps=e, K_over_Kstar=1.0) for e in eps_grid]
    claims = []
    if all(at_star) and len(at_star) > 1:
        accs = [g["final_acc"] for g in at_star]
        claims.append(Claim("the accuracy at K*(eps) increases with eps", all(a < b for a, b in zip(accs, accs[1:])),
                            ", ".join(f"eps {e:g}: {acc_pm(g)}" for e, g in zip(eps_grid, at_star)),
                            cells=cells_of(*((f"eps {e:g}", g) for e, g in zip(eps_grid, at_star))), ordered=True))
    for e, star in zip(eps_grid, at_star):
        others = [pick(groups, eps=e, K_over_Kstar=r) for r in TRADEOFF_K if r != 1.0]
        if star and all(others):
            ok = all(star["final_acc"] > o["final_acc"] for o in others)
            claims.append(Claim(f"at eps = {e:g}, K*(eps) = {star['K']} beats the other two K", bool(ok),
                                ", ".join(f"K={g['K']}: {acc_pm(g)}" for g in sorted(others + [star], key=lambda g: g["K"])),
                                cells=cells_of(*((f"K={g['K']}", g) for g in [star, *others]))))
    return claims


def _render_tradeoff(records, scale: str, out: Path):
    groups = group_records(records)
    lines = ["## Figs. 3 / 8 analogue: privacy-utility trade-off, K*(eps) = K*(1) eps^2 and 0.5 / 2 x K*(eps), "
             "sigma from eq. (11)", ""]
    rows = [[f"{g['eps']:g}", str(g["K"]), f"{g['K_over_Kstar']:g}", acc_pm(g), fmt(g["eps_rigorous"])]
            for g in sorted(groups, key=lambda g: (g["eps"], g["K"]))]
    lines += md_table(["eps (target)", "K", "K / K*(eps)", "accuracy", "eps rigorous"], rows)
    fig, axes = new_axes(1)
    plot_acc_vs(axes[0], [dict(g, series=f"{g['K_over_Kstar']:g} x K*(eps)") for g in groups], x="eps",
                series_key="series", xlabel="target eps (paper calibration)", title="accuracy vs eps")
    return lines, [savefig(fig, out, "accuracy_vs_eps.png")]


TABLE = Table("Figs. 3/8, privacy-utility trade-off at K*(eps) and two other K", _build_tradeoff,
              lambda records, scale: _claims_tradeoff(records), _render_tradeoff,
              lambda scale: differences("fig8", scale))
