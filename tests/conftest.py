"""Test-wide set-up, done before any test module imports numpy, Ray or Flower's simulation.

* Every Ray instance a test starts binds 127.0.0.1 (see :mod:`flower_dp._ray_local`).
* numpy's OpenBLAS runs single-threaded: its thread pool hung in ``exec_blas`` (a 100x10 matmul in a
  Flower ServerApp thread, Ray running beside it; seen with py-spy), which stalled CI.
  ``scripts/test.sh`` exports the same; this covers a plain ``pytest`` run.
* Under pytest-xdist (``scripts/test.sh`` runs two workers), every test that starts Ray, a Flower run, a
  SuperLink/SuperNode or a ``ray start`` cluster is in one ``xdist_group`` ("engines") and so runs on one worker,
  one at a time and in file order, as in a serial run: Ray instances, Flower daemons and raylet checks never
  overlap.  Every other file is a group of its own (its module fixtures built once) and runs on the other worker
  beside them.  The engines run first: they are the longest unit.  A plain ``pytest`` run keeps the file order.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from flower_dp._ray_local import use_loopback  # noqa: E402  (after the environment is set)

use_loopback()


import pytest  # noqa: E402

#: Test files whose every test starts (or shares) a Ray instance, a Flower run or a Ray cluster.  Tests marked
#: ``flower`` in other files join them.
ENGINE_FILES = frozenset({
    "test_flower_push_sum.py", "test_flower_push_sum_algorithms.py", "test_flower_run.py", "test_gau_lrq_deployment.py",
    "test_gau_lrq_flower.py", "test_gau_lrq_flower_dropin.py", "test_gossip_ray.py", "test_node_worker.py",
    "test_noise_cuda.py", "test_push_sum_deployment.py", "test_push_sum_dropin.py", "test_push_sum_faults.py",
    "test_push_sum_readme_diff.py", "test_push_sum_relay.py", "test_ray_cluster.py", "test_ray_loopback.py",
    "test_ray_two_raylets.py", "test_readme_gau_lrq_diff.py", "test_releases.py",
})
ENGINES = "engines"


def _is_engine(item) -> bool:
    return item.path.name in ENGINE_FILES or item.get_closest_marker("flower") is not None


def pytest_collection_modifyitems(config, items):
    if not (getattr(config, "workerinput", None) is not None or getattr(config.option, "numprocesses", None)):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(ENGINES if _is_engine(item) else item.path.name))
    items.sort(key=lambda item: not _is_engine(item))  # stable: the engines first, each part in file order
