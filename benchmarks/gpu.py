"""One prepared GPU check: ``python -m benchmarks.gpu --out FILE.json [--device cuda] [--quick]``.

Made to be run once on a rented GPU machine (no Flower, no Opacus, no dataset files, no network needed) and to
leave a JSON document of what it found, section by section:

``env``
    torch / CUDA / GPU / CPU facts and the versions of the libraries the figures depend on.
``nodes_cuda_vs_cpu``
    Every push-sum algorithm of the registry, a small in-process run (:func:`flower_dp.experiments.run_experiment`,
    ``[run] reproducible = true``, synthetic Fashion-MNIST) once with ``run.device = "cpu"`` and once on the device:
    where the nodes' tensors live, final accuracy, the push-sum mass ``sum_i w_i``, the largest difference between the
    two network-average models, wall times.
``private_step``
    Interleaved timings (min / median ms) on the device of the non-private step, our fast DP step (ghost clipping +
    the nodes' Gaussian noise + SGD, :func:`benchmarks.private_step.make_steps`) and the noise alone, drawn as the nodes
    draw it (numpy float64 on the CPU, then copied to the device), with the CPU-only draw and torch's on-device float32
    sampler beside it for scale: the share of a GPU step the CPU-side noise takes.
``resnet_node_iteration``
    ms per node-iteration of the ResNet-18 push-sum runs of the reproductions' full-scale tables (one representative
    run per algorithm family and model, at the table's batch size), and from it the GPU hours of those tables with
    the nodes stepped one after the other on one GPU.
``ray_gpu_placement``
    The Ray host-actor backend with GPU shares: a local Ray with two hosts on half a GPU each, then a two-raylet
    cluster with one (declared) GPU per raylet; where each host lands, its device, and whether the results equal the
    in-process CPU loop.

Every section runs in its own ``try``; a failure is recorded as ``{"error": "<traceback tail>"}`` and the next
section runs.  The JSON file is rewritten after every section, so a run cut short keeps what finished.  Each section
has a time budget (it stops repeating timings past it) and a hard limit (an alarm ends it).  With ``--device cpu``
everything runs on the CPU and the figures that need a GPU say ``skipped`` with the reason.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import interleaved_times, machine_info, versions

__all__ = ["main", "run", "SECTIONS"]

SECTIONS = ("env", "nodes_cuda_vs_cpu", "private_step", "resnet_node_iteration", "ray_gpu_placement")
#: seconds per section: past it a section stops repeating timings / starting cases (default and --quick)
BUDGET_S = {"env": 30, "nodes_cuda_vs_cpu": 60, "private_step": 50, "resnet_node_iteration": 60,
            "ray_gpu_placement": 90}
#: the Ray section starts a local Ray (10-15 s on a loaded 2-core machine) and its hosts before the two-raylet case
QUICK_BUDGET_S = {"env": 20, "nodes_cuda_vs_cpu": 30, "private_step": 15, "resnet_node_iteration": 25,
                  "ray_gpu_placement": 150}
OPTIONAL_MODULES = ("flwr", "opacus", "torchvision", "tqdm", "matplotlib", "numba")

# --------------------------------------------------------------------------------------------------- helpers


class _HardTimeout(BaseException):
    """A section ran past its hard limit (SIGALRM).  A BaseException, so that no library's ``except Exception``
    swallows it; the driver records it as the section's error."""


def _on_alarm(signum, frame):  # noqa: ARG001
    raise _HardTimeout("section exceeded its hard time limit")


class Budget:
    """A section's time budget: ``seconds`` from ``t0`` (a section stops starting new work once it is over)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.t0 = float(seconds), time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over(self) -> bool:
        return self.elapsed() > self.seconds


def _error(exc: BaseException) -> str:
    """The tail of a traceback (what a report needs to find the failure)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-3000:]


def _is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def _sync(device: str) -> None:
    if _is_cuda(device):
        import torch

        torch.cuda.synchronize()


def _synced(fn: Callable[[], object], device: str) -> Callable[[], object]:
    """``fn`` followed by ``torch.cuda.synchronize()`` on a GPU (so a timed call includes its kernels)."""
    if not _is_cuda(device):
        return fn

    def call():
        fn()
        _sync(device)

    return call


def timings(fns: dict[str, Callable[[], object]], repeats: int, budget: Budget, device: str, *, warmup: int = 2,
            chunk: int = 5) -> dict[str, Any]:
    """Interleaved wall times (:func:`benchmarks._common.interleaved_times`, synchronized on a GPU) in chunks of
    ``chunk`` rounds, until ``repeats`` rounds or the budget is spent (at least one chunk).  Per callable
    ``{"min_ms", "median_ms", "n"}``, plus ``"repeats"`` and ``"stopped_by_budget"``."""
    wrapped = {k: _synced(v, device) for k, v in fns.items()}
    _sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    done, first = 0, True
    while done < repeats:
        n = min(chunk, repeats - done)
        got = interleaved_times(wrapped, n, warmup=warmup if first else 0, shuffle_seed=done)
        for k, v in got.items():
            times[k].extend(v)
        done += n
        first = False
        if budget.over():
            break
    out: dict[str, Any] = {k: {"min_ms": round(min(v) * 1e3, 4), "median_ms": round(statistics.median(v) * 1e3, 4),
                               "n": len(v)} for k, v in times.items()}
    out["repeats"] = done
    out["stopped_by_budget"] = done < repeats
    return out


