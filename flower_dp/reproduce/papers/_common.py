"""Helpers shared by the paper modules: push-sum configs, tables, claim helpers, plots."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..core import Claim, RunSpec, acc_pm, cells_of, fmt, group_records

__all__ = ["full_scale_only", "pushsum_spec", "slug", "md_table", "ordering_claim_detail", "ordering_claim", "plot_curves", "plot_acc_vs", "style", "logx"]


def slug(*parts: Any) -> str:
    """A filesystem-safe run id from its parts."""
    s = "-".join(str(p) for p in parts)
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", s)


def full_scale_only(settings: dict[str, Any], scale: str, paper: str, table: str, cost: str) -> None:
    """Raise a clear error when ``table`` has no config at ``scale`` (a GPU-and-CIFAR-only experiment)."""
    if scale not in settings:
        smoke = ", or --scale smoke to check the pipeline on synthetic data" if "smoke" in settings else ""
        raise ValueError(
            f"{paper} --table {table} has no {scale!r} scale (valid: {', '.join(sorted(settings))}): it needs {cost}, "
            "which 2 CPU cores cannot finish. Run --scale full on a GPU machine with the dataset on disk (set "
            f"FLOWER_DP_DATA to a torchvision root holding cifar-10-batches-py/){smoke}")


def pushsum_spec(
    run_id: str,
    labels: dict[str, Any],
    *,
    seed: int,
    num_iters: int,
    eval_every: int,
    n_nodes: int,
    model: str,
    topology: str,
    algorithm: str,
    params: dict[str, Any],
    dataset: str = "fashion_mnist",
    samples_per_node: int | None = None,
    test_samples: int | None = None,
    topology_kwargs: dict[str, Any] | None = None,
    partition: str = "shuffle_split",
    checkpoint: bool = True,
    model_kwargs: dict[str, Any] | None = None,
    debug_metrics: bool = False,
) -> RunSpec:
    """A :class:`RunSpec` for the in-process runner (config as :func:`config_from_dict` takes it).

    ``debug_metrics=True`` (only for a table that needs them, which must say so in its report) puts
    the nodes' uncharged training statistics (loss, clip fraction, gradient norms, batch sizes) into
    the history; off, they stay on the nodes (:mod:`flower_dp.releases`).
    """
    config = {
        "run": {"name": run_id, "seed": int(seed), "num_iters": int(num_iters), "eval_every": int(eval_every),
                "checkpoint": bool(checkpoint), "progress": True, **({"debug_metrics": True} if debug_metrics else {})},
        "data": {"dataset": dataset, "partition": partition, "samples_per_node": samples_per_node,
                 "test_samples": test_samples},
        "model": {"name": model, **(model_kwargs or {})},
        "topology": {"name": topology, "n_nodes": int(n_nodes), **(topology_kwargs or {})},
        "algorithm": {"name": algorithm, "params": dict(params)},
    }
    return RunSpec(run_id=slug(run_id, f"s{seed}"), labels=dict(labels), config=config, seed=int(seed))


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(x if isinstance(x, str) else fmt(x) for x in r) + " |")
    return out


def ordering_claim_detail(a_name: str, a, b_name: str, b) -> tuple[bool | None, str]:
    """(a > b?, 'a 0.81 vs b 0.78 (+0.03)') for two grouped rows."""
    if a is None or b is None:
        return None, "missing runs"
    diff = a["final_acc"] - b["final_acc"]
    return bool(diff > 0), f"{a_name} {acc_pm(a)} vs {b_name} {acc_pm(b)} ({diff:+.3f})"


def ordering_claim(name: str, a_name: str, a, b_name: str, b) -> Claim:
    """The claim ``name`` that grouped row ``a`` beats ``b`` (:func:`ordering_claim_detail`), with both as its cells."""
    ok, detail = ordering_claim_detail(a_name, a, b_name, b)
    return Claim(name, ok, detail, cells=cells_of((a_name, a), (b_name, b)))


def plot_curves(ax, records, *, label_key: str, y: str = "acc_avg", x: str = "k", title: str = "") -> None:
    """One line per record (mean over seeds when labels repeat), labelled by ``labels[label_key]``."""
    import numpy as np

    from ..core import curve

    groups = group_records(records)
    for g in groups:
        xs_all, ys_all = [], []
        for r in g["records"]:
            xs, ys = curve(r, y, x)
            xs_all.append(xs)
            ys_all.append(ys)
        if not xs_all or not xs_all[0]:
            continue
        n = min(len(v) for v in ys_all)
        ys = np.mean([v[:n] for v in ys_all], axis=0)
        ax.plot(xs_all[0][:n], ys, marker="o", ms=3, label=str(g[label_key]))
    ax.set_xlabel({"k": "iteration k", "bits_total": "bits sent (all nodes)"}.get(x, x))
    ax.set_ylabel({"acc_avg": "test accuracy", "test_loss_avg": "test loss"}.get(y, y))
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_acc_vs(ax, groups, *, x: str, series_key: str, title: str = "", xlabel: str = "") -> None:
    """Final accuracy (mean +- std over seeds) against a numeric field, one series per ``series_key``."""
    series: dict[Any, list] = {}
    for g in groups:
        series.setdefault(g[series_key], []).append(g)
    for name, gs in series.items():
        gs = sorted(gs, key=lambda g: g[x])
        ax.errorbar([g[x] for g in gs], [g["final_acc"] for g in gs], yerr=[g["final_acc_std"] for g in gs],
                    marker="o", ms=4, capsize=3, label=str(name))
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel("final test accuracy")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def style(ax, *, xlabel: str, ylabel: str = "final test accuracy", title: str = "", legend: bool = True) -> None:
    """Labels, a light grid and a small legend: the look every reproduction plot shares."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def logx(ax) -> None:
    """Log-scaled x axis without the crowded minor tick labels."""
    from matplotlib.ticker import NullFormatter

    xs = np.concatenate([np.asarray(line.get_xdata(), dtype=float).ravel() for line in ax.lines
                         if line.get_transform() == ax.transData] or [np.zeros(0)])
    if not np.any(np.isfinite(xs) & (xs > 0)):  # nothing to place (e.g. no proven eps): say so, keep the axis linear
        ax.text(0.5, 0.5, "no positive finite x to plot", transform=ax.transAxes, ha="center", fontsize=8, color="gray")
        return
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())


