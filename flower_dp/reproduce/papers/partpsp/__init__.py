"""DPPS / PartPSP (Zhou, Xue, Chen, experiments section): Tables 2-4 and Figs. 2-4 on the MLP.

Table 2 (real sensitivity, N = 10, d-Out graphs): PartPSP-1 > PartPSP-2 > SGPDP at b = 3 on 4-Out.
Fig. 2 / Table 3: the estimated sensitivity (eq. 22, network max) stays above the real one every round.
DPPS's privacy is per node-message with an *estimated* sensitivity published in the clear, so its
eps is ``eps_heuristic`` (no DP proof, not record-level; ``eps_rigorous`` is null): the composition of its
Laplace releases under the estimated sensitivity.

One module per table: :mod:`.table2` (with Fig. 2), :mod:`.fig2_diag` (why est < real in a few Fig. 2 rounds:
the reset rounds, and the safe floor), :mod:`.table3`, :mod:`.table4`, :mod:`.fig3`, :mod:`.fig4`,
:mod:`.aligned` (Table 2 aligned with the authors' code; the runs behind PartPSP-2's and SGPDP's patterns);
:mod:`._shared` holds the algorithms, graphs, settings and run parameters they share.
"""

from __future__ import annotations

from ...core import paper_of_tables
from . import aligned, fig2_diag, fig3, fig4, table2, table3, table4
from ._shared import PAPER_ROUNDS, PAPER_T2_COLS, SETTINGS, T2_MODELS, T2_TOPOS, VARIANTS
from .fig3 import FIG3_DEG, FIG3_SPLITS, PAPER_FIG3
from .fig4 import FIG4_CLIP, FIG4_DEG, FIG4_MODELS, FIG4_N, FIG4_ROUNDS, PAPER_FIG4, PAPER_FIG4_RESNET
from .table2 import FIG2, FIG2_MODELS, FIG2_RESNET, FIG2_TOPOS, PAPER_T2
from .table3 import PAPER_T3, PAPER_T3_DROP, T3_CONST, T3_CONST_RESNET, T3_MODELS, T3_TOPOS
from .table4 import LINK_BPS, PAPER_T4, T4_ALGS, T4_TOPOS
from ..noise_binds import PARTPSP_TABLE
from .table4 import _shared_sizes, _t4_rows  # noqa: F401  (imported from here before the split; tests use them)

__all__ = ["PAPER", "SETTINGS", "VARIANTS", "T2_MODELS", "T2_TOPOS", "PAPER_T2", "PAPER_T2_COLS", "PAPER_ROUNDS",
           "FIG2", "FIG2_RESNET", "FIG2_MODELS", "FIG2_TOPOS", "PAPER_T3", "PAPER_T3_DROP", "T3_CONST",
           "T3_CONST_RESNET", "T3_TOPOS", "T3_MODELS", "FIG3_DEG", "FIG3_SPLITS", "PAPER_FIG3", "FIG4_DEG", "FIG4_N",
           "FIG4_ROUNDS", "FIG4_CLIP", "PAPER_FIG4", "PAPER_FIG4_RESNET", "FIG4_MODELS", "T4_TOPOS", "T4_ALGS",
           "PAPER_T4", "LINK_BPS"]

PAPER = paper_of_tables(
    name="partpsp",
    title="DPPS / PartPSP: differentially private perturbed push-sum with partial sharing",
    tables={"table2": table2.TABLE, "fig2-diag": fig2_diag.TABLE, "table3": table3.TABLE, "table4": table4.TABLE,
            "fig3": fig3.TABLE, "fig4": fig4.TABLE, "table2-aligned": aligned.TABLE_ALIGNED,
            "pattern-diag": aligned.TABLE_PATTERN, "noise-binds": PARTPSP_TABLE},
    default_table="table2",
)
