"""The Python front door: ``import flower_dp`` is light, its names load on use, and :func:`flower_dp.train_private`
runs a private push-sum experiment on a caller's own model and tensors (budgets, results, resume, backends)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = ROOT / "docs" / "snippets" / "own_model.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(code: str, cwd: Path | None = None, timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=ENV,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_import_flower_dp_loads_neither_torch_nor_flower():
    out = _run("import sys, flower_dp; print(sorted(m for m in ('torch', 'flwr', 'ray') if m in sys.modules))")
    assert out.strip() == "[]"


def test_front_door_names_resolve_to_their_modules():
    out = _run("import flower_dp as f; print(f.PushSumStrategy, f.GauLRQ); "
               "from flower_dp.strategies import GauLRQ, PushSumStrategy; "
               "from flower_dp.privacy import GaussianStep, LaplaceStep, calibrate_noise_multiplier, rigorous_epsilon; "
               "from flower_dp.clients.lrq_mod import gau_lrq_mod; "
               "from flower_dp.experiments.private_training import train_private; "
               "assert (f.PushSumStrategy, f.GauLRQ, f.gau_lrq_mod, f.rigorous_epsilon, f.calibrate_noise_multiplier, "
               "f.train_private, f.GaussianStep, f.LaplaceStep) == (PushSumStrategy, GauLRQ, gau_lrq_mod, "
               "rigorous_epsilon, calibrate_noise_multiplier, train_private, GaussianStep, LaplaceStep); "
               "assert set(f.__all__) <= set(dir(f)); print(f.__version__)")
    assert "PushSumStrategy" in out and "GauLRQ" in out
    with pytest.raises(AttributeError, match="no attribute 'nope'.*its names are"):
        import flower_dp

        flower_dp.nope  # noqa: B018


def test_own_model_snippet_runs_as_written(tmp_path):
    """The README's own-model example, run as the file it is: it trains, writes results and prints the eps spent,
    which is the rigorous eps of the results and meets the target."""
    out = subprocess.run([sys.executable, str(SNIPPET)], capture_output=True, text=True, cwd=tmp_path, env=ENV,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.fullmatch(r"test accuracy (\S+) at eps = (\S+), delta = (\S+)\n", out.stdout)
    assert m, out.stdout
    acc, eps, delta = map(float, m.groups())
    assert len([ln for ln in SNIPPET.read_text().splitlines() if ln.strip()]) <= 10  # the README's ten lines
    doc = json.loads((tmp_path / "run_out" / "results.json").read_text())
    assert doc["status"] == "finished" and doc["history"][-1]["k"] == 40
    assert acc == pytest.approx(doc["history"][-1]["acc_avg"], abs=5e-4)
    assert acc > 0.5  # three balanced classes: chance is 1/3
    per_node = doc["privacy"]["per_node"]
    assert len(per_node) == 4 and delta == 1e-5
    assert eps == pytest.approx(max(p["eps_rigorous"] for p in per_node), abs=5e-3)
    assert 2.8 < eps <= 3.0 + 5e-3  # calibrated to the target, not above it
    assert doc["config"]["data"]["dataset"].startswith("own:")


def _data(n: int = 600, seed: int = 1):
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
    return x, (x[:, 0] > 0).long()


def _model():
    return torch.nn.Linear(8, 2)


def _small(**kw):
    from flower_dp import train_private

    x, y = _data()
    args = {"n_nodes": 3, "num_iters": 8, "eval_every": 4, "batch_size": 16, "lr": 0.1, "seed": 2, **kw}
    return train_private(_model, (x[:480], y[:480]), (x[480:], y[480:]), **args)


def test_given_noise_multiplier_is_the_plans_and_its_eps_is_the_accountants():
    from flower_dp import GaussianStep, rigorous_epsilon

    z = 1.3
    run = _small(noise_multiplier=z, clip=0.5, delta=1e-5)
    plan = run.plan
    for i in range(3):
        assert plan.noise_std[i][0] == pytest.approx(z * 0.5 / 16, rel=1e-12)
        assert plan.noise_multiplier[i].tolist() == pytest.approx([z] * 8, rel=1e-12)
    spent = run.privacy_spent()
    assert spent.num_releases == 8 and spent.delta == 1e-5
    want = max(rigorous_epsilon([GaussianStep(q=q, noise_multiplier=z, count=8)], 1e-5) for q in plan.q)
    assert spent.epsilon == pytest.approx(want, rel=1e-9)


def test_target_epsilon_is_met_and_the_result_is_the_runners():
    run = _small(target_epsilon=2.0, delta=1e-5)
    spent = run.privacy_spent()
    assert 1.9 < spent.epsilon <= 2.0 + 1e-6
    assert [h["k"] for h in run.history] == [4, 8] and run.status == "finished"
    assert math.isfinite(run.final_accuracy) and run.out_dir is None


def test_budget_arguments_are_checked():
    with pytest.raises(ValueError, match="not both"):
        _small(target_epsilon=2.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="noise_multiplier is supported for.*dyn_d2p.*target_epsilon"):
        _small(noise_multiplier=1.0, algorithm="dyn_d2p")
    with pytest.raises(ValueError, match="backend"):
        _small(target_epsilon=2.0, backend="spark")


def test_stop_and_resume_ends_with_the_uninterrupted_numbers(tmp_path, monkeypatch):
    from flower_dp.experiments.runner import STOP_FILE_ENV

    whole = _small(target_epsilon=2.0, reproducible=True, out_dir=tmp_path / "whole")
    stop = tmp_path / "STOP"
    stop.touch()
    monkeypatch.setenv(STOP_FILE_ENV, str(stop))
    first = _small(target_epsilon=2.0, reproducible=True, out_dir=tmp_path / "cut")
    assert first.status == "stopped" and [h["k"] for h in first.history] == [4]
    monkeypatch.delenv(STOP_FILE_ENV)
    rest = _small(target_epsilon=2.0, reproducible=True, out_dir=tmp_path / "cut", resume=True)
    assert rest.status == "finished"
    assert rest.history == whole.history
    assert rest.privacy_spent().epsilon == whole.privacy_spent().epsilon
    with pytest.raises(Exception, match="different config"):  # other data: a different config, refused
        from flower_dp import train_private

        x, y = _data(seed=9)
        train_private(_model, (x[:480], y[:480]), (x[480:], y[480:]), n_nodes=3, num_iters=8, eval_every=4,
                      batch_size=16, lr=0.1, seed=2, target_epsilon=2.0, reproducible=True,
                      out_dir=tmp_path / "cut", resume=True)


@pytest.mark.flower
@pytest.mark.parametrize("backend", ["ray", "flower"])
def test_ray_and_flower_backends_give_the_inprocess_numbers(tmp_path, backend):
    """backend="ray": the host actors under this process's run engine; "flower": a Flower simulation whose own Ray
    head runs with token authentication (its simulation must still join it)."""
    torch.set_num_threads(1)
    ref = _small(target_epsilon=2.0, reproducible=True)
    ray = _small(target_epsilon=2.0, reproducible=True, backend=backend, num_hosts=1, out_dir=tmp_path)
    assert ray.status == "finished" and [h["k"] for h in ray.history] == [4, 8] and ray.backend == backend
    if backend == "ray":
        assert ray.history == ref.history and ray.plan is not None
    for mine, theirs in zip(ray.history, ref.history):
        assert mine["acc_avg"] == theirs["acc_avg"] and mine["test_loss_avg"] == theirs["test_loss_avg"]
    assert ray.privacy_spent().epsilon == ref.privacy_spent().epsilon
