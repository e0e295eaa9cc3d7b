"""What a reproduction's report is made of: number formatting, records grouped over seeds, the cells a table
picks, the machine line, and the figures (axes, learning curves) saved beside the report.
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .. import results as rio
from .records import FLOAT32_SAMPLER_NOTE

def fmt(x: Any, nd: int = 3) -> str:
    """A number for a table: ``nan`` -> '-', large values in scientific notation."""
    if x is None:
        return "-"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf"
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.{nd}g}"
    return f"{v:.{nd}f}"


def mean_std(vals: Iterable[float]) -> tuple[float, float, int]:
    arr = np.asarray([float(v) for v in vals if v is not None and not math.isnan(float(v))], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan"), 0
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0, int(arr.size)


def group_records(records: list[dict[str, Any]], keys: list[str] | None = None) -> list[dict[str, Any]]:
    """Records with equal labels (all but the seed) merged: mean/std/count of the numeric fields."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        labels = r["labels"]
        key = tuple((k, labels[k]) for k in (keys or sorted(labels)))
        groups.setdefault(key, []).append(r)
    out = []
    for key, rs in groups.items():
        row: dict[str, Any] = dict(key)
        heuristic = any("eps_heuristic" in r for r in rs)
        for field_ in ("final_acc", "best_acc", "final_loss", "bits_total", "eps_rigorous", "eps_paper",
                       "num_iters", "wall_time_s", "cpu_time_s", "train_cpu_s") + (("eps_heuristic",) if heuristic else ()):
            m, s, n = mean_std(r.get(field_, float("nan")) for r in rs)
            row[field_], row[f"{field_}_std"] = m, s
            row["n_seeds"] = n if field_ == "final_acc" else row.get("n_seeds", n)
        if heuristic:  # no implemented proof: no rigorous eps, not even a nan standing in for one
            row["eps_rigorous"] = row["eps_rigorous_std"] = None
            row["privacy_note"] = next((r["privacy_note"] for r in rs if r.get("privacy_note")), "heuristic, no DP proof")
            if all(r.get("privacy_note") == FLOAT32_SAMPLER_NOTE for r in rs if "eps_heuristic" in r):
                # a proven mechanism whose noise was drawn by the float32 sampler: its rigorous eps is missing (nan,
                # so the paper's claims on it fail rather than hold), not undefined as a heuristic mechanism's is
                row["eps_rigorous"] = row["eps_rigorous_std"] = float("nan")
        row["records"] = rs
        out.append(row)
    return out


def pick(groups: list[dict[str, Any]], **labels: Any) -> dict[str, Any] | None:
    """The grouped row whose labels match ``labels`` (None when absent)."""
    for g in groups:
        if all(g.get(k) == v for k, v in labels.items()):
            return g
    return None


def acc_pm(g: dict[str, Any] | None) -> str:
    """'0.812 +- 0.010 (3)' or '0.812' for one seed, '-' when missing; accuracies in [0, 1]."""
    if g is None:
        return "-"
    if g.get("n_seeds", 1) > 1:
        return f"{fmt(g['final_acc'])} +- {g['final_acc_std']:.3f}"
    return fmt(g["final_acc"])


def machine_string() -> str:
    try:
        load = "load avg " + "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        load = "load avg unknown"
    return f"{platform.processor() or platform.machine()}; {os.cpu_count()} logical cores; {load}; {platform.platform()}"


def savefig(fig, out: Path, name: str) -> str:
    """Save a matplotlib figure as PNG in ``out`` atomically; return its file name."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    rio.atomic_write_bytes(out / name, buf.getvalue())
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name


def new_axes(ncols: int = 1, *, width: float = 5.0, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = max(1, int(ncols))  # a partial sweep may have nothing yet for a panel: one empty axes, not an error
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def curve(rec: dict[str, Any], y: str = "acc_avg", x: str = "k") -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for h in rec.get("history", []):
        if y in h and x in h:
            xs.append(float(h[x]))
            ys.append(float(h[y]))
    return xs, ys


def plot_learning_curves(records: list[dict[str, Any]], out: Path, name: str = "learning_curves.png",
                         max_series: int = 24) -> str | None:
    """Test accuracy and test loss vs iteration for every run of a reproduction (mean over seeds).

    One line per distinct label set; ``None`` when no run recorded a curve or there are too many
    series for a readable legend.
    """
    groups = group_records(records)
    series = []
    for g in groups:
        keys = sorted(g["records"][0]["labels"], key=lambda k: (k != "algorithm", k))
        label = ", ".join(str(g[k]) if k == "algorithm" else f"{k} {g[k]}" for k in keys if k != "figure")
        per_y = {}
        for y in ("acc_avg", "test_loss_avg"):
            runs = [curve(r, y) for r in g["records"]]
            runs = [c for c in runs if len(c[0]) >= 2]
            if runs:
                n = min(len(c[0]) for c in runs)
                per_y[y] = (runs[0][0][:n], np.mean([c[1][:n] for c in runs], axis=0))
        if per_y:
            series.append((label, per_y))
    if not series or len(series) > max_series:
        return None
    panels = [y for y in ("acc_avg", "test_loss_avg") if any(y in p for _, p in series)]
    fig, axes = new_axes(len(panels))
    for ax, y in zip(axes, panels):
        for label, per_y in series:
            if y in per_y:
                ax.plot(*per_y[y], marker="o", ms=2, label=label)
        ax.set_xlabel("iteration k (federated: round)")
        ax.set_ylabel({"acc_avg": "test accuracy", "test_loss_avg": "test loss"}[y])
        ax.set_title({"acc_avg": "accuracy vs iteration", "test_loss_avg": "loss vs iteration"}[y], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return savefig(fig, out, name)
