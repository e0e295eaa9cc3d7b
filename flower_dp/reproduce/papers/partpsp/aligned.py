"""PartPSP Table 2 aligned with the authors' code, and the controlled runs behind PartPSP-2's and SGPDP's patterns.

``table2-aligned``: Table 2's MLP rows (PartPSP-1, PartPSP-2, SGPDP; b = 1, 2, 3 and NoDP) with what the authors'
code does where our ``table2`` follows our defaults (:data:`~._shared.AUTHORS_DIFFS`): the step decay
(gamma_s, gamma_l and gamma_n / 10 from rounds 240 and 540, :data:`ALIGNED_DECAY`), inputs in [0, 1]
(``data.scaling = "unit"``), sync period 4, and per-node evaluation (the exact average of the shared part with each
node's own head, the nodes' accuracies averaged: :mod:`flower_dp.reproduce.node_eval`).  The network-average
accuracy of the same runs is reported beside it.  The committed ``table2`` is untouched.

``pattern-diag``: single-factor runs at Table 2's own setting (no alignment) on 4-Out.  PartPSP-2 with standardised
vs [0, 1] inputs at b = 1 and 3 (its residual network carries the raw image past the noisy shared layers; [0, 1]
inputs make the image small beside the noisy tanh branch), and SGPDP likewise at b = 3, plus SGPDP for one epoch
(the authors' matched setting, where their code collapses too); and PartPSP-1 at Table 3's b = 5 on 2-Out with both
input scalings, beside the real sensitivity of the authors' released log for that setting.  Every run is also
evaluated per node.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...core import Claim, Table, fmt, mean_std, pick
from ...core import group_records as _group_records
from .._common import md_table
from ._shared import _MAIN3, PAPER_ROUNDS, SETTINGS, T2_TOPOS, VARIANTS, _params, partpsp_spec

__all__ = ["TABLE_ALIGNED", "TABLE_PATTERN", "ALIGNED", "ALIGNED_DECAY", "ALIGNED_TOPOS", "aligned_spec",
           "verdict_aligned", "verdict_pattern"]

#: the authors' step decay in rounds of the paper's 720 (epochs 5 and 10 of 60 rounds); other lengths scale it
ALIGNED_DECAY = (240, 540)
#: what the aligned runs change against ``table2``: the authors' sync period and inputs
ALIGNED = {"sync_period": 4, "scaling": "unit"}
#: the graphs of the aligned table per scale (the paper's EXP and the two ends of the d-Out columns)
ALIGNED_TOPOS = {"smoke": ["2-Out"], "ci": ["4-Out"], "full": ["EXP", "4-Out", "8-Out"]}
ALIGNED_BS = {"smoke": [3.0], "ci": [1.0, 3.0], "full": [1.0, 3.0]}
#: the graph of the NoDP rows (the paper's NoDP varies < 0.1 points across graphs) and of the headline ordering
ALIGNED_MAIN_TOPO = {"smoke": "2-Out", "ci": "4-Out", "full": "4-Out"}
#: the graph and budgets of the pattern diagnostic
PATTERN_TOPO = {"smoke": "2-Out", "ci": "4-Out", "full": "4-Out"}
PATTERN_BS = {"smoke": [3.0], "ci": [1.0, 3.0], "full": [1.0, 3.0]}
#: the paper's Table 2 (%), MLP, 4-Out column, for the report
PAPER_4OUT = {"PartPSP-1": {"b1": 40.63, "b2": 46.25, "b3": 63.51, "NoDP": 89.71},
              "PartPSP-2": {"b1": 25.42, "b2": 24.78, "b3": 24.07, "NoDP": 88.91},
              "SGPDP": {"b1": 26.68, "b2": 32.39, "b3": 26.94, "NoDP": 81.64}}
STAND_IN = "Dataset: Fashion-MNIST stands in for MNIST (not available offline), as in every PartPSP table here."
#: a controlled factor "moves" the accuracy when it changes it by more than this (accuracy in [0, 1])
MOVES = 0.05
#: Table 3's budget and graph, where the authors' released log gives PartPSP-1's real sensitivity
T3_B, T3_TOPO = 5.0, "2-Out"
#: the authors' released Table 3 log, PartPSP-1 Real on 2-Out: mean real sensitivity (node 0) and accuracy (%)
AUTHORS_T3_PARTPSP1 = {"sensitivity_real": 18.4, "accuracy": 88.50}
#: the authors' own code (WearTheClo/PartPSP @ 0634980, run outside this project on 2026-11-28: CPU, 10 gloo ranks,
#: Fashion-MNIST through their MNIST pipeline, one seed; command in docs/reproductions.md), accuracy (%) after 2
#: epochs: setting -> (PartPSP-2, PartPSP-1)
AUTHORS_CODE_FMNIST = {"b = 5, 2-Out": (70.6, 67.7), "b = 3, 4-Out": (68.6, 34.1)}


def _decay(rounds: int) -> tuple[int, ...]:
    return tuple(max(1, round(r * rounds / PAPER_ROUNDS)) for r in ALIGNED_DECAY)


def aligned_spec(scale: str, seed: int, label: str, b: float | None, topo_label: str, *, figure: str,
                 scaling: str = "standard", sync_period: int | None = None, decay: bool = False,
                 rounds: int | None = None, extra_labels: dict[str, Any] | None = None):
    """One MLP run of Table 2's setting (``label`` in :data:`VARIANTS`, ``b`` None = NoDP) with the given input
    scaling, sync period and step decay; evaluated per node too (``node_eval``)."""
    from flower_dp.clients.registry import param_names

    s = SETTINGS[scale]
    alg, split = VARIANTS[label]
    topo, kw = T2_TOPOS[topo_label]
    n_rounds = int(rounds or s["rounds"])
    extra = {"b": b, "sensitivity": "real"} if b else {"gamma_n": 0.0, "sensitivity": "real"}
    if sync_period is not None:
        extra["sync_period"] = sync_period
    if decay:
        extra["decay_at"] = list(_decay(n_rounds))
    params = {k: v for k, v in _params(alg, split, **extra).items() if k in param_names(alg)}
    tag = f"b{b:g}" if b else "NoDP"
    labels = {"figure": figure, "algorithm": label, "b": tag, "topology": topo_label, "scaling": scaling,
              **(extra_labels or {})}
    suffix = "".join(f"-{v}" for v in (extra_labels or {}).values())
    spec = partpsp_spec(f"{figure}-{label}-{tag}-{topo_label}-{scaling}{suffix}", labels, seed=seed,
                        num_iters=n_rounds, eval_every=min(s["eval_every"], n_rounds), topology=topo,
                        topology_kwargs=kw, algorithm=alg, params=params, n_nodes=s["n"], model="partpsp_mlp",
                        dataset="fashion_mnist", samples_per_node=s["samples_per_node"],
                        test_samples=s["test_samples"])
    if scaling != "standard":
        spec.config["data"]["scaling"] = scaling
    return dataclasses.replace(spec, node_eval=True)


def _build_aligned(scale: str, seeds: list[int]):
    specs = []
    for seed in seeds:
        main = ALIGNED_MAIN_TOPO[scale]  # the headline graph first (a sweep stopped early has made it)
        for topo_label in [main] + [t for t in ALIGNED_TOPOS[scale] if t != main]:
            for label in _MAIN3:
                for b in [*ALIGNED_BS[scale], None]:
                    if b is None and topo_label != ALIGNED_MAIN_TOPO[scale]:
                        continue  # NoDP once per algorithm
                    specs.append(aligned_spec(scale, seed, label, b, topo_label, figure="t2aligned",
                                              scaling=ALIGNED["scaling"], sync_period=ALIGNED["sync_period"],
                                              decay=True))
    return specs


def _build_pattern(scale: str, seeds: list[int]):
    topo = PATTERN_TOPO[scale]
    specs = []
    for seed in seeds:
        for b in PATTERN_BS[scale]:
            for scaling in ("standard", "unit"):
                specs.append(aligned_spec(scale, seed, "PartPSP-2", b, topo, figure="pattern", scaling=scaling,
                                          extra_labels={"length": "table2"}))
        for scaling in ("standard", "unit"):
            specs.append(aligned_spec(scale, seed, "SGPDP", 3.0, topo, figure="pattern", scaling=scaling,
                                      extra_labels={"length": "table2"}))
        one_epoch = max(1, SETTINGS[scale]["rounds"] // 12)
        specs.append(aligned_spec(scale, seed, "SGPDP", 3.0, topo, figure="pattern", rounds=one_epoch,
                                  extra_labels={"length": "one epoch"}))
        for scaling in ("standard", "unit"):  # PartPSP-1 at Table 3's b and graph: do the inputs set its noise?
            specs.append(aligned_spec(scale, seed, "PartPSP-1", T3_B, T3_TOPO, figure="pattern", scaling=scaling,
                                      extra_labels={"length": "table2"}))
    return specs


def group_records(records) -> list[dict[str, Any]]:
    """:func:`~flower_dp.reproduce.core.group_records` with the per-node accuracy's mean and std over the seeds."""
    groups = _group_records(records)
    for g in groups:
        g["acc_node_eval"], g["acc_node_eval_std"], _ = mean_std(_vals(g))
    return groups