def _partial(ctx: dict, fields: dict) -> dict:
    """A section's result dict, registered in ``ctx`` so that the driver keeps what it holds if the section fails
    (a hard timeout, an error outside a case's own ``try``)."""
    part = ctx.setdefault("partial", {})
    part.update(fields)
    return part


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats as strings, tuples as lists, unknown objects as str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy / torch scalars
        return _clean(obj.item())
    return str(obj)


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(doc), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _say(msg: str) -> None:
    print(f"[benchmarks.gpu] {msg}", flush=True)


def _peak_mem_gib(device: str) -> float | None:
    if not _is_cuda(device):
        return None
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def _reset_peak(device: str) -> None:
    if _is_cuda(device):
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# --------------------------------------------------------------------------------------------------- 1. env

def section_env(ctx: dict, budget: Budget) -> dict:
    import torch

    out: dict[str, Any] = _partial(ctx, {
        "device": ctx["device"], "device_requested": ctx["device_requested"], "quick": ctx["quick"],
        "torch": torch.__version__, "torch_cuda_version": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "machine": machine_info(), "versions": versions(),
        "python": sys.version.split()[0], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    })
    opt = {}
    for mod in OPTIONAL_MODULES:  # installed or not, without importing them
        try:
            if importlib.util.find_spec(mod) is None:
                opt[mod] = "not installed"
                continue
            try:
                opt[mod] = importlib.metadata.version(mod)
            except importlib.metadata.PackageNotFoundError:
                opt[mod] = "installed (version unknown)"
        except Exception as exc:  # noqa: BLE001
            opt[mod] = f"unknown ({type(exc).__name__})"
    out["optional_modules"] = opt
    try:
        out["dp_accounting_dist"] = importlib.metadata.version("dp-accounting")
    except Exception as exc:  # noqa: BLE001
        out["dp_accounting_dist"] = f"unknown ({type(exc).__name__})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(device_count=torch.cuda.device_count(), device_name=props.name,
                   total_memory_gib=round(props.total_memory / 2**30, 2),
                   capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                   cudnn=torch.backends.cudnn.version())
        t0 = time.perf_counter()
        x = torch.ones(1024, device="cuda")
        float((x + 1).sum())
        torch.cuda.synchronize()
        out["cuda_first_kernel_s"] = round(time.perf_counter() - t0, 3)
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,mig.mode.current",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()[-300:]
        except Exception as exc:  # noqa: BLE001
            out["nvidia_smi"] = f"not run ({type(exc).__name__}: {exc})"
    else:
        out["gpu"] = "skipped: torch.cuda.is_available() is False"
    return out


# --------------------------------------------------------------------------------------------------- 2. nodes

_DP = {"epsilon": 4.0, "delta": 1e-4, "accountant": "rdp"}
_DPPS = {"b": 5.0, "gamma_n": 0.5, "accountant": "rdp"}
#: PrivSGP family with a fixed noise std (its calibration alone takes seconds; the comparison needs the same noise on
#: both devices, not a calibrated one)
_VR = {"G": 2.0, "noise_std": 0.5, "epsilon": 4.0, "delta": 1e-4, "accountant": "rdp"}
#: algorithm -> (params, model ("cnn" = the section's CNN/MLP choice), topology); as tests/test_budget_every_algorithm
ALGORITHM_CASES: dict[str, tuple[dict, str, str]] = {
    "dyn_d2p": ({"variant": "dyn", **_DP}, "cnn", "exp_one_peer"),
    "privsgp_vr": (dict(_VR), "cnn", "exp_one_peer"),
    "dp_csgp": ({"G": 2.0, "compressor": "rand_0.5", "gamma_c": 0.5, **_DP, "calibration": "paper", "c2": 0.3724},
                "cnn", "exp_all_hops"),
    "partpsp": ({**_DPPS, "sync_period": 5}, "partpsp_mlp", "exp_one_peer"),
    "sgp": ({}, "cnn", "exp_one_peer"),
    "privsgp": (dict(_VR), "cnn", "exp_one_peer"),
    "dp2_sgd": (dict(_VR), "cnn", "undirected_ring"),
    "adp2_sgd": (dict(_VR), "cnn", "undirected_ring"),
    "sgpdp": ({**_DPPS, "sync_period": 5}, "partpsp_mlp", "exp_one_peer"),
    "pedfl": (dict(_DPPS), "partpsp_mlp", "exp_one_peer"),
}


def _node_config(algorithm: str, device: str, quick: bool) -> Any:
    from flower_dp.experiments import config_from_dict

    params, model, topo = ALGORITHM_CASES[algorithm]
    if model == "cnn":
        model = "mlp_2layer" if quick else "shallow_cnn"
    n, K, J, B = (4, 3, 32, 8) if quick else (4, 16, 64, 16)
    lr = 0.2 if model == "shallow_cnn" else 0.05  # the CNN leaves chance level within 16 iterations (SGP: ~0.4)
    return config_from_dict({
        "run": {"name": f"gpu-{algorithm}", "seed": 0, "num_iters": K, "eval_every": K, "progress": False,
                "checkpoint": False, "reproducible": True, "device": device},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": J, "test_samples": 100 if quick else 500},
        "model": {"name": model},
        "topology": {"name": topo, "n_nodes": n},
        "algorithm": {"name": algorithm, "params": {"lr": lr, "batch_size": B, **params}},
    })


def _tensor_devices(node) -> list[str]:
    import torch

    found = set()
    for attr in ("x", "data_x"):
        t = getattr(node, attr, None)
        if isinstance(t, torch.Tensor):
            found.add(str(t.device))
    model = getattr(node, "model", None)
    if model is not None:
        found.update(str(p.device) for p in model.parameters())
    return sorted(found)


