"""Gau-LRQ releases no data-dependent communication count (docs/privacy.md).

Two runs with the same public seed and config but their own secrets (the default) differ only through the
noise: every result field must be equal except the charged, post-processed outputs (the model's accuracy and
loss), the run's public nonce, its secret file path and its wall time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flower_dp.experiments.gau_lrq import run_gau_lrq
from flower_dp.mechanisms import lrq
from flower_dp.mechanisms.gau_lrq_codec import RoundSpec, encode_update, lrq_public_range, public_bits

#: fields that may differ between two same-seed runs: post-processing of the charged releases (the model and
#: what it evaluates to), the public per-run nonce, where each run's own secret lies, timings
ALLOWED = {"accuracy_per_round", "final_accuracy", "evaluate_serverapp", "loss", "accuracy", "stream_nonce",
           "secret_file", "wall_time_s"}


def _diff(a, b, path="") -> list[str]:
    """Every path at which ``a`` and ``b`` differ, skipping the allowed fields."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one run" for k in set(a) ^ set(b) if k not in ALLOWED]
        for k in set(a) & set(b):
            if k not in ALLOWED:
                out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return [] if same else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize("method", ["gau-lrq", "qg-sgd", "bq-sgd", "gau-sgd"])
def test_two_same_seed_runs_differ_only_in_charged_outputs(tmp_path, method):
    """No result field (bits, bytes, per-coordinate bits, ...) varies with the clients' updates."""
    kw = dict(num_clients=6, clients_per_round=3, num_rounds=2, local_steps=2, noise_multiplier=0.5, lr=0.1,
              dataset="synthetic_fashion_mnist", model="logreg", per_class=4, test_samples=50, seed=3)
    a = run_gau_lrq(method, out_dir=str(tmp_path / "a"), **kw)
    b = run_gau_lrq(method, out_dir=str(tmp_path / "b"), **kw)
    assert a["rounds"][0]["bits_algorithmic"] > 0 and a["bytes_per_round"][0] > 0
    diffs = _diff(a, b)
    assert not diffs, "\n".join(diffs)


def test_message_size_is_fixed_by_the_public_spec():
    """Updates of every size inside the clip ball give LRQ messages of the same packed size and bit count."""
    spec = RoundSpec("lrq", 0, sigma=0.05, clip=0.5)
    lo, width = lrq_public_range(spec)
    assert width == lrq.lrq_bits_fixed(0.5, 0.05) and lo == -math.ceil(0.5 / lrq.lrq_w_min(0.05))
    sizes = set()
    for scale in (0.0, 1e-4, 0.1, 10.0):  # the last is clipped to norm 0.5, all in one coordinate
        delta = np.zeros(1000)
        delta[:1 if scale == 10.0 else 1000] = scale
        payload, meta, stats = encode_update(delta, spec, b"k" * 32)
        sizes.add((payload["m"].nbytes, meta["lo"], meta["width"], meta["m_dtype"], stats["bits_algorithmic"]))
    assert sizes == {(math.ceil(1000 * width / 8), lo, width, "int8", public_bits(spec, 1000))}