def _acc(g: dict[str, Any] | None, key: str) -> str:
    if g is None:
        return "-"
    std = g.get(f"{key}_std")
    return fmt(g.get(key)) + (f" +- {std:.3f}" if g.get("n_seeds", 1) > 1 and std == std else "")


def _vals(g: dict[str, Any] | None, key: str = "acc_node_eval") -> tuple[float, ...]:
    return tuple(float(r.get(key, float("nan"))) for r in (g or {}).get("records", []))


def _claims_aligned(records, scale: str) -> list[Claim]:
    groups = group_records(records)
    topo = ALIGNED_MAIN_TOPO[scale]
    b = f"b{max(ALIGNED_BS[scale]):g}"
    rows = [(lab, pick(groups, algorithm=lab, b=b, topology=topo)) for lab in _MAIN3]
    out = []
    if all(g is not None for _, g in rows):
        m = [g["acc_node_eval"] for _, g in rows]
        out.append(Claim(f"PartPSP-1 > PartPSP-2 > SGPDP at {b}, {topo} (per-node evaluation, aligned setting)",
                         bool(m[0] > m[1] > m[2]), " > ".join(f"{lab} {fmt(v)}" for (lab, _), v in zip(rows, m)),
                         cells=tuple((lab, _vals(g)) for lab, g in rows), ordered=True))
    for lab in _MAIN3:
        cells = [(t, pick(groups, algorithm=lab, b=b, topology=t)) for t in ALIGNED_TOPOS[scale]]
        cells = [(t, g) for t, g in cells if g is not None]
        if len(cells) >= 2 and lab == "PartPSP-1":
            first, last = cells[0][1]["acc_node_eval"], cells[-1][1]["acc_node_eval"]
            out.append(Claim(f"PartPSP-1's accuracy rises with the degree ({cells[0][0]} -> {cells[-1][0]}, {b})",
                             bool(last > first), f"{fmt(first)} -> {fmt(last)}",
                             cells=((cells[0][0], _vals(cells[0][1])), (cells[-1][0], _vals(cells[-1][1])))))
        nodp = pick(groups, algorithm=lab, b="NoDP")
        priv = pick(groups, algorithm=lab, b=b, topology=topo)
        if nodp is not None and priv is not None:
            out.append(Claim(f"{lab}: privacy costs accuracy ({b} < NoDP, {topo})",
                             bool(priv["acc_node_eval"] < nodp["acc_node_eval"]),
                             f"{fmt(priv['acc_node_eval'])} vs {fmt(nodp['acc_node_eval'])}",
                             cells=(("private", _vals(priv)), ("NoDP", _vals(nodp)))))
    return out