def _one_node_run(algorithm: str, device: str, quick: bool) -> tuple[dict, Any]:
    import torch

    from flower_dp.experiments import run_experiment

    cfg = _node_config(algorithm, device, quick)
    _sync(device)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # calibration = "paper" says its rigorous eps exceeds the target: known
        res = run_experiment(cfg, out_dir=None, progress=False)
    _sync(device)
    wall = time.perf_counter() - t0
    nodes = res.nodes
    avg = torch.stack([nd.eval_params().detach().to("cpu", torch.float64) for nd in nodes]).mean(0)
    eps = res.eps_rigorous_max
    row = {"device": device, "tensor_devices": sorted({d for nd in nodes for d in _tensor_devices(nd)}),
           "model": cfg.model["name"], "n_nodes": cfg.n_nodes, "num_iters": int(cfg.run["num_iters"]),
           "status": res.status, "final_accuracy": res.final_accuracy,
           "push_sum_mass": float(sum(float(nd.w) for nd in nodes)), "wall_s": round(wall, 3),
           "avg_param_norm": float(avg.norm()), "eps_rigorous_max": eps, "eps_heuristic_max": res.eps_heuristic_max}
    return row, avg


def section_nodes(ctx: dict, budget: Budget) -> dict:
    import torch

    from flower_dp.clients import registry

    device, quick = ctx["device"], ctx["quick"]
    out: dict[str, Any] = _partial(ctx, {
        "device": device, "reproducible": True, "dataset": "synthetic_fashion_mnist",
        "note": "one in-process run per algorithm with run.device = cpu and one with the device; "
                "max_abs_diff_avg_params compares the two network-average models"})
    if not _is_cuda(device):
        out["gpu"] = "skipped: device is cpu, so the 'device' run is a second CPU run (its diff must be 0)"
    algorithms = list(ALGORITHM_CASES) + sorted(set(registry.ALGORITHMS) - set(ALGORITHM_CASES))
    if _is_cuda(device):  # cuDNN / cuBLAS initialisation outside the first algorithm's wall time
        from flower_dp.models import build_model

        m = build_model("shallow_cnn").to(device)
        m(torch.zeros(2, 1, 28, 28, device=device)).sum().backward()
        _sync(device)
    cases: dict[str, Any] = {}
    out["cases"] = cases  # filled as it goes: kept if the section is cut short
    for alg in algorithms:
        if alg not in ALGORITHM_CASES:
            cases[alg] = {"skipped": "no parameter set for this algorithm in benchmarks.gpu.ALGORITHM_CASES"}
            continue
        if budget.over():
            cases[alg] = {"skipped": f"section time budget ({budget.seconds:.0f} s) spent"}
            continue
        try:
            cpu, cpu_avg = _one_node_run(alg, "cpu", quick)
            dev, dev_avg = _one_node_run(alg, device, quick)
            diff = float((cpu_avg - dev_avg).abs().max())
            cases[alg] = {"cpu": cpu, "device": dev, "max_abs_diff_avg_params": diff,
                          "max_abs_avg_param": float(cpu_avg.abs().max()),
                          "accuracy_diff": float(dev["final_accuracy"]) - float(cpu["final_accuracy"]),
                          "on_device": all(d.startswith(device.split(":")[0]) for d in dev["tensor_devices"])}
            _say(f"  {alg}: diff {diff:.3g}, acc cpu {cpu['final_accuracy']:.3f} / {device} "
                 f"{dev['final_accuracy']:.3f}, wall {cpu['wall_s']:.1f} / {dev['wall_s']:.1f} s")
        except Exception as exc:  # noqa: BLE001
            cases[alg] = {"error": _error(exc)}
            _say(f"  {alg}: error {type(exc).__name__}: {exc}")
    return out


# --------------------------------------------------------------------------------------------------- 3. private step

PRIVATE_CASES = [("mlp_2layer", 32), ("mlp_2layer", 64), ("shallow_cnn", 32), ("shallow_cnn", 64),
                 ("resnet18_cifar_gn", 32)]
QUICK_PRIVATE_CASES = [("mlp_2layer", 8), ("shallow_cnn", 8), ("resnet18_cifar_gn", 2)]


def _input_shape(model_or_dataset: str) -> tuple[int, int, int]:
    return (3, 32, 32) if "cifar" in model_or_dataset else (1, 28, 28)


def _private_case(model: str, batch: int, device: str, repeats: int, budget: Budget) -> dict:
    """One (model, batch): interleaved timings of the steps and of the noise (see :func:`section_private_step`)."""
    import torch

    from flower_dp.mechanisms.noise import gaussian_noise
    from flower_dp.models import build_model, count_parameters
    from flower_dp.rng import node_secret, noise_generator

    from .private_step import make_steps

    _reset_peak(device)
    steps = make_steps(model, batch, device=device, input_shape=_input_shape(model))
    d = count_parameters(build_model(model))  # as make_steps' noise: every parameter
    key = node_secret(False, 0)
    ks = [0, 0, 0]
    cpu_buf = torch.empty(d)

    def noise_node():  # exactly PushSumNode.gaussian: a new float32 tensor on the node's device
        ks[0] += 1
        return gaussian_noise(d, 1.0, noise_generator(key, 2, ks[0]), dtype=torch.float32, device=device)

    def noise_cpu_only():  # the CPU part of it: numpy's float64 draw, scaled, rounded into a CPU float32 buffer
        ks[1] += 1
        return gaussian_noise(d, 1.0, noise_generator(key, 3, ks[1]), out=cpu_buf)

    gen = torch.Generator(device=device).manual_seed(0)
    dev_buf = torch.empty(d, device=device)

    def noise_torch_on_device():  # for scale only: NOT what the nodes do (float32 sampler, tail not proven)
        return torch.randn(d, generator=gen, device=device, out=dev_buf)

    fns = {"nonprivate": steps["nonprivate"], "dp_fast": steps["dp_fast"], "noise_node": noise_node,
           "noise_cpu_only": noise_cpu_only, "noise_torch_on_device": noise_torch_on_device}
    t = timings(fns, repeats, budget, device, warmup=1 if repeats < 5 else 2)
    med = {k: t[k]["median_ms"] for k in fns}
    mn = {k: t[k]["min_ms"] for k in fns}
    return {
        "model": model, "batch": batch, "d": d, "device": device, "timings": t,
        "median_ratio_dp_fast_over_nonprivate": round(med["dp_fast"] / med["nonprivate"], 3),
        "ratio_dp_fast_over_nonprivate": round(mn["dp_fast"] / mn["nonprivate"], 3),
        "noise_share_of_dp_step_median": round(med["noise_node"] / med["dp_fast"], 3),
        "noise_cpu_part_share_of_dp_step_median": round(med["noise_cpu_only"] / med["dp_fast"], 3),
        "noise_copy_to_device_ms_median": round(med["noise_node"] - med["noise_cpu_only"], 4),
        "peak_memory_gib": _peak_mem_gib(device),
    }


