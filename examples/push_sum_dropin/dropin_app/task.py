"""The user's own code, unchanged: a model and a per-partition data loader."""

from __future__ import annotations

import torch
from torch import nn

NUM_PARTITIONS = 4
SAMPLES = 48


class Net(nn.Module):
    """A small MLP for 2-class, 10-feature data."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():  # every node starts from the same weights (and the global RNG is left alone)
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_data(partition_id: int, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partition ``partition_id``: two Gaussian blobs, shifted per partition (non-IID)."""
    g = torch.Generator().manual_seed(1000 + partition_id)
    y = torch.randint(0, 2, (SAMPLES,), generator=g)
    x = torch.randn(SAMPLES, 10, generator=g) + (2.0 * y[:, None] - 1.0) + 0.3 * partition_id / num_partitions
    return x, y
