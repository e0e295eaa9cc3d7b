"""PartPSP Fig. 2 diagnostic: why the estimated sensitivity falls below the real one in a few rounds.

At paper scale every Fig. 2 run of ``table2`` has 1-8 of its 120 rounds with est < real (min est/real 0.887), where
the paper's Fig. 2 stays above.  Two causes are possible: our implementation (e.g. the sync not leaving every node in
one state, or the real sensitivity measured wrong), or the estimator itself.  Eq. (22) resets, in the first round
after a sync (and at k = 0), to S = 2 C' max_i ||eps_i||_1, while two nodes leaving one common state are up to
max_ij ||eps_i - eps_j||_1 <= 2 max_i ||eps_i||_1 apart: with C' < 1 (0.78 here) the reset value can fall below the
real sensitivity, by up to a factor C', and nowhere else does the analysis predict it.  The paper's own released
Fig. 4 logs show the same thing: 1-3 violations per run, always in the first round after a sync.

The runs: table2's Fig. 2 configurations at the scale's settings (paper: PartPSP-1/-2 x EXP/2-Out, MLP, b = 5,
120 rounds), each with our optional safe floor (``reset_floor``: S >= 2 max_i ||eps_i||_1 in reset rounds)
off and on.  The claims are the diagnostic questions, each answered from the records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core import Claim, Table, curve, fmt, new_axes, savefig, seed_means
from .._common import md_table, style
from ._shared import SETTINGS
from .table2 import FIG2, FIG2_MODELS, FIG2_RESNET, FIG2_SYNC, FIG2_TOPOS, _sens_rows, below_real, fig2_spec, reset_round

__all__ = ["TABLE", "FLOORS"]

#: the floor off (the paper's and the authors' code's estimator) and on (our safe floor)
FLOORS = {"off": False, "on": True}
#: claim (a) holds when at least this share of the floor-off runs' below-real rounds are reset rounds
RESET_SHARE = 0.9
#: claim (c): the floor's accuracy cost counts as small within this many points (accuracy in [0, 1])
ACC_TOL = 0.01


def _build(scale: str, seeds: list[int]):
    specs = []
    for seed in seeds:
        for mname in FIG2_MODELS[scale]:
            for topo_label in FIG2_TOPOS[scale]:
                for label in FIG2:
                    for floor, on in FLOORS.items():
                        cell = f"-{mname}" if mname != "MLP" else ""
                        specs.append(fig2_spec(
                            scale, seed, mname, topo_label, label, reset_floor=on,
                            run_id=f"fig2diag-{label}{cell}-{topo_label}-floor-{floor}",
                            labels={"figure": "fig2-diag", "algorithm": label, "model": mname,
                                    "topology": topo_label, "floor": floor, "sync": FIG2_SYNC}))
    return specs


def _name(r: dict[str, Any]) -> str:
    lab = r["labels"]
    return f"{lab['algorithm']}, {lab['model']}, {lab['topology']}"


def _c_prime(r: dict[str, Any]) -> float:
    """The run's C' (table2's Fig. 2 constants)."""
    return (FIG2 if r["labels"]["model"] == "MLP" else FIG2_RESNET)[r["labels"]["algorithm"]][0]


def _sync(r: dict[str, Any]) -> int:
    return int(r["labels"].get("sync", FIG2_SYNC))


def _stats(r: dict[str, Any]) -> dict[str, Any]:
    """Per run: rounds, below-real rounds (in reset rounds / elsewhere), est/real ratios, mean est."""
    rows = _sens_rows(r)
    sp = _sync(r)
    bad = below_real(r, sp)
    ratios = [(k, e / rl) for k, e, rl in rows if rl > 0]
    reset_ratios = [q for k, q in ratios if reset_round(k, sp)]
    other_ratios = [q for k, q in ratios if not reset_round(k, sp)]
    nan = float("nan")
    return {
        "rounds": len(rows), "reset_rounds": sum(reset_round(k, sp) for k, _, _ in rows),
        "bad_reset": [x for x in bad if x[3]], "bad_other": [x for x in bad if not x[3]],
        "min_reset": min(reset_ratios, default=nan), "min_other": min(other_ratios, default=nan),
        "mean_ratio": sum(q for _, q in ratios) / len(ratios) if ratios else nan,
        "mean_est": sum(e for _, e, _ in rows) / len(rows) if rows else nan,
        "mean_real": sum(rl for _, _, rl in rows) / len(rows) if rows else nan,
    }


def _where(r: dict[str, Any], x: tuple[int, float, float, bool]) -> str:
    """'PartPSP-1, MLP, 2-Out seed 1 k = 25 (iteration 24, the sync round, est/real 0.9992)'."""
    k, e, rl, _ = x
    t, sp = k - 1, _sync(r)
    if sp <= 0:
        phase = "no sync"
    elif (t + 1) % sp == 0:
        phase = "the sync round itself, the last of its period"
    else:
        phase = f"round {t % sp + 1} of its sync period"
    return f"{_name(r)} seed {r['seed']} k = {k} (iteration {t}, {phase}, est/real {e / rl:.4f})"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _by_position(recs) -> dict[int, list[float]]:
    """est/real of every round of ``recs``, by its position in the sync period (iteration t % sync_period: 0 is
    the reset round, sync_period - 1 the sync round itself)."""
    out: dict[int, list[float]] = {}
    for r in recs:
        sp = _sync(r)
        for k, e, rl in _sens_rows(r):
            if rl > 0 and sp > 0:
                out.setdefault((k - 1) % sp, []).append(e / rl)
    return dict(sorted(out.items()))


def _split(records):
    recs = [r for r in records if r["labels"].get("figure") == "fig2-diag" and _sens_rows(r)]
    return [r for r in recs if r["labels"]["floor"] == "off"], [r for r in recs if r["labels"]["floor"] == "on"]


def _pairs(off, on):
    key = lambda r: (r["labels"]["algorithm"], r["labels"]["model"], r["labels"]["topology"], r["seed"])  # noqa: E731
    by = {key(r): r for r in on}
    return [(r, by[key(r)]) for r in off if key(r) in by]


def _claims(records, scale: str) -> list[Claim]:
    off, on = _split(records)
    out = []
    st_off = [(r, _stats(r)) for r in off]
    bad = [(r, x) for r, s in st_off for x in s["bad_reset"] + s["bad_other"]]
    n_reset = sum(x[3] for _, x in bad)
    rounds = sum(s["rounds"] for _, s in st_off)
    base = sum(s["reset_rounds"] for _, s in st_off)
    others = [_where(r, x) for r, x in bad if not x[3]]
    out.append(Claim(
        f"(a) floor off: the rounds with est < real are the first round after a sync (a reset round of eq. 22), as "
        f"in the paper's own Fig. 4 logs (at least {RESET_SHARE:.0%} of them)",
        bool(n_reset >= RESET_SHARE * len(bad)) if bad else None,
        (f"{n_reset} of {len(bad)} below-real rounds ({n_reset / len(bad):.0%}) are reset rounds, which are only "
         f"{base} of the {rounds} rounds ({base / rounds:.0%}) of the {len(off)} floor-off runs"
         + (f"; the others: {'; '.join(others)}" if others else "")) if bad
        else f"no round below the real sensitivity in {len(off)} floor-off runs ({rounds} rounds)"))
    mins = [(s["min_reset"] / _c_prime(r), s["min_reset"], _c_prime(r)) for r, s in st_off
            if s["min_reset"] == s["min_reset"]]  # not NaN: the run has a reset round with real > 0
    if mins:
        worst = min(mins)
        out.append(Claim(
            "(a') floor off, reset rounds: est/real >= C' (equal states after a sync are at most 2 max_i ||eps_i||_1 "
            "= est / C' apart; below C' would point at our implementation)",
            bool(worst[0] >= 1 - 1e-9),
            f"min est/real over the reset rounds {fmt(worst[1])} at C' = {worst[2]:g} (min over runs of "
            f"(est/real) / C' = {worst[0]:.3f})"))
    st_on = [(r, _stats(r)) for r in on]
    if st_on:
        left_reset = [(r, x) for r, s in st_on for x in s["bad_reset"]]
        left_other = [(r, x) for r, s in st_on for x in s["bad_other"]]
        out.append(Claim(
            "(b) floor on (S >= 2 max_i ||eps_i||_1 in reset rounds): no reset round with est < real",
            not left_reset,
            f"{len(left_reset)} reset rounds below over {len(on)} runs (min est/real in reset rounds "
            f"{fmt(min(s['min_reset'] for _, s in st_on))}); below-real rounds left elsewhere: {len(left_other)}"
            + (f" ({'; '.join(_where(r, x) for r, x in left_other)})" if left_other else "")
            + f"; min est/real outside reset rounds {fmt(min(s['min_other'] for _, s in st_on))}"))
    pairs = _pairs(off, on)
    if pairs:
        acc_off, acc_on = _mean([a["final_acc"] for a, _ in pairs]), _mean([b["final_acc"] for _, b in pairs])
        ratio_off = _mean([_stats(a)["mean_ratio"] for a, _ in pairs])
        ratio_on = _mean([_stats(b)["mean_ratio"] for _, b in pairs])
        est_up = _mean([_stats(b)["mean_est"] / _stats(a)["mean_est"] - 1 for a, b in pairs])
        out.append(Claim(
            f"(c) the floor's cost is small: final accuracy within {ACC_TOL * 100:g} point of floor off "
            "(paired by configuration and seed)",
            bool(abs(acc_on - acc_off) <= ACC_TOL),
            f"{len(pairs)} pairs: accuracy off {fmt(acc_off)} vs on {fmt(acc_on)} ({(acc_on - acc_off) * 100:+.2f} "
            f"points); mean est/real off {fmt(ratio_off)} vs on {fmt(ratio_on)}; mean estimate (the Laplace "
            f"scale's S) {est_up * 100:+.1f} % with the floor",
            cells=(("floor off", seed_means(a for a, _ in pairs)), ("floor on", seed_means(b for _, b in pairs)))))
    return out


def _findings(records, scale: str) -> list[str]:
    """The "why" section's conclusion in numbers."""
    off, on = _split(records)
    if not off:
        return []
    st_off = [(r, _stats(r)) for r in off]
    bad = [(r, x) for r, s in st_off for x in s["bad_reset"] + s["bad_other"]]
    n_reset = sum(x[3] for _, x in bad)
    cps = sorted({_c_prime(r) for r in off})
    cp = "/".join(f"{c:g}" for c in cps)
    min_reset = min((s["min_reset"] for _, s in st_off), default=float("nan"))
    lines = [
        f"Conclusion: the estimator with C' < 1, not our implementation, is what falls below the real sensitivity. "
        f"Floor off, {n_reset} of the {len(bad)} below-real rounds of {len(off)} runs x "
        f"{st_off[0][1]['rounds']} rounds are the first round after a sync, where eq. (22) restarts at "
        f"2 C' max_i ||eps_i||_1 (C' = {cp}: {'/'.join(f'{2 * c:g}' for c in cps)} max_i ||eps_i||_1) while nodes "
        f"leaving one synced state can be up to 2 max_i ||eps_i||_1 apart; there est/real never went below C' "
        f"(min {fmt(min_reset)}), as that bound allows (states left unequal by a sync, or a wrong real "
        "sensitivity, could go lower). The paper's own released Fig. 4 logs fall below in the same rounds: 1-3 "
        "per run, by up to ~3 %."]
    others = [_where(r, x) for r, x in bad if not x[3]]
    if others:
        lines.append(f"The {len(others)} below-real round(s) outside a reset round ({'; '.join(others)}) are where "
                     "eq. (22)'s recursion is a heuristic bound with empirically tuned C', lambda, "
                     "tightest at the end of a sync period: a matter of those hyper-parameters, not of the "
                     "reset.")
    st_on = [(r, _stats(r)) for r in on]
    pairs = _pairs(off, on)
    if st_on and pairs:
        left_reset = sum(len(s["bad_reset"]) for _, s in st_on)
        left_other = sum(len(s["bad_other"]) for _, s in st_on)
        acc_off, acc_on = _mean([a["final_acc"] for a, _ in pairs]), _mean([b["final_acc"] for _, b in pairs])
        est_up = _mean([_stats(b)["mean_est"] / _stats(a)["mean_est"] - 1 for a, b in pairs])
        lines.append(f"With our safe floor (reset_floor: S >= 2 max_i ||eps_i||_1 in reset rounds), "
                     f"{left_reset} reset rounds are below the real sensitivity, at a mean estimate (the Laplace "
                     f"scale) {est_up * 100:+.1f} % and accuracy {fmt(acc_on)} vs {fmt(acc_off)} without it.")
        if left_other:
            pos_off, pos_on = _by_position(off), _by_position(on)
            last = max(pos_off)
            lines.append(
                f"Outside reset rounds the floor changes little: {left_other} floor-on round(s) there are below "
                f"(floor off: {sum(len(s['bad_other']) for _, s in st_off)}); at the last round "
                f"of a sync period (the sync round itself) est/real is {fmt(_mean(pos_off[last]))} on average, min "
                f"{fmt(min(pos_off[last]))} floor off vs {fmt(_mean(pos_on[last]))}, min {fmt(min(pos_on[last]))} "
                "floor on. There eq. (22)'s recursion, a heuristic bound with empirically tuned C', lambda, "
                "is tightest within a period, as in the paper's own Fig. 2 logs (min est/real "
                "1.014-1.051 over 120 rounds): a matter of those hyper-parameters, not of the reset.")
    return lines


def _render(records, scale: str, out: Path):
    s = SETTINGS[scale]
    recs = sorted((r for r in records if r["labels"].get("figure") == "fig2-diag"),
                  key=lambda r: (r["labels"]["algorithm"], r["labels"]["topology"], r["seed"], r["labels"]["floor"]))
    lines = [f"## Fig. 2 diagnostic: est < real rounds, reset rounds, and the safe floor (b = 5, N = {s['n']}, "
             f"{s['fig2_rounds']} rounds, sync every {FIG2_SYNC})", "",
             "History row k is iteration k - 1; a reset round (eq. 22 restarts at 2 C' ||eps_i||_1) is iteration 0 "
             f"and every iteration t with t % {FIG2_SYNC} == 0, i.e. k = 1, {FIG2_SYNC + 1}, {2 * FIG2_SYNC + 1}, "
             f"...: the first round after a sync (iteration t is a sync round iff (t + 1) % {FIG2_SYNC} == 0). "
             "'below' counts rounds with est < real: in reset rounds / elsewhere.", ""]
    rows = []
    for r in recs:
        st = _stats(r)
        rows.append([_name(r), str(r["seed"]), r["labels"]["floor"], str(st["rounds"]),
                     f"{len(st['bad_reset'])} / {len(st['bad_other'])}", fmt(st["min_reset"]), fmt(st["min_other"]),
                     fmt(st["mean_ratio"]), fmt(st["mean_real"]), fmt(st["mean_est"]), fmt(r["final_acc"])])
    lines += md_table(["configuration", "seed", "floor", "rounds", "below (reset / other)", "min est/real (reset)",
                       "min est/real (other)", "mean est/real", "mean real", "mean est", "accuracy"], rows)
    off, on = _split(recs)
    pos = {floor: _by_position(rs) for floor, rs in (("off", off), ("on", on)) if rs}
    if pos:
        lines += ["", "est/real by position in the sync period (iteration t % sync_period: 0 = the reset round, the "
                  "first after a sync; the last = the sync round itself), mean and min over every run and round:", ""]
        positions = sorted({q for v in pos.values() for q in v})
        lines += md_table(["floor"] + [f"t % {FIG2_SYNC} = {q}" for q in positions],
                          [[floor] + [f"{fmt(_mean(v[q]))} (min {fmt(min(v[q]))})" if q in v else "-"
                                      for q in positions] for floor, v in pos.items()])
    plots = []
    cells = sorted({(r["labels"]["algorithm"], r["labels"]["model"], r["labels"]["topology"]) for r in recs})
    if cells:
        fig, axes = new_axes(len(cells))
        for ax, cell in zip(axes, cells):
            for r in recs:
                lab = r["labels"]
                if (lab["algorithm"], lab["model"], lab["topology"]) != cell or r["seed"] != recs[0]["seed"]:
                    continue
                ks, est = curve(r, "sensitivity_est")
                _, real = curve(r, "sensitivity_real")
                ax.plot(ks, [e / rl if rl > 0 else float("nan") for e, rl in zip(est, real)],
                        ls="-" if lab["floor"] == "off" else "--", label=f"floor {lab['floor']}")
                if lab["floor"] == "off":
                    bad = below_real(r, _sync(r))
                    ax.scatter([x[0] for x in bad], [x[1] / x[2] for x in bad], color="tab:red", s=12, zorder=3,
                               label="est < real (floor off)")
            ax.axhline(1.0, color="black", lw=0.8)
            style(ax, xlabel="round k", ylabel="est / real", title=f"{', '.join(cell)} (seed {recs[0]['seed']})")
        plots.append(savefig(fig, out, "est_over_real.png"))
    return lines, plots


def _differences(scale: str) -> list[str]:
    s = SETTINGS[scale]
    return [
        "Dataset: Fashion-MNIST stands in for MNIST (not available offline; see table2); the model is the paper's "
        "3-layer tanh MLP; C', lambda per split from the released Fig. 2 logs (0.78 / 0.55 and 0.78 / 0.62).",
        f"{s['fig2_rounds']} rounds (the paper's Fig. 2 logs 120), N = {s['n']}, b = 5, sync every {FIG2_SYNC}.",
        "The floor-on runs are ours, not the paper's: our optional safe floor, "
        "``reset_floor = true`` in [algorithm.params].",
        "The claims of this target are our diagnostic questions, not the paper's claims: a FAIL answers a question, "
        "it is not a failed reproduction.",
    ]


TABLE = Table("Fig. 2 diagnostic: where est < real falls (reset rounds), and the reset-round safe floor", _build,
              _claims, _render, _differences, findings=_findings)
