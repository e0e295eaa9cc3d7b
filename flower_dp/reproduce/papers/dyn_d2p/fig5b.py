"""Dyn-D2P Fig. 5b: more nodes at J = 1250 samples per node give higher accuracy (eps = 1)."""

from __future__ import annotations

from pathlib import Path

from ...core import Claim, acc_pm, cells_of, fmt, group_records
from .._common import md_table, pushsum_spec
from ._shared import SETTINGS, _curves_report, _eps1_figure, _eps1_params

#: Fig. 5b: J = 1250 samples per node, more nodes -> higher accuracy (the 1/sqrt(n) factor), eps = 1
FIG5B_N = {"smoke": (2, 4), "ci": (5, 10, 20), "full": (10, 20, 30, 40)}


def _build_fig5b(scale: str, seeds: list[int]):
    s = SETTINGS["table2"][scale]
    J = 1250 if scale != "smoke" else s["samples_per_node"]
    base = _eps1_params(scale)
    return [pushsum_spec(f"fig5b-n{n}", {"algorithm": "Dyn-D2P", "n": n}, seed=seed, num_iters=s["K"],
                         eval_every=s["eval_every"], n_nodes=n, model=s["model"], topology="exp_one_peer",
                         algorithm="dyn_d2p", dataset=s["dataset"], samples_per_node=J,
                         test_samples=s["test_samples"], params=base)
            for seed in seeds for n in FIG5B_N[scale]]


def _claims_fig5b(records) -> list[Claim]:
    gs = sorted(group_records(records), key=lambda g: g["n"])
    curve_txt = ", ".join(f"n={g['n']}: {acc_pm(g)}" for g in gs)
    return [Claim("Fig. 5b: more nodes (J fixed) give higher accuracy",
                  all(a["final_acc"] < b["final_acc"] for a, b in zip(gs, gs[1:])), curve_txt,
                  cells=cells_of(*((f"n={g['n']}", g) for g in gs)), ordered=True)]


def _render_fig5b(records, scale: str, out: Path):
    gs = sorted(group_records(records), key=lambda g: g["n"])
    lines = ["## Fig. 5b: Dyn-D2P with J = 1250 samples per node and more nodes (eps = 1, exponential graph)", "",
             "The paper (curves only) reports higher accuracy with more nodes.", ""]
    lines += md_table(["n", "accuracy", "eps rigorous"], [[str(g["n"]), acc_pm(g), fmt(g["eps_rigorous"])] for g in gs])
    return _curves_report(lines, records, out, label_key="n",
                          title="Dyn-D2P, eps = 1, J = 1250: accuracy vs iteration")


TABLE = _eps1_figure("Fig. 5b, Dyn-D2P with more nodes at J = 1250 per node (eps = 1)", _build_fig5b, _claims_fig5b,
                     _render_fig5b)
