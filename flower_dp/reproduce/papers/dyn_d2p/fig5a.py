"""Dyn-D2P Fig. 5a: Dyn-D2P on a directed ring, the time-varying exponential graph and the complete graph (eps = 1)."""

from __future__ import annotations

from pathlib import Path

from ...core import Claim, acc_pm, fmt, group_records, pick
from .._common import md_table, ordering_claim, pushsum_spec
from ._shared import SETTINGS, _curves_report, _eps1_figure, _eps1_params

#: Fig. 5a: n = 20, eps = 1, three topologies; the paper says accuracy ring < exponential < complete
FIG5A_TOPOS = {"directed ring": "directed_ring", "time-varying exponential": "exp_one_peer", "complete": "complete"}


def _build_fig5a(scale: str, seeds: list[int]):
    s = SETTINGS["table2"][scale]
    base = _eps1_params(scale)
    return [pushsum_spec(f"fig5a-{topo}", {"algorithm": "Dyn-D2P", "topology": label}, seed=seed,
                         num_iters=s["K"], eval_every=s["eval_every"], n_nodes=s["n"], model=s["model"], topology=topo,
                         algorithm="dyn_d2p", dataset=s["dataset"], samples_per_node=s["samples_per_node"],
                         test_samples=s["test_samples"], params=base)
            for seed in seeds for label, topo in FIG5A_TOPOS.items()]


def _claims_fig5a(records) -> list[Claim]:
    groups = group_records(records)
    ring, exp, full = (pick(groups, topology=t) for t in FIG5A_TOPOS)
    return [ordering_claim("Fig. 5a: time-varying exponential > directed ring (eps = 1)", "exponential", exp, "ring", ring),
            ordering_claim("Fig. 5a: complete > time-varying exponential (eps = 1)", "complete", full, "exponential", exp)]


def _render_fig5a(records, scale: str, out: Path):
    groups = group_records(records)
    s = SETTINGS["table2"][scale]
    lines = [f"## Fig. 5a: Dyn-D2P on three topologies (shallow CNN, n = {s['n']}, eps = 1, delta = 1e-4, "
             f"K = {s['K']})", "", "The paper (curves only) reports ring < time-varying exponential < complete.", ""]
    lines += md_table(["topology", "accuracy", "eps rigorous", "bits (all nodes)"],
                      [[t, acc_pm(pick(groups, topology=t)), fmt(pick(groups, topology=t)["eps_rigorous"]),
                        fmt(pick(groups, topology=t)["bits_total"])] for t in FIG5A_TOPOS if pick(groups, topology=t)])
    return _curves_report(lines, records, out, label_key="topology", title="Dyn-D2P, eps = 1: accuracy vs iteration")


TABLE = _eps1_figure("Fig. 5a, Dyn-D2P on ring / time-varying exponential / complete graphs (eps = 1)", _build_fig5a,
                     _claims_fig5a, _render_fig5a)
