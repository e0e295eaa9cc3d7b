"""Dyn-D2P (Zhu et al., experiments section): Tables 1-2 and Figs. 1, 4, 5a, 5b.

The paper's claims checked here: at equal eps, Dyn-D2P beats Const-D2P (and the dynamic variants
sit between); accuracy rises with eps; and, ours, the rigorous eps of the paper's GDP/CLT
calibration next to its target.

One module per table: :mod:`.tables` (Tables 1 and 2: one grid, two settings), :mod:`.diag` (the Table 2
diagnostics), :mod:`.clip_scale` (Table 2 with clip bounds scaled to the measured gradient norms), :mod:`.fig1`, :mod:`.fig4`, :mod:`.fig5a`, :mod:`.fig5b`; :mod:`._shared` holds the algorithms,
the paper's numbers, the settings and the differences from the paper they share.
"""

from __future__ import annotations

from ...core import paper_of_tables
from . import clip_scale, diag, fig1, fig4, fig5a, fig5b, tables
from ._shared import ALGS, CLIP, DELTA, PAPER_EPS, PAPER_TABLES, SETTINGS
from .fig1 import FIG1
from .fig4 import FIG4_EPS, FIG4_INV
from .fig5a import FIG5A_TOPOS
from .fig5b import FIG5B_N
from ..noise_binds import DYN_D2P_TABLE, DYN_KMAP_TABLE

__all__ = ["PAPER", "ALGS", "PAPER_TABLES", "PAPER_EPS", "DELTA", "SETTINGS", "CLIP", "FIG1", "FIG4_INV", "FIG4_EPS",
           "FIG5A_TOPOS", "FIG5B_N"]

PAPER = paper_of_tables(
    name="dyn-d2p",
    title="Dyn-D2P: dynamic differentially private decentralized learning",
    tables={
        "table2": tables.TABLE2,
        "table1": tables.TABLE1,
        "table2-diag": diag.TABLE,
        "clip-scale": clip_scale.TABLE,
        "fig1": fig1.TABLE,
        "fig4": fig4.TABLE,
        "fig5a": fig5a.TABLE,
        "fig5b": fig5b.TABLE,
        "noise-binds": DYN_D2P_TABLE,
        "k-map": DYN_KMAP_TABLE,
    },
    default_table="table2",
    paper_scale=lambda table, spec: tables._paper_scale_keeps(table, spec),
    runners={"gradnorm": clip_scale.run_gradnorm},
)
