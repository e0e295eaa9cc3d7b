"""DP-CSGP Figs. 1-2 diagnostic: why every compressor at every eps lands at the same accuracy (0.716-0.723 at
paper scale), and where the paper's differences can show.

Three candidate causes, one factor at a time at the figures' setting (n = 10, 2-layer net, B = 64, G = 0.5,
eps 0.5, exact communication = DP2-SGD and the strongest compressor rand10):

- **clip-limited steps**: with every per-sample gradient clipped to G = 0.5 at lr 0.01 each step moves the model at
  most lr G; the clip-only twins (clipping, no noise) against the non-private runs say how much of the plateau is
  the clipping's;
- **step size**: the same runs at :data:`LR_FACTOR` x the step size (clip-only and private) say whether a larger step
  separates the cells;
- **the compressor's error under the noise**: rand10 against exact communication without noise (non-private and
  clip-only) and with it (eps 0.5) says whether the compression error shows only when the noise does not drown it.

The runs are :data:`T_DIAG` iterations long (the figures: 4687), the same for every run here, so they compare among
themselves.  ``dp_csgp.PAPER`` registers it as the ``diag`` table.
"""

from __future__ import annotations

from pathlib import Path

from ..core import Claim, acc_pm, cells_of, fmt, group_records, pick
from ._common import md_table, pushsum_spec
from ._dp_csgp_settings import COMPRESSORS, DELTA, SETTINGS

__all__ = ["T_DIAG", "LR_FACTOR", "DIAG_EPS", "DIAG_COMPRESSORS", "verdict"]

T_DIAG = {"smoke": 8, "ci": 300, "full": 1200}
EVAL_EVERY = {"smoke": 4, "ci": 100, "full": 250}
LR_FACTOR = 10
DIAG_EPS = 0.5
DIAG_COMPRESSORS = ("DP2-SGD (exact)", "rand10")
#: a factor "moves" the accuracy when it changes it by more than this
MOVES = 0.02
#: the figures' step size (the ci table's own is 0.1): every scale runs the paper's, so the factor means the same
LR = SETTINGS["full"]["lr"]


def _build(scale: str, seeds: list[int]):
    s = SETTINGS[scale]
    specs = []

    def spec(label: str, mode: str, lr_factor: int, seed: int):
        comp, gamma_c = COMPRESSORS[label]
        extra = {"nonprivate": {"nonprivate": True}, "clip only": {"clip_only": True}, "private": {}}[mode]
        return pushsum_spec(
            f"csgpdiag-{label.split(' ')[0]}-{mode.replace(' ', '')}-lrx{lr_factor}",
            {"algorithm": label, "mode": mode, "lr": f"x{lr_factor}"}, seed=seed, num_iters=T_DIAG[scale],
            eval_every=EVAL_EVERY[scale], n_nodes=s["n"], model=s["model"], topology="exp_all_hops",
            algorithm="dp_csgp", dataset=s["dataset"], samples_per_node=s["samples_per_node"],
            test_samples=s["test_samples"],
            params={"batch_size": s["B"], "lr": LR * lr_factor, "epsilon": DIAG_EPS, "delta": DELTA, "G": s["G"],
                    "compressor": comp, "gamma_c": gamma_c, "calibration": "rigorous", **extra})

    for seed in seeds:
        for f in (1, LR_FACTOR):
            for mode in ("nonprivate", "clip only", "private"):
                for label in DIAG_COMPRESSORS:
                    specs.append(spec(label, mode, f, seed))
    return specs


