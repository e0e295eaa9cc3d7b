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

The records live in :mod:`.records`, the claims in :mod:`.claims`, the report's formatting and figures in
:mod:`.render`; this module re-exports their names, so a paper imports everything from here.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


from .. import results as rio
from .claims import (  # noqa: F401 - re-exported: the papers import them from here
    DISCRIMINATION_FACTOR, Claim, seed_values, pooled_seed_values, seed_means, cells_of,
)
from .records import (  # noqa: F401 - re-exported: the papers import them from here
    _DONE, _same_config, _per_node, HEURISTIC_MECHANISMS, _heuristic_note, FLOAT32_SAMPLER_NOTE,
    with_sampler, _float32_private, unproven_sampler, drew_float32_noise, _privacy_fields, HEURISTIC_LABELS,
    migrate_record, record_from_doc, config_sha, committed_records, _same_config_record, _float32_record,
    _drew_float32, _committed_record, _note_cpu, _read_cpu, _CSV_SKIP, _write_records,
)
from .render import (  # noqa: F401 - re-exported: the papers import them from here
    fmt, mean_std, group_records, pick, acc_pm, machine_string, savefig, new_axes, curve, plot_learning_curves,
)

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
BACKENDS = ("inprocess", "ray", "flower")
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
        return _with_node_eval(doc, run_dir)
    from .node_eval import NODE_EVAL_NAME

    (run_dir / NODE_EVAL_NAME).unlink(missing_ok=True)  # made again when this run finishes
    if backend == "ray" and spec.node_eval:
        raise ValueError(f"run {spec.run_id!r} asks for node_eval, which the inprocess backend alone computes; "
                         "got backend 'ray': run it with --backend inprocess")
    if backend == "flower":
        if spec.node_eval:
            raise ValueError(f"run {spec.run_id!r} asks for node_eval, which the inprocess backend alone computes; "
                             "got backend 'flower': run it with --backend inprocess")
        from ..experiments.flower_backend import run_flower_experiment

        run_flower_experiment(cfg, out_dir=run_dir)
    else:
        from ..errors import CheckpointError

        where = "ray" if backend == "ray" else "inprocess"  # the Ray cluster: RAY_ADDRESS (reproduce's ray_address)
        resume = (run_dir / rio.CHECKPOINT_NAME).is_file() and same
        try:
            result = run_experiment(cfg, out_dir=run_dir, resume=resume, progress=True, backend=where)
        except CheckpointError as err:  # unreadable (older format, corrupted): this run starts again, the rest stand
            if not resume:
                raise
            print(f"flower-dp: {spec.run_id}: its checkpoint cannot be resumed ({err}); running it from the start",
                  file=sys.stderr)
            (run_dir / rio.CHECKPOINT_NAME).unlink(missing_ok=True)
            result = run_experiment(cfg, out_dir=run_dir, resume=False, progress=True, backend=where)
        if spec.node_eval and result.status in _DONE:
            from .node_eval import node_eval_record

            rio.write_json(run_dir / NODE_EVAL_NAME, node_eval_record(cfg, result.nodes))
    doc = rio.read_json(run_dir / "results.json")
    if doc is None:
        raise RuntimeError(f"run {spec.run_id!r} wrote no results.json in {str(run_dir)!r}")
    return _with_node_eval(doc, run_dir)


def _with_node_eval(doc: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The results document with the run's per-node evaluation (``node_eval.json``, if any) in its ``extra_record``."""
    from .node_eval import NODE_EVAL_NAME

    found = rio.read_json(run_dir / NODE_EVAL_NAME)
    if found:
        doc["extra_record"] = {**doc.get("extra_record", {}), **found}
    return doc


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
    if not todo:
        log(f"estimate: 0 CPU hours: all {len(specs)} runs are finished (their records in {out / 'records.json'} or "
            f"their run folders are reused)")
        return 0.0
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
