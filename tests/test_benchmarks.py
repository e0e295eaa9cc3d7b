"""Smoke tests of the benchmark suite: it runs in --quick mode and writes a valid JSON document.

No timing is asserted (the machine is shared); only structure, and that measured figures
are positive numbers where the code under test exists.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest

from flower_dp import bench_cli

# benchmarks/ is a top-level package of the checkout (not installed); bench_cli finds it
benchmarks = bench_cli._import_benchmarks()


@pytest.fixture(scope="module")
def quick_doc(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("bench") / "latest.json"
    rc = benchmarks.main(["--quick", "--skip-ray", "--out", str(out)])
    torch.set_num_threads(threads)
    assert rc == 0
    return json.loads(out.read_text())


def test_quick_suite_writes_every_required_key(quick_doc):
    """All required top-level keys are present; machine is a string and versions an object."""
    for key in benchmarks.REQUIRED_KEYS:
        assert key in quick_doc, key
    assert isinstance(quick_doc["machine"], str) and quick_doc["machine"]
    assert isinstance(quick_doc["versions"], dict) and "torch" in quick_doc["versions"]
    assert quick_doc["quick"] is True and quick_doc["threads"]["torch_intra_op"] == 1


def test_quick_suite_figures_are_positive_ratios(quick_doc):
    """Every figure whose code exists is a finite positive number; the Ray ones are null with a note."""
    for key in ("private_step_ratio_cnn_b64", "private_step_ratio_mlp_b64", "lrq_codec_ratio", "wire_ratio",
                "private_step_median_ratio_cnn_b64", "lrq_codec_median_ratio", "lrq_codec_cpu_median_ratio",
                "private_step_median_ratio_cnn_b64_prefetch", "private_step_median_ratio_mlp_b64_prefetch"):
        v = quick_doc[key]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (key, v)
    # bucketing rounds noise levels down: eps can only grow (accountant.bucket_steps docstring)
    assert quick_doc["accounting_eps_rel_diff"] >= 0
    assert quick_doc["max_nodes_inprocess_mlp"] >= 1
    assert quick_doc["engine_overhead_ratio"] is None and quick_doc["engine_overhead_median_ratio"] is None
    # ours / Opacus' best mode (by the median) sits beside the per-mode ratios: a number with Opacus, else null
    ours_vs_best = quick_doc["private_step_median_ours_over_opacus_best_cnn_b64"]
    assert (ours_vs_best is None) == (quick_doc["private_step_ratio_cnn_b64_opacus_ghost"] is None)
    assert ours_vs_best is None or ours_vs_best > 0
    assert "missing" in quick_doc["details"]["engine_overhead"]["note"]
    # the LRQ codec's error is N(0, sigma^2) by construction (Gau-LRQ, Sec. IV): a sanity check of the run
    assert quick_doc["details"]["lrq_codec"]["error_std_over_sigma"] == pytest.approx(1.0, abs=0.05)


def test_table_names_each_figure(quick_doc):
    """The printed table has one line per headline figure and the machine line."""
    table = benchmarks.format_table(quick_doc)
    for word in ("private step", "engine overhead", "accounting", "LRQ codec", "LRQ wire", "max nodes", "machine"):
        assert word in table


def test_cli_registers_bench_and_rejects_unknown_benchmark():
    """``flower-dp bench`` parses the suite's options; an unknown --only name is refused."""
    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--quick", "--only", "wire", "--skip-ray"])
    assert args.quick and args.only == ["wire"] and args.func is not None
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--only", "nonsense"])
    with pytest.raises(ValueError, match="unknown benchmark"):
        benchmarks.run_suite(quick=True, only=("nonsense",))


def test_summary_judges_every_goal_from_the_runs(quick_doc):
    """``python -m benchmarks.summary``: one line per figure, each goal judged on every run's figure (by the
    median where the goal says so), never hard-coded; a figure the run did not measure is "not measured"."""
    import copy
    import importlib

    summary = importlib.import_module(benchmarks.__name__ + ".summary")
    table = summary.summarize([quick_doc, quick_doc])
    lines = table.splitlines()
    assert len(lines) == 2 + len(summary.rows_for())
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    # --quick --skip-ray: the Ray and engine figures are null, so their goals are not judged
    assert "| `engine_overhead_ratio` | - / - | - / - |" in table and "not measured" in table

    good, bad = copy.deepcopy(quick_doc), copy.deepcopy(quick_doc)
    good["accounting_seconds_30000"], bad["accounting_seconds_30000"] = 0.5, 7.0
    good["details"]["accounting"]["long"]["median_seconds"] = 0.6
    bad["details"]["accounting"]["long"]["median_seconds"] = 8.0
    row = next(r for r in summary.GOALS if r.label == "accounting_seconds_30000")
    line = lambda docs: next(x for x in summary.summarize(docs).splitlines() if f"`{row.label}`" in x)  # noqa: E731
    assert line([good, good]).endswith("| < 3 s | yes |")
    assert line([good, bad]).endswith("| in 1 of 2 runs |")
    assert line([bad, bad]).endswith("| **no** |")
    assert "0.50 s / 0.60 s | 7.00 s / 8.00 s | 6.5 / 7.4 |" in line([good, bad])


def test_noise_floor_reports_every_generator_and_the_step_beside_a_draw():
    """``python -m benchmarks.noise_floor``: the shape of its document (no timing is asserted)."""
    import importlib

    doc = importlib.import_module(benchmarks.__name__ + ".noise_floor").run(repeats=3, d=1000)
    assert set(doc["draw_ms"]) == {"SFC64", "PCG64", "PCG64DXSM", "Philox", "MT19937"}
    assert set(doc["step_ms"]) == {"alone", "beside_a_draw", "alone_again"}
    assert all(v["min_ms"] > 0 and v["median_ms"] >= v["min_ms"] for v in doc["draw_ms"].values())
    assert doc["floor_ratio_b64"] > 0 and doc["interference_ratio"] > 0


