"""Dyn-D2P Table 2 diagnostics: why our accuracies differ from the paper's at eps = 0.3.

Table 2 at the paper's setting puts Const-D2P far above the paper (0.72 vs 45.37 %) and Dyn-D2P far below it
(0.66 vs 84.88 %).  The paper tunes Cbar (Const) and rho_c, rho_mu (Dyn) per eps and does not report the batch size;
we run our defaults.  These runs decide between "hyper-parameters" and "our implementation":

- **clip-only twins** (``clip_only``: the variant's C_k, no noise): with the non-private run they split the gap to
  non-private into what clipping costs and what the noise costs;
- **the paper's tuning protocol**, a slice of its grids at eps = 0.3: Const-D2P over Cbar, Dyn-D2P over
  1/rho_c = 1/rho_mu (the paper's calibration, as in its table);
- **the batch size** the paper leaves open: B = 4x ours at the same number of epochs;
- **the learning rate** against the clipping (``LR_FACTOR`` x the paper's 0.03): the clip-only twins at 10x the step
  size decide whether clipped training itself can reach the paper's accuracies in K = 3000 (then the gap is the
  step size / training length, hyper-parameters, not our clipping), and the private runs at eps 0.3 with that
  step size say how much of it survives the noise.

The claims are the diagnostic questions, each answered from the records.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ...core import Claim, Table, fmt, group_records, new_axes, pick, savefig
from .._common import md_table, pushsum_spec
from ._shared import CLIP, DELTA, PAPER_EPS, PAPER_TABLES, SETTINGS

__all__ = ["diag_table", "DIAG_EPS", "TABLE"]

#: the eps of the largest gaps to the paper
DIAG_EPS = 0.3
#: per scale: Const-D2P's Cbar grid and Dyn-D2P's 1/rho grid (1/rho_c = 1/rho_mu), slices of the paper's grids
GRIDS = {"smoke": dict(clip_bar=(1.5, 0.5), inv_rho=(0.5, 0.8)),
         "ci": dict(clip_bar=(1.5, 0.5), inv_rho=(0.5, 0.8)),
         "full": dict(clip_bar=(2.5, 1.5, 0.5), inv_rho=(0.1, 0.5, 0.8))}
#: the larger batch, as a multiple of the table's (same number of epochs: K / this)
BATCH_FACTOR = 4
#: the larger step size, as a multiple of the table's (our clip-only twins reach at K = 3000 what the non-private
#: run reaches at K = 250: the clipped steps are ~10x shorter)
LR_FACTOR = 10
#: the ``diagnostic`` labels of the step-size runs
LR_TWIN, LR_PRIVATE = f"clip only, lr x{LR_FACTOR}", f"lr x{LR_FACTOR}"
#: a milder step size for the private runs (at 10x the noise blows the network average's loss up), and its label
LR_MILD = 3
LR_PRIVATE_MILD = f"lr x{LR_MILD}"


def diag_table(settings: dict[str, dict[str, Any]], clip: dict[str, float], delta: float,
               paper_rows: dict[str, list[float]], paper_eps: list[float]) -> Table:
    """The ``table2-diag`` target, built on Table 2's ``settings`` (per scale), clip defaults and delta."""
    paper_at = {alg: vals[paper_eps.index(DIAG_EPS)] / 100 for alg, vals in paper_rows.items()}

    def build(scale: str, seeds: list[int]):
        s = settings[scale]
        g = GRIDS[scale]

        def spec(run_id: str, labels: dict[str, Any], params: dict[str, Any], seed: int, batch: int = s["B"]):
            factor = batch // s["B"]
            return pushsum_spec(
                f"diag-{run_id}", {"diagnostic": "-", "algorithm": "-", "clip_bar": "-", "inv_rho": "-",
                                   "batch": batch, **labels}, seed=seed,
                num_iters=max(1, s["K"] // factor), eval_every=max(1, s["eval_every"] // factor), n_nodes=s["n"],
                model=s["model"], topology="exp_one_peer", algorithm="dyn_d2p", dataset=s["dataset"],
                samples_per_node=s["samples_per_node"], test_samples=s["test_samples"],
                params={"batch_size": batch, "lr": s["lr"], "delta": delta, "rho_c": 2.0, "rho_mu": 2.0, **clip,
                        "epsilon": DIAG_EPS, "calibration": "paper", **params})

        specs = []
        for seed in seeds:
            specs.append(spec("nonprivate", {"diagnostic": "non-private", "algorithm": "Non-private"},
                              {"variant": "nonprivate"}, seed))
            for v, name in (("const", "Const-D2P"), ("dyn", "Dyn-D2P")):
                specs.append(spec(f"{v}-clip-only", {"diagnostic": "clip only", "algorithm": name},
                                  {"variant": v, "clip_only": True}, seed))
            # in the order of the questions' weight (a sweep that stops early has answered the first ones): Dyn-D2P's
            # mildest decays, then the step size (Dyn-D2P has the largest gap), then the rest of the grids
            invs = sorted(g["inv_rho"], reverse=True)
            dyn_grid = [spec(f"dyn-inv{inv:g}", {"diagnostic": "grid", "algorithm": "Dyn-D2P", "inv_rho": inv},
                             {"variant": "dyn", "rho_c": 1 / inv, "rho_mu": 1 / inv}, seed) for inv in invs]
            specs += dyn_grid[:2]
            lr = s["lr"] * LR_FACTOR
            for v, name in (("dyn", "Dyn-D2P"), ("const", "Const-D2P")):
                specs.append(spec(f"{v}-clip-only-lr{lr:g}", {"diagnostic": LR_TWIN, "algorithm": name},
                                  {"variant": v, "clip_only": True, "lr": lr}, seed))
                specs.append(spec(f"{v}-lr{lr:g}", {"diagnostic": LR_PRIVATE, "algorithm": name},
                                  {"variant": v, "lr": lr}, seed))
            mild = round(s["lr"] * LR_MILD, 10)
            for v, name in (("dyn", "Dyn-D2P"), ("const", "Const-D2P")):
                specs.append(spec(f"{v}-lr{mild:g}", {"diagnostic": LR_PRIVATE_MILD, "algorithm": name},
                                  {"variant": v, "lr": mild}, seed))
            specs += dyn_grid[2:]
            for cb in g["clip_bar"]:
                specs.append(spec(f"const-cbar{cb:g}", {"diagnostic": "grid", "algorithm": "Const-D2P",
                                                        "clip_bar": cb}, {"variant": "const", "clip_bar": cb}, seed))
            for v, name in (("const", "Const-D2P"), ("dyn", "Dyn-D2P")):
                specs.append(spec(f"{v}-batch{BATCH_FACTOR * s['B']}", {"diagnostic": "batch", "algorithm": name},
                                  {"variant": v}, seed, batch=BATCH_FACTOR * s["B"]))
        return specs

    def claims(records, scale: str) -> list[Claim]:
        groups = group_records(records)
        nonpriv = pick(groups, diagnostic="non-private")
        out = []
        for name in ("Const-D2P", "Dyn-D2P"):
            twin = pick(groups, diagnostic="clip only", algorithm=name)
            grid = [g for g in groups if g["diagnostic"] == "grid" and g["algorithm"] == name]
            best = max(grid, key=lambda g: g["final_acc"]) if grid else None
            if nonpriv is not None and twin is not None:
                clip_cost = nonpriv["final_acc"] - twin["final_acc"]
                noise = (f"; the noise at eps {DIAG_EPS:g} costs {twin['final_acc'] - best['final_acc']:+.3f} more "
                         f"(best grid point {fmt(best['final_acc'])})" if best is not None else
                         "; the grid runs that price the noise have not finished")
                out.append(Claim(f"{name}: clipping alone costs less than 3 points (clip-only twin vs non-private)",
                                 bool(clip_cost < 0.03), f"non-private {fmt(nonpriv['final_acc'])}, clip-only "
                                 f"{fmt(twin['final_acc'])}: clipping costs {clip_cost:+.3f}{noise}"))
            if twin is not None:
                # no noise can raise the accuracy above its noiseless twin's: the paper's number above it needs
                # another clipping (hyper-parameters), whatever the noise calibration
                out.append(Claim(f"{name}: our default clipping (no noise at all) reaches the paper's "
                                 f"{paper_at[name] * 100:.2f} % at eps {DIAG_EPS:g} (within 3 points)",
                                 bool(twin["final_acc"] >= paper_at[name] - 0.03),
                                 f"clip-only twin {fmt(twin['final_acc'])} vs the paper's {paper_at[name]:.4f}: "
                                 f"{(twin['final_acc'] - paper_at[name]) * 100:+.1f} points"))
            if best is not None:
                gap = best["final_acc"] - paper_at[name]
                out.append(Claim(f"{name}: the best point of the paper's grid (slice) is within 3 points of the "
                                 f"paper's {paper_at[name] * 100:.2f} % at eps {DIAG_EPS:g}", bool(abs(gap) <= 0.03),
                                 f"best {fmt(best['final_acc'])} at {_setting(best)}; {gap * 100:+.1f} points; grid "
                                 + ", ".join(f"{_setting(g)}: {fmt(g['final_acc'])}" for g in grid)))
        const = [g for g in groups if g["diagnostic"] == "grid" and g["algorithm"] == "Const-D2P"]
        dyn = [g for g in groups if g["diagnostic"] == "grid" and g["algorithm"] == "Dyn-D2P"]
        if const and dyn:
            bc, bd = max(g["final_acc"] for g in const), max(g["final_acc"] for g in dyn)
            out.append(Claim(f"Tuned as the paper tunes (best of each grid), Dyn-D2P beats Const-D2P at eps "
                             f"{DIAG_EPS:g}", bool(bd > bc), f"Dyn-D2P {fmt(bd)} vs Const-D2P {fmt(bc)}"))
        base_lr = settings[scale]["lr"]
        for name in ("Const-D2P", "Dyn-D2P"):
            fast = pick(groups, diagnostic=LR_TWIN, algorithm=name)
            twin = pick(groups, diagnostic="clip only", algorithm=name)
            if nonpriv is not None and fast is not None:
                # the implementation check: clipped training with a step size fit for clipped gradients reaches
                # the non-private accuracy (our clipping is right; the paper's numbers need another step size / K)
                out.append(Claim(f"{name}: with {LR_FACTOR}x the step size, clipping alone costs less than 3 points "
                                 "(clip-only twin vs non-private)", bool(nonpriv["final_acc"] - fast["final_acc"] < 0.03),
                                 f"non-private {fmt(nonpriv['final_acc'])}, clip-only at lr {base_lr * LR_FACTOR:g} "
                                 f"{fmt(fast['final_acc'])}" + (f" (at lr {base_lr:g}: {fmt(twin['final_acc'])})"
                                                                if twin is not None else "")))
            for factor, label in ((LR_FACTOR, LR_PRIVATE), (LR_MILD, LR_PRIVATE_MILD)):
                noisy = pick(groups, diagnostic=label, algorithm=name)
                if noisy is None:
                    continue
                gap = noisy["final_acc"] - paper_at[name]
                out.append(Claim(f"{name}: with {factor}x the step size, eps {DIAG_EPS:g} is within 3 points of the "
                                 f"paper's {paper_at[name] * 100:.2f} %", bool(abs(gap) <= 0.03),
                                 f"{fmt(noisy['final_acc'])} at lr {base_lr * factor:g} vs the paper's "
                                 f"{paper_at[name]:.4f} ({gap * 100:+.1f} points; rigorous eps "
                                 f"{fmt(noisy['eps_rigorous'])}; final test loss {fmt(noisy['final_loss'])})"))
        for name in ("Const-D2P", "Dyn-D2P"):
            big = pick(groups, diagnostic="batch", algorithm=name)
            base = [g for g in groups if g["diagnostic"] == "grid" and g["algorithm"] == name
                    and _is_default(g)]
            if big is not None and base:
                d = big["final_acc"] - base[0]["final_acc"]
                out.append(Claim(f"{name}: the unreported batch size matters (B x{BATCH_FACTOR} at equal epochs moves "
                                 "the accuracy by more than 3 points)", bool(abs(d) > 0.03),
                                 f"B = {big['batch']}: {fmt(big['final_acc'])} vs B = {base[0]['batch']}: "
                                 f"{fmt(base[0]['final_acc'])} ({d:+.3f})"))
        return out

    def render(records, scale: str, out: Path):
        groups = group_records(records)
        s = settings[scale]
        order = {"non-private": 0, "clip only": 1, "grid": 2, LR_TWIN: 3, LR_PRIVATE: 4, LR_PRIVATE_MILD: 5, "batch": 6}
        rows = sorted(groups, key=lambda g: (order.get(g["diagnostic"], 9), g["algorithm"], str(g["clip_bar"]),
                                             str(g["inv_rho"])))
        lines = [f"## Dyn-D2P Table 2 diagnostics at eps = {DIAG_EPS:g} (shallow CNN, n = {s['n']}, K = {s['K']} at "
                 f"B = {s['B']}, lr = {s['lr']}, the paper's calibration)", "",
                 f"The paper at eps {DIAG_EPS:g}: " + ", ".join(f"{k} {v * 100:.2f} %" for k, v in paper_at.items()),
                 ""]
        lines += md_table(["diagnostic", "algorithm", "setting", "accuracy", "eps rigorous", "eps paper", "seeds"],
                          [[g["diagnostic"], g["algorithm"], _setting(g), fmt(g["final_acc"]),
                            fmt(g["eps_rigorous"]), fmt(g["eps_paper"]), str(g["n_seeds"])] for g in rows]) + [""]
        fig, (ax,) = new_axes(1, width=8.0)
        labels = [f"{g['algorithm']}\n{g['diagnostic']}\n{_setting(g)}" for g in rows]
        ax.bar(range(len(rows)), [g["final_acc"] for g in rows], color="tab:blue")
        for name, v in paper_at.items():
            if name in ("Const-D2P", "Dyn-D2P"):
                ax.axhline(v, ls="--", lw=1, color="tab:red" if name == "Dyn-D2P" else "tab:gray",
                           label=f"paper {name} {v * 100:.1f} %")
        ax.set_xticks(range(len(rows)), labels, fontsize=6)
        ax.set_ylabel("final test accuracy")
        ax.legend(fontsize=7)
        ax.set_title(f"Dyn-D2P Table 2 diagnostics, eps {DIAG_EPS:g}", fontsize=9)
        return lines, [savefig(fig, out, "diagnostics.png")]

    def differences(scale: str) -> list[str]:
        s, g = settings[scale], GRIDS[scale]
        return [f"eps = {DIAG_EPS:g} only (the largest gaps); Const-D2P Cbar in {{{', '.join(f'{v:g}' for v in g['clip_bar'])}}}"
                f" and Dyn-D2P 1/rho_c = 1/rho_mu in {{{', '.join(f'{v:g}' for v in g['inv_rho'])}}}: slices of the "
                "paper's grids (Cbar 2.5 ... 0.5; 1/rho 0.1 ... 0.8, an 8 x 8 grid for Dyn-D2P).",
                f"Batch {BATCH_FACTOR * s['B']} runs K = {s['K'] // BATCH_FACTOR} iterations (the same epochs as "
                f"B = {s['B']} at K = {s['K']}).",
                f"The step-size runs use lr = {s['lr'] * LR_FACTOR:g} ({LR_FACTOR}x the paper's {s['lr']:g}; the private "
                f"runs also {s['lr'] * LR_MILD:g}, {LR_MILD}x), the paper's "
                "clipping defaults and K; the paper reports lr 0.03 for the CNN but not its batch size or K (its "
                "pseudo-code steps on one sample).",
                "Clip-only twins are not private (no noise, nothing charged): diagnostics, never results.",
                "The claims of this target are our diagnostic questions, not the paper's claims: a FAIL answers a "
                "question (e.g. clipping costs more than 3 points), it is not a failed reproduction."]

    def findings(records, scale: str) -> list[str]:
        """The diagnosis in numbers: what clipping costs at the paper's step size and at a fitting one, and what the
        noise of eps 0.3 costs in every private setting tried."""
        groups = group_records(records)
        nonpriv = pick(groups, diagnostic="non-private")
        if nonpriv is None:
            return []
        lines = []
        base_lr = settings[scale]["lr"]
        for name in ("Const-D2P", "Dyn-D2P"):
            twin = pick(groups, diagnostic="clip only", algorithm=name)
            fast = pick(groups, diagnostic=LR_TWIN, algorithm=name)
            private = [g for g in groups if g["algorithm"] == name and math.isfinite(g["eps_rigorous"] or math.inf)]
            if twin is None or not private:
                continue
            best = max(private, key=lambda g: g["final_acc"])
            clip = (f"clipping alone costs {(nonpriv['final_acc'] - twin['final_acc']) * 100:.1f} points at lr "
                    f"{base_lr:g}")
            if fast is not None:
                left = nonpriv["final_acc"] - fast["final_acc"]
                clip += (f" and {left * 100:.1f} at lr {base_lr * LR_FACTOR:g} (the clipped steps are short at the "
                         "paper's step size; " + ("the clipping itself is not the gap)" if left < 0.03 else
                                                  "most of the clip cost is the step size)"))
            lines.append(
                f"{name} at eps {DIAG_EPS:g}: {clip}; the best of its {len(private)} private setting(s) here "
                f"({best['diagnostic'] if _setting(best) == best['diagnostic'] else best['diagnostic'] + ', ' + _setting(best)}) "
                f"reaches {fmt(best['final_acc'])}, "
                f"{(best['final_acc'] - paper_at[name]) * 100:+.1f} points from the paper's {paper_at[name] * 100:.2f} % "
                f"(rigorous eps {fmt(best['eps_rigorous'])} for the paper's calibration of eps {DIAG_EPS:g}).")
        # Table 2's ordering claim at eps 0.3 (Dyn-D2P > Const-D2P), setting by setting: the same batch / step size
        pairs = []
        for diag_name, what in (("grid", f"B {settings[scale]['B']}, lr {base_lr:g} (Table 2's setting)"),
                                ("batch", f"B {BATCH_FACTOR * settings[scale]['B']} at equal epochs"),
                                (LR_PRIVATE_MILD, f"lr {base_lr * LR_MILD:g}"), (LR_PRIVATE, f"lr {base_lr * LR_FACTOR:g}")):
            pair = []
            for n in ("Dyn-D2P", "Const-D2P"):
                cands = [g for g in groups if g["diagnostic"] == diag_name and g["algorithm"] == n
                         and (diag_name != "grid" or _is_default(g))]
                pair.append(cands[0] if cands else None)
            if all(pair):
                pairs.append((what, pair[0]["final_acc"] - pair[1]["final_acc"], pair))
        if pairs:
            ahead = [w for w, d, _ in pairs if d > 0]
            lines.append(
                f"Table 2's ordering at eps {DIAG_EPS:g} (Dyn-D2P > Const-D2P), setting by setting: "
                + "; ".join(f"{w}: Dyn-D2P {fmt(p[0]['final_acc'])} vs Const-D2P {fmt(p[1]['final_acc'])} ({d:+.3f})"
                            for w, d, p in pairs)
                + (": Dyn-D2P leads only at " + ", ".join(ahead) + ", so the ordering at this eps turns on the "
                   "batch and step size at our K (the paper gives lr 0.03 but neither B nor K), not on the algorithms "
                   "as we implement them." if ahead and len(ahead) < len(pairs) else
                   ": Dyn-D2P leads in every setting tried." if ahead else
                   ": Dyn-D2P trails in every setting tried; these hyper-parameters do not explain it."))
        # the verdict, from the same numbers: an implementation fault would show in the clip-only twins at a fitting
        # step size (no noise: only our clipping and push-sum), a tuning/scale cause in the private settings alone
        twins = [pick(groups, diagnostic=LR_TWIN, algorithm=n) for n in ("Const-D2P", "Dyn-D2P")]
        if all(t is not None for t in twins) and lines:
            worst = max(nonpriv["final_acc"] - t["final_acc"] for t in twins)
            near = [n for n in ("Const-D2P", "Dyn-D2P") if any(
                abs(g["final_acc"] - paper_at[n]) <= 0.03 for g in groups
                if g["algorithm"] == n and math.isfinite(g["eps_rigorous"] or math.inf))]
            lines.append(
                f"Verdict so far: without noise, our clipped Const-D2P and Dyn-D2P come within {worst * 100:.1f} points "
                f"of the non-private {fmt(nonpriv['final_acc'])} at lr {base_lr * LR_FACTOR:g}, so clipping and "
                "push-sum are not what separates us from the paper; "
                + ("no private setting tried comes within 3 points of the paper's number for either algorithm, "
                   "so the cause is open here: these runs rule out our clipping and push-sum, the grid slices, 4x the "
                   "batch and 3-10x the step size; `--table clip-scale` tests the clip bounds against the measured "
                   "gradient norms, and the model size." if not near else
                   f"{' and '.join(near)} come(s) within 3 points of the paper in some private setting here."))
        return lines

    return Table(f"Table 2 diagnostics at eps {DIAG_EPS:g}: clip-only twins, the paper's tuning grids, the batch size",
                 build, claims, render, differences, findings)


def _setting(g: dict[str, Any]) -> str:
    parts = []
    if g.get("clip_bar") not in (None, "-"):
        parts.append(f"Cbar {g['clip_bar']:g}")
    if g.get("inv_rho") not in (None, "-"):
        parts.append(f"1/rho {g['inv_rho']:g}")
    if g.get("diagnostic") in (LR_TWIN, LR_PRIVATE):
        parts.append(f"lr x{LR_FACTOR}")
    if g.get("diagnostic") == LR_PRIVATE_MILD:
        parts.append(f"lr x{LR_MILD}")
    if g.get("diagnostic") in ("batch", "clip only", "non-private") or not parts:
        parts.append(f"B {g['batch']}")
    return ", ".join(parts)


def _is_default(g: dict[str, Any]) -> bool:
    """The grid point with the table's own hyper-parameters (Cbar 1.5, rho 2)."""
    return g.get("clip_bar") == 1.5 or g.get("inv_rho") == 0.5


#: the ``table2-diag`` target on Table 2's settings
TABLE = diag_table(SETTINGS["table2"], CLIP["table2"], DELTA, PAPER_TABLES["table2"], PAPER_EPS)
