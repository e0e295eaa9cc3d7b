"""Bad input gets a specific error naming the value, the valid range and the fix (issue 9, table-driven).

Every case asserts the exception type and a message fragment, runs in an empty working
directory, and must leave no results file (``results.json``, ``history.csv``, a checkpoint or
a temporary file of an atomic write) behind.
"""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from flower_dp import topology as T
from flower_dp.clients.registry import prepare
from flower_dp.data import load_dataset, partition
from flower_dp.errors import CheckpointError, ConfigError, DecodeError, NonFiniteError
from flower_dp.experiments.config import config_from_dict
from flower_dp.mechanisms import check_no_batchnorm, gaussian_noise, lrq, make_compressor, per_sample_clipped_grad_sum
from flower_dp.models import build_model
from flower_dp.privacy import (
    GaussianStep,
    PrivacyBudget,
    calibrate_noise_multiplier,
    dyn_d2p_schedule,
    gau_lrq_schedule,
    rigorous_epsilon,
)
from flower_dp.results import ensure_writable_dir

SIZES = dict(n_nodes=2, samples_per_node=[10, 10], num_iters=5, dim=3, seed=0)


def _prep(name, **params):
    return lambda: prepare(name, params, **SIZES)


def _nan_grad():
    model = torch.nn.Linear(2, 2)
    x = torch.tensor([[float("nan"), 1.0]])
    per_sample_clipped_grad_sum(model, torch.nn.functional.cross_entropy, x, torch.tensor([0]), 1.0)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again when the with-block ends


def _ray_address_not_answering():
    from flower_dp.gossip.ray_backend import check_ray_address

    check_ray_address(_closed_port(), timeout_s=2.0)


def _ray_address_malformed():
    from flower_dp.gossip.ray_backend import check_ray_address

    check_ray_address("headnode")


def _strategy(**kw):
    from flower_dp.strategies.push_sum import PushSumStrategy

    args = {"n_nodes": 8, "spec": {"builder": "toy", "n_nodes": 8}, "num_iters": 6, "iters_per_round": 3, **kw}
    return PushSumStrategy(args.pop("n_nodes"), args.pop("spec"), **args)


class _GridWithFourSuperNodes:
    def get_node_ids(self):
        return [11, 12, 13, 14]

    def send_and_receive(self, messages, timeout=None):  # pragma: no cover - must not be reached
        raise AssertionError("the strategy sent messages to too few SuperNodes")


def _fewer_supernodes_than_nodes():
    _strategy(transport="relay", timeout_s=0.3, out_dir="out").start(_GridWithFourSuperNodes())


def _unwritable_results_dir():
    Path("blocker").write_text("x")
    _strategy(out_dir="blocker/out")


def _runner_cfg(**over):
    raw = {"run": {"num_iters": 2, "eval_every": 1, "progress": False},
           "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 16, "test_samples": 10},
           "model": {"name": "logreg"}, "topology": {"name": "exp_one_peer", "n_nodes": 2},
           "algorithm": {"name": "sgp", "params": {"lr": 0.1, "batch_size": 4}}}
    for key, value in over.items():
        section, name = key.split(".")
        raw[section][name] = value
    return config_from_dict(raw)


def _run(cfg, **kw):
    from flower_dp.experiments import run_experiment

    return run_experiment(cfg, out_dir="out", progress=False, **kw)


def _lrq_wrong_key():
    msg = lrq.encode(np.zeros(10), 1.0, b"right")
    lrq.decode(msg, 1.0, b"wrong")


