"""Issue 16: a node's Gaussian noise drawn ahead on a background thread (``run.prefetch_noise``) is the noise drawn in
line, bit for bit, and a draw made for another key, iteration or length is never used."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from flower_dp.errors import ConfigError
from flower_dp.experiments import config_from_dict, run_experiment
from flower_dp.mechanisms.noise import NoisePrefetcher, gaussian_noise
from flower_dp.rng import node_secret, noise_generator


def _inline(key, node, k, std, d, dtype=torch.float32):
    return gaussian_noise(d, std, noise_generator(key, node, k) if std > 0 else None, dtype=dtype)


@pytest.mark.parametrize("reproducible", [False, True])
def test_prefetched_noise_is_the_inline_noise_bit_for_bit(reproducible):
    key = node_secret(reproducible, 5)
    pre = NoisePrefetcher(noise_generator)
    stds = [0.7, 1.3, 0.0, 2.5, 1e-3, 0.9]  # the std changes per release (Dyn-D2P's schedule); 0 draws nothing
    for k, std in enumerate(stds):
        nxt = k + 1 if k + 1 < len(stds) else None
        got = pre.noise(key, 3, k, std, 1001, next_k=nxt)
        assert got.dtype == torch.float32 and got.shape == (1001,)
        assert torch.equal(got, _inline(key, 3, k, std, 1001)), k
    # float64 as well (no rounding step)
    pre64 = NoisePrefetcher(noise_generator)
    a = pre64.noise(key, 0, 0, 2.0, 17, next_k=1, dtype=torch.float64)
    b = pre64.noise(key, 0, 1, 2.0, 17, dtype=torch.float64)
    assert torch.equal(a, _inline(key, 0, 0, 2.0, 17, torch.float64))
    assert torch.equal(b, _inline(key, 0, 1, 2.0, 17, torch.float64))


def test_a_draw_made_for_another_key_iteration_node_or_length_is_dropped():
    k1, k2 = node_secret(False, 0), node_secret(False, 0)  # two secrets: the key of a node restored from a checkpoint
    pre = NoisePrefetcher(noise_generator)
    pre.noise(k1, 0, 0, 1.0, 64, next_k=1)
    assert torch.equal(pre.noise(k2, 0, 1, 1.0, 64, next_k=2), _inline(k2, 0, 1, 1.0, 64))  # another key
    assert torch.equal(pre.noise(k2, 0, 5, 1.0, 64, next_k=6), _inline(k2, 0, 5, 1.0, 64))  # another iteration
    assert torch.equal(pre.noise(k2, 1, 6, 1.0, 64, next_k=7), _inline(k2, 1, 6, 1.0, 64))  # another node
    assert torch.equal(pre.noise(k2, 1, 7, 1.0, 65, next_k=8), _inline(k2, 1, 7, 1.0, 65))  # another length
    pre.cancel()
    assert torch.equal(pre.noise(k2, 1, 8, 1.0, 65), _inline(k2, 1, 8, 1.0, 65))


def test_the_draw_ahead_runs_on_the_noise_thread():
    pre = NoisePrefetcher(noise_generator)
    key = node_secret(True, 1)
    pre.noise(key, 0, 0, 1.0, 8, next_k=1)
    seen = []
    pre._pending[-1].add_done_callback(lambda f: seen.append(threading.current_thread().name))
    pre.noise(key, 0, 1, 1.0, 8)  # waits for the draw made ahead
    assert seen and (seen[0].startswith("flower-dp-noise") or seen[0] == threading.current_thread().name)
    assert any(t.name.startswith("flower-dp-noise") for t in threading.enumerate())


def _cfg(prefetch, algorithm="dyn_d2p", params=None, reproducible=True):
    return config_from_dict({
        "run": {"name": "prefetch", "seed": 2, "num_iters": 5, "eval_every": 5, "progress": False,
                "checkpoint": False, "reproducible": reproducible, "prefetch_noise": prefetch},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 32, "test_samples": 64},
        "model": {"name": "logreg"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": algorithm, "params": params or {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4,
                                                              "batch_size": 8, "lr": 0.1, "accountant": "rdp"}},
    })


@pytest.mark.parametrize("algorithm,params", [
    ("dyn_d2p", None),
    ("privsgp_vr", {"epsilon": 4.0, "delta": 1e-4, "batch_size": 8, "lr": 0.05}),
])
def test_a_run_with_prefetched_noise_gives_the_same_numbers(tmp_path, algorithm, params):
    a = run_experiment(_cfg(False, algorithm, params), out_dir=tmp_path / "a", progress=False)
    b = run_experiment(_cfg(True, algorithm, params), out_dir=tmp_path / "b", progress=False)
    assert a.final_accuracy == b.final_accuracy and a.history == b.history
    assert json.dumps(a.privacy, sort_keys=True) == json.dumps(b.privacy, sort_keys=True)  # NaN-safe
    for na, nb in zip(a.nodes, b.nodes, strict=True):
        assert torch.equal(na.x, nb.x)
    assert all(n._prefetcher is not None for n in b.nodes) and all(n._prefetcher is None for n in a.nodes)


def test_prefetch_noise_must_be_a_bool():
    with pytest.raises(ConfigError, match="run.prefetch_noise must be true or false, got 'yes'"):
        _cfg("yes")


def test_the_streams_must_be_given():
    with pytest.raises(TypeError, match="flower_dp.rng.noise_generator"):
        NoisePrefetcher(None)