def _eval_spread(records) -> float:
    """The largest |per-node - network-average| accuracy over the runs evaluated per node (nan without any)."""
    d = [abs(r["acc_node_eval"] - r["final_acc"]) for r in records
         if r.get("acc_node_eval") is not None and r.get("final_acc") is not None]
    return max(d) if d else float("nan")


def verdict_aligned(records, scale: str) -> str:
    """Per algorithm on the main graph: our per-node accuracy beside the paper's at each b, which cells match (within
    :data:`MOVES`), and how far the per-node evaluation is from the network average."""
    groups = group_records(records)
    topo = ALIGNED_MAIN_TOPO[scale]
    parts = []
    for lab in _MAIN3:
        cells, match = [], []
        for b in [*(f"b{x:g}" for x in ALIGNED_BS[scale]), "NoDP"]:
            g = pick(groups, algorithm=lab, b=b, topology=topo) if b != "NoDP" else pick(groups, algorithm=lab, b=b)
            if g is None:
                continue
            ours, paper = g["acc_node_eval"], PAPER_4OUT[lab][b] / 100
            cells.append(f"{b} {fmt(ours)} (paper {paper:.3f})")
            if abs(ours - paper) <= MOVES:
                match.append(b)
        if cells:
            parts.append(f"{lab}: {', '.join(cells)}; within {MOVES:g} of the paper: "
                         f"{', '.join(match) or 'none'}")
    if not parts:
        return "Verdict: open (the runs that decide it have not finished)."
    spread = _eval_spread(records)
    return (f"Verdict, from these runs ({topo}, per-node evaluation, aligned setting): " + "; ".join(parts)
            + f". Per-node and network-average evaluation differ by at most {fmt(spread)}: the evaluation is not "
            "what separates our numbers from the paper's; Fashion-MNIST stands in for MNIST, which bounds how close "
            "the NoDP rows can come. Where a private cell is off, the step decay, [0, 1] inputs and sync period 4 "
            "together do not explain it; the authors' own code on Fashion-MNIST does (pattern-diag's verdict, "
            "docs/reproductions.md): their PartPSP-2 then beats their PartPSP-1 as ours does.")


