"""Min / median per run, spread over runs, and each goal met or not, from several suite documents.

``python -m benchmarks.summary run1.json run2.json run3.json`` prints the Markdown table of
``docs/benchmarks/README.md``.  A goal is judged on every run's figure (by the median where the goal says
so): "yes" when all runs meet it, "in k of n runs", or "**no**".  Nothing is hard-coded: a figure that is
missing (``null``: Opacus not installed, Ray skipped) shows as "-" and its goal as "not measured".
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import PRIVATE_STEP_CASES, OPACUS_MODES, _get

__all__ = ["GOALS", "Row", "rows_for", "summarize", "main"]


@dataclass(frozen=True)
class Row:
    """One line of the table: where its min and median figures live in a document, and its goal."""

    label: str
    minimum: tuple[str, ...]
    median: tuple[str, ...] | None = None
    goal: str = ""
    #: ``ok(value) -> bool`` on the figure the goal names (the median if there is one, else the minimum)
    ok: Callable[[float], bool] | None = None
    fmt: str = "ratio"


def _ps(case: str, key: str) -> tuple[str, ...]:
    return ("details", "private_step", "cases", case, key)


def rows_for() -> list[Row]:
    """Every row, in the README's order."""
    rows: list[Row] = []
    for c in PRIVATE_STEP_CASES:
        lim = 1.3 if c.startswith("cnn") else 1.5
        rows.append(Row(f"private_step_ratio_{c}", (f"private_step_ratio_{c}",), _ps(c, "median_ratio_fast"),
                        f"<= {lim} by the median", lambda v, lim=lim: v <= lim))
        rows.append(Row(f"private_step_median_ratio_{c}_prefetch",
                        _ps(c, "ratio_fast_prefetch"), (f"private_step_median_ratio_{c}_prefetch",),
                        f"<= {lim} by the median", lambda v, lim=lim: v <= lim))
        for m in OPACUS_MODES:
            rows.append(Row(f"private_step_ratio_{c}_opacus_{m}", (f"private_step_ratio_{c}_opacus_{m}",),
                            (f"private_step_median_ratio_{c}_opacus_{m}",), "(peer)"))
        rows.append(Row("ours beside Opacus, same loop", _ps(c, "ratio_fast_beside_opacus"),
                        _ps(c, "median_ratio_fast_beside_opacus"), "(same loop)"))
        rows.append(Row(f"private_step_median_ours_over_opacus_best_{c}", (), (f"private_step_median_ours_over_opacus_best_{c}",),
                        "<= 0.6 (median)", lambda v: v <= 0.6))
    for c in ("cnn_b64", "mlp_b64"):
        rows.append(Row(f"private_step_ratio_{c}_vmap", (f"private_step_ratio_{c}_vmap",), _ps(c, "median_ratio_vmap"),
                        "(reference path)"))
    rows += [
        Row("engine_overhead_ratio", ("engine_overhead_ratio",), ("engine_overhead_median_ratio",), "<= 1.15 by the median",
            lambda v: v <= 1.15),
        Row("engine overhead without the eps reports", ("details", "engine_overhead", "ratio_without_privacy_reports"),
            ("details", "engine_overhead", "median_ratio_without_privacy_reports"), "(diagnostic)"),
        Row("accounting_seconds_3000", ("accounting_seconds_3000",), ("details", "accounting", "median_seconds_bucketed"),
            "< 3 s", lambda v: v < 3, "seconds"),
        Row("accounting_eps_rel_diff", ("accounting_eps_rel_diff",), None, "0 <= x <= 1 %", lambda v: 0 <= v <= 0.01, "percent"),
        Row("accounting_seconds_30000", ("accounting_seconds_30000",), ("details", "accounting", "long", "median_seconds"),
            "< 3 s", lambda v: v < 3, "seconds"),
        Row("accounting_eps_rel_diff_30000", ("accounting_eps_rel_diff_30000",), None, "0 <= x <= 1 % above exact",
            lambda v: 0 <= v <= 0.01, "percent"),
        Row("lrq_codec_ratio", ("lrq_codec_ratio",), ("lrq_codec_median_ratio",), "<= 2.2 by the median", lambda v: v <= 2.2),
        Row("lrq_codec_cpu_ratio", ("lrq_codec_cpu_ratio",), ("lrq_codec_cpu_median_ratio",), "<= 2.2 by the median",
            lambda v: v <= 2.2),
        Row("wire_ratio", ("wire_ratio",), None, "(bytes on the wire / raw floats)"),
        Row("max_nodes_inprocess_mlp", ("max_nodes_inprocess_mlp",), None, ">= 1,024", lambda v: v >= 1024, "int"),
        Row("max_nodes_ray_mlp", ("max_nodes_ray_mlp",), None, ">= 1,024", lambda v: v >= 1024, "int"),
        Row("max_nodes_flower_cnn", ("max_nodes_flower_cnn",), None, ">= 64", lambda v: v >= 64, "int"),
    ]
    for s in ("inprocess", "ray"):
        rows.append(Row(f"scale_mlp_{s}_throughput_ratio_1024_vs_64", (f"scale_mlp_{s}_throughput_ratio_1024_vs_64",),
                        (f"scale_mlp_{s}_median_throughput_ratio_1024_vs_64",), ">= 0.8 by the median (within 20 %)",
                        lambda v: v >= 0.8))
    for k in ("scale_mlp_inprocess_rss_gb_1024", "scale_mlp_ray_rss_gb_1024", "scale_cnn_flower_rss_gb_64"):
        rows.append(Row(k, (k,), None, "< 16 GiB (peak)", lambda v: v < 16, "gib"))
    rows.append(Row("raylets_throughput_ratio", ("raylets_throughput_ratio",), ("raylets_median_throughput_ratio",),
                    "(reported: 2 raylets / 1)"))
    return rows