def test_engine_round_parts_time_what_the_strategy_calls():
    """The engine benchmark's per-round parts (register, segment, average, reports) wrap methods the push-sum
    strategy really calls: its Flower side is ``segments_class``, whose registration and backend are overridden."""
    from flower_dp.strategies._push_sum_backend import FlowerSegments
    from flower_dp.strategies.push_sum import PushSumStrategy

    import importlib

    engine = importlib.import_module("benchmarks.engine")
    timed = engine._timed_strategy()
    assert issubclass(timed, PushSumStrategy) and issubclass(timed.segments_class, FlowerSegments)
    for name in ("_register", "_new_backend"):
        assert getattr(timed.segments_class, name) is not getattr(FlowerSegments, name), name
    backend_calls = {"run_segment", "network_average", "privacy_reports", "param_layout"}
    from flower_dp.gossip.ray_backend import RayGossipBackend

    assert set(engine.ROUND_PARTS[1:]) == backend_calls
    assert all(callable(getattr(RayGossipBackend, name, None)) for name in backend_calls)


def test_quick_suite_reports_the_exact_noise_mode(quick_doc):
    """The exact mode's figures: samples/s per sigma (grid units), and its private step next to the float one."""
    rates = quick_doc["exact_noise_samples_per_s"]
    assert set(rates) == {"1", "10", "1000", "1e+06"}
    assert all(isinstance(v, (int, float)) and v > 0 for v in rates.values())
    assert quick_doc["float_noise_samples_per_s"] > 0
    for case in ("cnn", "mlp"):
        for key in (f"private_step_ratio_{case}_b64_exact", f"private_step_ratio_{case}_b64_float_beside_exact"):
            v = quick_doc[key]
            assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (key, v)


def test_ray_scale_dense_matrices_and_projection():
    """``benchmarks.ray_scale``: the matrices' term is what a topology really caches, and the projection scales the
    rest linearly in n (no Ray started)."""
    import importlib

    from flower_dp.topology import make_topology

    rs = importlib.import_module(benchmarks.__name__ + ".ray_scale")
    for n in (5, 20, 64):
        topo = make_topology("exp", n)
        cached = sum(topo.matrix(k).nbytes for k in range(topo.period))
        assert rs.dense_topology_mib(n) == pytest.approx(cached / 2**20)
    prev = {"n": 64, "rss_mb": 100.0 + 2 * rs.dense_topology_mib(64), "topology_mb_per_process": rs.dense_topology_mib(64)}
    assert rs._projected_mib(prev, 128, 2) == pytest.approx(200.0 + 2 * rs.dense_topology_mib(128))
    keys = rs.latest_keys({"max_nodes_two_raylets_mlp": 8, "stopped": "every size ran",
                           "two_raylets": {"4": {"rss_mb": 1000.0, "rss_mb_per_node": 250.0,
                                                 "node_iterations_per_s": 9.0, "throughput_ratio_vs_inprocess": 1.5},
                                           "8": {"rss_mb": 1010.0, "rss_mb_per_node": 126.25,
                                                 "node_iterations_per_s": 10.0}},
                           "inprocess": {"4": missing_point()}})
    assert keys["scale_mlp_two_raylets_marginal_mb_per_node"] == {"8": 2.5}
    assert keys["scale_mlp_two_raylets_rss_gb"] == {"4": pytest.approx(1000 / 1024, abs=1e-3),
                                                   "8": pytest.approx(1010 / 1024, abs=1e-3)}
    assert keys["scale_mlp_two_raylets_inprocess_node_iterations_per_s"] == {}


def missing_point() -> dict:
    return {"value": None, "note": "missing: n=4 failed"}


@pytest.mark.flower
def test_ray_scale_quick_runs_both_engines_and_stops_every_raylet(tmp_path):
    """``python -m benchmarks.ray_scale --quick``: ``ray start`` (one raylet of 2 CPUs here), 4 MLP nodes on 2 host
    actors and in-process; every figure measured, the result written, and no raylet process left."""
    import importlib

    rs = importlib.import_module(benchmarks.__name__ + ".ray_scale")
    out = tmp_path / "ray_scale.json"
    doc = rs.run(quick=True, out_path=out)
    assert json.loads(out.read_text())["max_nodes_two_raylets_mlp"] == 4 == doc["value"]
    assert doc["stopped"] == "every size ran" and doc["raylet_groups_left"] == []
    ray_pt, ip = doc["two_raylets"]["4"], doc["inprocess"]["4"]
    assert sorted(h["nodes"] for h in ray_pt["hosts"]) == [2, 2]
    assert ray_pt["memory_after"]["workers"].count("ray::_Host") == 2
    # the hosts' RSS is part of all the workers' RSS; registering 4 nodes grew the hosts
    assert 0 < ray_pt["memory_after"]["hosts_rss_mb"] <= ray_pt["rss_mb"]
    assert ray_pt["memory_after"]["hosts_rss_mb"] > ray_pt["memory_empty_hosts"]["hosts_rss_mb"]
    for pt in (ray_pt, ip):
        assert pt["node_iterations_per_s"] > 0 and pt["rss_mb_per_node"] == pytest.approx(pt["rss_mb"] / 4, abs=0.05)
    assert ray_pt["throughput_ratio_vs_inprocess"] > 0
    for proc_group in doc["raylet_process_groups"]:
        with pytest.raises(ProcessLookupError):
            import os

            os.killpg(proc_group, 0)