def _render_aligned(records, scale: str, out: Path):
    groups = group_records(records)
    topos = ALIGNED_TOPOS[scale]
    lines = [verdict_aligned(records, scale), "",
             "Accuracy, per-node evaluation (shared part averaged exactly, each node's own head; the authors' "
             "evaluation) / the network-average model (ours in `table2`), final round; paper: Table 2, MLP (%).", ""]
    rows = []
    for lab in _MAIN3:
        for b in [*(f"b{x:g}" for x in ALIGNED_BS[scale]), "NoDP"]:
            row = [lab, b]
            for t in topos:
                g = pick(groups, algorithm=lab, b=b, topology=t)
                row.append("-" if g is None else f"{_acc(g, 'acc_node_eval')} / {fmt(g.get('final_acc'))}")
            row.append(fmt(PAPER_4OUT[lab].get(b)))
            rows.append(row)
    lines += md_table(["algorithm", "b", *[f"{t}: per node / average" for t in topos], "paper 4-Out (%)"], rows)
    return lines, []


def _differences_aligned(scale: str) -> list[str]:
    s = SETTINGS[scale]
    return [
        f"Aligned with the authors' code (WearTheClo/PartPSP, see `table2`'s list with file:line on both sides): "
        f"step decay / 10 from rounds {_decay(s['rounds'])} (of {s['rounds']}), inputs in [0, 1] (data.scaling = "
        f"unit), sync period {ALIGNED['sync_period']}, per-node evaluation (run once on the final nodes).",
        "Not aligned: Poisson batches (theirs: fixed shards), the final accuracy after the last round (theirs: after "
        "11 of 12 epochs), the real sensitivity for the noise scale (the paper's Sec. 5.4; their code: the estimate).",
        f"Rows: PartPSP-1, PartPSP-2, SGPDP at b = {ALIGNED_BS[scale]} on {ALIGNED_TOPOS[scale]}, NoDP on "
        f"{ALIGNED_MAIN_TOPO[scale]} only (b = 2, PEDFL, the ResNet-18 column and the 6-Out graph are not run here).",
        STAND_IN,
    ]


