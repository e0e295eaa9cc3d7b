#!/usr/bin/env bash
# Issue 28's remaining sweeps in one call on a 16-core machine: every sweep runs at once (--jobs summing to 15, one
# torch thread each), each under `timeout $LIMIT`; each sweep's output folder (records, reports; no checkpoints)
# is tarred into $OUT/<name>.tgz. Run from the repo root:  OUT=/some/dir bash runs/device_sweep.sh
# SMOKE=1 runs every sweep at --scale smoke into /tmp (a check of the script, nothing committed).
# The repo need not be pip-installed: a sitecustomize on PYTHONPATH maps flower_dp.clients / flower_dp.strategies
# to the top-level clients/ and strategies/ folders (what pyproject's package-dir does), in every spawned worker too.
set -u
REPO=$PWD
OUT=${OUT:?set OUT to the folder the tarballs go to}
LIMIT=${LIMIT:-480}
# STOP_MARGIN s before the limit each sweep gets `touch DIR/STOP`: its runs end at their segment's end, checkpointed,
# and nothing is charged twice on resume; `timeout` (which kills mid-segment) is only the backstop
STOP_MARGIN=${STOP_MARGIN:-150}
SMOKE=${SMOKE:-0}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1 CI=1
export FLOWER_DP_DATA=$REPO/.devdata/fashion-mnist
SHIM=$(mktemp -d /tmp/fdp-shim.XXXXXX)
cat > "$SHIM/sitecustomize.py" <<'PY'
import importlib.util, os, sys
_ROOT = os.environ["FLOWER_DP_REPO"]
_MAP = {"flower_dp.clients": "clients", "flower_dp.strategies": "strategies"}
class _RepoLayout:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in _MAP:
            folder = os.path.join(_ROOT, _MAP[name])
            return importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                          submodule_search_locations=[folder])
        return None
sys.meta_path.insert(0, _RepoLayout)
PY
export FLOWER_DP_REPO=$REPO
PYPATH=$SHIM:$REPO
# dp_accounting (and its needs) from the carried wheels, where this python lacks it
if ! python3 -c "import dp_accounting" 2>/dev/null && ls "$REPO"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$REPO"/.whl/*.whl || exit 1
  PYPATH=$PYPATH:/tmp/site
fi
export PYTHONPATH=$PYPATH
python3 -c "import flower_dp.clients as c, flower_dp.reproduce as r, torch; print('flower_dp.clients from', c.__file__, '| torch', torch.__version__)" || exit 1

# name | jobs | paper | table | scale | output folder | extra args   (jobs sum to 15)
SWEEPS=(
  "partpsp-fig2-diag-paper|4|partpsp|fig2-diag|paper|docs/results/partpsp-fig2-diag-paper|"
  "partpsp-table2-aligned-paper|3|partpsp|table2-aligned|paper|docs/results/partpsp-table2-aligned-paper|--seeds 1"
  "partpsp-pattern-diag-paper|1|partpsp|pattern-diag|paper|docs/results/partpsp-pattern-diag-paper|--seeds 1"
  "dyn-d2p-clip-scale-paper|5|dyn-d2p|clip-scale|paper|docs/results/dyn-d2p-clip-scale-paper|--seeds 1"
  "dp-csgp-diag-paper|2|dp-csgp|diag|paper|docs/results/dp-csgp-diag-paper|--seeds 1"
)
START=$(date +%s)
pids=()
for entry in "${SWEEPS[@]}"; do
  IFS='|' read -r name jobs paper table scale dir extra <<<"$entry"
  if [ "$SMOKE" = 1 ]; then scale=smoke; dir=/tmp/device-sweep-smoke/$name; jobs=1; fi
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  ( ( sleep $(( LIMIT > STOP_MARGIN ? LIMIT - STOP_MARGIN : 1 )); touch "$dir/STOP" ) & watchdog=$!
    timeout "$LIMIT" python3 -m flower_dp.cli reproduce "$paper" --table "$table" --scale "$scale" --jobs "$jobs" \
      --out "$dir" --no-estimate $extra >"$OUT/$name.log" 2>&1; echo "$?" >"$OUT/$name.rc"
    kill "$watchdog" 2>/dev/null ) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "all sweeps ended after $(( $(date +%s) - START )) s"
for entry in "${SWEEPS[@]}"; do
  IFS='|' read -r name jobs paper table scale dir extra <<<"$entry"
  if [ "$SMOKE" = 1 ]; then dir=/tmp/device-sweep-smoke/$name; fi
  # the records and reports; checkpoints are left behind (each run's results.json says how far it got)
  tar -czf "$OUT/$name.tgz" --exclude='checkpoint*' --exclude='*.pt' --exclude='.estimate-probe' --exclude=STOP "$dir" 2>/dev/null
  n_done=$(grep -l '"status": "\(finished\|stopped_by_budget\)' "$dir"/runs/*/results.json \
    "$dir"/runs/*/reproduce_doc.json 2>/dev/null | wc -l)
  n_runs=$(ls -d "$dir"/runs/*/ 2>/dev/null | wc -l)
  printf '%-32s rc=%-4s run folders %3s, finished %3s, tgz %s  | %s\n' "$name" "$(cat "$OUT/$name.rc")" "$n_runs" \
    "$n_done" "$(du -h "$OUT/$name.tgz" | cut -f1)" "$(grep -E 'claims reproduced|estimate|Error|error' "$OUT/$name.log" | tail -1)"
done
# the logs travel in one file (at most 8 files come back)
tail -n 40 "$OUT"/*.log > "$OUT/logs.txt" 2>&1; rm -f "$OUT"/*.log "$OUT"/*.rc