def section_private_step(ctx: dict, budget: Budget) -> dict:
    device, quick = ctx["device"], ctx["quick"]
    cases = QUICK_PRIVATE_CASES if quick else PRIVATE_CASES
    repeats = 2 if quick else 30
    out: dict[str, Any] = _partial(ctx, {
        "device": device, "repeats_target": repeats,
        "note": "dp_fast = ghost clipping + noise_node + SGD (benchmarks.private_step.make_steps, lr 0); noise_node "
                "is drawn as PushSumNode.gaussian draws it (numpy float64 on the CPU, rounded to float32, copied to "
                "the device); noise_cpu_only is its CPU part; noise_torch_on_device (torch.randn on the device) is "
                "for scale only",
    })
    if not _is_cuda(device):
        out["gpu"] = "skipped: device is cpu; these are CPU timings (the GPU share of the CPU-side noise is not measured)"
    per_case_budget = Budget(budget.seconds / max(1, len(cases)))
    res: dict[str, Any] = {}
    out["cases"] = res  # filled as it goes
    for model, batch in cases:
        name = f"{model}_b{batch}"
        if budget.over():
            res[name] = {"skipped": f"section time budget ({budget.seconds:.0f} s) spent"}
            continue
        per_case_budget.t0 = time.perf_counter()
        try:
            res[name] = _private_case(model, batch, device, repeats, per_case_budget)
            t = res[name]["timings"]
            _say(f"  {name}: nonprivate {t['nonprivate']['median_ms']:.3f} ms, dp_fast {t['dp_fast']['median_ms']:.3f} "
                 f"ms, noise_node {t['noise_node']['median_ms']:.3f} ms (median, {t['repeats']} rounds)")
        except Exception as exc:  # noqa: BLE001
            res[name] = {"error": _error(exc)}
            _say(f"  {name}: error {type(exc).__name__}: {exc}")
        finally:
            _reset_peak(device)
    return out


# --------------------------------------------------------------------------------------------------- 4. ResNet node-iteration

#: algorithm -> family timed together (one representative run per family and model)
FAMILY = {"dyn_d2p": "dyn_d2p", "privsgp_vr": "privsgp", "privsgp": "privsgp", "dp2_sgd": "privsgp",
          "adp2_sgd": "privsgp", "dp_csgp": "dp_csgp", "partpsp": "dpps", "sgpdp": "dpps", "pedfl": "dpps",
          "sgp": "sgp"}


#: the reproduction tables whose full-scale runs need a GPU (every other table's full-scale runs are
#: ``cpu_feasible``).  Listed rather than found: building every table's full-scale runs estimates PrivSGP-VR's MNIST
#: K* from the dataset (16 s here; on a machine without the data, torchvision may try to download it)
GPU_TABLES: dict[str, tuple[str, ...]] = {
    "dyn-d2p": ("table1",),
    "privsgp-vr": ("fig1", "fig2", "fig3", "fig4", "fig5"),
    "dp-csgp": ("fig3-4",),
    "partpsp": ("table2", "table3", "fig4"),
    "gau-lrq": ("table4-cifar10", "table4-cifar100", "fig5-cifar10", "fig5-cifar100"),
}


def full_scale_gpu_runs(gpu_tables: dict[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """The full-scale runs of the reproduction tables ``gpu_tables`` (default :data:`GPU_TABLES`) that need a GPU
    (:func:`flower_dp.reproduce.core.cpu_feasible` false), per paper table: push-sum runs as ``{"algorithm",
    "model", "batch", "n", "K", "params", "topology", "dataset", "seeds"}``, runs of other kinds counted."""
    from flower_dp.reproduce import get_paper
    from flower_dp.reproduce.core import cpu_feasible

    tables: dict[str, Any] = {}
    for name, names in (GPU_TABLES if gpu_tables is None else gpu_tables).items():
        paper = get_paper(name)
        seeds = list(range(int(paper.default_seeds.get("full", 1))))
        for table in names:
            key = f"{name}/{table}"
            try:
                specs = [s for s in paper.build_runs("full", table, seeds) if not cpu_feasible(s)]
            except Exception as exc:  # noqa: BLE001
                tables[key] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            if not specs:
                continue
            runs, other = [], {}
            for s in specs:
                c = s.config
                if s.kind != "pushsum":
                    other[s.kind] = other.get(s.kind, 0) + 1
                    continue
                params = dict(c["algorithm"]["params"])
                runs.append({"algorithm": c["algorithm"]["name"], "model": c["model"]["name"],
                             "batch": int(params.get("batch_size", 0)), "n": int(c["topology"]["n_nodes"]),
                             "K": int(c["run"]["num_iters"]), "params": params, "topology": c["topology"]["name"],
                             "dataset": c["data"]["dataset"], "seeds": len(seeds)})
            tables[key] = {"runs": runs, "other_kinds": other}
    return tables


def _group_key(run: dict) -> str:
    return f"{FAMILY.get(run['algorithm'], run['algorithm'])}|{run['model']}|B{run['batch']}"


def _representatives(tables: dict) -> dict[str, dict]:
    """Per group (family, model, batch): the first private run of the group (else the first), and the group's total
    node-iterations (sum of n K); groups ordered by that total, largest first."""
    groups: dict[str, dict] = {}
    for t in tables.values():
        for r in t.get("runs", []):
            g = groups.setdefault(_group_key(r), {"rep": None, "node_iterations": 0, "algorithms": set()})
            g["node_iterations"] += r["n"] * r["K"]
            g["algorithms"].add(r["algorithm"])
            private = r["params"].get("variant") != "nonprivate" and r["algorithm"] != "sgp"
            if g["rep"] is None or (private and g["rep"]["params"].get("variant") == "nonprivate"):
                g["rep"] = r
    for g in groups.values():
        g["algorithms"] = sorted(g["algorithms"])
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]["node_iterations"]))


