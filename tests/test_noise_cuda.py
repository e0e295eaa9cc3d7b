"""The Gaussian sampler of CUDA nodes (``torch-cuda-float64``): named per device, recorded and checked like the
CPU one, its tail cut derived, and (on a GPU only) its draws N(0, std^2) with the tail present.

On a CUDA device ``gaussian_noise`` draws with torch's CUDA float64 normal (cuRAND ``curand_normal2_double``:
Box-Muller on 53-bit uniforms u = z 2^-53 + 2^-54, so |z| <= sqrt(-2 ln 2^-54) = 8.65) from a Philox generator
seeded with 64 bits of the node's noise stream; on the CPU it keeps numpy's float64 ziggurat bit for bit
(tests/test_noise_law.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flower_dp.mechanisms.noise import (CUDA_GAUSSIAN_SAMPLER, GAUSSIAN_SAMPLER, PROVEN_SAMPLERS, TAIL_CUT_STD,
                                        TAIL_CUT_STD_BY_SAMPLER, gaussian_noise, gaussian_sampler, is_proven_sampler)
from flower_dp.rng import NodeKey, noise_generator, noise_record

CUDA = torch.cuda.is_available()


def test_the_sampler_is_named_per_device():
    assert gaussian_sampler("cpu") == gaussian_sampler(torch.device("cpu")) == GAUSSIAN_SAMPLER == "numpy-float64"
    assert gaussian_sampler("cuda") == gaussian_sampler("cuda:1") == gaussian_sampler(torch.device("cuda", 0)) \
        == CUDA_GAUSSIAN_SAMPLER == "torch-cuda-float64"
    assert gaussian_sampler(["cpu", "cpu"]) == "numpy-float64"
    assert gaussian_sampler(["cuda:0", "cuda:1"]) == "torch-cuda-float64"
    assert gaussian_sampler(["cuda", "cpu", "cuda:1"]) == "numpy-float64+torch-cuda-float64"  # sorted, distinct
    assert CUDA_GAUSSIAN_SAMPLER in PROVEN_SAMPLERS and GAUSSIAN_SAMPLER in PROVEN_SAMPLERS


def test_a_mixed_label_is_proven_when_every_part_is():
    assert is_proven_sampler("numpy-float64+torch-cuda-float64")
    assert is_proven_sampler("torch-cuda-float64") and is_proven_sampler("numpy-float64")
    assert not is_proven_sampler("numpy-float64+torch-float32")
    assert not is_proven_sampler("torch-float32") and not is_proven_sampler(None) and not is_proven_sampler("")
    assert not is_proven_sampler("numpy-float64+")


def test_tail_cuts_per_sampler():
    """Box-Muller from u >= 2^-54 (cuRAND's 53-bit double uniform plus half a step): |z| <= sqrt(-2 ln 2^-54);
    torch's CPU float64 one from u >= 2^-53; numpy's ziggurat stays TAIL_CUT_STD = 13.7.  All far beyond what the
    accountants' deltas notice: the missed mass P(|Z| > 8.65) is ~5e-18 per coordinate."""
    cuda_cut = math.sqrt(-2 * math.log(2.0 ** -54))
    assert abs(cuda_cut - 8.65) < 0.005 and abs(TAIL_CUT_STD_BY_SAMPLER[CUDA_GAUSSIAN_SAMPLER] - cuda_cut) < 0.005
    assert abs(math.sqrt(-2 * math.log(2.0 ** -53)) - TAIL_CUT_STD_BY_SAMPLER["torch-float64"]) < 0.005
    assert TAIL_CUT_STD_BY_SAMPLER[GAUSSIAN_SAMPLER] == TAIL_CUT_STD == 13.7
    assert set(TAIL_CUT_STD_BY_SAMPLER) == set(PROVEN_SAMPLERS)
    assert math.erfc(cuda_cut / math.sqrt(2)) < 1e-17


def test_records_and_identities_name_the_device_sampler():
    from flower_dp.recorder import plan_summary, sampler_identity

    assert noise_record(False)["gaussian_sampler"] == noise_record(True, device="cpu")["gaussian_sampler"] == \
        "numpy-float64"
    assert noise_record(False, device="cuda")["gaussian_sampler"] == "torch-cuda-float64"
    assert noise_record(True, device=["cpu", "cuda:0"])["gaussian_sampler"] == "numpy-float64+torch-cuda-float64"
    assert noise_record(True, device="cuda")["mode"] == "reproducible"
    assert sampler_identity() == {"gaussian_sampler": "numpy-float64"}
    assert sampler_identity("cuda:1") == {"gaussian_sampler": "torch-cuda-float64"}

    class Plan:
        def summary(self, device="cpu"):
            return {"algorithm": "x", "noise": noise_record(True, device=device)}

    s = plan_summary(Plan(), "cuda")
    assert s["noise"]["gaussian_sampler"] == "torch-cuda-float64" and s["noise"]["mode"] == "reproducible"
    assert plan_summary(Plan())["noise"]["gaussian_sampler"] == "numpy-float64" and plan_summary(object()) == {}


def test_a_cuda_sampler_checkpoint_is_refused_by_a_cpu_run_and_back(tmp_path):
    from flower_dp.errors import CheckpointError
    from flower_dp.recorder import SAMPLER_REFUSAL, RunRecorder, sampler_identity

    RunRecorder(tmp_path, identity={"config": {"a": 1}, **sampler_identity("cuda")}).save_checkpoint({"k": 5})
    cpu = RunRecorder(tmp_path, identity={"config": {"a": 1}, **sampler_identity("cpu")}, refusals=SAMPLER_REFUSAL)
    with pytest.raises(CheckpointError, match="torch-cuda-float64.*numpy-float64: a run's noise comes from one") as e:
        cpu.load_checkpoint()
    assert "unproven" not in str(e.value)
    cuda = RunRecorder(tmp_path, identity={"config": {"a": 1}, **sampler_identity("cuda:0")}, refusals=SAMPLER_REFUSAL)
    assert cuda.load_checkpoint()["k"] == 5
    cpu.save_checkpoint({"k": 6})
    with pytest.raises(CheckpointError, match="numpy-float64.*torch-cuda-float64: a run's noise comes from one"):
        cuda.load_checkpoint()
    mixed = RunRecorder(tmp_path, identity={"config": {"a": 1}, **sampler_identity(["cpu", "cuda"])},
                        refusals=SAMPLER_REFUSAL)
    with pytest.raises(CheckpointError, match="numpy-float64, this run draws with numpy-float64\\+torch-cuda-float64"):
        mixed.load_checkpoint()


def test_the_strategy_names_the_sampler_of_its_nodes_devices():
    pytest.importorskip("flwr")
    from strategies.push_sum import PushSumStrategy

    s = PushSumStrategy(2, {}, num_iters=2, iters_per_round=1, transport="relay")
    assert s._node_devices() == ["cpu"] and s.recorder.identity()["gaussian_sampler"] == "numpy-float64"
    s._relay_devices = {1: "cuda", 0: "cpu"}
    assert s.recorder.identity()["gaussian_sampler"] == "numpy-float64+torch-cuda-float64"

    class Backend:
        devices = ["cuda", "cuda"]

    r = PushSumStrategy(2, {}, num_iters=2, iters_per_round=1, transport="ray")
    r.backend = Backend()
    assert r.recorder.identity()["gaussian_sampler"] == "torch-cuda-float64"
    r.backend = None
    r.backend_kwargs = {"device": "cpu"}
    assert r._node_devices() == ["cpu"]


def test_the_cpu_path_draws_numpys_numbers_on_a_cpu_device():
    """Unchanged by the CUDA sampler: a CPU device draws numpy's float64 ziggurat (bit for bit)."""
    key = NodeKey(12345, reproducible=True)
    got = gaussian_noise(1000, 1.3, noise_generator(key, 2, 7), dtype=torch.float64, device=torch.device("cpu"))
    ref = noise_generator(key, 2, 7).standard_normal(1000) * 1.3
    assert np.array_equal(got.numpy(), ref)


def _p_abs_beyond(t: float) -> float:
    return math.erfc(t / math.sqrt(2))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_noise_is_gaussian_keyed_and_deterministic():
    from scipy import stats

    key, std, d = NodeKey(2 ** 255 + 987654321, reproducible=False), 0.37, 1_000_000
    a = gaussian_noise(d, std, noise_generator(key, 3, 11), dtype=torch.float32, device="cuda")
    assert a.device.type == "cuda" and a.dtype == torch.float32
    p = stats.kstest(a.double().cpu().numpy() / std, "norm").pvalue
    assert p > 1e-3, p
    assert torch.equal(a, gaussian_noise(d, std, noise_generator(key, 3, 11), dtype=torch.float32, device="cuda"))
    buf = torch.empty(d, dtype=torch.float32, device="cuda")
    assert torch.equal(gaussian_noise(d, std, noise_generator(key, 3, 11), device="cuda", out=buf), a)
    assert not torch.equal(a, gaussian_noise(d, std, noise_generator(key, 3, 12), device="cuda"))
    assert not torch.equal(a, gaussian_noise(d, std, noise_generator(key, 4, 11), device="cuda"))
    f64 = gaussian_noise(d, std, noise_generator(key, 3, 11), dtype=torch.float64, device="cuda")
    assert torch.equal(f64.float(), a)  # float32 is the float64 draw rounded
    assert torch.count_nonzero(gaussian_noise(d, 0.0, None, device="cuda")) == 0


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_noise_keeps_its_tail():
    """2e8 draws: counts beyond 5 std (expected 115) and 5.5 std (7.6) in wide bands; 1e9 draws: some |z| > 5.77,
    beyond where torch's float32 sampler stops (a float32 sampler passes the counts but not this).  This test fails
    by chance with probability ~exp(-7.9) = 4e-4 (no draw beyond 5.77 in 1e9) plus < 1e-4 for the bands."""
    key, chunk = NodeKey(7, reproducible=True), 50_000_000
    n5 = n55 = 0
    zmax = 0.0
    for k in range(20):  # 20 x 5e7 = 1e9
        z = gaussian_noise(chunk, 1.0, noise_generator(key, 0, k), dtype=torch.float64, device="cuda").abs_()
        if k < 4:  # the first 2e8
            n5 += int((z > 5.0).sum())
            n55 += int((z > 5.5).sum())
        zmax = max(zmax, float(z.max()))
        del z
    assert abs(2e8 * _p_abs_beyond(5.0) - 115) < 1 and abs(2e8 * _p_abs_beyond(5.5) - 7.6) < 0.1
    assert 60 <= n5 <= 180, n5
    assert 1 <= n55 <= 25, n55
    assert 5.77 < zmax <= TAIL_CUT_STD_BY_SAMPLER[CUDA_GAUSSIAN_SAMPLER], zmax
