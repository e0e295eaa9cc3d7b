"""Bad input gets a specific error naming the value, the valid range and the fix (issue 9, table-driven).

Every case asserts the exception type and a message fragment; none writes a results file.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_dp import topology as T
from flower_dp.clients.registry import prepare
from flower_dp.data import load_dataset, partition
from flower_dp.errors import ConfigError, DecodeError, NonFiniteError
from flower_dp.experiments.config import config_from_dict
from flower_dp.mechanisms import check_no_batchnorm, gaussian_noise, lrq, make_compressor, per_sample_clipped_grad_sum
from flower_dp.models import build_model
from flower_dp.privacy import (
    GaussianStep,
    PrivacyBudget,
    calibrate_noise_multiplier,
    dyn_d2p_schedule,
    gau_lrq_calibration,
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
    ("sigma <= 0", lambda: GaussianStep(0.1, 0.0), ValueError, "nu must be > 0, got 0.0"),
    ("unknown accountant", lambda: rigorous_epsilon([], 1e-5, accountant="moments"), ValueError, "unknown accountant"),
    ("steps < 1", lambda: calibrate_noise_multiplier(1.0, 1e-5, 0.1, 0), ValueError, "steps must be >= 1, got 0"),
    ("rho <= 1", lambda: dyn_d2p_schedule("dyn", epsilon=1, delta=1e-5, q=0.1, num_iters=10, rho_c=0.5),
     ValueError, "rho_c must be >= 1"),
    ("unknown dyn variant", lambda: dyn_d2p_schedule("fast", epsilon=1, delta=1e-5, q=0.1, num_iters=10),
     ValueError, "unknown variant 'fast'"),
    ("B > N", lambda: gau_lrq_calibration(1.0, 1e-5, num_rounds=3, B=30, N=20), ValueError, "B must be <= 20, got 30"),
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
]


@pytest.mark.parametrize("label, call, exc, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error(label, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_table_has_at_least_30_cases():
    assert len(CASES) >= 30


def test_unwritable_results_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable.*pass --out"):
        ensure_writable_dir(blocker / "out")


def test_cli_reports_bad_values_with_exit_code_2(capsys):
    from flower_dp.cli import main

    assert main(["accountant", "--sigma", "1", "--q", "2", "--steps", "10", "--delta", "1e-5"]) == 2
    assert "q must be in (0, 1], got 2.0" in capsys.readouterr().err
    assert main(["run", "no_such_config"]) == 2
    assert "unknown built-in config 'no_such_config'" in capsys.readouterr().err
