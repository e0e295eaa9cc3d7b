"""flower-dp benchmark suite: ``python -m benchmarks [--quick] [--out FILE]`` or ``flower-dp bench``.

Each headline figure is a ratio against a yardstick measured in the same run (side by side
where possible), plus the absolute numbers, the machine, thread counts and versions.  On a
shared machine absolute times are noisy; the ratios are what to compare.

| key | figure | yardstick |
|---|---|---|
| ``private_step_ratio_{cnn,mlp}_b{32,64}`` | DP step with the fast (ghost) clipping path | non-private step |
| ``private_step_ratio_{cnn,mlp}_b{32,64}_opacus_{hooks,ghost,functorch}`` | Opacus' DP step, each mode (null without Opacus) | non-private step, interleaved with ours |
| ``private_step_median_ratio_{cnn,mlp}_b{32,64}_prefetch`` | the same, noise drawn ahead on a second thread (``run.prefetch_noise``), blocks of consecutive steps | non-private steps, same blocks |
| ``private_step_median_ours_over_opacus_best_{cnn,mlp}_b{32,64}`` | our DP step, by the median (goal <= 0.6) | Opacus' best mode, same loop |
| ``exact_noise_samples_per_s`` | exact discrete Gaussian samples/s per core, by sigma (grid units; goal >= 20 M) | ``float_noise_samples_per_s`` (numpy's ziggurat), ``opendp_noise_samples_per_s`` |
| ``private_step_ratio_{cnn,mlp}_b64_exact`` | the exact-mode DP step (``noise_sampler="exact"``) | non-private step; ``..._float_beside_exact``: the float mode's, same loop |
| ``engine_overhead_ratio`` | segment under Flower on Ray, n = 16 CNN Dyn-D2P, one epoch | in-process segment |
| ``accounting_seconds_3000`` | rigorous (PLD) eps of a 3,000-step dynamic schedule | (seconds) |
| ``accounting_eps_rel_diff`` | bucketed eps | unbucketed eps |
| ``accounting_seconds_30000`` | rigorous eps of a 30,000-step schedule, 30,000 distinct levels | (seconds, cold, min of 3) |
| ``accounting_eps_rel_diff_30000`` | its bucketed eps | a lower bound of its unbucketed eps (levels rounded up) |
| ``lrq_codec_ratio`` | LRQ encode + decode of 1e7 coordinates | drawing the same randoms |
| ``lrq_codec_cpu_ratio`` | the same by each call's thread CPU time (steadier on a loaded machine) | the draws' CPU time |
| ``wire_ratio`` | bytes Flower ships for a Gau-LRQ round's uploads (real mod) | algorithmic bits / 8 |
| ``max_nodes_inprocess_mlp`` / ``max_nodes_flower_cnn`` | largest n run (scale): MLP nodes in-process / CNN Flower SuperNodes | |
| ``scale_mlp_{inprocess,ray}_throughput_ratio_1024_vs_64`` | node-iterations/s at n = 1,024 (in-process / 2 Ray host actors) | the same at n = 64 |
| ``scale_mlp_inprocess_rss_gb_1024``, ``scale_mlp_ray_rss_gb_1024``, ``scale_cnn_flower_rss_gb_64`` | peak RSS (GiB): the process / the summed Ray workers | |
| ``raylets_throughput_ratio`` | host-actor node-iterations/s on 2 raylets (``ray.cluster_utils.Cluster``) | the same on 1 raylet |
| ``max_nodes_two_raylets_mlp``, ``scale_mlp_two_raylets_*`` | largest MLP network on 2 host actors on 2 raylets (``ray start``, :mod:`benchmarks.ray_scale`); its RSS, MiB/node, node-iterations/s by n | the in-process engine at the same n (``..._inprocess_*``, ``..._throughput_ratio_vs_inprocess``) |

``private_step_median_ratio_*``, ``engine_overhead_median_ratio``, ``lrq_codec_median_ratio``,
``lrq_codec_cpu_median_ratio`` and ``raylets_median_throughput_ratio`` are the same ratios by the median
over repeats (the others: minimum).

A benchmark whose code under test does not exist yet reports ``null`` with a ``missing`` note.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

__all__ = ["BENCHMARKS", "REQUIRED_KEYS", "run_suite", "format_table", "main"]

#: Benchmarks in run order.
BENCHMARKS = ("private_step", "engine_overhead", "accounting", "lrq_codec", "wire", "scale", "raylets", "exact_noise",
              "ray_scale")

#: Opacus ``grad_sample_mode`` values timed beside our private step (benchmarks.private_step.OPACUS_MODES).
OPACUS_MODES = ("hooks", "ghost", "functorch")
PRIVATE_STEP_CASES = tuple(f"{m}_b{b}" for m in ("cnn", "mlp") for b in (32, 64))

REQUIRED_KEYS = (
    "private_step_ratio_cnn_b64",
    "private_step_ratio_mlp_b64",
    "engine_overhead_ratio",
    "accounting_seconds_3000",
    "accounting_eps_rel_diff",
    "accounting_seconds_30000",
    "accounting_eps_rel_diff_30000",
    "engine_overhead_median_ratio",
    "lrq_codec_ratio",
    "lrq_codec_median_ratio",
    "lrq_codec_cpu_ratio",
    "lrq_codec_cpu_median_ratio",
    "wire_ratio",
    "max_nodes_flower_cnn",
    "max_nodes_inprocess_mlp",
    *(f"private_step_ratio_{c}_opacus_{mode}" for c in PRIVATE_STEP_CASES for mode in OPACUS_MODES),
    *(f"private_step_median_ours_over_opacus_best_{c}" for c in PRIVATE_STEP_CASES),
    "scale_mlp_inprocess_throughput_ratio_1024_vs_64",
    "scale_mlp_ray_throughput_ratio_1024_vs_64",
    "scale_mlp_inprocess_rss_gb_1024",
    "scale_mlp_ray_rss_gb_1024",
    "scale_cnn_flower_rss_gb_64",
    "raylets_throughput_ratio",
    "machine",
    "versions",
)


def _get(d, *path):
    for p in path:
        if not isinstance(d, dict) or d.get(p) is None:
            return None
        d = d[p]
    return d


def _run_one(name: str, quick: bool, skip_ray: bool) -> dict:
    from . import accounting, engine, exact_noise, lrq_codec, private_step, ray_scale, raylets

    fns = {
        "private_step": lambda: private_step.run(quick),
        "engine_overhead": lambda: engine.run_overhead(quick, skip_ray=skip_ray),
        "accounting": lambda: accounting.run(quick),
        "lrq_codec": lambda: lrq_codec.run_codec(quick),
        "wire": lambda: lrq_codec.run_wire(quick),
        "scale": lambda: engine.run_scale(quick, skip_ray=skip_ray),
        "raylets": lambda: raylets.run(quick, skip_ray=skip_ray),
        "exact_noise": lambda: exact_noise.run(quick),
        "ray_scale": lambda: ray_scale.run(quick, skip_ray=skip_ray, budget_s=900),
    }
    t0 = time.perf_counter()
    try:
        out = fns[name]()
    except Exception as exc:  # noqa: BLE001 -- one failing benchmark must not lose the others
        out = {"value": None, "note": f"failed: {type(exc).__name__}: {exc}"}
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def run_suite(*, quick: bool = False, only: tuple[str, ...] | None = None, skip_ray: bool = False,
              threads: int = 1, log=print) -> dict:
    """Run the benchmarks and return the result document (see the module table for its keys).

    Parameters
    ----------
    quick : bool
        Tiny sizes (smoke test, seconds); the figures are then not meaningful.
    only : tuple of str, optional
        Subset of :data:`BENCHMARKS`; the others are reported as not run.
    skip_ray : bool
        Do not start Ray (engine overhead and Ray scale become null).
    threads : int
        ``torch.set_num_threads`` for the whole run (1: stable on a shared machine).
    """
    import torch

    from . import engine
    from ._common import machine_info, versions

    torch.set_num_threads(int(threads))
    chosen = tuple(only) if only else BENCHMARKS
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; valid choices are {list(BENCHMARKS)}")
    t0 = time.perf_counter()
    try:
        load_start = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load_start = None
    details: dict = {}
    for name in BENCHMARKS:
        if name not in chosen:
            details[name] = {"value": None, "note": "not run (--only)"}
            continue
        log(f"[bench] {name} ...", file=sys.stderr) if log is print else log(f"[bench] {name} ...")
        details[name] = _run_one(name, quick, skip_ray)
    doc = {
        "private_step_ratio_cnn_b64": _get(details, "private_step", "cases", "cnn_b64", "ratio_fast"),
        "private_step_ratio_mlp_b64": _get(details, "private_step", "cases", "mlp_b64", "ratio_fast"),
        "private_step_ratio_cnn_b64_vmap": _get(details, "private_step", "cases", "cnn_b64", "ratio_vmap"),
        "private_step_ratio_mlp_b64_vmap": _get(details, "private_step", "cases", "mlp_b64", "ratio_vmap"),
        "engine_overhead_ratio": _get(details, "engine_overhead", "value"),
        "engine_overhead_median_ratio": _get(details, "engine_overhead", "median_ratio"),
        "accounting_seconds_3000": None if quick else _get(details, "accounting", "seconds_bucketed"),
        "accounting_eps_rel_diff": _get(details, "accounting", "eps_rel_diff"),
        "accounting_seconds_30000": None if quick else _get(details, "accounting", "long", "seconds"),
        "accounting_eps_rel_diff_30000": None if quick else _get(details, "accounting", "long", "eps_rel_diff"),
        "lrq_codec_ratio": _get(details, "lrq_codec", "ratio"),
        "lrq_codec_median_ratio": _get(details, "lrq_codec", "median_ratio"),
        "lrq_codec_cpu_ratio": _get(details, "lrq_codec", "cpu_ratio"),
        "lrq_codec_cpu_median_ratio": _get(details, "lrq_codec", "cpu_median_ratio"),
        "wire_ratio": _get(details, "wire", "ratio"),
        "max_nodes_flower_cnn": _get(details, "scale", "max_nodes_flower_cnn"),
        "max_nodes_inprocess_mlp": _get(details, "scale", "max_nodes_inprocess_mlp"),
        **{k: v for k, v in engine.scale_keys(details.get("scale") or {}).items()
           if k not in ("max_nodes_flower_cnn", "max_nodes_inprocess_mlp")},
        "raylets_throughput_ratio": _get(details, "raylets", "value"),
        "raylets_median_throughput_ratio": _get(details, "raylets", "median_ratio"),
        "raylets_node_iterations_per_s": {str(r): _get(details, "raylets", f"node_iterations_per_s_{r}") for r in (1, 2)},
        "machine": machine_info(),  # its load average is at the end of the run; load_avg_start below
        "load_avg_start": load_start,
        "versions": versions(),
        "threads": {"torch_intra_op": torch.get_num_threads(), "torch_inter_op": torch.get_num_interop_threads(),
                    "cpu_count": os.cpu_count()},
        "quick": bool(quick),
        "command": "python -m benchmarks" + (" --quick" if quick else "") + (" --skip-ray" if skip_ray else "")
        + (f" --only {' '.join(chosen)}" if only else ""),
        "total_wall_s": None,
        "details": details,
    }
    for case in PRIVATE_STEP_CASES:  # ours and Opacus' modes, by the minimum and by the median over repeats
        doc.setdefault(f"private_step_ratio_{case}", _get(details, "private_step", "cases", case, "ratio_fast"))
        doc[f"private_step_median_ratio_{case}"] = _get(details, "private_step", "cases", case, "median_ratio_fast")
        # run.prefetch_noise: the noise drawn on a second thread (consecutive steps of one node)
        doc[f"private_step_median_ratio_{case}_prefetch"] = _get(details, "private_step", "cases", case,
                                                                 "median_ratio_fast_prefetch")
        for mode in OPACUS_MODES:
            doc[f"private_step_ratio_{case}_opacus_{mode}"] = _get(details, "private_step", "cases", case,
                                                                    f"ratio_opacus_{mode}")
            doc[f"private_step_median_ratio_{case}_opacus_{mode}"] = _get(details, "private_step", "cases", case,
                                                                           f"median_ratio_opacus_{mode}")
        doc[f"private_step_median_ours_over_opacus_best_{case}"] = _get(details, "private_step", "cases", case,
                                                                         "median_ours_over_opacus_best")
    doc["opacus"] = _get(details, "private_step", "opacus")
    if quick:
        doc["accounting_seconds_quick"] = _get(details, "accounting", "seconds_bucketed")
    # the exact-noise mode (noise_sampler="exact"): discrete Gaussian samples/s per core by sigma (grid units), and
    # its private step over the non-private one next to the float mode's, measured in the same loop
    doc["exact_noise_samples_per_s"] = _get(details, "exact_noise", "exact")
    doc["float_noise_samples_per_s"] = _get(details, "exact_noise", "numpy_float_ziggurat", "any")
    doc["opendp_noise_samples_per_s"] = _get(details, "exact_noise", "opendp")
    for case in ("cnn", "mlp"):
        b = "b8" if quick else "b64"
        doc[f"private_step_ratio_{case}_b64_exact"] = _get(details, "exact_noise", "steps", f"{case}_{b}", "ratio_exact")
        doc[f"private_step_ratio_{case}_b64_float_beside_exact"] = _get(details, "exact_noise", "steps", f"{case}_{b}",
                                                                       "ratio_float")
    # the Ray engine on two raylets (ray start) against in-process, up to the largest MLP network that fits
    from . import ray_scale

    rs = details.get("ray_scale") or {}
    doc.update(ray_scale.latest_keys(rs) if "two_raylets" in rs else
               {k: None for k in ray_scale.latest_keys({})})
    doc["total_wall_s"] = round(time.perf_counter() - t0, 1)
    return doc


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_table(doc: dict) -> str:
    """A plain-text table of the headline figures (the JSON holds the rest)."""
    ps = _get(doc, "details", "private_step", "cases") or {}
    rows = [("figure", "value", "absolute / note")]
    for case, r in ps.items():
        rows.append((f"private step {case} fast/np", _fmt(r["ratio_fast"]),
                     f"np {r['nonprivate_ms']:.3g} ms, fast {r['dp_fast_ms']:.3g} ms, vmap {r['dp_vmap_ms']:.3g} ms "
                     f"({r['ratio_vmap']:.3g}x); median {_fmt(r.get('median_ratio_fast'))}"))
        if r.get("median_ratio_fast_prefetch") is not None:
            rows.append((f"  noise drawn ahead {case} (median)", _fmt(r["median_ratio_fast_prefetch"]),
                         f"in line, same blocks {_fmt(r.get('median_ratio_fast_chain'))}"))
        if r.get("ratio_opacus_hooks") is None:
            rows.append((f"  opacus {case}", "null", str(r.get("opacus"))))
            continue
        rows.append((f"  opacus {case} (min/median)", "", "; ".join(
            f"{mode} {_fmt(r[f'ratio_opacus_{mode}'])}/{_fmt(r[f'median_ratio_opacus_{mode}'])}" for mode in OPACUS_MODES)
            + f"; ours beside them {_fmt(r['ratio_fast_beside_opacus'])}/{_fmt(r['median_ratio_fast_beside_opacus'])}"
            + f"; ours / best ({r['opacus_best_mode']}) {_fmt(r['median_ours_over_opacus_best'])}"))
    eo = _get(doc, "details", "engine_overhead") or {}
    rows.append(("engine overhead flower/inproc", _fmt(doc["engine_overhead_ratio"]),
                 eo.get("note") or f"Flower segment {eo.get('flower_segment_s')} s (start-up {eo.get('flower_startup_s')} s), "
                 f"host actors alone {eo.get('ray_backend_segment_s')} s, in-process {eo.get('inprocess_s')} s "
                 f"(min of {len(eo.get('flower_rounds_s') or [])} interleaved; median ratio {eo.get('median_ratio')}; "
                 f"without the privacy reports {eo.get('ratio_without_privacy_reports')} / "
                 f"{eo.get('median_ratio_without_privacy_reports')})"))
    ac = _get(doc, "details", "accounting") or {}
    rows.append((f"accounting {ac.get('steps')} steps (s)", _fmt(ac.get("seconds_bucketed")), ac.get("note", "")))
    rows.append(("accounting eps rel diff", _fmt(doc["accounting_eps_rel_diff"]),
                 f"bucketed {_fmt(ac.get('ref_eps_bucketed'))} vs exact {_fmt(ac.get('ref_eps_unbucketed'))}"))
    lg = ac.get("long") or {}
    rows.append((f"accounting {lg.get('steps')} steps (s)", _fmt(lg.get("seconds")),
                 f"median {_fmt(lg.get('median_seconds'))} s; eps {_fmt(lg.get('eps'))} <= {_fmt(lg.get('lower_eps'))} "
                 f"(levels rounded up) + {_fmt(lg.get('eps_rel_diff'))} rel; PLD h vs h/2 {_fmt(lg.get('pld_discretization_rel_diff'))}"))
    lc = _get(doc, "details", "lrq_codec") or {}
    rows.append(("LRQ codec / draws", _fmt(doc["lrq_codec_ratio"]),
                 lc.get("note") or f"d={lc.get('d')}: {lc.get('encode_decode_s')} s vs {lc.get('draw_only_s')} s; "
                 f"dense worst case {lc.get('ratio_dense')}"))
    wr = _get(doc, "details", "wire") or {}
    rows.append(("LRQ wire / algorithmic", _fmt(doc["wire_ratio"]),
                 wr.get("note") if wr.get("wire_bytes") is None else
                 f"{wr.get('wire_bytes')} B vs {wr.get('algorithmic_bytes')} B ({wr.get('clients')} clients, "
                 f"{wr.get('packed_width_bits')}-bit packed)"))
    rows.append(("max nodes in-process MLP", _fmt(doc["max_nodes_inprocess_mlp"]),
                 f"node-it/s {json.dumps(doc.get('scale_mlp_inprocess_node_iterations_per_s'))}, MB/node "
                 f"{json.dumps(doc.get('scale_mlp_inprocess_mb_per_node'))}; 1024 vs 64 "
                 f"{_fmt(doc.get('scale_mlp_inprocess_throughput_ratio_1024_vs_64'))}, peak "
                 f"{_fmt(doc.get('scale_mlp_inprocess_rss_gb_1024'))} GiB"))
    rows.append(("max nodes Ray host actors MLP", _fmt(doc.get("max_nodes_ray_mlp")),
                 f"node-it/s {json.dumps(doc.get('scale_mlp_ray_node_iterations_per_s'))}, MB/node "
                 f"{json.dumps(doc.get('scale_mlp_ray_mb_per_node'))}; 1024 vs 64 "
                 f"{_fmt(doc.get('scale_mlp_ray_throughput_ratio_1024_vs_64'))}, peak "
                 f"{_fmt(doc.get('scale_mlp_ray_rss_gb_1024'))} GiB"))
    rows.append(("max nodes Flower CNN", _fmt(doc["max_nodes_flower_cnn"]),
                 f"node-it/s {json.dumps(doc.get('scale_cnn_flower_node_iterations_per_s'))}, MB/node "
                 f"{json.dumps(doc.get('scale_cnn_flower_mb_per_node'))}; peak "
                 f"{_fmt(doc.get('scale_cnn_flower_rss_gb_64'))} GiB"))
    rl = _get(doc, "details", "raylets") or {}
    rows.append(("Ray 2 raylets / 1 raylet", _fmt(doc.get("raylets_throughput_ratio")),
                 rl.get("note") or f"node-it/s {rl.get('node_iterations_per_s_2')} vs {rl.get('node_iterations_per_s_1')} "
                 f"(median ratio {rl.get('median_ratio')}); hosts on distinct Ray nodes: {rl.get('hosts_on_distinct_ray_nodes_2')}"))
    rs = _get(doc, "details", "ray_scale") or {}
    rows.append(("max nodes MLP on 2 raylets", _fmt(doc.get("max_nodes_two_raylets_mlp")),
                 rs.get("note") or f"GiB {json.dumps(doc.get('scale_mlp_two_raylets_rss_gb'))}, MiB/node "
                 f"{json.dumps(doc.get('scale_mlp_two_raylets_mb_per_node'))}, node-it/s "
                 f"{json.dumps(doc.get('scale_mlp_two_raylets_node_iterations_per_s'))} vs in-process "
                 f"{json.dumps(doc.get('scale_mlp_two_raylets_inprocess_node_iterations_per_s'))}; {rs.get('stopped')}"))
    ex = _get(doc, "details", "exact_noise") or {}
    rows.append(("exact noise samples/s by sigma", "", ex.get("note") or
                 f"exact {json.dumps(ex.get('exact'))}; numpy float {ex.get('numpy_float_ziggurat')}; "
                 f"opendp {json.dumps(ex.get('opendp'))} ({ex.get('opendp_version')})"))
    for case, r in (ex.get("steps") or {}).items():
        rows.append((f"exact private step {case}/np", _fmt(r["ratio_exact"]),
                     f"float mode {_fmt(r['ratio_float'])}; exact/float {_fmt(r['exact_over_float'])}; "
                     f"np {r['nonprivate_ms']} ms, exact {r['exact_ms']} ms (noise alone {r['exact_noise_only_ms']} ms)"))
    w = [max(len(str(r[i])) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"machine: {doc['machine']}; threads {doc['threads']}; total {doc['total_wall_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m benchmarks [--quick] [--out FILE] [--only NAME ...] [--skip-ray]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def add_arguments(parser) -> None:
    """The suite's options (shared with ``flower-dp bench``)."""
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test in well under a minute")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON document here")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=None, help="run only these benchmarks")
    parser.add_argument("--skip-ray", action="store_true", help="do not start Ray (Ray figures become null)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--scale-plot", type=Path, default=None,
                        help="draw the scale curves here (PNG), e.g. docs/benchmarks/scale.png")


def run_from_args(args) -> int:
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    doc = run_suite(quick=args.quick, only=tuple(args.only) if args.only else None, skip_ray=args.skip_ray,
                    threads=args.threads)
    print(format_table(doc))
    scale_plot = getattr(args, "scale_plot", None)
    if scale_plot is not None and isinstance(_get(doc, "details", "scale"), dict):
        from . import engine

        scale_plot.parent.mkdir(parents=True, exist_ok=True)
        engine.plot_scale(doc["details"]["scale"], scale_plot)
        print(f"wrote {scale_plot}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0