def _time_node_iteration(rep: dict, device: str, quick: bool, budget: Budget) -> dict:
    import torch

    from flower_dp.clients import registry
    from flower_dp.clients.push_sum_app import build_plan_node
    from flower_dp.gossip import run_iteration
    from flower_dp.models import build_model, count_parameters
    from flower_dp.topology import make_topology

    n = 2
    B = 4 if quick else rep["batch"]  # 4: a BatchNorm model (resnet18_tv_bn) refuses a batch of 1 at its 1x1 layer
    iters = 1 if quick else 8
    J = 4 * B  # the cost of an iteration does not depend on J (PrivSGP-VR's table: J / B blocks)
    params = dict(rep["params"], batch_size=B)
    if "accountant" in registry.param_names(rep["algorithm"]):
        # RDP: the plan's accounting at this small J (sampling rate 1/4) takes < 3 s; PLD took 70 s for PrivSGP-VR's
        # fixed noise.  The noise level does not change the cost of an iteration.
        params["accountant"] = "rdp"
    t_build = time.perf_counter()
    model_fn = functools.partial(build_model, rep["model"], seed=0)
    dim = count_parameters(model_fn())
    plan = registry.prepare(rep["algorithm"], params, n_nodes=n, samples_per_node=[J] * n, num_iters=iters + 2,
                            dim=dim, seed=0, reproducible=True)
    topo = registry.topology_for(plan, make_topology(rep["topology"], n))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(J, *_input_shape(rep["dataset"]), generator=g), torch.randint(0, 10, (J,), generator=g))
            for _ in range(n)]
    _reset_peak(device)
    nodes = [build_plan_node(i, device, plan=plan, topology=topo, model_fn=model_fn, data=data) for i in range(n)]
    _sync(device)
    built_s = time.perf_counter() - t_build
    t0 = time.perf_counter()
    for nd in nodes:
        nd.setup()
    _sync(device)
    setup_s = time.perf_counter() - t0
    first_s = None
    if not quick:
        t0 = time.perf_counter()
        run_iteration(nodes, 0, receivers=topo.out_neighbors)  # warm-up (allocator, cuDNN)
        _sync(device)
        first_s = time.perf_counter() - t0
    per_node_ms = []
    for k in range(0 if quick else 1, iters + (0 if quick else 1)):
        t0 = time.perf_counter()
        run_iteration(nodes, k, receivers=topo.out_neighbors)
        _sync(device)
        per_node_ms.append((time.perf_counter() - t0) * 1e3 / n)
        if budget.over():
            break
    return {"algorithm": rep["algorithm"], "model": rep["model"], "batch": B, "table_batch": rep["batch"],
            "plan_and_build_s": round(built_s, 3),
            "n_nodes_timed": n, "samples_per_node_timed": J, "d": dim, "device": device,
            "tensor_devices": _tensor_devices(nodes[0]), "setup_s": round(setup_s, 3),
            "first_iteration_s": None if first_s is None else round(first_s, 3), "iterations_timed": len(per_node_ms),
            "ms_per_node_iteration_min": round(min(per_node_ms), 3),
            "ms_per_node_iteration_median": round(statistics.median(per_node_ms), 3),
            "peak_memory_gib_2_nodes": _peak_mem_gib(device)}


