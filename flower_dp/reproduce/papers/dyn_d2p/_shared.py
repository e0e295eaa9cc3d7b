"""What the Dyn-D2P tables share: the algorithms (``ALGS``), the paper's Tables 1-2 (``PAPER_TABLES``, ``PAPER_EPS``),
delta, the per-table and per-scale ``SETTINGS``, the clip defaults (``CLIP``), the label of a variant (``_label``) and
the differences from the paper common to the tables and figures (``_differences_tables``); and what Figs. 5a and 5b
share (Dyn-D2P at eps = 1: ``_eps1_params``, ``_eps1_figure``, ``_curves_report``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core import Table, new_axes, savefig
from .._common import plot_curves

ALGS = [("Non-private", "nonprivate"), ("Const-D2P", "const"), ("Dyn[mu]-D2P", "dyn_mu"),
        ("Dyn[C]-D2P", "dyn_c"), ("Dyn-D2P", "dyn")]
PAPER_TABLES = {
    "table2": {"Non-private": [89.98] * 4, "Const-D2P": [45.37, 58.63, 74.65, 80.81],
               "Dyn[mu]-D2P": [81.12, 82.98, 82.23, 84.36], "Dyn[C]-D2P": [82.93, 83.65, 84.06, 84.98],
               "Dyn-D2P": [84.88, 85.36, 86.21, 87.89]},
    "table1": {"Non-private": [82.16] * 4, "Const-D2P": [46.37, 52.38, 60.02, 71.11],
               "Dyn[mu]-D2P": [64.12, 66.21, 69.37, 76.30], "Dyn[C]-D2P": [66.93, 68.37, 72.02, 77.65],
               "Dyn-D2P": [71.87, 72.14, 75.06, 79.89]},
}
PAPER_EPS = [0.3, 0.7, 1.0, 3.0]
DELTA = 1e-4

#: per table and scale: data/model/run sizes and the grid
SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "table2": {
        "smoke": dict(dataset="fashion_mnist", model="shallow_cnn", n=4, K=6, eval_every=3, B=16, lr=0.1,
                      samples_per_node=96, test_samples=300, eps=[0.3, 3.0], algs=["const", "dyn"]),
        "ci": dict(dataset="fashion_mnist", model="shallow_cnn", n=20, K=100, eval_every=25, B=32, lr=0.1,
                   samples_per_node=None, test_samples=2000, eps=[0.3, 3.0], algs=["const", "dyn"]),
        "full": dict(dataset="fashion_mnist", model="shallow_cnn", n=20, K=3000, eval_every=250, B=32, lr=0.03,
                     samples_per_node=None, test_samples=None, eps=PAPER_EPS,
                     algs=["const", "dyn_mu", "dyn_c", "dyn"]),
    },
    "table1": {
        "smoke": dict(dataset="synthetic_cifar10", model="logreg", model_kwargs={"in_features": 3 * 32 * 32}, n=4,
                      K=4, eval_every=2, B=8, lr=0.05, samples_per_node=32, test_samples=64, eps=[0.3, 3.0],
                      algs=["const", "dyn"]),
        "ci": dict(dataset="cifar10", model="resnet18_cifar_gn", n=20, K=20, eval_every=10, B=16, lr=0.05,
                   samples_per_node=None, test_samples=1000, eps=[0.3, 3.0], algs=["const", "dyn"]),
        "full": dict(dataset="cifar10", model="resnet18_cifar_gn", n=20, K=3000, eval_every=250, B=32, lr=0.05,
                     samples_per_node=None, test_samples=None, eps=PAPER_EPS,
                     algs=["const", "dyn_mu", "dyn_c", "dyn"]),
    },
}
CLIP = {"table2": dict(clip0=4.0, clip_bar=1.5), "table1": dict(clip0=7.0, clip_bar=3.0)}


def _label(variant: str) -> str:
    return dict((v, k) for k, v in ALGS)[variant]


def _differences_tables(table: str, scale: str) -> list[str]:
    s = SETTINGS[table][scale]
    out = [
        f"Scale: K = {s['K']} iterations, batch B = {s['B']}, lr = {s['lr']}, n = {s['n']} "
        f"({'all' if not s['samples_per_node'] else s['samples_per_node']} samples per node); the paper does not "
        "report K or B and trains to convergence, so our absolute accuracies are lower.",
        "Hyper-parameters are our defaults (C0 = 4 / Cbar = 1.5 on the CNN, rho_c = rho_mu = 2), not the paper's "
        "per-eps grid search (its selected values are not reported).",
        "calibration = rigorous solves the noise so that the PLD eps meets the target; calibration = paper uses the "
        "paper's GDP/CLT formulas, whose rigorous eps is reported in the table (it exceeds the target).",
        "Each cell is the mean over the seeds named in the header, +- their sample standard deviation where there "
        "are two or more (the paper averages 5 runs); differences within that spread are seed noise.",
    ]
    if table == "table2" and scale == "full":
        out.append("The gaps to the paper are diagnosed at eps 0.3 by `flower-dp reproduce dyn-d2p --table table2-diag "
                   "--scale paper` (docs/results/dyn-d2p-table2-diag-paper): clip-only twins (the variants' clipping "
                   "without noise) split the gap into what clipping and what the noise cost; slices of the paper's "
                   "tuning grids, 10x the step size and 4x the batch say which hyper-parameter moves it. Its "
                   "'ordering' line answers this table's eps 0.3 claim (Dyn-D2P > Const-D2P) setting by setting. "
                   "`--table clip-scale` (docs/results/dyn-d2p-clip-scale-paper) measures the per-sample gradient "
                   "norms and runs the eps 0.3 and 3 cells with the clip bounds scaled to them, clip-only twins at "
                   "those bounds and a smaller CNN; its verdict line names what moves the eps 0.3 accuracy, or says "
                   "open with what it rules out.")
    if s["dataset"].startswith("synthetic"):
        out.append(f"Dataset: {s['dataset']} is a labelled synthetic stand-in (CIFAR-10 is not available offline).")
    elif s["dataset"] == "cifar10":
        out.append("Dataset: CIFAR-10 through torchvision; it must already be on disk (no network here).")
    return out


def _eps1_params(scale: str) -> dict[str, Any]:
    """Figs. 5a and 5b: Dyn-D2P at eps = 1 (rigorous calibration) with Table 2's batch, step size and clip defaults."""
    s = SETTINGS["table2"][scale]
    return dict(batch_size=s["B"], lr=s["lr"], delta=DELTA, rho_c=2.0, rho_mu=2.0, variant="dyn", epsilon=1.0,
                calibration="rigorous", **CLIP["table2"])


def _eps1_figure(title: str, build, claims, render) -> Table:
    """The entry of Fig. 5a or 5b: claims from the records alone, Table 2's differences from the paper."""
    return Table(title, build, lambda records, scale: claims(records), render,
                 lambda scale: _differences_tables("table2", scale))


def _curves_report(lines: list[str], records, out: Path, *, label_key: str, title: str):
    """``lines`` and the one plot of Figs. 5a and 5b: accuracy vs iteration, one curve per ``label_key``."""
    fig, axes = new_axes(1)
    plot_curves(axes[0], records, label_key=label_key, title=title)
    return lines, [savefig(fig, out, "accuracy_vs_iteration.png")]
