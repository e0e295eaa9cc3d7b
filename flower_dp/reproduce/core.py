"""The reproduction engine: run a paper's grid of experiments, resume it, summarise, plot, report.

A paper (``flower_dp.reproduce.papers.<name>``) describes its headline experiments as a list of
:class:`RunSpec` (one per run and seed) and knows how to check its claims on the finished
records.  This module does everything else, the same way for every paper:

* each run gets a folder ``OUT/runs/<run_id>/`` holding the runner's ``results.json``,
  ``history.csv`` and checkpoint; a run whose ``results.json`` says it finished (with the same
  config) is **not** run again, and a run with a checkpoint continues from it, so an interrupted
  sweep resumes where it stopped;
* ``OUT/runs/`` is not committed (checkpoints are large and stay on the machine that ran them), but
  ``OUT/records.json`` is: a finished run whose committed record carries this spec's ``config_sha`` is
  reused from the record alone, so a sweep started in one session resumes from a fresh clone in the next
  (only the unfinished runs' checkpoints are lost);
* ``OUT/records.json`` / ``OUT/records.csv``: one record per run (labels, seed, config, final and
  best accuracy, loss, bits, rigorous and paper eps per node, wall time, versions), rewritten
  atomically after every run;
* ``OUT/summary.csv``: the records grouped over seeds (mean, std, count);
* PNG plots and ``OUT/report.md``: our table beside the paper's, the claims checked with their
  numbers, the exact command line.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from .. import results as rio

__all__ = [
    "RunSpec",
    "Claim",
    "cells_of",
    "seed_values",
    "pooled_seed_values",
    "seed_means",
    "Paper",
    "Table",
    "bound_table",
    "paper_of_tables",
    "SCALES",
    "BACKENDS",
    "run_sweep",
    "estimate_cpu_hours",
    "settings_scale",
    "cpu_feasible",
    "group_records",
    "plot_learning_curves",
    "fmt",
    "mean_std",
]

SCALES = ("smoke", "ci", "full", "paper")
#: models too big for the 2-core CPU paper scale (``--scale paper`` drops their runs; ``full`` keeps them)
GPU_MODELS = ("resnet", "vit")


def settings_scale(scale: str) -> str:
    """The settings a scale reads: ``paper`` is ``full`` (the paper's setting) without the GPU-only models."""
    return "full" if scale == "paper" else scale


def cpu_feasible(spec: "RunSpec") -> bool:
    """Whether ``spec``'s model fits the CPU paper scale (not a ResNet/ViT)."""
    model = spec.config.get("model")
    name = model.get("name") if isinstance(model, dict) else model
    return not any(g in str(name or "").lower() for g in GPU_MODELS)
BACKENDS = ("inprocess", "flower")
_DONE = ("finished", "stopped_by_budget")
#: ``touch OUT/STOP`` stops a sweep writing to OUT: each running run at the end of its segment (checkpoint written,
#: status ``"stopped"``), and no run starts after it; the same command resumes, charging nothing twice
#: (:data:`flower_dp.experiments.runner.STOP_FILE_ENV`).  A sweep removes an old one when it starts.
STOP_NAME = "STOP"


@dataclass(frozen=True)
class RunSpec:
    """One run of a reproduction.

    run_id : unique, filesystem-safe name (it is the run's folder)
    labels : what the report groups by, e.g. ``{"algorithm": "Dyn-D2P", "eps": 0.3, "calibration": "paper"}``
    config : an experiment config dict for :func:`flower_dp.experiments.config_from_dict` (``kind="pushsum"``)
             or the keyword arguments of the paper's own runner (other kinds)
    seed : the seed (also in ``config``); records with equal labels and different seeds are averaged
    kind : "pushsum" (the experiment runner) or a paper-specific runner name
    node_eval : push-sum only: the final nodes are also evaluated one by one (:mod:`.node_eval`)
    """

    run_id: str
    labels: dict[str, Any]
    config: dict[str, Any]
    seed: int = 0
    kind: str = "pushsum"
    node_eval: bool = False
    """push-sum runs: also evaluate each node on the shared average with its own head (:mod:`.node_eval`)"""


#: a claim discriminates when the range of its cells' means exceeds this many times the largest seed std of a cell
DISCRIMINATION_FACTOR = 2.0


@dataclass(frozen=True)
class Claim:
    """A paper's claim checked on our records.

    cells : the cells the claim compares, each ``(name, per-seed values)`` of the quantity compared (accuracy, bits,
            sensitivity...); empty when the claim compares no cells (a bound, a property of each run).  They decide
            whether the claim discriminates (:meth:`discriminates`): a comparison that holds while its cells are equal
            within the seed spread holds only because nothing differs.
    ordered : the claim orders its cells (A > B > C, in the order given): the gap that must exceed the spread is
            the smallest between neighbours, since every step of the ordering has to be resolved; otherwise the range
            of the cell means.
    """

    name: str
    passed: bool | None  # None = could not be checked at this scale
    detail: str
    cells: tuple[tuple[str, tuple[float, ...]], ...] = ()
    ordered: bool = False

    def _spread(self) -> tuple[float, float, int] | None:
        """(the gap between the cell means: their range, or for an ordered claim the smallest neighbour gap; the
        largest seed std of a cell (ddof 1); the fewest seeds of a cell); None: fewer than two cells with values."""
        vals = [[float(v) for v in vs if v is not None and math.isfinite(float(v))] for _, vs in self.cells]
        vals = [v for v in vals if v]
        if len(vals) < 2:
            return None
        means = [sum(v) / len(v) for v in vals]
        stds = [float(np.std(v, ddof=1)) for v in vals if len(v) > 1]
        gap = (min(abs(a - b) for a, b in zip(means, means[1:])) if self.ordered else max(means) - min(means))
        return gap, max(stds) if stds else float("nan"), min(len(v) for v in vals)

    def discriminates(self) -> bool | None:
        """Whether the cells differ beyond the seed spread: the range of their means exceeds
        :data:`DISCRIMINATION_FACTOR` x the largest seed std of a cell.  None when it cannot be told: fewer than two
        cells with values, or a cell with one seed (no spread measured)."""
        sp = self._spread()
        if sp is None or sp[2] < 2:
            return None
        gap, std, _ = sp
        return bool(gap > DISCRIMINATION_FACTOR * std)

    def discrimination(self) -> str:
        """The report's "discriminates?" entry: the verdict, the gap between the cells and the seed spread."""
        sp = self._spread()
        if sp is None:
            return "n/a (compares no cells)"
        gap, std, n_min = sp
        if n_min < 2:
            return f"n/a (one seed: no spread; gap between the cells {fmt(gap)})"
        ratio = gap / std if std > 0 else float("inf")
        what = "smallest step" if self.ordered and len(self.cells) > 2 else "gap"
        return (f"{'yes' if self.discriminates() else '**no**'}: {what} {fmt(gap)} = {fmt(ratio, 1)} x the largest "
                f"seed std {fmt(std)} (needs > {DISCRIMINATION_FACTOR:g})")

    def verdict(self) -> str:
        """The report's verdict; a claim that holds while its cells are equal within the seed spread is "holds, not
        discriminating", counted apart from the reproduced ones."""
        if self.passed and self.discriminates() is False:
            return "holds, not discriminating"
        return {True: "**reproduced**", False: "**not reproduced**", None: "not checkable at this scale"}[self.passed]


def seed_values(g: dict[str, Any] | None, key: str = "final_acc") -> tuple[float, ...]:
    """The per-seed values of ``key`` in a grouped row (:func:`group_records`): what a :class:`Claim`'s cell holds."""
    if g is None:
        return ()
    return tuple(float(r.get(key, float("nan"))) for r in g.get("records", []))


def pooled_seed_values(groups: Iterable[dict[str, Any] | None], key: str = "final_acc") -> tuple[float, ...]:
    """Per seed, the mean of ``key`` over several grouped rows (a claim about an average over cells): one value
    per seed present in every row."""
    per: dict[Any, list[float]] = {}
    rows = [g for g in groups if g is not None]
    for g in rows:
        for r in g.get("records", []):
            per.setdefault(r.get("seed"), []).append(float(r.get(key, float("nan"))))
    return tuple(sum(v) / len(v) for v in per.values() if len(v) == len(rows))


def seed_means(records: Iterable[dict[str, Any]], key: str = "final_acc") -> tuple[float, ...]:
    """Per seed, the mean of ``key`` over ``records`` (several configurations of one arm of a claim)."""
    per: dict[Any, list[float]] = {}
    for r in records:
        per.setdefault(r.get("seed"), []).append(float(r.get(key, float("nan"))))
    return tuple(sum(v) / len(v) for v in per.values())


def cells_of(*named: tuple[str, dict[str, Any] | None], key: str = "final_acc"
             ) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """:attr:`Claim.cells` from ``(name, grouped row)`` pairs: each row's per-seed ``key`` (missing rows left out)."""
    return tuple((name, seed_values(g, key)) for name, g in named if g is not None)


@dataclass
class Paper:
    """What a paper contributes to a reproduction (see ``flower_dp.reproduce.papers``)."""

    name: str
    title: str
    tables: dict[str, str]
    default_table: str
    build_runs: Callable[[str, str, list[int]], list[RunSpec]]
    check_claims: Callable[[list[dict[str, Any]], str, str], list[Claim]]
    render: Callable[[list[dict[str, Any]], str, str, Path], tuple[list[str], list[str]]]
    """render(records, table, scale, out) -> (markdown lines of tables, list of written plot file names)"""
    differences: Callable[[str, str], list[str]]
    runners: dict[str, Callable[..., dict[str, Any]]] = field(default_factory=dict)
    default_seeds: dict[str, int] = field(default_factory=lambda: {"smoke": 1, "ci": 1, "full": 5, "paper": 2})
    paper_scale: Callable[[str, RunSpec], bool] | None = None
    """paper_scale(table, spec) -> whether ``--scale paper`` keeps this run of the table's ``full`` grid (besides
    dropping GPU models); None keeps them all"""
    estimators: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[dict[str, Any]], float]]] = \
        field(default_factory=dict)
    """kind -> (cut, work) for the CPU-hour estimate of runs that are not push-sum runs: ``cut(config)`` is the
    config of a one-segment probe (e.g. one round) and ``work(config)`` a run's work in units of that probe"""
    findings: Callable[[list[dict[str, Any]], str, str], list[str]] | None = None
    """findings(records, table, scale) -> more lines for the report's "why" section, drawn from the records (a
    diagnostic's conclusion in numbers); None: the ``differences`` lines only"""


