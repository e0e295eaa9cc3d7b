"""``flower-dp reproduce PAPER [--table N] [--scale smoke|ci|full] [--backend inprocess|flower] [--out DIR]``."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from . import reproduce

    rep = reproduce(args.paper, table=args.table, scale=args.scale, backend=args.backend, out=args.out,
                    seeds=args.seeds)
    failed = [c for c in rep.claims if c.passed is False]
    print(f"{len(rep.claims) - len(failed)}/{len(rep.claims)} claims reproduced or not checkable; "
          f"{len(failed)} not reproduced (see the report for why)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from . import PAPERS

    p = sub.add_parser(
        "reproduce",
        help="reproduce a paper's headline experiment and write a report beside the paper's table",
        description="Run a paper's headline experiment at a chosen scale (smoke: tests; ci: minutes on 2 CPU "
                    "cores; full: the paper's setting), resuming any finished or interrupted runs in --out, "
                    "then write records (JSON/CSV), plots (PNG) and report.md.",
    )
    p.add_argument("paper", choices=sorted(PAPERS), help="which paper")
    p.add_argument("--table", default=None, help="which table/figure (default: the headline one)")
    p.add_argument("--scale", default="ci", choices=["smoke", "ci", "full"])
    p.add_argument("--backend", default="inprocess", choices=["inprocess", "flower"],
                   help="inprocess (reference) or flower (Flower simulation on Ray; same numbers)")
    p.add_argument("--out", default=None, help="output folder (default runs/reproduce/PAPER-TABLE-SCALE)")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default depends on the scale)")
    p.set_defaults(func=_cmd)
