#!/usr/bin/env bash
# The noise-binds sweeps of issue 41, cheapest first, ONE process at a time (one torch thread), each resuming from
# its folder: finished runs are reused, an interrupted run continues from its checkpoint.  After each command the
# folder's finished files (records, summary, claims, report, plots; never runs/) are committed on the current branch.
#
#   nohup setsid scripts/noise_binds_sweep.sh > runs/noise_binds_sweep.log 2>&1 &
#
# Stop: `touch docs/results/noise-binds.STOP` (no new command starts; the running one finishes) or `touch
# docs/results/<folder>/STOP` (the running sweep stops at the end of its segments, nothing charged twice).
# Resume: the same command.  NO_COMMIT=1 leaves the commits to you.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 FLOWER_DP_THREADS=1
R=docs/results
FDP=".venv/bin/flower-dp"
[ -x "$FDP" ] || FDP="flower-dp"

commit_folder() {
  local f="$1" i
  [ "${NO_COMMIT:-0}" = 1 ] && return 0
  local py=".venv/bin/python"; [ -x "$py" ] || py=python3
  "$py" -c "from flower_dp.reproduce.cli import write_index; write_index('$R')"  # the index and its scoreboard
  for i in $(seq 1 20); do
    git add -- "$f"/*.json "$f"/*.csv "$f"/*.md "$f"/*.png "$R/README.md" 2>/dev/null
    if git diff --cached --quiet -- "$f" "$R/README.md"; then return 0; fi
    local n
    n=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['records']))" "$f/records.json" 2>/dev/null)
    if git commit -q -m "$(basename "$f"): ${n:-?} finished runs (scripts/noise_binds_sweep.sh)" -- "$f" "$R/README.md"; then
      return 0
    fi
    sleep 15  # another git command holds the index: try again
  done
  echo "noise_binds_sweep: could not commit $f" >&2
}

run() {  # run PAPER TABLE SEEDS FOLDER [--runs PATTERNS]
  local paper="$1" table="$2" seeds="$3" folder="$4"; shift 4
  if [ -e "$R/noise-binds.STOP" ]; then echo "noise_binds_sweep: $R/noise-binds.STOP found, stopping"; exit 0; fi
  echo "== $(date -u +%FT%TZ) $paper $table $* -> $folder"
  "$FDP" reproduce "$paper" --table "$table" --scale paper --seeds "$seeds" --no-estimate --out "$R/$folder" "$@"
  commit_folder "$R/$folder"
}

# seed 0 of Gau-LRQ's private cell first: the pilot of its regime (the later full command reuses it)
run gau-lrq noise-binds 1 gau-lrq-noise-binds --runs 'nb-Gau-LRQ-N960-s0'
run dp-csgp noise-binds 5 dp-csgp-noise-binds
# seed 0 of Dyn-D2P's cells (its clip-only twin resumes the pilot's checkpoint): the pilot of its regime, early
run dyn-d2p noise-binds 1 dyn-d2p-noise-binds --runs 'nb-Dyn-D2P-*-s0'
run partpsp noise-binds 5 partpsp-noise-binds
run gau-lrq noise-binds 5 gau-lrq-noise-binds
run privsgp-vr noise-binds 5 privsgp-vr-noise-binds
run dyn-d2p noise-binds 5 dyn-d2p-noise-binds
for K in 600 1200 1800 3000; do  # the K map one K at a time, so each K's cells are committed as they finish
  run dyn-d2p k-map 3 dyn-d2p-k-map --runs "kmap-*-K$K-s*"
done
run dyn-d2p k-map 3 dyn-d2p-k-map
echo "== $(date -u +%FT%TZ) noise_binds_sweep: all done"
