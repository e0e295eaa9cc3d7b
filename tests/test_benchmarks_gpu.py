"""``python -m benchmarks.gpu``, the prepared GPU check, on the CPU: --quick writes every section, none fails.

On a machine without a GPU every section still runs on the CPU; what needs a GPU says ``skipped`` with the reason
(the GPU-hours estimate, the GPU facts), and the "device" run of ``nodes_cuda_vs_cpu`` is a second CPU run, so it
must equal the first bit for bit.  A failing section is recorded and the next one runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.gpu as gpu

ROOT = Path(__file__).resolve().parents[1]


def _errors(obj, path="doc"):
    """Paths of every ``error`` entry in a nested document."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "error":
                found.append(f"{path}: {str(v)[-600:]}")
            else:
                found.extend(_errors(v, f"{path}.{k}"))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found.extend(_errors(v, f"{path}[{i}]"))
    return found


def _skips(obj):
    """Every ``skipped`` value (and the GPU-only strings) in a nested document."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "skipped":
                found.append(v)
            else:
                found.extend(_skips(v))
    elif isinstance(obj, list):
        for v in obj:
            found.extend(_skips(v))
    return found


@pytest.mark.flower  # starts a local Ray and a two-raylet Ray cluster
def test_quick_cpu_run_writes_every_section_without_errors(tmp_path):
    out = tmp_path / "gpu.json"
    # budgets scaled down: each section still runs its first case of every kind (the loaded 2-core CI machine)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--quick", "--budget-scale", "0.3",
                           "--out", str(out)], cwd=ROOT, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["finished_sections"] == list(gpu.SECTIONS)
    assert all(name in doc for name in gpu.SECTIONS)
    assert _errors(doc) == [], "\n".join(_errors(doc))
    for reason in _skips(doc):
        assert isinstance(reason, str) and len(reason) > 10, reason
    # one progress line per section, with its seconds
    for name in gpu.SECTIONS:
        assert any(f"section {name}: ok in " in line for line in proc.stdout.splitlines()), proc.stdout[-2000:]

    # GPU-only figures say why they are absent
    assert doc["env"]["cuda_available"] is False and doc["env"]["gpu"].startswith("skipped")
    assert doc["nodes_cuda_vs_cpu"]["gpu"].startswith("skipped")
    assert doc["private_step"]["gpu"].startswith("skipped")
    assert doc["resnet_node_iteration"]["gpu_hours_total_sequential"].startswith("skipped")
    assert doc["ray_gpu_placement"]["gpu"].startswith("skipped")

    # nodes: the "device" run is a second CPU run: the same numbers
    cases = doc["nodes_cuda_vs_cpu"]["cases"]
    ran = {a: c for a, c in cases.items() if "skipped" not in c}
    assert "dyn_d2p" in ran, cases
    for alg, c in ran.items():
        assert c["max_abs_diff_avg_params"] == 0.0, alg
        assert c["accuracy_diff"] == 0.0 and c["on_device"], alg
        for side in ("cpu", "device"):
            assert c[side]["tensor_devices"] == ["cpu"] and c[side]["status"] == "finished", (alg, c[side])
            assert c[side]["push_sum_mass"] == pytest.approx(c[side]["n_nodes"], abs=1e-9), (alg, side)

    # private step: positive interleaved timings of the non-private step, the DP step and the noise
    first = doc["private_step"]["cases"]["mlp_2layer_b8"]
    for k in ("nonprivate", "dp_fast", "noise_node", "noise_cpu_only"):
        assert first["timings"][k]["median_ms"] > 0 and first["timings"][k]["n"] >= 1, k

    # ResNet node-iteration: the full-scale tables are listed, the first group measured
    res = doc["resnet_node_iteration"]
    assert "dyn-d2p/table1" in res["full_scale_tables"] and res["full_scale_tables"]["dyn-d2p/table1"]["node_iterations"] > 0
    measured = [g["measured"] for g in res["groups"].values() if "ms_per_node_iteration_median" in (g["measured"] or {})]
    assert measured and measured[0]["ms_per_node_iteration_median"] > 0

    # Ray: no GPU, so hosts fall back to the CPU; the host-actor results equal the in-process loop bit for bit
    local = doc["ray_gpu_placement"]["local_half_gpu_hosts"]["toy"]
    assert local["devices"] == ["cpu", "cpu"] and local["num_gpus_per_host_effective"] == 0
    assert local["bit_identical"] and local["max_abs_diff_x"] == 0.0
    two = doc["ray_gpu_placement"]["two_raylets_one_gpu_each"]
    assert two["toy"]["ray_nodes_of_hosts"] == 2 and [h["gpu_ids"] for h in two["toy"]["hosts"]] == [["0"], ["0"]]
    assert two["toy"]["bit_identical"] and two["toy"]["match_1e-5"]


def test_a_failing_section_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    """A section that raises leaves ``{"error": traceback}``; the file is rewritten after each section."""
    out = tmp_path / "doc.json"
    seen = []

    def fail(ctx, budget):
        gpu._partial(ctx, {"finished_part": 1})
        raise RuntimeError("boom in a section")

    def ok(ctx, budget):
        seen.append(json.loads(out.read_text())["meta"]["finished_sections"])  # written before this section
        return {"value": 1}

    monkeypatch.setattr(gpu, "SECTION_FUNCS", {name: (fail if name == "private_step" else ok) for name in gpu.SECTIONS})
    doc = gpu.run(out, device="cpu", sections=gpu.SECTIONS)
    assert "boom in a section" in doc["private_step"]["error"] and "Traceback" in doc["private_step"]["error"]
    assert doc["private_step"]["finished_part"] == 1  # what the section finished before it failed is kept
    assert all(doc[name]["value"] == 1 for name in gpu.SECTIONS if name != "private_step")
    assert seen[-1] == ["env", "nodes_cuda_vs_cpu", "private_step", "resnet_node_iteration"]
    assert json.loads(out.read_text())["meta"]["finished_sections"] == list(gpu.SECTIONS)


def test_timings_stop_at_the_budget():
    """Past its budget the timing loop stops after the chunk it is in, and says so."""
    import time

    calls = []
    res = gpu.timings({"a": lambda: calls.append(time.sleep(0.01))}, repeats=1000, budget=gpu.Budget(0.05),
                      device="cpu", warmup=0, chunk=3)
    assert res["stopped_by_budget"] and res["repeats"] < 1000 and res["a"]["n"] == res["repeats"] >= 3
    assert res["a"]["min_ms"] >= 9.0


def test_groups_take_a_private_representative_and_add_node_iterations():
    tables = {"p/t": {"runs": [
        {"algorithm": "dyn_d2p", "model": "m", "batch": 32, "n": 20, "K": 100, "params": {"variant": "nonprivate"}},
        {"algorithm": "dyn_d2p", "model": "m", "batch": 32, "n": 20, "K": 50, "params": {"variant": "dyn"}},
        {"algorithm": "dp2_sgd", "model": "m", "batch": 125, "n": 16, "K": 10, "params": {}},
        {"algorithm": "privsgp_vr", "model": "m", "batch": 125, "n": 16, "K": 10, "params": {}},
    ], "other_kinds": {}}}
    groups = gpu._representatives(tables)
    assert list(groups) == ["dyn_d2p|m|B32", "privsgp|m|B125"]  # largest total first
    assert groups["dyn_d2p|m|B32"]["node_iterations"] == 3000
    assert groups["dyn_d2p|m|B32"]["rep"]["params"]["variant"] == "dyn"
    assert groups["privsgp|m|B125"]["algorithms"] == ["dp2_sgd", "privsgp_vr"]


def test_noise_tail_counter_on_cpu_matches_the_gaussian(tmp_path):
    """benchmarks.gpu_noise_tail on the CPU sampler: 2e6 draws, the counts near their expectation (a wide band:
    the test checks the counter, the H200 run in docs/benchmarks checks the sampler at 5e10 draws)."""
    import json

    from benchmarks import gpu_noise_tail

    out = tmp_path / "tail.json"
    assert gpu_noise_tail.main(["2e6", str(out), "--device", "cpu"]) == 0
    res = json.loads(out.read_text())
    assert res["draws"] == 2_000_000 and res["sampler"] == "numpy-float64"
    assert abs(res["var"] - 1) < 0.01 and abs(res["mean"]) < 0.005
    for cut in ("3.0", "4.0"):
        assert abs(res["beyond"][cut]["poisson_sd"]) < 6, res["beyond"][cut]


def test_gpu_noise_check_runs_on_the_cpu(tmp_path):
    """benchmarks.gpu_noise_check on the CPU sampler, small: the timing sections and the law (through
    gpu_noise_tail.count_tail), which finds numpy's float64 sampler Gaussian."""
    import json

    from benchmarks import gpu_noise_check

    out = tmp_path / "check.json"
    assert gpu_noise_check.main(["--device", "cpu", "--out", str(out), "--repeats", "2", "--tail-draws", "2e6"]) == 0
    doc = json.loads(out.read_text())
    law = doc["law"]
    assert law["ks_ok"] and law["same_key_same_numbers"] and law["out_bit_identical"] and law["other_k_differs"]
    assert law["total_draws"] == law["count_draws"] == 2_000_000
    assert set(law["counts_beyond"]) == {"5.0", "5.5", "6.0"} and 3 < law["max_abs_z"] < 13.7
    assert doc["sampler"] == "numpy-float64" and set(doc["timing"]) == {"mlp", "shallow_cnn", "resnet18_gn"}
