"""PartPSP Fig. 4: real average sensitivity (RAS) by network size N and d-Out degree."""

from __future__ import annotations

from pathlib import Path

from ...core import Claim, Table, fmt, new_axes, savefig
from .._common import md_table, style
from ._shared import SETTINGS, T2_MODELS, _params, _ras, partpsp_spec

#: RAS over the first 20 rounds for N = 10 / 50 and d-Out degrees (MLP, clip 1.0, C' .95, lambda .55, sync 4)
FIG4_DEG = {"smoke": (1, 2), "ci": (1, 2, 4, 6, 8), "full": (1, 2, 4, 6, 8)}
FIG4_N = {"smoke": (4, 8), "ci": (10, 50), "full": (10, 20, 30, 40, 50)}
FIG4_ROUNDS = {"smoke": 4, "ci": 20, "full": 20}
#: the spec decodes "GCT1.0" from the Fig. 4 log names, but an L1 clip of 1.0 gives a RAS of ~1.5 (smoke run), 40x
#: below the paper's ~62; Fig. 3's clip 200 reproduces Fig. 3's magnitudes, so Fig. 4 uses it too
FIG4_CLIP = 200.0
PAPER_FIG4 = {10: {1: 61.9, 2: 63.2, 4: 44.0, 6: 29.7, 8: 17.5}, 50: {1: 62.6, 2: 64.6, 4: 46.8, 6: 38.5, 8: 33.8}}
PAPER_FIG4_RESNET = {10: {1: 17.7, 2: 17.7, 4: 12.7, 6: 8.5, 8: 4.4}, 50: {1: 17.9, 2: 17.8, 4: 12.8, 6: 10.5, 8: 9.1}}
FIG4_MODELS = {"smoke": ["MLP"], "ci": ["MLP"], "full": ["MLP", "ResNet-18"]}


def _build_fig4(scale: str, seeds: list[int]):
    s = SETTINGS[scale]
    rounds = FIG4_ROUNDS[scale]
    specs = []
    for seed in seeds:
        for mname in FIG4_MODELS[scale]:
            model = T2_MODELS[mname]["model"]
            if mname == "MLP":
                extra, suffix = dict(clip_l1=FIG4_CLIP, c_prime=0.95, lam=0.55), ""
            else:  # the ResNet logs: lr 1e-5, clip 100, C' 0.78, lambda 0.7
                extra = dict(clip_l1=100.0, c_prime=0.78, lam=0.7, lr=1e-5, lr_l=1e-5, model_name=model)
                suffix = f"-{mname}"
            for n in FIG4_N[scale]:
                for d in FIG4_DEG[scale]:
                    specs.append(partpsp_spec(
                        f"fig4-N{n}-d{d}{suffix}", {"figure": "fig4", "N": n, "degree": d, "model": mname}, seed=seed,
                        num_iters=rounds, eval_every=rounds, n_nodes=n, model=model, dataset="fashion_mnist",
                        samples_per_node=s["samples_per_node"], test_samples=s["test_samples"], topology="d_out",
                        topology_kwargs={"deg": d}, algorithm="partpsp", checkpoint=False,
                        params=_params("partpsp", "partpsp1", b=5.0, sync_period=4, sensitivity="estimate",
                                       measure_real=True, **extra)))
    return specs


def _ras_table(records, model: str = "MLP") -> dict[tuple[int, int], float]:
    per: dict[tuple[int, int], list[float]] = {}
    for r in records:
        if r["labels"].get("model", "MLP") == model:
            per.setdefault((r["labels"]["N"], r["labels"]["degree"]), []).append(_ras(r))
    return {k: sum(v) / len(v) for k, v in per.items()}


def _fig4_models(records) -> list[str]:
    return [m for m in T2_MODELS if any(r["labels"].get("model", "MLP") == m for r in records)]


