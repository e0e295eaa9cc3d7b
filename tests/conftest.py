"""Test-wide set-up, done before any test module imports numpy, Ray or Flower's simulation.

* Every Ray instance a test starts binds 127.0.0.1 (see :mod:`flower_dp._ray_local`).
* numpy's OpenBLAS runs single-threaded: its thread pool hung in ``exec_blas`` (a 100x10 matmul in a
  Flower ServerApp thread, Ray running beside it; seen with py-spy), which stalled CI.
  ``scripts/test.sh`` exports the same; this covers a plain ``pytest`` run.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from flower_dp._ray_local import use_loopback  # noqa: E402  (after the environment is set)

use_loopback()
