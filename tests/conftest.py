"""Test-wide set-up, done before any test module imports numpy, Ray or Flower's simulation.

* Every Ray instance a test starts binds 127.0.0.1 (see :mod:`flower_dp._ray_local`).
* numpy's OpenBLAS runs single-threaded: its thread pool hung in ``exec_blas`` (a 100x10 matmul in a
  Flower ServerApp thread, Ray running beside it; seen with py-spy), which stalled CI.
  ``scripts/test.sh`` exports the same; this covers a plain ``pytest`` run.
* Under pytest-xdist (``scripts/test.sh`` runs two workers), every test that starts Ray, a Flower run, a
  SuperLink/SuperNode or a ``ray start`` cluster is in one scheduling scope ("engines", this file's
  ``pytest_xdist_make_scheduler``) and so runs on one worker, one at a time and in file order, as in a serial run: Ray instances, Flower daemons and raylet checks never
  overlap.  Every other file is a group of its own (its module fixtures built once) and runs on the other worker
  beside them.  The engines run first: they are the longest unit.  A plain ``pytest`` run keeps the file order.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from flower_dp._ray_local import use_loopback  # noqa: E402  (after the environment is set)

use_loopback()


import ast  # noqa: E402
from functools import lru_cache  # noqa: E402
from pathlib import Path  # noqa: E402

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
TESTS = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def _flower_marked(file_name: str) -> frozenset[str]:
    """The test functions of ``file_name`` decorated with ``pytest.mark.flower`` (read from the source, so that the
    scheduler, which sees node ids only, and the workers, which see items, agree)."""
    path = TESTS / file_name
    if not path.is_file():
        return frozenset()
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                "mark.flower" in ast.unparse(d) for d in node.decorator_list):
            names.add(node.name)
    return frozenset(names)


def is_engine(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (``tests/test_x.py::test_y[param]``) starts Ray, Flower or a cluster."""
    file_part, _, rest = nodeid.partition("::")
    name = Path(file_part).name
    return name in ENGINE_FILES or rest.split("[", 1)[0].split("::")[-1] in _flower_marked(name)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with two kinds of scope: every engine test in one ("engines": one worker, one at a
    time, in collection order) and every other file a scope of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class EnginesApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ENGINES if is_engine(nodeid) else nodeid.split("::", 1)[0]

    return EnginesApart(config, log)


def pytest_collection_modifyitems(config, items):
    if getattr(config, "workerinput", None) is not None:  # a worker: its order is the scheduler's queue
        items.sort(key=lambda item: not is_engine(item.nodeid))  # stable: the engines first, each part in file order