def _claims_fig4(records, scale: str) -> list[Claim]:
    claims = []
    for model in _fig4_models(records):
        tag = "" if model == "MLP" else f" ({model})"
        ras = _ras_table(records, model)
        ns, degs = sorted({n for n, _ in ras}), sorted({d for _, d in ras})
        small, large = ns[0], ns[-1]
        far = [d for d in degs if 4 * d <= small]  # d << N for every N of the sweep
        rel = {d: abs(ras[(large, d)] / ras[(small, d)] - 1) for d in degs if (small, d) in ras and (large, d) in ras}
        if far:
            worst = max(rel[d] for d in far if d in rel)
            claims.append(Claim(
                f"for d << N (d = {', '.join(map(str, far))}) the RAS hardly depends on N (N = {small} vs {large}, "
                f"within 15 %){tag}", bool(worst < 0.15),
                ", ".join(f"d={d}: {fmt(ras[(small, d)])} vs {fmt(ras[(large, d)])} ({100 * rel[d]:.1f} %)" for d in far)))
        near = [d for d in degs if d >= small // 2 + 1 and d > 1]
        if near and far:
            ok = min(rel[d] for d in near) > max(rel[d] for d in far)
            claims.append(Claim(f"when d is close to N = {small} (d = {', '.join(map(str, near))}) the RAS differs more "
                                f"between network sizes{tag}", bool(ok),
                                ", ".join(f"d={d}: {100 * rel[d]:.1f} %" for d in degs if d in rel)))
        for n in ns:
            vals = [ras[(n, d)] for d in degs if d > 1 and (n, d) in ras]
            claims.append(Claim(f"RAS falls as the degree grows beyond 2 (N = {n}){tag}",
                                all(a > b for a, b in zip(vals, vals[1:])),
                                ", ".join(f"d={d}: {fmt(ras[(n, d)])}" for d in degs if d > 1 and (n, d) in ras)))
    return claims


def _render_fig4(records, scale: str, out: Path):
    lines = [f"## Fig. 4: real average sensitivity over the first {FIG4_ROUNDS[scale]} rounds by network size N and "
             "d-Out degree (PartPSP-1, b = 5, sync every 4 rounds; MLP: L1 clip "
             f"{FIG4_CLIP:g}, C' 0.95, lambda 0.55; ResNet-18: clip 100, C' 0.78, lambda 0.7, lr 1e-5)", "",
             "Ours / the paper's released logs (MNIST for the MLP, Fashion-MNIST for ResNet-18); the paper has N = 10 "
             "and 50.", ""]
    models = _fig4_models(records)
    fig, axes = new_axes(len(models))
    for ax, model in zip(axes, models):
        paper = PAPER_FIG4 if model == "MLP" else PAPER_FIG4_RESNET
        ras = _ras_table(records, model)
        ns, degs = sorted({n for n, _ in ras}), sorted({d for _, d in ras})
        rows = [[f"N = {n}"] + [f"{fmt(ras.get((n, d), float('nan')))} / {paper.get(n, {}).get(d, '-')}" for d in degs]
                for n in ns]
        lines += [f"### {model}", ""] + md_table(["network"] + [f"d = {d}" for d in degs], rows) + [""]
        for i, n in enumerate(ns):
            ax.plot(degs, [ras.get((n, d), float("nan")) for d in degs], marker="o", color=f"C{i}", label=f"ours N = {n}")
            if n in paper:
                ax.plot(sorted(paper[n]), [paper[n][d] for d in sorted(paper[n])], ls=":", marker="x", color=f"C{i}",
                        label=f"paper N = {n}")
        style(ax, xlabel="d-Out degree", ylabel="RAS (mean real sensitivity)", title=f"{model}: RAS vs degree and N")
    return lines, [savefig(fig, out, "ras_vs_network_size.png")]


def _fig4_differences(scale: str) -> list[str]:
    return [
        "Dataset: Fashion-MNIST stands in for MNIST (not available offline); the model is the paper's 3-layer tanh MLP.",
        "The paper does not say which split Fig. 4 uses; we run PartPSP-1 (the first layer shared).",
        f"L1 clip {FIG4_CLIP:g} (Fig. 3's) instead of the 1.0 decoded from the log names: with 1.0 the clip bounds the "
        "sensitivity far below the paper's values (RAS ~1.5 against ~62), so that reading of the logs cannot be right.",
        f"Network sizes {', '.join(map(str, FIG4_N[scale]))}; each node holds 60,000 / N training images, as in a "
        "partition of the full set.",
    ]


TABLE = Table("Fig. 4, real average sensitivity by network size N and degree", _build_fig4, _claims_fig4,
              _render_fig4, _fig4_differences)
