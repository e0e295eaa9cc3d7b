"""``flower-dp reproduce PAPER|all [--table N] [--scale smoke|ci|full] [--backend inprocess|ray|flower]
[--ray-address HEAD:PORT] [--out DIR]``."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

__all__ = ["register", "write_index"]


def write_index(out: Path) -> Path:
    """``out/README.md``: one line per reproduction found under ``out`` (claims reproduced, time, report link).

    Built from the files each reproduction leaves (``*/claims.json``, ``*/records.json``), so the index also
    lists tables run one by one (``flower-dp reproduce PAPER --table T --out out/PAPER-T``).
    """
    from .. import results as rio

    lines = ["# Reproductions", "",
             "| paper | table | scale | runs | claims reproduced | holds, not discriminating | discriminating / total | "
             "wall time (min) | CPU time (min) | report | command |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for claims_path in sorted(Path(out).glob("*/claims.json")):
        folder = claims_path.parent
        doc, recs = rio.read_json(claims_path), rio.read_json(folder / "records.json")
        if not doc or not recs:
            continue
        meta, claims, records = doc["meta"], doc["claims"], recs["records"]
        flat = sum(1 for c in claims if c["passed"] and c.get("discriminates") is False)
        n_ok = sum(1 for c in claims if c["passed"]) - flat
        n_chk = sum(1 for c in claims if c["passed"] is not None)
        n_disc = sum(1 for c in claims if c.get("discriminates"))
        wall, cpu = meta.get("compute_time_s", 0.0) / 60, meta.get("cpu_time_s", 0.0) / 60  # summed by reproduce()
        rel = f"{folder.name}/report.md"
        n_runs = str(len(records))
        try:
            from . import get_paper, missing_runs

            missing = missing_runs(get_paper(meta["paper"]), meta, records)
        except (KeyError, ValueError):
            missing = []
        if missing:
            n_runs += f" ({len(missing)} not run)"
        lines.append(f"| {meta['paper']} | {meta['table']} | {meta['scale']} | {n_runs} | {n_ok}/{n_chk} | {flat} | "
                     f"{n_disc}/{len(claims)} | "
                     f"{wall:.1f} | {cpu:.1f} | [{rel}]({rel}) | `{meta['command']}` |")
    lines += ["", "Wall and CPU time are sums over the runs (each run's own timer; CPU time of the driver process).",
              "Claims reproduced leaves out those that hold only because the cells they compare are equal within the "
              "seed spread (\"holds, not discriminating\", their own column). Discriminating / total: the claims whose "
              "cells differ beyond the seed spread (each report's \"discriminates?\" column says how far); the rest "
              "compare no cells, ran one seed (no spread measured) or do not discriminate.",
              "Every report lists its claims one by one, with our numbers, the rigorous eps (for the mechanisms without a "
              "DP proof, DPPS family and BQ-SGD, a labelled heuristic eps instead), and why numbers differ.", ""]
    lines += scoreboard(out)
    path = Path(out) / "README.md"
    # hand-written sections (e.g. planned paper-scale sweeps) after the marker survive a rewrite of the index
    old = path.read_text() if path.exists() else ""
    tail = old[old.index(INDEX_END):] if INDEX_END in old else INDEX_END + "\n"
    rio.atomic_write_bytes(path, ("\n".join(lines) + "\n" + tail).encode())
    return path


def scoreboard(out: Path) -> list[str]:
    """The index's scoreboard: per paper, its noise-binds claims (``*-noise-binds/claims.json`` and
    ``dyn-d2p-k-map``) counted by their test's category (:data:`flower_dp.reproduce.stats.CATEGORIES`)."""
    from .. import results as rio
    from .stats import CATEGORIES

    counts: dict[str, dict[str, int]] = {}
    folders: dict[str, list[str]] = {}
    for claims_path in sorted([*Path(out).glob("*-noise-binds/claims.json"), *Path(out).glob("*-k-map/claims.json")]):
        doc = rio.read_json(claims_path)
        if not doc:
            continue
        paper = doc["meta"]["paper"]
        c = counts.setdefault(paper, dict.fromkeys(CATEGORIES, 0))
        folders.setdefault(paper, []).append(claims_path.parent.name)
        for claim in doc["claims"]:
            cat = claim.get("category") or "not discriminating"
            c[cat] += 1
            c["regime passed"] = c.get("regime passed", 0) + (cat == "regime" and claim.get("passed") is True)
    if not counts:
        return []
    out_lines = ["", "## Scoreboard: the claims where the noise binds (issue 41)", "",
                 "Each claim is a test over five seeds (three for the K map): 'A beats B' a paired 95 % t-interval, "
                 "'A comparable to B' two one-sided tests with the margin fixed before the run. Substantive: the "
                 "interval decides (a pass that could have failed, or a fail it proves); not discriminating: the "
                 "interval cannot tell; by construction: true by the calibration or by arithmetic (bits = payload "
                 "ratio), counted apart. Regime: the checks that the noise costs >= 0.05 against its noise-free twin "
                 "(the setting, not a paper claim). Counted from each folder's claims.json; the regimes and the plan: "
                 "[noise-binds.md](noise-binds.md).", "",
                 "| paper | substantive passes | substantive fails | by construction | not discriminating | "
                 "regime checks passed | folders |", "|---|---|---|---|---|---|---|"]
    for paper, c in sorted(counts.items()):
        out_lines.append(f"| {paper} | {c['substantive pass']} | {c['substantive fail']} | {c['by construction']} | "
                         f"{c['not discriminating']} | {c.get('regime passed', 0)}/{c['regime']} | "
                         + ", ".join(f"[{f}]({f}/report.md)" for f in folders[paper]) + " |")
    return out_lines