@dataclass(frozen=True)
class Table:
    """One reproduction target of a paper (a table or a figure): its runs, claims, report and caveats."""

    title: str
    build: Callable[[str, list[int]], list[RunSpec]]
    """build(scale, seeds) -> the runs"""
    claims: Callable[[list[dict[str, Any]], str], list[Claim]]
    """claims(records, scale) -> the paper's claims checked on our records"""
    render: Callable[[list[dict[str, Any]], str, Path], tuple[list[str], list[str]]]
    """render(records, scale, out) -> (markdown lines, written plot file names)"""
    differences: Callable[[str], list[str]]
    """differences(scale) -> one line per way our setting differs from the paper's"""
    findings: Callable[[list[dict[str, Any]], str], list[str]] | None = None
    """findings(records, scale) -> more "why" lines drawn from the records (e.g. a diagnostic's conclusion in
    numbers), after the ``differences`` lines; None: none"""


def bound_table(title: str, table: str, *, build: Callable, claims: Callable, render: Callable,
                differences: Callable) -> Table:
    """A :class:`Table` from a paper module's table-generic functions, called by keyword with ``table``
    bound (``build(scale=, table=, seeds=)``, ``claims(records=, table=, scale=)``,
    ``render(records=, table=, scale=, out=)``, ``differences(table=, scale=)``)."""
    return Table(title, lambda scale, seeds: build(scale=scale, table=table, seeds=seeds),
                 lambda records, scale: claims(records=records, table=table, scale=scale),
                 lambda records, scale, out: render(records=records, table=table, scale=scale, out=out),
                 lambda scale: differences(table=table, scale=scale))