def _party_cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    if entry.get("eps") is not None:
        return fmt(entry["eps"])
    if entry.get("eps_heuristic") is not None:
        return f"{fmt(entry['eps_heuristic'])} (heuristic)"
    return "none"


def party_lines(groups) -> list[str]:
    """The report's section on parties: whom each run's eps protects against (:mod:`flower_dp.privacy.parties`)."""
    rows = []
    for g in groups:
        by = next((r.get("eps_by_party") for r in g["records"] if r.get("eps_by_party")), None)
        if by is None:
            continue
        label = " ".join(f"{g[k]}" for k in ("algorithm", "N", "eps") if k in g)
        rows.append([label] + [_party_cell(by.get(name)) for name in
                               ("model_observer", "client", "network_observer", "server")])
    if not rows:
        return []
    keyed = [r for r in rows if r[2] not in ("none", "-")]
    shared = [r for r in rows if r[2] == "none"]
    client = ("another client holds the run secret these runs shared with every client, so it has no eps"
              if not keyed else
              "another client holds only its own key, so it sees the released models and whether it was itself "
              "sampled (the fixed-size pair at q = B/(N-1), its own share of the noise known)"
              + ("" if not shared else "; in the runs that shared one run secret with every client it has no eps"))
    return ["", "## Privacy per party", "",
            "Every eps above is the **model observer's** (party `model_observer`: it sees the released global models "
            "only, the Gau-LRQ paper's adversary). The same runs against the other parties (docs/privacy.md, "
            f"\"Threat model\"): {client}; a network observer sees who sends, so it knows the sample and gets no "
            "amplification (GDP conditioned on the sample, mixed over the binomial participation count); the server "
            "decodes each update, so it has no eps.", ""] + md_table(
        ["run", "model observer", "another client", "network observer", "server"], rows)
