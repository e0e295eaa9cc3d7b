#!/usr/bin/env bash
# README command 2: install flower-dp with its test extras and run the whole test suite.
# Exits non-zero when a test fails or when no test ran (pytest exit code 5).
# The Gau-LRQ Flower simulations run in a pytest process of their own: Flower's simulation must
# start its own Ray, which an earlier in-process Ray test can leave in a state it does not expect.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" test
cd "$ROOT"
ISOLATED=tests/test_gau_lrq_flower.py
set +e
.venv/bin/python -m pytest --ignore="$ISOLATED" "$@"
rc1=$?
.venv/bin/python -m pytest "$ISOLATED" "$@"
rc2=$?
set -e
for rc in "$rc1" "$rc2"; do
  if [ "$rc" = 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi
  if [ "$rc" != 0 ]; then exit "$rc"; fi
done
exit 0