def paper_of_tables(*, name: str, title: str, tables: dict[str, Table], default_table: str, **kw: Any) -> Paper:
    """A :class:`Paper` whose callables dispatch on the table name to its :class:`Table`."""
    if default_table not in tables:
        raise ValueError(f"default_table {default_table!r} is not one of {sorted(tables)}")
    return Paper(
        name=name, title=title, tables={k: t.title for k, t in tables.items()}, default_table=default_table,
        build_runs=lambda scale, table, seeds: tables[table].build(scale, seeds),
        check_claims=lambda records, table, scale: tables[table].claims(records, scale),
        render=lambda records, table, scale, out: tables[table].render(records, scale, out),
        differences=lambda table, scale: tables[table].differences(scale),
        findings=lambda records, table, scale: (tables[table].findings(records, scale) if tables[table].findings
                                                else []), **kw)


# --------------------------------------------------------------------------------------------- running

def _progress(total: int, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    quiet = bool(os.environ.get("CI")) or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="run", disable=quiet)


def _on_device(config: dict[str, Any], device: str | None) -> dict[str, Any]:
    """``config`` with ``[run] device`` set to ``device`` (None: unchanged).  Where a run computes is an execution
    detail like the backend: it is not part of a run's identity (:func:`_same_config`, :func:`config_sha`)."""
    if device is None:
        return config
    import copy

    out = copy.deepcopy(config)
    out.setdefault("run", {})["device"] = device
    return out


def _run_pushsum(spec: RunSpec, run_dir: Path, backend: str, device: str | None = None) -> dict[str, Any]:
    """Run (or resume, or reuse) one push-sum experiment on ``device`` (None: the config's); return its results
    document.  A run finished on another device is reused; a checkpoint of another device starts the run again
    (its noise came from another sampler)."""
    from ..experiments import config_from_dict, run_experiment

    cfg = config_from_dict(_on_device(spec.config, device))
    doc = rio.read_json(run_dir / "results.json")
    if doc and doc.get("config"):  # a run from before [run] debug_metrics existed ran with it off
        doc["config"].setdefault("run", {}).setdefault("debug_metrics", False)
        doc["config"]["run"].setdefault("reproducible", True)  # before secret noise every run was seeded
    same = bool(doc) and _same_config(doc.get("config"), cfg)
    if same and doc.get("status") in _DONE and drew_float32_noise(record_from_doc(spec, doc)):
        print(f"flower-dp: {spec.run_id}: its private noise came from torch's float32 sampler (eps not proven); "
              "running it again", file=sys.stderr)
        same = False
    if same and doc.get("status") in _DONE:
        doc["_reused"] = True
        return doc
    if backend == "flower":
        if spec.node_eval:
            raise ValueError(f"run {spec.run_id!r} asks for node_eval, which the inprocess backend alone computes; "
                             "got backend 'flower': run it with --backend inprocess")
        from ..experiments.flower_backend import run_flower_experiment

        run_flower_experiment(cfg, out_dir=run_dir)
    else:
        from ..errors import CheckpointError

        resume = (run_dir / rio.CHECKPOINT_NAME).is_file() and same
        try:
            result = run_experiment(cfg, out_dir=run_dir, resume=resume, progress=True)
        except CheckpointError as err:  # unreadable (older format, corrupted): this run starts again, the rest stand
            if not resume:
                raise
            print(f"flower-dp: {spec.run_id}: its checkpoint cannot be resumed ({err}); running it from the start",
                  file=sys.stderr)
            (run_dir / rio.CHECKPOINT_NAME).unlink(missing_ok=True)
            result = run_experiment(cfg, out_dir=run_dir, resume=False, progress=True)
        if spec.node_eval and result.status in _DONE:
            from .node_eval import node_eval_record

            doc = rio.read_json(run_dir / "results.json") or {}
            doc["extra_record"] = {**doc.get("extra_record", {}), **node_eval_record(cfg, result.nodes)}
            rio.write_json(run_dir / "results.json", doc)
    doc = rio.read_json(run_dir / "results.json")
    if doc is None:
        raise RuntimeError(f"run {spec.run_id!r} wrote no results.json in {str(run_dir)!r}")
    return doc