#: the line after which docs/results/README.md holds hand-written sections that write_index keeps
INDEX_END = "<!-- end of the generated index; hand-written sections below are kept -->"


def _rerender(args: argparse.Namespace) -> int:
    """``--rerender``: rebuild reports from ``records.json`` (no run repeated); ``all``: every folder under --out."""
    from . import rerender

    if args.paper == "all":
        base = Path(args.out or Path("runs") / "reproduce" / args.scale)
        folders = sorted(f.parent for f in base.glob("*/records.json"))
        if not folders:
            raise ValueError(f"--rerender found no */records.json under {str(base)!r}; pass --out with the reproductions")
        reps = [rerender(f) for f in folders]
        print(f"index: {write_index(base)}")
    else:
        from . import get_paper

        table = args.table or get_paper(args.paper).default_table
        out = Path(args.out or Path("runs") / "reproduce" / f"{args.paper}-{table}-{args.scale}")
        reps = [rerender(out, paper=args.paper)]
    for rep in reps:
        print(f"{rep.paper} {rep.table}: re-rendered {rep.report_path}")
    return 0


def _cmd(args: argparse.Namespace) -> int:
    from . import PAPERS, reproduce

    if args.rerender:
        return _rerender(args)
    if args.paper == "all":
        if args.table:
            raise ValueError(f"--table {args.table!r} needs one paper, got 'all'; drop --table or name a paper")
        base = Path(args.out or Path("runs") / "reproduce" / args.scale)
        if args.estimate:
            raise ValueError("--estimate needs one paper, got 'all'; name a paper (and --table)")
        if args.runs is not None:
            raise ValueError(f"--runs {args.runs!r} needs one paper, got 'all'; name a paper (and --table)")
        reps = [reproduce(p, scale=args.scale, backend=args.backend, out=base / p, seeds=args.seeds,
                          reproducible=args.reproducible, jobs=args.jobs, device=args.device,
                          ray_address=args.ray_address,
                          command=f"flower-dp reproduce {p} --scale {args.scale} --backend {args.backend} "
                                  f"--out {base / p}" + (f" --seeds {args.seeds}" if args.seeds else "")
                                  + (" --reproducible" if args.reproducible else "")
                                  + (f" --jobs {args.jobs}" if args.jobs > 1 else "")
                                  + (f" --device {args.device}" if args.device else ""))
                for p in PAPERS]
        print(f"index: {write_index(base)}")
    else:
        rep = reproduce(args.paper, table=args.table, scale=args.scale, backend=args.backend, out=args.out,
                        seeds=args.seeds, reproducible=args.reproducible, jobs=args.jobs, device=args.device,
                        ray_address=args.ray_address,
                        estimate="only" if args.estimate else (False if args.no_estimate else None),
                        runs=args.runs.split(",") if args.runs is not None else None)
        reps = [rep] if rep is not None else []
    for rep in reps:
        failed = [c for c in rep.claims if c.passed is False]
        print(f"{rep.paper}: {len(rep.claims) - len(failed)}/{len(rep.claims)} claims reproduced or not checkable; "
              f"{len(failed)} not reproduced (see {rep.report_path})")
    return 0