def _claims_pattern(records, scale: str) -> list[Claim]:
    groups = group_records(records)
    out = []
    for lab, bs in (("PartPSP-2", PATTERN_BS[scale]), ("SGPDP", [3.0])):
        for b in bs:
            std = pick(groups, algorithm=lab, b=f"b{b:g}", scaling="standard", length="table2")
            unit = pick(groups, algorithm=lab, b=f"b{b:g}", scaling="unit", length="table2")
            if std is None or unit is None:
                continue
            d = unit["final_acc"] - std["final_acc"]
            paper = PAPER_4OUT[lab][f"b{b:g}"] / 100
            gap = std["final_acc"] - paper
            share = f"; of the gap to the paper's {paper:.4f} it closes {-d / gap:.0%}" if gap > 0 else ""
            out.append(Claim(f"{lab}, b{b:g}: [0, 1] inputs lower the accuracy by more than {MOVES:g}",
                             bool(d < -MOVES),
                             f"standard {fmt(std['final_acc'])}, unit {fmt(unit['final_acc'])} "
                             f"(change {fmt(d)}{share})",
                             cells=(("standard", _vals(std, "final_acc")), ("unit", _vals(unit, "final_acc")))))
    one = pick(groups, algorithm="SGPDP", length="one epoch")
    if one is not None:
        out.append(Claim("SGPDP after one epoch stays near chance (< 0.3), as in the authors' code at that setting",
                         bool(one["final_acc"] < 0.3), f"accuracy {fmt(one['final_acc'])}"))
    return out


def verdict_pattern(records, scale: str) -> str:
    """How much of PartPSP-2's gap to the paper the [0, 1] inputs explain, and whether SGPDP's collapse is there
    (near chance at both lengths) and depends on the inputs."""
    groups = group_records(records)
    parts = []
    shares = []
    for b in PATTERN_BS[scale]:
        std = pick(groups, algorithm="PartPSP-2", b=f"b{b:g}", scaling="standard", length="table2")
        unit = pick(groups, algorithm="PartPSP-2", b=f"b{b:g}", scaling="unit", length="table2")
        if std is None or unit is None:
            continue
        d, gap = unit["final_acc"] - std["final_acc"], std["final_acc"] - PAPER_4OUT["PartPSP-2"][f"b{b:g}"] / 100
        shares.append(-d / gap if gap > 0 else float("nan"))
        parts.append(f"PartPSP-2 b{b:g}: [0, 1] inputs {d:+.3f} ({fmt(std['final_acc'])} -> {fmt(unit['final_acc'])}; "
                     f"paper {PAPER_4OUT['PartPSP-2'][f'b{b:g}']:.2f} %)")
    if shares:
        parts.append("the input scaling explains " + (
            "most" if min(shares) >= 0.5 else f"at most {max(shares):.0%}") + " of PartPSP-2's gap to the paper"
            + ("" if min(shares) >= 0.5 else " (not the cause)"))
    ratios = [r for g in groups if g["algorithm"] == "PartPSP-2" for r in _estimate_over_real(g)]
    if ratios:
        two = [g for g in groups if g["algorithm"] == "PartPSP-2" and g["scaling"] == "standard"]
        noise = sorted(_mean_history(g, "noise_std") for g in two)
        accs = [g["final_acc"] for g in two]
        parts.append(f"the authors' code scales the noise by the sensitivity estimate (optimizer/PartialGP.py:258-260), "
                     f"which these runs log beside the real sensitivity they use: estimate / real "
                     f"{min(ratios):.2f}-{max(ratios):.2f} (median per run), while PartPSP-2's b = 1 and b = 3 runs, "
                     f"whose mean noise std differs {noise[-1] / noise[0]:.0f}x, end within "
                     f"{max(accs) - min(accs):.3f} of each other: a noise scale {max(ratios):.1f}x larger does not "
                     "explain PartPSP-2's paper numbers either")
    p1 = {sc: pick(groups, algorithm="PartPSP-1", b=f"b{T3_B:g}", topology=T3_TOPO, scaling=sc)
          for sc in ("standard", "unit")}
    if all(p1.values()):
        s_std, s_unit = (_mean_history(p1[sc], "sensitivity_real") for sc in ("standard", "unit"))
        parts.append(f"PartPSP-1 at Table 3's b = {T3_B:g} on {T3_TOPO}: [0, 1] inputs "
                     f"{p1['unit']['final_acc'] - p1['standard']['final_acc']:+.3f} ({fmt(p1['standard']['final_acc'])} "
                     f"-> {fmt(p1['unit']['final_acc'])}) with mean real sensitivity {s_std:.1f} -> {s_unit:.1f} "
                     f"(the authors' released log: {AUTHORS_T3_PARTPSP1['sensitivity_real']:g} at "
                     f"{AUTHORS_T3_PARTPSP1['accuracy']:.2f} % on MNIST)")
    std = pick(groups, algorithm="SGPDP", b="b3", scaling="standard", length="table2")
    unit = pick(groups, algorithm="SGPDP", b="b3", scaling="unit", length="table2")
    one = pick(groups, algorithm="SGPDP", length="one epoch")
    sg = [g["final_acc"] for g in (std, unit, one) if g is not None]
    if sg:
        collapsed = max(sg) < 0.3
        parts.append(f"SGPDP b3: {', '.join(fmt(v) for v in sg)} (table2 standard / unit / one epoch where run; paper "
                     f"{PAPER_4OUT['SGPDP']['b3']:.2f} %): " + (
                         "near chance at every length and input scaling (the paper's is low too, above ours): SGPDP "
                         "fails here as in the paper, and the inputs are not the cause" if collapsed else "not near chance in every run"))
    spread = _eval_spread(records)
    if not parts:
        return "Verdict: open (the runs that decide it have not finished)."
    parts.append("the authors' own code on Fashion-MNIST (docs/reproductions.md; one seed, 2 epochs) puts PartPSP-2 "
                 "ahead of PartPSP-1 as ours does: " + ", ".join(
                     f"{two:.1f} vs {one:.1f} % at {where}" for where, (two, one) in AUTHORS_CODE_FMNIST.items())
                 + ", where their MNIST logs and the paper have PartPSP-1 far ahead: PartPSP-2's paper level is "
                 "MNIST's, not our implementation's")
    return ("Verdict, from these runs: " + "; ".join(parts)
            + (f". Per-node and network-average evaluation differ by at most {fmt(spread)}." if spread == spread else "."))