def section_resnet(ctx: dict, budget: Budget) -> dict:
    device, quick = ctx["device"], ctx["quick"]
    out: dict[str, Any] = _partial(ctx, {"device": device})
    t0 = time.perf_counter()
    tables = full_scale_gpu_runs()
    out["enumerate_s"] = round(time.perf_counter() - t0, 2)
    groups = _representatives(tables)
    measured: dict[str, Any] = {}
    out["measured_so_far"] = measured  # replaced by "groups" at the end
    for key, g in groups.items():
        if budget.over():
            measured[key] = {"skipped": f"section time budget ({budget.seconds:.0f} s) spent"}
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # calibration notes (paper mode, DPPS heuristic eps)
                measured[key] = _time_node_iteration(g["rep"], device, quick, budget)
            m = measured[key]
            _say(f"  {key}: {m['ms_per_node_iteration_median']:.1f} ms per node-iteration (median of "
                 f"{m['iterations_timed']}, B = {m['batch']})")
        except ImportError as exc:  # resnet18_tv_bn without torchvision
            measured[key] = {"skipped": f"{type(exc).__name__}: {exc}"}
            _say(f"  {key}: skipped ({exc})")
        except Exception as exc:  # noqa: BLE001
            measured[key] = {"error": _error(exc)}
            _say(f"  {key}: error {type(exc).__name__}: {exc}")
        finally:
            _reset_peak(device)
    del out["measured_so_far"]
    out["groups"] = {k: {"algorithms": g["algorithms"], "node_iterations_full_scale": g["node_iterations"],
                         "representative": {x: g["rep"][x] for x in ("algorithm", "model", "batch", "n", "K",
                                                                      "topology", "dataset")},
                         "measured": measured.get(k)} for k, g in groups.items()}
    # the estimate
    why_not = None
    if not _is_cuda(device):
        why_not = "skipped: device is cpu (these are CPU timings of this machine, not GPU hours)"
    elif quick:
        why_not = "skipped: --quick shrinks the batches to 2, so the timings are not the tables' cost"
    per_table: dict[str, Any] = {}
    total_h, missing_groups = 0.0, set()
    for name, t in tables.items():
        if "error" in t:
            per_table[name] = {"error": t["error"]}
            continue
        ni = sum(r["n"] * r["K"] for r in t["runs"])
        hours, unmeasured = 0.0, set()
        for r in t["runs"]:
            m = measured.get(_group_key(r)) or {}
            if "ms_per_node_iteration_median" not in m:
                unmeasured.add(_group_key(r))
                continue
            hours += r["n"] * r["K"] * m["ms_per_node_iteration_median"] / 3.6e6
        missing_groups |= unmeasured
        row: dict[str, Any] = {"pushsum_runs": len(t["runs"]), "node_iterations": ni,
                               "seeds": t["runs"][0]["seeds"] if t["runs"] else None,
                               "settings": sorted({f"{r['algorithm']} {r['model']} n={r['n']} K={r['K']} "
                                                   f"B={r['batch']}" for r in t["runs"]})[:8]}
        if t["other_kinds"]:
            row["not_estimated"] = {k: f"{v} runs of kind {k!r} (not push-sum node-iterations)"
                                    for k, v in t["other_kinds"].items()}
        if why_not is None:
            row["gpu_hours_sequential"] = round(hours, 2)
            if unmeasured:
                row["gpu_hours_missing_groups"] = sorted(unmeasured)
        total_h += hours
        per_table[name] = row
    out["full_scale_tables"] = per_table
    if why_not is None:
        out["gpu_hours_total_sequential"] = round(total_h, 2)
        out["gpu_hours_assumes"] = ("one GPU, the n nodes of a run stepped one after the other, runs one after the "
                                    "other, at the median ms per node-iteration of the group's representative "
                                    "(timed with 2 nodes); excludes evaluation, checkpoints, PrivSGP-VR's set-up "
                                    "pass over the VR table and the non-push-sum (Gau-LRQ) runs"
                                    + (f"; groups not measured (hours missing): {sorted(missing_groups)}"
                                       if missing_groups else ""))
    else:
        out["gpu_hours_total_sequential"] = why_not
    if why_not is None:
        _say(f"  GPU hours, nodes stepped one after the other on one GPU: {total_h:.1f} in all (push-sum runs "
             f"of the full-scale GPU tables; groups not measured: {sorted(missing_groups) or 'none'})")
        for name, row in per_table.items():
            if "gpu_hours_sequential" in row and row["node_iterations"]:
                _say(f"    {name}: {row['gpu_hours_sequential']:.1f} h for {row['pushsum_runs']} runs, "
                     f"{row['node_iterations']:,} node-iterations ({'; '.join(row['settings'][:3])})")
    else:
        _say(f"  GPU hours: {why_not}")
    return out


# --------------------------------------------------------------------------------------------------- 5. Ray placement

def _node_device(node) -> str:
    """Where a node's state lives (run on its host by ``RayGossipBackend.apply``)."""
    return str(node.x.device)


def _compare_with_inprocess(be, factory, n: int, K: int) -> dict:
    """Run ``be`` for iterations 0..K-1 and the same nodes in-process on the CPU; the largest differences."""
    import torch

    from flower_dp.gossip import run_iteration

    ref = [factory(i, "cpu") for i in range(n)]
    for nd in ref:
        nd.setup()
    for k in range(K):
        run_iteration(ref, k)
    be.setup()
    seg = be.run_segment(0, K)
    states = be.state_dicts()
    dx = max(float((states[nd.node_id]["x"].to(torch.float64) - nd.x.to("cpu", torch.float64)).abs().max())
             for nd in ref)
    dw = max(abs(float(states[nd.node_id]["w"]) - float(nd.w)) for nd in ref)
    bitwise = all(torch.equal(states[nd.node_id]["x"], nd.x.cpu()) and states[nd.node_id]["w"] == nd.w for nd in ref)
    return {"iterations": K, "segment_wall_s": round(seg.wall_time_s, 3), "max_abs_diff_x": dx, "max_abs_diff_w": dw,
            "bit_identical": bool(bitwise), "match_1e-5": bool(dx <= 1e-5 and dw <= 1e-5),
            "push_sum_mass": float(sum(float(s["w"]) for s in states.values()))}


def _placement(be) -> dict:
    info = be.host_info()
    try:
        node_devices = be.apply(_node_device)
    except Exception as exc:  # noqa: BLE001
        node_devices = {"error": f"{type(exc).__name__}: {exc}"}
    return {"devices": list(be.devices), "num_gpus_per_host_effective": be.num_gpus_per_host, "hosts": info,
            "ray_nodes_of_hosts": len({h["ray_node_id"] for h in info}), "node_tensor_devices": node_devices}


