#!/usr/bin/env bash
# README command 1: install flower-dp and run the quickstart.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
if .venv/bin/flower-dp --help | grep -q quickstart; then
  exec .venv/bin/flower-dp quickstart "$@"
else
  exec .venv/bin/flower-dp --help
fi
