"""Reproduce the papers' headline experiments: ``flower-dp reproduce PAPER``.

>>> from flower_dp.reproduce import reproduce
>>> rep = reproduce("dp-csgp", scale="smoke", out="runs/repro")   # doctest: +SKIP
>>> [(c.name, c.passed) for c in rep.claims]                       # doctest: +SKIP

Scales: ``smoke`` (seconds to a few minutes; tests), ``ci`` (minutes on 2 CPU cores, the
committed reports in ``docs/results/<paper>/``), ``full`` (the paper's setting; a GPU or a Ray
cluster), ``paper`` (``full`` without the ResNet/ViT runs: hours on 2 CPU cores, ``--jobs 2``; the
reports in ``docs/results/<paper>-<table>-paper/``).  Output in ``out``: ``records.json``/``records.csv`` (one record per run),
``summary.csv`` (seeds grouped), PNG plots and ``report.md``; each run's own results folder is
under ``out/runs/`` and a finished run is never re-run, so an interrupted sweep resumes.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import math
import os
import re
import shlex
import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import numpy as np

from .. import results as rio
from ..errors import ConfigError
from .core import (BACKENDS, DISCRIMINATION_FACTOR, SCALES, Claim, Paper, RunSpec, cpu_feasible, estimate_cpu_hours,
                   fmt, group_records, machine_string, plot_learning_curves, run_sweep, seed_values, settings_scale)

__all__ = ["PAPERS", "reproduce", "rerender", "get_paper", "Reproduction", "RunSpec", "Claim", "SCALES", "BACKENDS"]

#: paper name -> module under flower_dp.reproduce.papers
PAPERS: dict[str, str] = {
    "dyn-d2p": "dyn_d2p",
    "privsgp-vr": "privsgp_vr",
    "dp-csgp": "dp_csgp",
    "partpsp": "partpsp",
    "gau-lrq": "gau_lrq",
}


def get_paper(name: str) -> Paper:
    """The :class:`Paper` named ``name`` (one of :data:`PAPERS`)."""
    if name not in PAPERS:
        raise ConfigError(f"unknown paper {name!r}; valid choices are {sorted(PAPERS)}")
    return importlib.import_module(f"flower_dp.reproduce.papers.{PAPERS[name]}").PAPER


@dataclass
class Reproduction:
    """What :func:`reproduce` returns."""

    paper: str
    table: str
    scale: str
    records: list[dict[str, Any]]
    claims: list[Claim]
    report_path: Path
    wall_time_s: float


def _finite_sum(values) -> float:
    """Sum of the numbers that are there (a reused run without its CPU record counts as missing, not 0 or NaN)."""
    return float(sum(v for v in values if isinstance(v, (int, float)) and math.isfinite(v)))


def _check(value: Any, valid: tuple | list | dict, what: str) -> None:
    if value not in valid:
        raise ConfigError(f"unknown {what} {value!r}; valid choices are {sorted(valid)}")


def reproduce(
    paper: str,
    *,
    table: str | None = None,
    scale: str = "ci",
    backend: str = "inprocess",
    out: str | Path | None = None,
    seeds: int | None = None,
    command: str | None = None,
    log=print,
    reproducible: bool = False,
    jobs: int = 1,
    estimate: bool | None = None,
    device: str | None = None,
    runs: Sequence[str] | None = None,
    ray_address: str | None = None,
) -> Reproduction | None:
    """Run (or resume) a paper's headline experiment and write its records, plots and report.

    Parameters
    ----------
    paper : one of :data:`PAPERS`
    table : which table/figure of the paper (default: the paper's headline one; see ``tables``)
    scale : "smoke" | "ci" | "full" | "paper" (``full``'s setting, the paper's own, without the ResNet/ViT runs:
        what 2 CPU cores can run to the end; paper modules may keep a subset of the grid, see
        :attr:`~flower_dp.reproduce.core.Paper.paper_scale`)
    backend : "inprocess" (the reference runner) | "ray" (the push-sum nodes on Ray host actors, same numbers) |
        "flower" (Flower simulation on Ray, same numbers)
    ray_address : "HEAD:PORT" or "auto" of a running Ray cluster the "ray" and "flower" runs join (set as
        ``RAY_ADDRESS`` for the sweep; default: ``RAY_ADDRESS``, else a Ray of each run's own on 127.0.0.1)
    out : output folder (default ``runs/reproduce/<paper>-<table>-<scale>``)
    seeds : number of seeds (default: the paper's default for the scale; the papers averaged 5 runs)
    reproducible : False (default): privacy noise and private sampling come from each node's own secret
        (Gau-LRQ: a fresh master secret and nonce), as in a real deployment, so the reported eps holds against
        everyone who reads the results.  True: the seeded simulation mode (the same numbers on every run
        and backend; the guarantee holds only against parties that do not know the seed); the report says so.
    jobs : runs at once, each in its own process with one torch thread (use one per core)
    estimate : print the CPU hours of the unfinished runs, measured on one segment, before the sweep (default:
        at the ``full`` and ``paper`` scales); ``"only"``: print it and return None without running.  The probe
        runs on the CPU whatever ``device``.
    device : where the push-sum runs compute: "cpu", "cuda", "cuda:N" or "auto" (a GPU when one is visible).
        None (default): the configs' device, the CPU.  Not part of a run's identity: finished runs are reused
        whatever device made them, and each record names its device.  GPU nodes draw their noise on the GPU
        (``torch-cuda-float64``), so a GPU run's numbers differ from a CPU run's.  Gau-LRQ runs stay on the CPU.
    runs : run-id patterns (``fnmatch``, e.g. ``"table2-dyn_c-*-s1"``): only the table's runs that match one of them
        (None: all).  A way to split one sweep over machines: each runs its share into its own --out, then the
        ``runs/<run_id>/`` folders are copied into one --out, where the full sweep reuses every finished run.
    """
    p = get_paper(paper)
    table = table or p.default_table
    _check(table, p.tables, f"table for {paper} (valid: {p.tables})")
    _check(scale, SCALES, "scale")
    _check(backend, BACKENDS, "backend")
    if ray_address is not None:
        if backend == "inprocess":
            raise ConfigError(f"ray_address={ray_address!r} is for --backend ray or flower, got --backend inprocess; "
                              "pass --backend ray or drop --ray-address")
        from ..gossip.ray_backend import check_ray_address

        check_ray_address(ray_address)
    if backend != "inprocess" and jobs > 1:
        raise ConfigError(f"--jobs {jobs} with --backend {backend}: the runs share the Ray cluster's CPUs, one at a "
                          "time; pass --jobs 1 (each run spreads its nodes over the cluster itself)")
    if device is not None and not (device in ("cpu", "cuda", "auto") or re.fullmatch(r"cuda:\d+", str(device))):
        raise ConfigError(f"unknown device {device!r}; valid: 'cpu', 'cuda', 'cuda:N', 'auto' (pass --device cuda on a "
                          "GPU machine, or leave it out for the CPU)")
    n_seeds = p.default_seeds.get(scale, 2 if scale == "paper" else 1) if seeds is None else int(seeds)
    if n_seeds < 1:
        raise ConfigError(f"seeds must be >= 1, got {seeds!r}; pass --seeds 1 or more")
    # One torch thread per run unless FLOWER_DP_THREADS says otherwise: measured here, two OpenMP threads on a
    # busy 2-core machine made a DP-CSGP iteration 9x slower than one thread (spin-waiting threads).
    os.environ.setdefault("FLOWER_DP_THREADS", "1")
    out_path = Path(out) if out is not None else Path("runs") / "reproduce" / f"{paper}-{table}-{scale}"
    out_path = rio.ensure_writable_dir(out_path)
    specs = [_with_noise_mode(s, reproducible) for s in build_specs(p, scale, table, n_seeds)]
    if runs is not None:
        specs = select_runs(specs, runs)
    cmd = command or ("flower-dp reproduce " + " ".join(shlex.quote(a) for a in sys.argv[2:])
                      if sys.argv and sys.argv[0].endswith("flower-dp") else
                      f"flower-dp reproduce {paper} --table {table} --scale {scale} --backend {backend} "
                      f"--seeds {n_seeds} --out {out_path}" + (" --reproducible" if reproducible else "")
                      + (f" --jobs {jobs}" if jobs > 1 else "") + (f" --device {device}" if device else "")
                      + (f" --runs {shlex.quote(','.join(runs))}" if runs is not None else ""))
    meta = {"threads": int(os.environ["FLOWER_DP_THREADS"]), "paper": paper, "title": p.title, "table": table, "scale": scale, "backend": backend,
            "seeds": n_seeds, "command": cmd, "machine": machine_string(), "versions": rio.versions(),
            "noise": "reproducible" if reproducible else "secret", "device": device or "cpu"}
    log(f"reproduce {paper} ({p.tables[table]}), scale {scale}, backend {backend}, {len(specs)} runs "
        f"({n_seeds} seed(s)) -> {out_path}")
    if estimate or (estimate is None and scale in ("full", "paper")):
        hours = estimate_cpu_hours(p, specs, out_path, log=log)
        if hours is not None and jobs > 1:
            log(f"estimate: about {hours / min(jobs, len(specs)):.1f} h of wall time with --jobs {jobs}")
        if estimate == "only":
            return None
    t0 = time.perf_counter()
    with _ray_address_for_sweep(ray_address):
        records = run_sweep(p, specs, out_path, backend=backend, meta=meta, log=log, jobs=jobs, device=device)
    wall = time.perf_counter() - t0
    return _finish(p, meta, records, out_path, wall, log)


@contextlib.contextmanager
def _ray_address_for_sweep(ray_address: str | None) -> Iterator[None]:
    """``RAY_ADDRESS`` set to ``ray_address`` while the sweep runs (every run and its worker processes join that
    cluster), and restored after it, so a later Ray start in this process does not look for a cluster that is gone."""
    if ray_address is None:
        yield
        return
    before = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = ray_address
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = before


def select_runs(specs: list[RunSpec], patterns: Sequence[str]) -> list[RunSpec]:
    """The specs whose run id matches one of ``patterns`` (``fnmatch``), in the table's order; a pattern that matches
    no run is a :class:`ConfigError` naming it and the valid ids."""
    pats = [str(x).strip() for x in patterns if str(x).strip()]
    if not pats:
        raise ConfigError(f"runs must name at least one run id or pattern, got {list(patterns)!r} (valid: run ids of the "
                          "table, or fnmatch patterns of them); pass e.g. --runs 'table2-dyn-*', or leave --runs out "
                          "for every run")
    ids = [s.run_id for s in specs]
    unmatched = [x for x in pats if not any(fnmatch.fnmatchcase(i, x) for i in ids)]
    if unmatched:
        raise ConfigError(f"run pattern(s) {unmatched} match no run of this table; valid run ids: {ids}")
    return [s for s in specs if any(fnmatch.fnmatchcase(s.run_id, x) for x in pats)]


def build_specs(p: Paper, scale: str, table: str, n_seeds: int) -> list[RunSpec]:
    """The runs of ``table`` at ``scale``: ``paper`` is ``full``'s grid without GPU models, as the paper keeps it."""
    specs = p.build_runs(settings_scale(scale), table, list(range(n_seeds)))
    if scale != "paper":
        return specs
    kept = [s for s in specs if cpu_feasible(s) and (p.paper_scale is None or p.paper_scale(table, s))]
    if not kept:
        raise ConfigError(f"{p.name} {table!r} has no run that fits --scale paper (its models are ResNet/ViT, "
                          f"GPU only); run it with --scale full on a GPU machine or a Ray cluster")
    return kept


def _with_noise_mode(spec: RunSpec, reproducible: bool) -> RunSpec:
    """``spec`` with the noise mode set: ``[run] reproducible`` of a push-sum config; ``reproducible=True`` in
    the keyword arguments of a paper runner (absent = secret, so earlier secret-keyed runs stay reusable)."""
    cfg = dict(spec.config)
    if spec.kind == "pushsum":
        cfg["run"] = {**cfg.get("run", {}), "reproducible": bool(reproducible)}
    elif reproducible:
        cfg["reproducible"] = True
    else:
        cfg.pop("reproducible", None)
    return dataclasses.replace(spec, config=cfg)


def noise_label(meta: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The report's line on where the privacy noise came from (seeded noise is labelled so)."""
    modes = {str(r.get("noise_mode") or "reproducible") for r in records} or {str(meta.get("noise", "reproducible"))}
    if modes == {"secret"}:
        return ("Noise: **secret** - privacy noise and private sampling were drawn from per-node secrets (OS "
                "entropy) that never left the nodes; the seed keyed only public randomness.")
    return ("Noise: **reproducible (seeded simulation mode)** - privacy noise and private sampling were drawn from "
            "streams keyed by the published seed" + (" in some runs" if "secret" in modes else "") + ": the eps "
            "below holds only against parties that do not know the seed (`--reproducible`; runs recorded before "
            "secret noise are labelled seeded).")


def device_label(records: list[dict[str, Any]]) -> str | None:
    """The report's line on where the runs computed and which Gaussian sampler drew their noise, when the records
    come from more than one device (a sweep shared with a GPU: ``--runs``, ``scripts/deadline_share.py``), or None.
    A run's device is not part of its identity; its noise sampler differs by device (numpy float64 on the CPU,
    torch float64 on CUDA), so seeds of one cell drawn on different devices are different noise, not a repeat."""
    by_device: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_device.setdefault(str(r.get("device") or "cpu").split(":")[0], []).append(r)
    if len(by_device) < 2:
        return None
    parts = []
    for dev, rs in sorted(by_device.items(), key=lambda kv: -len(kv[1])):
        samplers = sorted({str(r["gaussian_sampler"]) for r in rs if r.get("gaussian_sampler")})
        wall = sorted(float(r["wall_time_s"]) for r in rs if math.isfinite(float(r.get("wall_time_s", float("nan")))))
        parts.append(f"{len(rs)} on `{dev}`" + (f" (noise sampler {', '.join(f'`{x}`' for x in samplers)})" if samplers else "")
                     + (f", median {wall[len(wall) // 2] / 60:.1f} min of wall time per run" if wall else ""))
    return ("Devices: the runs computed on more than one device - " + "; ".join(parts) + ". Where a run computes is "
            "not part of its identity (same config, same calibration and rigorous eps); the `device` column of "
            "records.csv names each run's.")


def sampler_label(records: list[dict[str, Any]]) -> str | None:
    """The report's warning for push-sum runs whose Gaussian noise came from torch's float32 sampler (cut at 5.77
    std: their eps_rigorous is an ideal Gaussian's, not proven for the noise drawn), or None."""
    from .core import drew_float32_noise

    def private(r: dict[str, Any]) -> bool:
        if drew_float32_noise(r):
            return True
        try:
            return math.isfinite(float(r.get("eps_rigorous")))
        except (TypeError, ValueError):
            return False

    cut = [r for r in records if drew_float32_noise(r)]
    if not cut:
        return None
    return (f"**Privacy caveat: {len(cut)} of the {sum(map(private, records))} private runs drew their Gaussian noise with torch's float32 "
            "sampler** (before commit 4575d7e), whose draws stop at 5.77 std and whose tail is coarse beyond ~4.4 "
            "std: their eps is the eps of an ideal Gaussian at the run's noise levels, not a proven bound for the "
            "noise drawn (an uncharged delta; docs/privacy.md, \"The Gaussian samplers\"), so it is reported as `eps_heuristic`, "
            "not `eps_rigorous`. Re-running them with the float64 sampler (the same command: a sweep does not reuse "
            "such a record) makes it proven; the accuracies do not depend on it.")


def rerender(
    out: str | Path,
    *,
    paper: str | None = None,
    transform: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    log=print,
) -> Reproduction:
    """Re-render a finished reproduction from its ``out/records.json`` alone: no run is repeated, ``out/runs/``
    is not needed (it is git-ignored, so the committed ``docs/results/*/records.json`` are the only inputs).

    Rewrites ``records.json``/``records.csv`` (records carried to today's names by
    :func:`flower_dp.reproduce.core.migrate_record`, their history kept to the public columns as
    :func:`~flower_dp.reproduce.core.record_from_doc` does, then ``transform``), ``summary.csv``, ``claims.json``,
    the plots and ``report.md``.  The paper, table, scale, command, machine and versions come from the
    stored meta (``paper``, when given, must match it).  ``transform(records) -> records`` is the hook for re-accounting finished runs without
    retraining (e.g. new ``eps_rigorous`` for a noise schedule the runs recorded): it gets the migrated
    records (each with ``labels``, ``history`` and, for the duration of the call, ``config``: the run's
    config rebuilt from the paper's specs by ``run_id``, not stored) and returns the ones to render.

    CLI: ``flower-dp reproduce PAPER --rerender --out DIR`` (or ``all --rerender --out docs/results``).

    >>> rerender("docs/results/partpsp")  # doctest: +SKIP
    """
    from .core import _write_records, migrate_record, unproven_sampler, with_sampler

    out_path = Path(out)
    doc = rio.read_json(out_path / "records.json")
    if not doc or "records" not in doc:
        raise ConfigError(f"no records.json in {str(out_path)!r}; nothing to re-render (run the reproduction first)")
    old = rio.read_json(out_path / "claims.json") or {}
    meta = {**doc.get("meta", {}), **old.get("meta", {})}
    for key in ("paper", "table", "scale"):
        if key not in meta:
            raise ConfigError(f"{str(out_path / 'records.json')!r} has no meta.{key}; cannot tell which report to render")
    if paper is not None and meta["paper"] != paper:
        raise ConfigError(f"{str(out_path)!r} holds a {meta['paper']!r} reproduction, not {paper!r}")
    p = get_paper(meta["paper"])
    try:  # the configs the runs were made from (records do not store them): the paper's specs, rebuilt
        specs = build_specs(p, meta["scale"], meta["table"], int(meta.get("seeds", 1)))
        configs = {sp.run_id: sp.config for sp in specs}
        kinds = {sp.run_id: sp.kind for sp in specs}
    except (ValueError, ConfigError):
        configs, kinds = {}, {}
    records = [migrate_record(_revive(r), configs.get(r.get("run_id"))) for r in doc["records"]]
    # recorded before results named their sampler: push-sum noise was torch's float32, so its eps is heuristic
    records = [unproven_sampler(with_sampler(r, kinds.get(r.get("run_id")))) for r in records]
    from ..releases import public_history_row

    for r in records:  # as record_from_doc does: uncharged statistics stay out of a record that did not opt in
        if not r.get("uncharged_statistics_released") and r.get("history"):
            r["history"] = [public_history_row(h) for h in r["history"]]
    if transform is not None:  # it sees each run's config (rebuilt from the paper's specs) under "config"
        stored = {r.get("run_id") for r in records if "config" in r}
        for r in records:
            if r.get("run_id") not in stored and r.get("run_id") in configs:
                r["config"] = configs[r["run_id"]]
        records = list(transform(records))
        for r in records:
            if r.get("run_id") not in stored:
                r.pop("config", None)
    meta.update(sweep_wall_time_s=0.0, rerendered=True)
    _write_records(out_path, records, {k: v for k, v in meta.items()
                                       if k not in ("sweep_wall_time_s", "compute_time_s", "cpu_time_s")})
    log(f"re-render {meta['paper']} ({meta['table']}, scale {meta['scale']}) from {out_path / 'records.json'}: "
        f"{len(records)} records, no run repeated")
    return _finish(p, meta, records, out_path, 0.0, log)


def _revive(obj: Any) -> Any:
    """JSON as :func:`flower_dp.results.jsonable` wrote it, with ``"inf"``/``"-inf"``/``"nan"`` floats again."""
    if isinstance(obj, dict):
        return {k: _revive(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_revive(v) for v in obj]
    if isinstance(obj, str) and obj in ("inf", "-inf", "nan"):
        return float(obj)
    return obj


def stale_records(p: Paper, meta: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """Run ids of the records made from another config than the one the table builds today for them (their
    ``config_sha`` differs; records without one, from before it existed, are not judged)."""
    from .core import config_sha

    try:
        specs = build_specs(p, meta["scale"], meta["table"], int(meta.get("seeds", 1)))
    except (ValueError, ConfigError):
        return []
    want = {s.run_id: config_sha(_with_noise_mode(s, meta.get("noise") == "reproducible").config) for s in specs}
    return [r["run_id"] for r in records
            if r.get("config_sha") and r.get("run_id") in want and r["config_sha"] != want[r["run_id"]]]


def missing_runs(p: Paper, meta: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """The run ids the table builds today (at the stored scale and seeds) that have no record, in build order
    (none when a record has no ``run_id``: then which runs it stands for is unknown)."""
    if any("run_id" not in r for r in records):
        return []
    try:
        specs = build_specs(p, meta["scale"], meta["table"], int(meta.get("seeds", 1)))
    except (ValueError, ConfigError):
        return []
    have = {r.get("run_id") for r in records}
    return [s.run_id for s in specs if s.run_id not in have]


def _finish(p: Paper, meta: dict[str, Any], records: list[dict[str, Any]], out_path: Path, wall: float,
            log) -> Reproduction:
    """Claims, tables, plots, summary.csv, claims.json and report.md of finished records."""
    table, scale = meta["table"], settings_scale(meta["scale"])
    claims = p.check_claims(records, table, scale)
    tables_md, plots = p.render(records, table, scale, out_path)
    curves = plot_learning_curves(records, out_path)  # accuracy and loss vs iteration, for every reproduction
    if curves and curves not in plots:
        plots = [*plots, curves]
    summary = [{k: v for k, v in g.items() if k != "records"} for g in group_records(records)]
    rio.write_csv(out_path / "summary.csv", summary)
    meta["sweep_wall_time_s"] = wall
    meta["compute_time_s"] = _finite_sum(r.get("wall_time_s") for r in records)
    meta["cpu_time_s"] = _finite_sum(r.get("cpu_time_s") for r in records)
    rio.write_json(out_path / "claims.json", {"meta": meta, "claims": [
        {"name": c.name, "passed": c.passed, "detail": c.detail, "discriminates": c.discriminates(),
         "discrimination": c.discrimination(), **({"category": c.category} if hasattr(c, "category") else {})}
        for c in claims]})
    report = _report_md(p, meta, records, claims, tables_md, plots)
    rio.atomic_write_bytes(out_path / "report.md", report.encode())
    for c in claims:
        state = {True: "PASS", False: "FAIL", None: "n/a"}[c.passed]
        log(f"  [{state}] {c.name}: {c.detail}")
    log(f"report: {out_path / 'report.md'}")
    return Reproduction(meta["paper"], table, scale, records, claims, out_path / "report.md", wall)


def table_spread(records: list[dict[str, Any]]) -> str | None:
    """The report's line on how far the table's cells (records grouped over seeds) differ at all: the range of their
    mean final accuracies against the largest seed std of a cell; None for fewer than two cells."""
    whole = Claim("all cells", None, "", cells=tuple((str(i), seed_values(g)) for i, g in
                                                     enumerate(group_records(records))))
    means = [float(np.mean(v)) for _, v in whole.cells if v]
    if len(means) < 2:
        return None
    return (f"Across the {len(means)} cells of this table (seeds grouped), the mean final accuracy spans "
            f"{fmt(min(means))} to {fmt(max(means))}; discriminates? {whole.discrimination()}.")


#: whom a report's ``eps rigorous`` protects against (:mod:`flower_dp.privacy.parties`), by family
PARTY_SENTENCE = {
    "push_sum": "It is stated for an **out-neighbour** (party `out_neighbour`: it receives every share a node sends), "
                "and bounds an observer of the network-average model too; `records.json` has every party "
                "(`eps_by_party`) for runs that recorded it (docs/privacy.md, \"Threat model\").",
    "gau_lrq": "It is stated for the **model observer** (party `model_observer`: the released global models only); "
               "the section \"Privacy per party\" gives the others (docs/privacy.md, \"Threat model\").",
}


def _report_md(p: Paper, meta: dict[str, Any], records, claims, tables_md: list[str], plots: list[str]) -> str:
    datasets = sorted({str(r.get("dataset")) for r in records})
    synthetic = any(r.get("synthetic_data") for r in records)
    compute = meta["compute_time_s"]
    lines = [
        f"# {p.title} — reproduction ({meta['table']}: {p.tables[meta['table']]})",
        "",
        f"Scale **{meta['scale']}**, backend **{meta['backend']}**, {meta['seeds']} seed(s), "
        f"{len(records)} runs, dataset(s): {', '.join(datasets)}"
        + (" (**synthetic stand-in**)" if synthetic else "") + ".",
        "",
        "Command (resumes: finished runs are reused, an interrupted one continues from its checkpoint):",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"Time: the runs took {compute / 60:.1f} min of wall time and {meta['cpu_time_s'] / 60:.1f} min of CPU time "
        f"in the driver process (sum over runs; this invocation: {meta['sweep_wall_time_s'] / 60:.1f} min, "
        f"finished runs are reused; {meta['threads']} torch thread(s) per run). Machine: {meta['machine']}. "
        f"Versions: torch {meta['versions'].get('torch')}, flwr {meta['versions'].get('flwr')}, "
        f"dp-accounting {meta['versions'].get('dp-accounting')}.",
        "",
        "Accuracy is the test accuracy of the final network-average model (federated: the global model). "
        "`eps rigorous` is the PLD/RDP eps (dp-accounting) of the noise actually added, max over nodes; "
        "`eps paper` is what the paper's own formula claims for the same run. "
        + (PARTY_SENTENCE["gau_lrq"] if meta.get("paper") == "gau-lrq" else PARTY_SENTENCE["push_sum"]),
        "",
        noise_label(meta, records),
        "",
        *([caveat, ""] if (caveat := sampler_label(records)) else []),
        *([where, ""] if (where := device_label(records)) else []),
    ]
    missing = missing_runs(p, meta, records)
    if missing:
        lines += [f"**Incomplete: {len(missing)} of the {len(missing) + len(records)} runs of this table have no "
                  f"record** ({', '.join(missing)}): their cells are left out of every table and claim below, not "
                  "filled; the command above runs them (finished runs are reused).", ""]
    stale = stale_records(p, meta, records)
    if stale:
        lines += [f"**Stale records: {len(stale)} of the {len(records)} runs were made from another config than this "
                  f"table builds today** ({', '.join(stale)}): their numbers are shown as they are; the command above "
                  "runs them again (and only them).", ""]
    from .core import drew_float32_noise

    unproven = [r for r in records if r.get("eps_heuristic") is not None and not drew_float32_noise(r)]  # the caveat has those
    notes = sorted({str(r["privacy_note"]) for r in unproven if r.get("privacy_note")})
    if unproven:
        lines += ["**No rigorous eps for the mechanisms without a DP proof** (DPPS family, BQ-SGD): their records carry "
                  "`eps_rigorous` = null and `eps_heuristic`, what the accountant computes for noise whose calibration "
                  "has no proof (" + "; ".join(notes or ["heuristic, no DP proof"]) + "). It is not a privacy guarantee.",
                  ""]
    if meta.get("rerendered"):
        lines += ["Re-rendered from `records.json` (`flower-dp reproduce PAPER --rerender`): no run was repeated.", ""]
    from .reaccount import reaccounted_line

    if (moved := reaccounted_line(records)) is not None:
        lines += [moved, ""]
    lines += tables_md
    tested = any(hasattr(c, "category") for c in claims)
    lines += ["", "## Claims", ""]
    if tested:  # claims decided by a test over the seeds (flower_dp.reproduce.stats)
        lines += ["Each claim is a test over the seeds (the table's header says which); its last column names the "
                  "category the index's scoreboard counts: substantive pass / fail (the interval decides), not "
                  "discriminating (it cannot tell), by construction (true by the calibration or by arithmetic), "
                  "regime (the noise-free twin's check of the setting), incomplete (too few seeds so far).", "",
                  "| claim | verdict | our numbers | test |", "|---|---|---|---|"]
    lines += [] if tested else [
              f"Discriminates? A claim comparing cells discriminates when the range of the cells' means exceeds "
              f"{DISCRIMINATION_FACTOR:g} x the largest seed std of a cell (the quantity the claim compares); one that "
              "holds while its cells are equal within that spread is \"holds, not discriminating\" (the index counts "
              "it apart). One seed: no spread, so not told.", "",
              "| claim | verdict | our numbers | discriminates? |", "|---|---|---|---|"]
    for c in claims:
        lines.append(f"| {c.name} | {c.verdict()} | {c.detail} | {c.discrimination()} |")
    spread = table_spread(records)
    if spread:
        lines += ["", spread]
    lines += ["", "## Why our numbers differ from the paper's", ""]
    lines += [f"- {d}" for d in p.differences(meta["table"], settings_scale(meta["scale"]))]
    if p.findings is not None:
        lines += [f"- {d}" for d in p.findings(records, meta["table"], settings_scale(meta["scale"]))]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({name})" for name in plots]
    lines += ["", "Files: `records.json` / `records.csv` (one record per run, with its history), `summary.csv` "
              "(seeds grouped), `runs/<run_id>/results.json` (each run's full results).", ""]
    return "\n".join(lines)