def _claims(records, scale: str) -> list[Claim]:
    groups = group_records(records)
    exact, comp = DIAG_COMPRESSORS
    out = []

    def g(label, mode, f=1):
        return pick(groups, algorithm=label, mode=mode, lr=f"x{f}")

    for f in (1, LR_FACTOR):
        npv, clip, priv = g(exact, "nonprivate", f), g(exact, "clip only", f), g(exact, "private", f)
        if npv and clip:
            d = npv["final_acc"] - clip["final_acc"]
            out.append(Claim(f"lr x{f}: clipping at G alone costs more than {MOVES:g} (the steps are clip-limited)",
                             bool(d > MOVES), f"non-private {acc_pm(npv)}, clip-only {acc_pm(clip)} ({d:+.3f})",
                             cells=cells_of(("non-private", npv), ("clip only", clip))))
        if clip and priv:
            d = clip["final_acc"] - priv["final_acc"]
            out.append(Claim(f"lr x{f}: the noise at eps {DIAG_EPS:g} costs more than {MOVES:g} on top of clipping",
                             bool(d > MOVES), f"clip-only {acc_pm(clip)}, private {acc_pm(priv)} ({d:+.3f})",
                             cells=cells_of(("clip only", clip), ("private", priv))))
        for mode in ("nonprivate", "clip only", "private"):
            a, b = g(exact, mode, f), g(comp, mode, f)
            if a and b:
                d = a["final_acc"] - b["final_acc"]
                out.append(Claim(f"lr x{f}, {mode}: {comp} loses more than {MOVES:g} to exact communication",
                                 bool(d > MOVES), f"exact {acc_pm(a)}, {comp} {acc_pm(b)} ({d:+.3f})",
                                 cells=cells_of(("exact", a), (comp, b))))
    return out


def verdict(records, scale: str) -> str:
    """Which of the three factors moves the accuracy (by more than :data:`MOVES`) at each step size, from the runs."""
    groups = group_records(records)
    exact, comp = DIAG_COMPRESSORS
    parts = []
    for f in (1, LR_FACTOR):
        g = {(lab, mode): pick(groups, algorithm=lab, mode=mode, lr=f"x{f}") for lab in DIAG_COMPRESSORS
             for mode in ("nonprivate", "clip only", "private")}
        if any(v is None for v in g.values()):
            continue
        acc = {k: v["final_acc"] for k, v in g.items()}
        costs = {"clipping at G": acc[exact, "nonprivate"] - acc[exact, "clip only"],
                 f"the noise at eps {DIAG_EPS:g}": acc[exact, "clip only"] - acc[exact, "private"],
                 f"{comp} under the noise": acc[exact, "private"] - acc[comp, "private"],
                 f"{comp} without noise": acc[exact, "clip only"] - acc[comp, "clip only"]}
        moves = [k for k, v in costs.items() if v > MOVES]
        parts.append(f"at lr {LR * f:g}: " + ", ".join(f"{k} costs {v:+.3f}" for k, v in costs.items())
                     + (f" -> only {' and '.join(moves)} move(s) the accuracy" if moves else " -> nothing moves it"))
    if not parts:
        return "Verdict: open (the runs that decide it have not finished)."
    return ("Verdict, from these runs (a factor moves the accuracy when it costs more than %g): " % MOVES
            + "; ".join(parts) + ". Cells that differ only in the compressor or eps stay equal wherever clipping "
            "is the only factor that moves the accuracy.")


def _render(records, scale: str, out: Path):
    groups = group_records(records)
    s = SETTINGS[scale]
    lines = [f"n = {s['n']}, {s['model']}, B = {s['B']}, G = {s['G']}, eps {DIAG_EPS:g} (rigorous calibration), "
             f"T = {T_DIAG[scale]}, lr {LR:g} and x{LR_FACTOR}; the Figs. 1-2 cells at paper scale: 0.716-0.723.", "",
             verdict(records, scale), ""]
    order = {"nonprivate": 0, "clip only": 1, "private": 2}
    rows = [[g["lr"], g["mode"], g["algorithm"], acc_pm(g), fmt(g["final_loss"]), fmt(g["eps_rigorous"])]
            for g in sorted(groups, key=lambda g: (g["lr"], order[g["mode"]], g["algorithm"]))]
    lines += md_table(["lr", "mode", "communication", "accuracy", "test loss", "eps rigorous"], rows)
    return lines, []


def _differences(scale: str) -> list[str]:
    return [f"T = {T_DIAG[scale]} for every run here (the figures: {SETTINGS['full']['T']} at paper scale); eps "
            f"{DIAG_EPS:g} only; exact communication (DP2-SGD) and rand10 only.",
            "Dataset: Fashion-MNIST stands in for MNIST (not available offline), as in Figs. 1-2 here."]