def _toy_factory(n: int):
    from flower_dp.clients.push_sum_app import build_toy_node
    from flower_dp.topology import make_topology

    return functools.partial(build_toy_node, topology=make_topology("random_irregular", n, seed=3), dim=32, seed=11)


def _dyn_d2p_factory(n: int, K: int):
    """Dyn-D2P logistic-regression nodes on in-memory data, seeded mode (as tests/test_ray_two_raylets.py)."""
    import torch

    from flower_dp.clients import registry
    from flower_dp.clients.push_sum_app import build_plan_node
    from flower_dp.models import build_model
    from flower_dp.topology import make_topology

    J = 16
    g = torch.Generator().manual_seed(0)
    model_fn = functools.partial(build_model, "logreg", num_classes=2, in_features=5, seed=0)
    data = [(torch.randn(J, 5, generator=g), torch.randint(0, 2, (J,), generator=g)) for _ in range(n)]
    dim = sum(p.numel() for p in model_fn().parameters())
    plan = registry.prepare("dyn_d2p", dict(lr=0.1, batch_size=8, variant="dyn", epsilon=2.0, delta=1e-4),
                            n_nodes=n, samples_per_node=[J] * n, num_iters=K, dim=dim, seed=1, reproducible=True)
    topo = registry.topology_for(plan, make_topology("random_irregular", n, seed=2))
    return functools.partial(build_plan_node, plan=plan, topology=topo, model_fn=model_fn, data=data)


def _ray_case(be_kwargs: dict, factory, n: int, K: int) -> dict:
    from flower_dp.gossip.ray_backend import RayGossipBackend

    t0 = time.perf_counter()
    be = RayGossipBackend(n, factory, timeout_s=120, **be_kwargs)
    try:
        out = {"backend_start_s": round(time.perf_counter() - t0, 2), **_placement(be)}
        out.update(_compare_with_inprocess(be, factory, n, K))
        return out
    finally:
        be.shutdown()


def _register_by_value() -> None:
    import ray

    mod = sys.modules.get(__name__)
    if mod is not None and __name__ != "__main__":  # hosts need not import the benchmarks package
        ray.cloudpickle.register_pickle_by_value(mod)


def section_ray(ctx: dict, budget: Budget) -> dict:
    import ray

    from flower_dp.gossip.ray_backend import ensure_ray

    from .raylets import _start_cluster, _stop_cluster

    device, quick = ctx["device"], ctx["quick"]
    n, K = 4, (3 if quick else 6)
    out: dict[str, Any] = _partial(ctx, {"device": device, "n_nodes": n, "iterations": K})
    if not _is_cuda(device):
        out["gpu"] = ("skipped: device is cpu; Ray sees no GPU here, so the local hosts fall back to the CPU and the "
                      "cluster's declared GPUs only place the hosts")
    # (a) local Ray, two hosts on half a GPU each
    local: dict[str, Any] = {}
    out["local_half_gpu_hosts"] = local
    try:
        if ray.is_initialized():
            ray.shutdown()
        t0 = time.perf_counter()
        ensure_ray(num_cpus=min(4, os.cpu_count() or 1))
        _register_by_value()
        local["ray_start_s"] = round(time.perf_counter() - t0, 2)
        local["cluster_resources"] = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
        local["toy"] = _ray_case({"num_hosts": 2, "num_gpus_per_host": 0.5}, _toy_factory(n), n, K)
        _say(f"  local Ray, 2 hosts x 0.5 GPU: devices {local['toy']['devices']}, gpu ids "
             f"{[h['gpu_ids'] for h in local['toy']['hosts']]}, max diff {local['toy']['max_abs_diff_x']:.3g}")
    except Exception as exc:  # noqa: BLE001
        local["error"] = _error(exc)
        _say(f"  local Ray: error {type(exc).__name__}: {exc}")
    finally:
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
    # (b) two raylets, one declared GPU each, one host per GPU, device left to the host
    two: dict[str, Any] = {}
    out["two_raylets_one_gpu_each"] = two
    if budget.over():
        two["skipped"] = f"section time budget ({budget.seconds:.0f} s) spent"
    else:
        cluster = temp = None
        try:
            t0 = time.perf_counter()
            cluster, temp = _start_cluster(2)
            _register_by_value()
            two["cluster_start_s"] = round(time.perf_counter() - t0, 2)
            two["cluster_resources"] = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
            kw = {"num_hosts": 2, "num_gpus_per_host": 1}
            for name, factory in (("toy", _toy_factory(n)), ("dyn_d2p_logreg", _dyn_d2p_factory(n, K))):
                if budget.over():
                    two[name] = {"skipped": f"section time budget ({budget.seconds:.0f} s) spent"}
                    continue
                try:
                    two[name] = _ray_case(kw, factory, n, K)
                    r = two[name]
                    _say(f"  two raylets, {name}: {r['ray_nodes_of_hosts']} Ray nodes, devices {r['devices']}, gpu "
                         f"ids {[h['gpu_ids'] for h in r['hosts']]}, max diff {r['max_abs_diff_x']:.3g}, "
                         f"match 1e-5 {r['match_1e-5']}")
                except Exception as exc:  # noqa: BLE001
                    two[name] = {"error": _error(exc)}
                    _say(f"  two raylets, {name}: error {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001
            two["error"] = _error(exc)
            _say(f"  two raylets: error {type(exc).__name__}: {exc}")
        finally:
            if cluster is not None:
                try:
                    _stop_cluster(cluster, temp)
                except Exception:  # noqa: BLE001
                    pass
    return out


# --------------------------------------------------------------------------------------------------- driver

SECTION_FUNCS: dict[str, Callable[[dict, Budget], dict]] = {
    "env": section_env, "nodes_cuda_vs_cpu": section_nodes, "private_step": section_private_step,
    "resnet_node_iteration": section_resnet, "ray_gpu_placement": section_ray,
}


def _ensure_namespace() -> str | None:
    """Make ``flower_dp.clients`` / ``flower_dp.strategies`` importable from a checkout that is not pip-installed.

    pyproject.toml maps the top-level ``clients/`` and ``strategies/`` folders into the ``flower_dp`` namespace; an
    install (``pip install --no-deps -e .``) does that.  Without one, this process adds the checkout root to
    ``flower_dp.__path__``, and Ray's workers get the same through a ``sitecustomize`` shim on ``PYTHONPATH``
    (best effort: a system ``sitecustomize`` earlier on the path would shadow it).  Returns a note, or None when
    nothing was needed."""
    try:
        if importlib.util.find_spec("flower_dp.clients") is not None:
            return None
    except ModuleNotFoundError:
        pass
    import flower_dp

    root = str(Path(__file__).resolve().parents[1])
    if root not in flower_dp.__path__:
        flower_dp.__path__.append(root)
    shim = Path(tempfile.mkdtemp(prefix="fdpns", dir="/tmp"))
    (shim / "sitecustomize.py").write_text(
        "try:\n    import flower_dp\n    if %r not in flower_dp.__path__:\n        flower_dp.__path__.append(%r)\n"
        "except Exception:\n    pass\n" % (root, root))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(shim), root] + ([old] if old else []))
    sys.path.insert(0, str(shim))
    return (f"flower_dp is not installed from this checkout (no flower_dp.clients): mapped {root}/clients and "
            f"{root}/strategies into flower_dp here and in Ray's workers (sitecustomize shim {shim}); "
            "`pip install --no-deps --no-build-isolation -e .` avoids this")