def _tables_epilog() -> str:
    """Every paper's tables and figures, for ``--help``."""
    from . import PAPERS, get_paper

    lines = ["tables and figures (--table; the first is the default):"]
    for name in sorted(PAPERS):
        paper = get_paper(name)
        order = [paper.default_table] + [t for t in paper.tables if t != paper.default_table]
        lines.append(f"  {name}:")
        lines += [f"    {t:<16} {paper.tables[t]}" for t in order]
    return "\n".join(lines)


class _HelpWithTables(argparse.Action):
    """``-h``: the help with every paper's tables (built only when asked: it imports the paper modules)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.epilog = _tables_epilog()
        parser.print_help()
        parser.exit()


def register(sub: argparse._SubParsersAction) -> None:
    from . import PAPERS

    p = sub.add_parser(
        "reproduce",
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="reproduce a paper's headline experiment and write a report beside the paper's table",
        description=textwrap.fill("Run a paper's headline experiment at a chosen scale (smoke: tests; ci: minutes on 2 CPU "
                    "cores; full: the paper's setting), resuming any finished or interrupted runs in --out, "
                    "then write records (JSON/CSV), plots (PNG) and report.md.  'all' runs the five papers' "
                    "headline tables into --out/<paper>/ and writes --out/README.md.", width=79),
    )
    p.add_argument("-h", "--help", action=_HelpWithTables, help="show this help and every paper's tables, then exit")
    p.add_argument("paper", choices=sorted(PAPERS) + ["all"], help="which paper (or all)")
    p.add_argument("--table", default=None, help="which table/figure (default: the headline one)")
    p.add_argument("--scale", default="ci", choices=["smoke", "ci", "full", "paper"],
                   help="smoke (tests), ci (minutes), full (the paper's setting, GPU), paper (the paper's setting "
                        "without ResNet/ViT runs: hours on CPU; use --jobs)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each in its own process with one torch thread (one per core; default 1)")
    p.add_argument("--estimate", action="store_true",
                   help="print the CPU hours of the unfinished runs, measured on one segment, and exit (the full and "
                        "paper scales print it before every sweep)")
    p.add_argument("--no-estimate", action="store_true",
                   help="skip the estimate the full and paper scales print before a sweep (its probe segment costs "
                        "CPU time, e.g. when the sweep was estimated already)")
    p.add_argument("--backend", default="inprocess", choices=["inprocess", "ray", "flower"],
                   help="inprocess (reference), ray (push-sum nodes on Ray host actors, spread over a Ray cluster) or "
                        "flower (Flower simulation on Ray); same numbers")
    p.add_argument("--ray-address", default=None, metavar="HEAD:PORT|auto",
                   help="with --backend ray or flower: join this running Ray cluster (never started or stopped "
                        "here); default RAY_ADDRESS, else a local Ray on 127.0.0.1 per run")
    p.add_argument("--device", default=None,
                   help="where push-sum runs compute: cpu (default), cuda, cuda:N or auto (a GPU when one is visible); "
                        "the GPU tables' --scale full needs it on a GPU machine. Not part of a run's identity: finished "
                        "runs are reused whatever device made them")
    p.add_argument("--runs", default=None,
                   help="only the runs whose id matches one of these comma-separated patterns (fnmatch, e.g. "
                        "'table2-dyn_c-*,table2-nonprivate-s1'): to split a sweep over machines, then copy the "
                        "runs/<run_id>/ folders into one --out, where the whole sweep reuses them")
    p.add_argument("--out", default=None, help="output folder (default runs/reproduce/PAPER-TABLE-SCALE)")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default depends on the scale)")
    p.add_argument("--reproducible", action="store_true",
                   help="seeded simulation mode: privacy noise and private sampling keyed by the published seed (the "
                        "same numbers on every run and backend; the guarantee holds only against parties that do "
                        "not know the seed).  Default: each node's own secret from OS entropy")
    p.add_argument("--rerender", action="store_true",
                   help="re-render records/summary/claims/plots/report.md from --out's records.json without running "
                        "anything ('all': every reproduction folder under --out, then its README index)")
    p.set_defaults(func=_cmd)