def _estimate_over_real(group: dict[str, Any]) -> list[float]:
    """Per run of ``group``: the median over its logged rounds of the sensitivity estimate over the real one."""
    import statistics

    out = []
    for rec in group.get("records", []):
        r = [h["sensitivity_est"] / h["sensitivity_real"] for h in rec.get("history", [])
             if h.get("sensitivity_real") and "sensitivity_est" in h]
        if r:
            out.append(statistics.median(r))
    return out


def _mean_history(group: dict[str, Any], key: str) -> float:
    """``key`` of ``group``'s runs' history rows, averaged over their logged rounds."""
    vals = [float(h[key]) for rec in group.get("records", []) for h in rec.get("history", []) if key in h]
    return sum(vals) / len(vals) if vals else float("nan")


def _render_pattern(records, scale: str, out: Path):
    groups = group_records(records)
    rows = []
    for g in sorted(groups, key=lambda g: (g["algorithm"], g["b"], g.get("length", ""), g["scaling"])):
        on_t2 = g["topology"] == PATTERN_TOPO[scale]
        rows.append([g["algorithm"], g["b"], g["topology"], g.get("length", "-"), g["scaling"], _acc(g, "final_acc"),
                     _acc(g, "acc_node_eval"), fmt(_mean_history(g, "sensitivity_real")),
                     fmt(PAPER_4OUT[g["algorithm"]].get(g["b"])) if on_t2 else "-"])
    lines = [verdict_pattern(records, scale), "",
             f"Single-factor runs at Table 2's setting on {PATTERN_TOPO[scale]}, and PartPSP-1 at Table 3's b = "
             f"{T3_B:g} on {T3_TOPO} (no other alignment).", ""]
    lines += md_table(["algorithm", "b", "graph", "length", "inputs", "network-average accuracy", "per-node accuracy",
                       "mean real sensitivity", "paper 4-Out (%)"], rows)
    return lines, []


def _differences_pattern(scale: str) -> list[str]:
    return ["Each pair differs in one factor only (the input scaling, or the length); everything else is "
            "`table2`'s setting, so a difference between a pair is that factor's effect.", STAND_IN]


TABLE_ALIGNED = Table("Table 2 aligned with the authors' code (step decay, [0, 1] inputs, sync 4, per-node "
                      "evaluation)", _build_aligned, _claims_aligned, _render_aligned, _differences_aligned)
TABLE_PATTERN = Table("PartPSP-2's and SGPDP's patterns: input scaling and length, one factor at a time",
                      _build_pattern, _claims_pattern, _render_pattern, _differences_pattern)