def _same_config(stored: Any, cfg: Any) -> bool:
    """Whether a run's stored config is ``cfg``: compared after both pass through today's config parser, so a
    key added later with its default (what the run in fact used) does not make a finished run look different.
    ``[run] device`` is left out of the comparison: a run finished on a GPU is the same run as on the CPU."""
    from ..errors import ConfigError
    from ..experiments import config_from_dict

    def placeless(conf: dict[str, Any]) -> dict[str, Any]:
        # where and how the nodes ran, not what they computed: the same results (prefetched noise is bit for bit)
        return {**conf, "run": {k: v for k, v in conf.get("run", {}).items() if k not in ("device", "prefetch_noise")}}

    if not isinstance(stored, dict):
        return False
    want = placeless(cfg.to_dict())
    if placeless(stored) == want:
        return True
    try:
        return placeless(config_from_dict(stored).to_dict()) == want
    except (ConfigError, TypeError, ValueError):
        return False


def _per_node(doc: dict[str, Any], key: str) -> list[float]:
    return [float(p.get(key, float("nan"))) for p in doc.get("privacy", {}).get("per_node", [])]


#: Mechanisms without an implemented DP proof: their eps is ``eps_heuristic`` (``eps_rigorous`` null), with a note.
#: Push-sum algorithm name (``config.algorithm.name``) or Gau-LRQ method (``config.method``) -> why.
HEURISTIC_MECHANISMS: dict[str, str] = {
    **{a: ("heuristic, no DP proof: Laplace noise scaled to a data-dependent sensitivity estimate broadcast in the "
           "clear (L1 clipping off by default, so the true sensitivity is unbounded); per node-message, not "
           "record-level") for a in ("partpsp", "sgpdp", "pedfl")},
    **{m: "heuristic, no DP proof: binomial noise matched by variance to the Gaussian" for m in ("bq-sgd", "bq")},
}


def _heuristic_note(config: dict[str, Any] | None) -> str | None:
    """The note of a heuristic mechanism for a run config (push-sum or Gau-LRQ), or None for a proven one."""
    cfg = config or {}
    name = (cfg.get("algorithm") or {}).get("name") if isinstance(cfg.get("algorithm"), dict) else None
    return HEURISTIC_MECHANISMS.get(name or cfg.get("method") or "")


#: The privacy note of a push-sum run whose Gaussian noise came from torch's float32 sampler (before commit 4575d7e):
#: its eps is an ideal Gaussian's at the run's noise levels, so it is kept as ``eps_heuristic``, never ``eps_rigorous``.
FLOAT32_SAMPLER_NOTE = (
    "heuristic, not proven for the noise drawn: an ideal Gaussian's eps at this run's noise levels, but the noise came "
    "from torch's float32 sampler (24-bit uniforms, no draw beyond 5.77 std, coarse tail beyond ~4.4 std), which "
    "leaves an uncharged delta; re-run it (the float64 sampler, noise.gaussian_sampler = torch-float64) for a proven eps"
)


