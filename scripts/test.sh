#!/usr/bin/env bash
# README command 2: install flower-dp with its test extras and run the whole test suite.
# Exits non-zero when a test fails, when no test ran (pytest exit code 5) or when a run hangs.
#
# The tests of ISOLATED each run in a pytest process of their own.  The Gau-LRQ Flower tests
# (tests/test_gau_lrq_flower*.py) run in the main suite: their simulations run under `flwr run`
# (flower_dp.experiments.flower_run: SuperLink, Ray head and apps in other processes), so the pytest process never
# starts Ray; after an in-process Ray test in the same process they take as long as alone.  Every pytest
# process runs under a wall-clock limit, and pytest-timeout (pyproject.toml) fails a single hung test with
# its stack, so the suite always ends.
#
# The main suite runs on FLOWER_DP_TEST_WORKERS pytest-xdist workers (default 2, one per core; 0 runs it in this
# process).  tests/conftest.py keeps every test that starts Ray or Flower on one worker, one at a time, while the
# other worker runs the rest beside them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" test
cd "$ROOT"
# numpy's bundled OpenBLAS spun forever in exec_blas (99 % CPU, no worker thread running) on a 100x10 matmul in
# a Flower ServerApp thread while Ray ran beside it (py-spy, 2026-11-23): the hang behind the earlier CI timeout.
# One OpenBLAS thread runs the product in the calling thread.  torch uses its own thread pool and is not affected.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
ISOLATED=(tests/test_readme_gau_lrq_diff.py)
MAIN_LIMIT_S="${FLOWER_DP_TEST_LIMIT_S:-4500}"   # the main suite: ~40 min on an idle 2-core machine (all of CI took 3109 s at stop 19); 75 min keeps CI under 90
ONE_LIMIT_S=900                                  # one isolated test takes < 1 min

status=0
check() {  # check RC WHAT: remember the first failure, say what it was
  local rc="$1" what="$2"
  if [ "$rc" = 0 ]; then return; fi
  if [ "$rc" = 5 ]; then echo "error: pytest collected no tests in $what" >&2; rc=1; fi
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "error: $what ran past its time limit and was stopped" >&2; fi
  if [ "$status" = 0 ]; then status="$rc"; fi
}

set +e
WORKERS="${FLOWER_DP_TEST_WORKERS:-2}"
PARALLEL=()
if [ "$WORKERS" != 0 ]; then PARALLEL=(-n "$WORKERS" --dist loadscope --no-loadscope-reorder); fi
timeout -k 60 "$MAIN_LIMIT_S" .venv/bin/python -m pytest "${PARALLEL[@]}" "${ISOLATED[@]/#/--ignore=}" "$@"
check $? "the main test suite"
for file in "${ISOLATED[@]}"; do
  ids=$(.venv/bin/python -m pytest -q --collect-only "$file" "$@" 2>/dev/null | grep "^$file::")
  if [ -z "$ids" ]; then check 5 "$file"; fi
  for id in $ids; do
    timeout -k 30 "$ONE_LIMIT_S" .venv/bin/python -m pytest "$id" "$@"
    check $? "$id"
  done
done
set -e
exit "$status"
