#!/usr/bin/env bash
# Shared set-up: a virtual environment in .venv with flower-dp installed (editable),
# plus the offline Fashion-MNIST Debian package when we are root on Debian.
# Usage: source scripts/setup_env.sh [EXTRAS]   (EXTRAS e.g. "test")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "setup: creating the virtual environment $ROOT/.venv"
  "$PY" -m venv "$ROOT/.venv"
fi
"$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
spec="$ROOT"
if [ -n "${1:-}" ]; then spec="$ROOT[$1]"; fi
echo "setup: installing flower-dp${1:+[$1]} (editable) and its dependencies (the first time: torch and Flower, a few GB)"
# setuptools notes every editable install with "Editable installation. Please be careful with folders in your
# working directory ..." (10 lines, nothing to act on); only that note is silenced, every other warning still shows.
PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation.:UserWarning" \
  "$ROOT/.venv/bin/python" -m pip install -q -e "$spec"
echo "setup: flower-dp $("$ROOT/.venv/bin/python" -c 'import flower_dp; print(flower_dp.__version__)') installed in $ROOT/.venv"
if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) >/dev/null \
    || echo "warning: could not install dataset-fashion-mnist; Fashion-MNIST runs will need --data-root" >&2
fi