#: The rows that carry a goal (the rest are peers and diagnostics).
GOALS = tuple(r for r in rows_for() if r.ok is not None)


def _fmt(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "seconds":
        return f"{v:.2f} s"
    if kind == "percent":
        return f"{100 * v:+.2f} %"
    if kind == "gib":
        return f"{v:.2f} GiB"
    if kind == "int":
        return f"{int(v):,}"
    return f"{v:.3g}"


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _verdict(row: Row, judged: list[float | None]) -> str:
    if row.ok is None:
        return ""
    vals = [v for v in judged if v is not None]
    if not vals:
        return "not measured"
    k = sum(bool(row.ok(v)) for v in vals)
    missing = f" ({len(judged) - len(vals)} not measured)" if len(vals) < len(judged) else ""
    if k == len(vals):
        return "yes" + missing
    return ("**no**" if k == 0 else f"in {k} of {len(vals)} runs") + missing


def summarize(docs: list[dict], names: list[str] | None = None) -> str:
    """The Markdown table over ``docs`` (one suite document per run)."""
    names = names or [f"run {i + 1}" for i in range(len(docs))]
    head = " | ".join(f"{n}: min / median" for n in names)
    out = [f"| key | {head} | spread over the runs (max - min): minima / medians | goal | met? |",
           "|---|" + "---|" * len(docs) + "---|---|---|"]
    for row in rows_for():
        mins = [_num(_get(d, *row.minimum)) if row.minimum else None for d in docs]
        meds = [_num(_get(d, *row.median)) if row.median else None for d in docs]
        cells = []
        for a, b in zip(mins, meds):
            cells.append(_fmt(b, row.fmt) if not row.minimum else
                         (_fmt(a, row.fmt) if row.median is None else f"{_fmt(a, row.fmt)} / {_fmt(b, row.fmt)}"))

        def spread(xs):
            xs = [x for x in xs if x is not None]
            return None if len(xs) < 2 else max(xs) - min(xs)

        parts = [spread(mins) if row.minimum else None, spread(meds) if row.median else None]
        sp = " / ".join(_fmt(p, "percent" if row.fmt == "percent" else "ratio") for p, want in
                        zip(parts, (bool(row.minimum), row.median is not None)) if want)
        judged = meds if row.median is not None else mins
        label = f"`{row.label}`" if " " not in row.label else row.label
        out.append(f"| {label} | {' | '.join(cells)} | {sp} | {row.goal} | {_verdict(row, judged)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.summary", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="suite documents (python -m benchmarks --out FILE), one per run")
    args = ap.parse_args(argv)
    docs = []
    for p in args.runs:
        try:
            docs.append(json.loads(p.read_text()))
        except (OSError, ValueError) as exc:
            ap.error(f"cannot read the suite document {p}: {exc}; pass files written by python -m benchmarks --out FILE")
    print(summarize(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
