"""LeNet on (Fashion-)MNIST for the Gau-LRQ example: data, local training, evaluation (plain PyTorch).

Nothing here knows about privacy: this is the code a Flower user already has.  Data follow
gau-lrq.md 8.2: client p gets ``per_class`` samples of every class, drawn independently of
other clients (overlap allowed), a deterministic function of (seed, p).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from flower_dp.data import load_dataset, stratified_client_indices
from flower_dp.models import build_model


def model_to_arrays(model: torch.nn.Module) -> ArrayRecord:
    return ArrayRecord({k: Array(v.detach().cpu().numpy().copy()) for k, v in model.state_dict().items()})


def arrays_to_model(arrays: ArrayRecord, model: torch.nn.Module) -> torch.nn.Module:
    model.load_state_dict({k: torch.from_numpy(a.numpy().copy()) for k, a in arrays.items()})
    return model


def client_data(dataset: str, pid: int, per_class: int, seed: int):
    ds = load_dataset(dataset, train=True)
    idx = torch.from_numpy(stratified_client_indices(ds.y.numpy(), pid, per_class=per_class, seed=seed))
    return ds.x[idx], ds.y[idx]


def local_train(model: torch.nn.Module, x, y, *, steps: int, lr: float, seed: int, batch: int = 32) -> float:
    """``steps`` SGD steps (momentum 0.9, weight decay 5e-4, paper Table II), fresh optimizer state."""
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        b = torch.randint(0, len(y), (batch,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[b]), y[b])
        loss.backward()
        opt.step()
    return float(loss.detach())


def evaluate(model: torch.nn.Module, dataset: str, n: int) -> tuple[float, float]:
    """(accuracy, loss) on the first ``n`` test images."""
    ds = load_dataset(dataset, train=False)
    model.eval()
    with torch.no_grad():
        out = model(ds.x[:n])
        return float((out.argmax(1) == ds.y[:n]).float().mean()), float(torch.nn.functional.cross_entropy(out, ds.y[:n]))


def new_model(seed: int = 0) -> torch.nn.Module:
    return build_model("lenet", seed=seed)


def ensure_secret_file(path: str) -> str:
    """Create the run secret (32 random bytes, mode 0600) if missing; returns the expanded path."""
    p = Path(os.path.expanduser(path))
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    return str(p)


def seed_for(seed: int, pid: int, rnd: int) -> int:
    return int(np.random.SeedSequence([seed, pid, rnd]).generate_state(1)[0])