def _resolve(device: str) -> tuple[str, str | None]:
    import torch

    if device == "auto":
        return ("cuda" if torch.cuda.is_available() else "cpu"), None
    if _is_cuda(device) and not torch.cuda.is_available():
        return "cpu", f"--device {device} asked but torch.cuda.is_available() is False: everything ran on the CPU"
    return device, None


def run(out: str | Path, *, device: str = "auto", quick: bool = False, sections: tuple[str, ...] = SECTIONS,
        budget_scale: float = 1.0, threads: int | None = None) -> dict:
    """Run the sections in order, rewriting ``out`` after each; returns the document.

    ``threads``: torch's CPU threads (also ``FLOWER_DP_THREADS`` for the runner); default torch's own, 1 with
    ``quick`` (a loaded small machine slows down many times over when torch's threads fight for its cores)."""
    import torch

    t_start = time.perf_counter()
    if threads is None and quick:
        threads = 1
    if threads is not None:
        torch.set_num_threads(int(threads))
        os.environ["FLOWER_DP_THREADS"] = str(int(threads))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    dev, warning = _resolve(device)
    ctx = {"device": dev, "device_requested": device, "quick": bool(quick)}
    doc: dict[str, Any] = {"meta": {"script": "benchmarks.gpu", "argv": sys.argv[1:], "device": dev,
                                    "device_requested": device, "quick": bool(quick),
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sections": list(sections),
                                    "finished_sections": []}}
    if warning:
        doc["meta"]["warning"] = warning
        _say(f"WARNING: {warning}")
    try:
        ns = _ensure_namespace()
    except Exception as exc:  # noqa: BLE001
        ns = f"could not map flower_dp.clients: {type(exc).__name__}: {exc}"
    if ns:
        doc["meta"]["namespace_note"] = ns
        _say(f"NOTE: {ns}")
    _write(path, doc)
    budgets = QUICK_BUDGET_S if quick else BUDGET_S
    old = signal.signal(signal.SIGALRM, _on_alarm) if hasattr(signal, "SIGALRM") else None
    try:
        for name in sections:
            budget = Budget(budgets[name] * budget_scale)
            hard = int(budget.seconds * 3 + 60)
            _say(f"section {name}: start (budget {budget.seconds:.0f} s, hard limit {hard} s)")
            if old is not None:
                signal.alarm(hard)
            ctx["partial"] = {}
            try:
                res = SECTION_FUNCS[name](ctx, budget)
                status = "ok"
            except BaseException as exc:  # noqa: BLE001 -- one section's failure never ends the run
                if isinstance(exc, KeyboardInterrupt):
                    raise
                res = {**ctx["partial"], "error": _error(exc)}  # what it finished, and why it stopped
                status = f"error ({type(exc).__name__}: {str(exc)[:200]})"
            finally:
                if old is not None:
                    signal.alarm(0)
            res["elapsed_s"] = round(budget.elapsed(), 2)
            res["budget_s"] = budget.seconds
            doc[name] = res
            doc["meta"]["finished_sections"].append(name)
            doc["meta"]["total_s"] = round(time.perf_counter() - t_start, 2)
            _write(path, doc)
            _say(f"section {name}: {status} in {budget.elapsed():.1f} s (total {doc['meta']['total_s']:.1f} s)")
    finally:
        if old is not None:
            signal.signal(signal.SIGALRM, old)
    _say(f"done in {time.perf_counter() - t_start:.1f} s; wrote {path}")
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write (rewritten after every section)")
    parser.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto (default: cuda when available)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2-3 repeats (a check of the script itself)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {', '.join(SECTIONS)} (default: all, in this order)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiply every section's time budget")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's own; 1 with --quick)")
    args = parser.parse_args(argv)
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = [s for s in sections if s not in SECTION_FUNCS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; valid: {list(SECTIONS)}")
    run(args.out, device=args.device, quick=args.quick, sections=sections, budget_scale=args.budget_scale,
        threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
