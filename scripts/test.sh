#!/usr/bin/env bash
# README command 2: install flower-dp with its test extras and run the whole test suite.
# Exits non-zero when a test fails or when no test ran (pytest exit code 5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" test
cd "$ROOT"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi
exit "$rc"