CASES = [
    # privacy core
    ("eps <= 0", lambda: PrivacyBudget(0.0, 1e-5), ValueError, "eps must be > 0 and finite, got 0.0"),
    ("eps inf", lambda: PrivacyBudget(float("inf"), 1e-5), ValueError, "eps must be > 0 and finite"),
    ("delta >= 1", lambda: PrivacyBudget(1.0, 1.0), ValueError, "delta must be in \\(0, 1\\), got 1.0"),
    ("delta <= 0", lambda: rigorous_epsilon([GaussianStep(0.1, 1.0)], 0.0), ValueError, "delta must be in"),
    ("q > 1", lambda: GaussianStep(1.5, 1.0), ValueError, "q must be in \\(0, 1\\], got 1.5"),
    ("sigma <= 0", lambda: GaussianStep(0.1, 0.0), ValueError, "noise_multiplier must be > 0, got 0.0"),
    ("unknown accountant", lambda: rigorous_epsilon([], 1e-5, accountant="moments"), ValueError, "unknown accountant"),
    ("steps < 1", lambda: calibrate_noise_multiplier(1.0, 1e-5, 0.1, 0), ValueError, "steps must be >= 1, got 0"),
    ("rho <= 1", lambda: dyn_d2p_schedule("dyn", epsilon=1, delta=1e-5, q=0.1, num_iters=10, rho_c=0.5),
     ValueError, "rho_c must be >= 1"),
    ("unknown dyn variant", lambda: dyn_d2p_schedule("fast", epsilon=1, delta=1e-5, q=0.1, num_iters=10),
     ValueError, "unknown variant 'fast'"),
    ("B > N", lambda: gau_lrq_schedule(epsilon=1.0, delta=1e-5, num_rounds=3, B=30, N=20), ValueError, "B must be <= 20, got 30"),
    # algorithms (config-level)
    ("unknown algorithm", _prep("fedavg"), ConfigError, "unknown algorithm 'fedavg'; valid choices"),
    ("malformed param key", _prep("dyn_d2p", epsilonn=1.0), ConfigError, "unknown parameter 'epsilonn'.*valid keys"),
    ("algorithm eps <= 0", _prep("dyn_d2p", epsilon=-1.0), ConfigError, "epsilon must be > 0, got -1"),
    ("algorithm delta >= 1", _prep("dyn_d2p", delta=1.0), ConfigError, "delta must be in \\(0, 1\\), got 1.0"),
    ("clip <= 0", _prep("dyn_d2p", clip0=0.0), ConfigError, "clip0 must be > 0, got 0"),
    ("rho_c < 1", _prep("dyn_d2p", rho_c=0.5), ConfigError, "rho_c must be >= 1"),
    ("unknown compressor", _prep("dp_csgp", compressor="zip"), ConfigError, "unknown compressor name, got 'zip'"),
    ("K < 1", lambda: prepare("sgp", {}, **{**SIZES, "num_iters": 0}), ValueError, "num_iters must be >= 1, got 0"),
    # mechanisms
    ("compressor a out of range", lambda: make_compressor("rand_1.5"), ValueError, "a must be in \\(0, 1\\), got 1.5"),
    ("negative noise std", lambda: gaussian_noise(3, -1.0, torch.Generator()), ValueError, "std must be >= 0"),
    ("BatchNorm under per-sample DP", lambda: check_no_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(2))),
     ValueError, "GroupNorm"),
    ("NaN gradient", _nan_grad, NonFiniteError, ""),
    ("LRQ wrong stream", _lrq_wrong_key, DecodeError, "integrity check"),
    ("LRQ sigma 0", lambda: lrq.encode(np.zeros(3), 0.0, b"k"), ValueError, "sigma must be > 0"),
    ("LRQ non-finite input", lambda: lrq.encode(np.array([np.inf]), 1.0, b"k"), ValueError, "must be finite"),
    # topology
    ("non column-stochastic", lambda: T.from_matrix(np.array([[0.6, 0.5], [0.5, 0.5]])), ValueError,
     "column-stochastic .* got column 0 summing to 1.1"),
    ("negative weight", lambda: T.from_matrix(np.array([[1.2, 0.5], [-0.2, 0.5]])), ValueError, "non-negative"),
    ("not strongly connected", lambda: T.from_matrix(np.eye(3)), ValueError, "not strongly connected"),
    ("n < 1", lambda: T.exp_one_peer(0), ValueError, "n must be >= 1, got 0"),
    ("bad d-Out degree", lambda: T.d_out(5, 6), ValueError, "deg must be in \\[1, n\\]"),
    ("unknown topology", lambda: T.make_topology("torus", 4), ValueError, "unknown topology 'torus'"),
    # data and models
    ("n larger than the dataset", lambda: partition(np.zeros(5), 6), ValueError, "n_nodes must be <= the number"),
    ("unknown dataset", lambda: load_dataset("imagenet"), ValueError, "unknown dataset 'imagenet'"),
    ("unknown model", lambda: build_model("vgg"), ValueError, "unknown model 'vgg'"),
    # configs and files
    ("unknown config section", lambda: config_from_dict({"runn": {}}), ConfigError, "unknown section \\[runn\\]"),
    ("malformed config key", lambda: config_from_dict({"run": {"num_iter": 3}}), ConfigError,
     "unknown key run.num_iter; valid keys"),
    ("config K < 1", lambda: config_from_dict({"run": {"num_iters": 0}}), ConfigError, "run.num_iters must be an integer >= 1"),
    ("unwritable results dir", _unwritable_results_dir, ValueError, "results directory .* is not writable.*pass --out"),
    # runs: the error comes before anything is written to out/
    ("run: n larger than the dataset", lambda: _run(_runner_cfg(**{"topology.n_nodes": 100000})), ValueError,
     "n_nodes must be <= the number"),
    ("run: unknown algorithm", lambda: _run(_runner_cfg(**{"algorithm.name": "gossip"})), ConfigError,
     "unknown algorithm 'gossip'"),
    ("run: resume without a checkpoint", lambda: _run(_runner_cfg(), resume=True), CheckpointError,
     "no checkpoint at .*run without --resume"),
    # Flower and Ray
    ("fewer SuperNodes than nodes", _fewer_supernodes_than_nodes, ConfigError,
     "the simulation runs 4 SuperNodes, n_nodes = 8.*set num-supernodes = 8"),
    ("Ray address not answering", _ray_address_not_answering, ConnectionError,
     "Ray address '127.0.0.1:\\d+' does not answer.*ray start --head.*unset it"),
    ("malformed Ray address", _ray_address_malformed, ValueError, "Ray address must be 'auto'.*got 'headnode'"),
    ("unknown transport", lambda: _strategy(transport="grpc"), ValueError,
     "unknown transport 'grpc'; valid choices are \\['ray', 'relay'\\]"),
    ("iters_per_round < 1", lambda: _strategy(iters_per_round=0), ValueError, "iters_per_round must be >= 1, got 0"),
    ("negative max_retries", lambda: _strategy(max_retries=-1), ValueError, "max_retries must be >= 0, got -1"),
    ("strategy resume without out_dir", lambda: _strategy(resume=True), ValueError,
     "resume=True needs the out_dir.*got out_dir=None"),
    ("negative GPU share", lambda: __import__("flower_dp.gossip.ray_backend", fromlist=["x"]).RayGossipBackend(
        2, num_gpus_per_host=-0.5), ValueError, "num_gpus_per_host must be >= 0 and finite, got -0.5"),
]


@pytest.mark.parametrize("label, call, exc, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error(label, call, exc, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(exc, match=match):
        call()
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.name in ("results.json", "history.csv", "checkpoint.pt") or p.name.endswith(".tmp"))
    assert not left, f"{label}: left {left} behind"


def test_table_has_at_least_30_cases():
    assert len(CASES) >= 30



def test_unwritable_results_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable.*pass --out"):
        ensure_writable_dir(blocker / "out")


def test_cli_reports_bad_values_with_exit_code_2(capsys):
    from flower_dp.cli import main

    assert main(["accountant", "--noise-multiplier", "1", "--q", "2", "--steps", "10", "--delta", "1e-5"]) == 2
    assert "q must be in (0, 1], got 2.0" in capsys.readouterr().err
    assert main(["run", "no_such_config"]) == 2
    assert "unknown built-in config 'no_such_config'" in capsys.readouterr().err