def with_sampler(rec: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """``rec`` (a new dict) naming its Gaussian sampler: a push-sum record from before results named it
    (``gaussian_sampler`` missing or None) drew torch's float32 noise, cut at 5.77 std (before commit 4575d7e)."""
    out = dict(rec)
    if out.get("gaussian_sampler") is None and kind == "pushsum":
        out["gaussian_sampler"] = "torch-float32"
    return out


def _float32_private(rec: dict[str, Any]) -> bool:
    """A private record (finite ``eps_rigorous``) whose noise came from torch's float32 sampler, not yet demoted."""
    try:
        private = math.isfinite(float(rec.get("eps_rigorous")))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        private = False
    return private and rec.get("gaussian_sampler") == "torch-float32"


def unproven_sampler(rec: dict[str, Any]) -> dict[str, Any]:
    """A record whose Gaussian noise was drawn by torch's float32 sampler, with its eps demoted to ``eps_heuristic``
    (:data:`FLOAT32_SAMPLER_NOTE`; history rows too).  Other records, and ones already demoted, come back unchanged
    (a new dict; idempotent).  Only a finite ``eps_rigorous`` is demoted: a non-private run drew no noise."""
    if not _float32_private(rec):
        return dict(rec)
    out = {k: v for k, v in rec.items() if k != "eps_rigorous"}
    out.update(eps_rigorous=None, eps_heuristic=rec["eps_rigorous"], privacy_note=FLOAT32_SAMPLER_NOTE)
    if isinstance(rec.get("history"), list):
        out["history"] = [{("eps_heuristic" if hk == "eps_rigorous" else hk): hv for hk, hv in h.items()}
                          for h in rec["history"]]
    return out


def drew_float32_noise(rec: dict[str, Any]) -> bool:
    """Whether a record is a private run whose noise came from torch's float32 sampler (demoted or not yet)."""
    return rec.get("privacy_note") == FLOAT32_SAMPLER_NOTE or _float32_private(rec)


def _privacy_fields(doc: dict[str, Any], config: dict[str, Any] | None) -> dict[str, Any]:
    """``eps_rigorous`` (max over nodes) or, for a mechanism without a proof, ``eps_rigorous: None`` with
    ``eps_heuristic`` and ``privacy_note``.  A results file from before the rename (a heuristic mechanism's
    number under ``eps_rigorous``) is read as heuristic."""
    per_node = doc.get("privacy", {}).get("per_node", []) or []
    note = next((p.get("privacy_note") for p in per_node if p.get("eps_heuristic") is not None
                 and p.get("privacy_note")), None) or _heuristic_note(config)
    if note is None and any(p.get("heuristic") for p in per_node if "eps_heuristic" not in p and
                            p.get("eps_rigorous") is not None):
        note = "heuristic, no DP proof"
    if note is None:
        eps_r = [float(p.get("eps_rigorous", float("nan"))) for p in per_node]
        return {"eps_rigorous": max(eps_r) if eps_r else float("nan")}
    vals = [p.get("eps_heuristic", p.get("eps_rigorous")) for p in per_node]
    vals = [float(v) for v in vals if v is not None]
    return {"eps_rigorous": None, "eps_heuristic": max(vals) if vals else float("nan"), "privacy_note": note}


#: Paper labels of the heuristic mechanisms (records written without their config): label -> HEURISTIC_MECHANISMS key.
HEURISTIC_LABELS = {"PartPSP-1": "partpsp", "PartPSP-2": "partpsp", "SGPDP": "sgpdp", "PEDFL": "pedfl",
                    "BQ-SGD": "bq-sgd"}


def migrate_record(rec: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A record written before ``eps_heuristic`` existed, with the names of today (a new dict; idempotent).

    A mechanism without a proof (:data:`HEURISTIC_MECHANISMS`, found from ``config``, the record's own
    ``config`` or its algorithm label) gets ``eps_rigorous: None``, ``eps_heuristic`` (the number it carried)
    and ``privacy_note``, and its history rows' ``eps_rigorous`` becomes ``eps_heuristic``.  Other records
    are returned unchanged.
    """
    note = _heuristic_note(config if config is not None else rec.get("config"))
    if note is None and config is None:
        note = HEURISTIC_MECHANISMS.get(HEURISTIC_LABELS.get(str((rec.get("labels") or {}).get("algorithm")), ""))
    if note is None or "eps_heuristic" in rec:
        return dict(rec)
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if k == "eps_rigorous":
            out["eps_rigorous"], out["eps_heuristic"], out["privacy_note"] = None, v, note
        elif k == "history":
            out[k] = [{("eps_heuristic" if hk == "eps_rigorous" else hk): hv for hk, hv in h.items()} for h in v]
        else:
            out[k] = v
    return out


def record_from_doc(spec: RunSpec, doc: dict[str, Any]) -> dict[str, Any]:
    """One flat record of a finished run (what the report and the CSV are made of)."""
    hist = doc.get("history", [])
    accs = [float(h.get("acc_avg", float("nan"))) for h in hist]
    eps_p = _per_node(doc, "eps_paper")
    info = doc.get("info", {})
    rec = {
        "run_id": spec.run_id,
        **{f"label_{k}": v for k, v in spec.labels.items()},
        "seed": spec.seed,
        "status": doc.get("status"),
        "num_iters": doc.get("num_iters"),
        "final_acc": accs[-1] if accs else float("nan"),
        "best_acc": max(accs) if accs else float("nan"),
        "final_loss": float(hist[-1].get("test_loss_avg", float("nan"))) if hist else float("nan"),
        "bits_total": float(hist[-1].get("bits_total", float("nan"))) if hist else float("nan"),
        **_privacy_fields(doc, spec.config),
        "eps_paper": max(eps_p) if eps_p else float("nan"),
        "delta": (doc.get("privacy", {}).get("per_node") or [{}])[0].get("delta"),
        "dataset": info.get("dataset", doc.get("dataset")),
        "synthetic_data": info.get("synthetic_data", False),
        "backend": doc.get("backend", "inprocess"),
        "device": info.get("device") or ((doc.get("config") or {}).get("run") or {}).get("device", "cpu"),
        "wall_time_s": float(doc.get("wall_time_s", float("nan"))),
        "train_cpu_s": float(doc.get("train_cpu_s", float("nan"))),
        "reused": bool(doc.get("_reused", False)),
        # debug_metrics runs (e.g. Dyn-D2P Fig. 1): training statistics the accountant did not charge are in the history
        "uncharged_statistics_released": bool(doc.get("uncharged_statistics_released", False)),
        # where the privacy noise came from (flower_dp.rng.noise_record); a run from before secret noise was seeded
        "noise_mode": (doc.get("noise") or {}).get("mode", "reproducible"),
        # push-sum noise drawn before the float64 sampler (commit 4575d7e) was torch's float32 (with_sampler)
        "gaussian_sampler": (doc.get("noise") or {}).get("gaussian_sampler"),
    }
    rec.update(doc.get("extra_record", {}))
    rec["config_sha"] = config_sha(spec.config)
    rec["labels"] = dict(spec.labels)
    if spec.kind == "pushsum" and not rec["uncharged_statistics_released"]:
        from ..releases import public_history_row

        hist = [public_history_row(h) for h in hist]  # a reused run from before the releases were filtered
    rec["history"] = hist
    return unproven_sampler(with_sampler(rec, spec.kind))


def config_sha(config: dict[str, Any]) -> str:
    """A short fingerprint of a run's config (canonical JSON, SHA-256): a committed record is reused only for
    the config that produced it."""
    import hashlib
    import json

    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def committed_records(out: Path) -> dict[str, dict[str, Any]]:
    """The finished records of ``out/records.json`` (what a previous session committed), by run id."""
    doc = rio.read_json(Path(out) / "records.json") or {}
    return {r["run_id"]: r for r in doc.get("records", []) if isinstance(r, dict) and r.get("run_id")
            and r.get("status") in _DONE}


def _same_config_record(spec: RunSpec, committed: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The committed record of ``spec``'s run id, if it was made from exactly this config (``config_sha``)."""
    rec = committed.get(spec.run_id)
    return rec if rec is not None and rec.get("config_sha") == config_sha(spec.config) else None


def _float32_record(spec: RunSpec, committed: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The committed record of exactly ``spec``'s config whose private noise came from torch's float32 sampler:
    its eps is not proven, so the run is made again (the record stands in records.json until then)."""
    rec = _same_config_record(spec, committed)
    return rec if rec is not None and _drew_float32(rec, spec) else None


def _drew_float32(rec: dict[str, Any], spec: RunSpec) -> bool:
    return drew_float32_noise(with_sampler(rec, spec.kind))


def _committed_record(spec: RunSpec, run_dir: Path, committed: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The committed record to reuse for ``spec``: only when the run folder holds no results of its own (those
    win: they may be newer), the record was made from exactly this config (``config_sha``) and its noise is
    proven (not :func:`_float32_record`)."""
    rec = _same_config_record(spec, committed)
    if rec is None or _drew_float32(rec, spec):
        return None
    if (run_dir / "results.json").is_file() or (run_dir / "reproduce_doc.json").is_file():
        return None
    return rec


def _note_cpu(run_dir: Path, cpu: float) -> None:
    rio.write_json(run_dir / "cpu_time.json", {"cpu_time_s": cpu})


def _read_cpu(run_dir: Path) -> float:
    doc = rio.read_json(run_dir / "cpu_time.json")
    return float(doc["cpu_time_s"]) if doc else float("nan")


_CSV_SKIP = ("labels", "history", "config")


def _write_records(out: Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    rio.write_json(out / "records.json", {"meta": meta, "records": records})
    rio.write_csv(out / "records.csv", [{k: v for k, v in r.items() if k not in _CSV_SKIP} for r in records])


def _run_one(paper: Paper, spec: RunSpec, run_dir: Path, backend: str, device: str | None = None
             ) -> tuple[dict[str, Any] | None, float]:
    """Run (or resume, or reuse) one spec; return its results document and the CPU seconds this call spent
    (``None`` when a stop was requested before it started: :data:`flower_dp.experiments.runner.STOP_FILE_ENV`).
    ``device`` places push-sum runs (None: their config's, the CPU); the other runners (Gau-LRQ) run on the CPU."""
    c0 = time.process_time()
    from ..experiments.runner import stop_requested

    if stop_requested():  # the sweep was asked to stop: this run does not start
        return None, 0.0
    if spec.kind == "pushsum":
        doc = _run_pushsum(spec, run_dir, backend, device)
    else:
        runner = paper.runners.get(spec.kind)
        if runner is None:
            raise ValueError(f"paper {paper.name!r} has no runner for kind {spec.kind!r}")
        doc = runner(spec, run_dir, backend)
    return doc, time.process_time() - c0


def _run_one_in_worker(paper_name: str, spec: RunSpec, run_dir: str, backend: str, device: str | None = None
                       ) -> tuple[dict[str, Any] | None, float, float]:
    """:func:`_run_one` in a worker process of ``run_sweep(jobs > 1)``: one torch thread, the paper by name; also
    the wall time of the run itself, timed here (the driver's clock would add the time the run waited in the queue)."""
    import torch

    torch.set_num_threads(int(os.environ.get("FLOWER_DP_THREADS", "1")))
    from . import get_paper

    t0 = time.perf_counter()
    doc, cpu = _run_one(get_paper(paper_name), spec, Path(run_dir), backend, device)
    return doc, cpu, time.perf_counter() - t0


def run_sweep(
    paper: Paper,
    specs: list[RunSpec],
    out: Path,
    *,
    backend: str = "inprocess",
    meta: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    jobs: int = 1,
    device: str | None = None,
) -> list[dict[str, Any]]:
    """Run every spec not already finished in ``out/runs``; return one record per spec (in order).

    ``jobs > 1`` runs that many specs at once, each in a process of its own with one torch thread (the way to
    use several cores: one run per core).  Records are the same as with ``jobs=1``; ``records.json`` is
    rewritten, in spec order, each time a run finishes, holding the runs finished so far and the committed records
    still waiting to be made again (float32 noise: those run last, after every missing run).  ``device`` places the
    push-sum runs ("cpu", "cuda", "cuda:N", "auto"; None: their configs', the CPU); it is not part of a run's
    identity, so finished runs are reused whatever device made them (records name it: ``device``).
    """
    out = rio.ensure_writable_dir(out)
    (out / "runs").mkdir(exist_ok=True)
    ids = [s.run_id for s in specs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"run ids must be unique within a reproduction, got duplicates {dup}")
    if int(jobs) < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs!r}; pass --jobs 1 (one run at a time) or more")
    meta = dict(meta or {})
    done: dict[int, dict[str, Any]] = {}
    bar = _progress(len(specs), f"{paper.name}")
    committed = committed_records(out)
    # committed records of these very configs whose noise came from torch's float32 sampler: made again (their eps
    # is not proven) after every run that is missing, and kept in records.json until then (their accuracies stand;
    # the report's caveat names them), so a sweep stopped half-way loses no result
    stale = {i: rec for i, s in enumerate(specs) if (rec := _float32_record(s, committed)) is not None}

    def finish(i: int, doc: dict[str, Any] | None, cpu: float, wall: float, rec: dict[str, Any] | None = None
               ) -> None:
        spec, run_dir = specs[i], out / "runs" / specs[i].run_id
        if rec is None and (doc is None or doc.get("status") == STOPPED):  # stopped on request: resumes next time
            if doc is not None:
                stopped.append(spec.run_id)
                k = (doc.get("history") or [{}])[-1].get("k", 0)
                log(f"{spec.run_id}: stopped on request at k = {k} of {doc.get('num_iters')} (checkpoint written; "
                    "the same command resumes it, charging nothing twice)")
            return
        if rec is not None:  # a committed record of this config, reused as it stands (its CPU time included)
            rec = {**rec, "reused": True}
        else:
            rec = record_from_doc(spec, doc)
            if rec["reused"]:
                rec["cpu_time_s"] = _read_cpu(run_dir)
            else:
                rec["cpu_time_s"] = cpu
                _note_cpu(run_dir, cpu)
        done[i] = rec
        state = "reused (already finished)" if rec["reused"] else f"done in {wall:.0f} s"
        eps = (f"eps heuristic {fmt(rec['eps_heuristic'])} (no DP proof)" if "eps_heuristic" in rec
               else f"eps rigorous {fmt(rec['eps_rigorous'])}")
        log(f"[{len(done)}/{len(specs)}] {spec.run_id}: acc {fmt(rec['final_acc'])}, "
            f"{eps} (paper {fmt(rec['eps_paper'])}) - {state}")
        _write_records(out, [done[j] if j in done else stale[j] for j in range(len(specs)) if j in done or j in stale],
                       meta)
        if bar is not None:
            bar.update(1)

    from ..experiments.runner import STOP_FILE_ENV
    from ..recorder import STOPPED

    stopped: list[str] = []
    stop_file = out / STOP_NAME
    if stop_file.exists():
        stop_file.unlink()
        log(f"removed {stop_file} (the stop request of an earlier sweep)")
    env_before = os.environ.get(STOP_FILE_ENV)
    os.environ[STOP_FILE_ENV] = str(stop_file.resolve())  # read by the runs, in this process and in the workers
    try:
        for spec in specs:
            (out / "runs" / spec.run_id).mkdir(parents=True, exist_ok=True)
        todo = []
        for i, spec in enumerate(specs):
            rec = _committed_record(spec, out / "runs" / spec.run_id, committed)
            if rec is not None:
                finish(i, None, 0.0, 0.0, rec=rec)
            else:
                todo.append(i)
        todo = [i for i in todo if i not in stale] + [i for i in todo if i in stale]
        if int(jobs) == 1:
            for i in todo:  # after a stop request, _run_one starts nothing
                spec = specs[i]
                t0 = time.perf_counter()
                doc, cpu = _run_one(paper, spec, out / "runs" / spec.run_id, backend, device)
                finish(i, doc, cpu, time.perf_counter() - t0)
        else:
            import multiprocessing as mp
            from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

            with ProcessPoolExecutor(max_workers=int(jobs), mp_context=mp.get_context("spawn")) as pool:
                started = {pool.submit(_run_one_in_worker, paper.name, specs[i], str(out / "runs" / specs[i].run_id),
                                       backend, device): i for i in todo}
                pending = set(started)
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in sorted(finished, key=lambda f: started[f]):
                        doc, cpu, wall = fut.result()  # a failed run raises here; the finished ones are recorded
                        finish(started[fut], doc, cpu, wall)
    finally:
        if bar is not None:
            bar.close()
        if env_before is None:
            os.environ.pop(STOP_FILE_ENV, None)
        else:
            os.environ[STOP_FILE_ENV] = env_before
    if len(done) < len(specs):  # stopped on request: what is finished so far, as records.json holds it
        log(f"stopped on request ({stop_file}): {len(done)} of {len(specs)} runs finished"
            + (f", {len(stopped)} stopped at a checkpoint" if stopped else "")
            + "; run the same command to go on")
        return [done[j] if j in done else stale[j] for j in range(len(specs)) if j in done or j in stale]
    return [done[i] for i in range(len(specs))]


def estimate_cpu_hours(paper: Paper, specs: list[RunSpec], out: Path, *, log: Callable[[str], None] = print
                       ) -> float | None:
    """CPU hours the unfinished ``specs`` will take, extrapolated from one measured segment.

    The probe is the first unfinished private push-sum spec (the costliest kind of run), cut to one segment
    (``eval_every`` iterations, with one evaluation and the privacy report) and run in ``out/estimate-probe``;
    the rest scales by iterations x nodes.  ``None`` when no push-sum spec is left to measure.
    """
    import copy
    import shutil

    committed = committed_records(out)
    todo = [s for s in specs if not _finished(s, out / "runs" / s.run_id, committed)]
    pushsum = [s for s in todo if s.kind == "pushsum"]
    if not pushsum:
        est = [s for s in todo if s.kind in paper.estimators]
        if not est:
            if todo:
                log(f"estimate: no push-sum run to measure among the {len(todo)} unfinished runs (kinds "
                    f"{sorted({s.kind for s in todo})}); no estimate")
            return None if todo else 0.0
        return _estimate_by_segments(paper, est, len(todo), out, log)
    private = [s for s in pushsum if math.isfinite(float(s.labels.get("eps", math.inf)))]
    probe = (private or pushsum)[0]
    cfg = copy.deepcopy(probe.config)
    seg = max(1, min(int(cfg["run"]["eval_every"]), int(cfg["run"]["num_iters"])))
    cfg["run"].update(num_iters=seg, eval_every=seg, checkpoint=False, progress=False)
    probe_dir = out / "runs" / ".estimate-probe"  # under runs/: git-ignored, like the runs
    shutil.rmtree(probe_dir, ignore_errors=True)
    c0 = time.process_time()
    _run_pushsum(RunSpec(probe.run_id, probe.labels, cfg, probe.seed), probe_dir, "inprocess")
    per_node_iter = (time.process_time() - c0) / (seg * int(cfg["topology"]["n_nodes"]))
    shutil.rmtree(probe_dir, ignore_errors=True)

    def work(s: RunSpec) -> float:
        if s.kind != "pushsum":
            return 0.0
        return float(s.config["run"]["num_iters"]) * float(s.config["topology"]["n_nodes"])

    hours = per_node_iter * sum(work(s) for s in todo) / 3600
    other = len(todo) - len(pushsum)
    log(f"estimate: {hours:.1f} CPU hours for {len(pushsum)} unfinished push-sum runs (measured: one segment of "
        f"{probe.run_id}, {seg} iterations, {per_node_iter * 1e3:.1f} ms per node-iteration incl. evaluation and "
        f"accounting)" + (f"; {other} runs of other kinds not estimated" if other else ""))
    return hours


def _estimate_by_segments(paper: Paper, todo: list[RunSpec], n_todo: int, out: Path,
                          log: Callable[[str], None]) -> float:
    """:func:`estimate_cpu_hours` for runs that are not push-sum runs (``paper.estimators``): the first one, cut to
    one segment, is timed; every run costs its ``work`` in such segments (set-up and calibration included, so
    the figure errs high)."""
    import shutil

    probe = todo[0]
    cut, _ = paper.estimators[probe.kind]
    probe_dir = out / "runs" / ".estimate-probe"
    shutil.rmtree(probe_dir, ignore_errors=True)
    probe_dir.mkdir(parents=True)
    c0 = time.process_time()
    paper.runners[probe.kind](RunSpec(probe.run_id, probe.labels, cut(dict(probe.config)), probe.seed,
                                      kind=probe.kind), probe_dir, "inprocess")
    per_unit = time.process_time() - c0
    shutil.rmtree(probe_dir, ignore_errors=True)
    hours = per_unit * sum(paper.estimators[s.kind][1](s.config) for s in todo) / 3600
    other = n_todo - len(todo)
    log(f"estimate: {hours:.1f} CPU hours for {len(todo)} unfinished {probe.kind} runs (measured: one segment of "
        f"{probe.run_id}, {per_unit:.1f} CPU s incl. set-up, calibration and evaluation)"
        + (f"; {other} runs of other kinds not estimated" if other else ""))
    return hours


def _finished(spec: RunSpec, run_dir: Path, committed: dict[str, dict[str, Any]]) -> bool:
    """Whether a run is done: the runner's results.json (push-sum runs), a paper runner's own record
    (``reproduce_doc.json``, e.g. Gau-LRQ) of this spec's config, or a committed record of this config
    (``committed``: :func:`committed_records` of the output folder)."""
    if _committed_record(spec, run_dir, committed) is not None:
        return True
    doc = rio.read_json(run_dir / "results.json")
    if bool(doc) and doc.get("status") in _DONE:
        return True
    doc = rio.read_json(run_dir / "reproduce_doc.json")
    return bool(doc) and doc.get("status") in _DONE and doc.get("repro_config") == spec.config


# --------------------------------------------------------------------------------------------- summaries

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
