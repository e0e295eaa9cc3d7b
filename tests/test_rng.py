"""Random streams keyed by (seed, node, purpose, k)."""

import pytest
import torch

from flower_dp.rng import numpy_rng, stream_seed, torch_generator


def test_streams_deterministic_and_distinct():
    assert stream_seed(0, 1, "noise", 3) == stream_seed(0, 1, "noise", 3)
    keys = {stream_seed(s, n, p, k) for s in (0, 1) for n in range(4) for p in ("data", "noise") for k in range(5)}
    assert len(keys) == 80 and all(0 <= v < 2**63 for v in keys)
    a = torch.randn(4, generator=torch_generator(0, 2, "noise", 7))
    b = torch.randn(4, generator=torch_generator(0, 2, "noise", 7))
    assert torch.equal(a, b)
    assert numpy_rng(0, 1, "data", 0).random() == numpy_rng(0, 1, "data", 0).random()


def test_unknown_purpose():
    with pytest.raises(ValueError, match="unknown RNG purpose 'x'"):
        stream_seed(0, 0, "x")
