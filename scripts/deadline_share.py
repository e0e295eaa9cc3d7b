"""Run a share of a reproduction's runs before a deadline, then pack the finished ones.

    PYTHONPATH=. python scripts/deadline_share.py PAPER TABLE SCALE OUT_DIR TARBALL RUN_ID [RUN_ID ...] \
        --deadline-s 500 --num-iters K [--device cuda] [--seeds 2]

(the run ids are the sweep's, as in its ``records.csv``; ``flower-dp reproduce ... --runs nothing`` lists them all in
its error.)

For a machine held for a fixed time (a lent GPU): each run id gets its own process
(``flower_dp.reproduce.reproduce(..., runs=[run_id], out=OUT_DIR/run_id)``, secret noise, one torch thread), all at
once.  Every few seconds the script reads how far each run is (``history.csv``: one row per evaluation) and, once the
rates are measured, stops the least advanced run whenever the slowest one would miss the deadline: the others then
get its share of the GPU and the cores.  At the deadline (or when all are done) it packs ``runs/<run_id>/`` of every
*finished* run, without its checkpoint, into TARBALL.  Unpacked into the full sweep's ``--out/runs/``, those runs are
reused as they stand (a run's device is not part of its identity; each record names it); an unfinished run is
dropped whole, never resumed on another device.  A status line per check goes to stdout, a JSON summary beside the
tarball.

    python scripts/deadline_share.py unpack TARBALL SWEEP_OUT/runs

puts the packed runs into the sweep's run folders, each only where the sweep has not started that run (no
``results.json``, no ``checkpoint.pt``): a run the sweep already started keeps its own results, never a mix of
two runs' files.  Plain ``tar x`` while the sweep runs can race a worker that starts the same run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

CHILD = ("import sys; from flower_dp.reproduce import reproduce; "
         "reproduce(sys.argv[1], table=sys.argv[2], scale=sys.argv[3], out=sys.argv[4], runs=[sys.argv[5]], "
         "device=sys.argv[6], estimate=False, seeds=int(sys.argv[7]))")


def _k_done(run_dir: Path) -> int:
    """The last evaluated iteration of a run (0 before its first evaluation)."""
    try:
        with open(run_dir / "history.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        return int(float(rows[-1]["k"])) if rows else 0
    except (OSError, KeyError, ValueError, IndexError):
        return 0


def _finished(run_dir: Path) -> bool:
    """Whether the run is done as the sweep counts it (``flower_dp.reproduce.core._DONE``: finished, or stopped by
    its privacy budget), so the sweep reuses what this packs."""
    from flower_dp.reproduce.core import _DONE
    from flower_dp.results import read_json

    doc = read_json(run_dir / "results.json")
    return bool(doc) and doc.get("status") in _DONE


def _check(args, procs, run_dir, first_seen, dropped, t0, deadline) -> bool:
    """One look at the runs: print their progress, drop the least advanced if the rest would miss the deadline;
    False once no run is left."""
    now = time.monotonic()
    active = [r for r, p in procs.items() if p.poll() is None and r not in dropped]
    ks = {r: _k_done(run_dir(r)) for r in procs}
    for r in active:
        if ks[r] > 0 and r not in first_seen:
            first_seen[r] = (now, ks[r])
    rates = {}
    for r in active:
        if r in first_seen and ks[r] > first_seen[r][1]:
            t1, k1 = first_seen[r]
            rates[r] = (ks[r] - k1) / (now - t1)
    eta = {r: (args.num_iters - ks[r]) / rates[r] for r in rates}
    print(f"[{now - t0:6.0f} s] active {len(active)}, k " + " ".join(f"{r.split('-', 1)[1]}={ks[r]}" for r in active)
          + (f", slowest eta {max(eta.values()):.0f} s, left {deadline - now:.0f} s" if eta else ""), flush=True)
    if not active:
        return False
    if (now - t0 > args.warmup_s and len(eta) == len(active) and len(active) > 1
            and max(eta.values()) > deadline - now):
        # the runs share one device: keep the most advanced m runs whose remaining iterations fit the time left
        # at the measured total rate (10 % margin), dropping at least one
        total, keep, need = sum(rates.values()), 0, 0.0
        for r in sorted(active, key=lambda r: -ks[r]):
            need += args.num_iters - ks[r]
            if need > 0.9 * total * (deadline - now):
                break
            keep += 1
        victims = sorted(active, key=lambda r: ks[r])[:max(1, len(active) - max(keep, 1))]
        for victim in victims:
            procs[victim].terminate()
            dropped.append(victim)
            print(f"  dropped {victim} at k = {ks[victim]}: the rest would miss the deadline", flush=True)
        first_seen.clear()
        first_seen.update({r: (now, ks[r]) for r in active if r not in victims})  # re-measure the rates without them
    return True


def unpack(tarball: Path, runs_dir: Path) -> dict[str, list[str]]:
    """Extract each packed run into ``runs_dir/<run_id>/`` unless the sweep there has started it; return which runs
    were put in and which were skipped."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise SystemExit(f"unpack: {str(runs_dir)!r} is not a folder; pass the sweep's --out/runs folder")
    put, skipped = [], []
    with tarfile.open(tarball, "r:gz") as tar:
        members: dict[str, list[tarfile.TarInfo]] = {}
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if not m.isfile() or len(parts) != 2 or ".." in parts:
                raise SystemExit(f"unpack: {m.name!r} in {str(tarball)!r} is not RUN_ID/FILE; not a share packed by "
                                 "this script")
            members.setdefault(parts[0], []).append(m)
        for rid, ms in members.items():
            dest = runs_dir / rid
            if (dest / "results.json").exists() or (dest / "checkpoint.pt").exists():
                skipped.append(rid)
                print(f"skipped {rid}: the sweep here has started or finished it (its own run stands)", flush=True)
                continue
            dest.mkdir(exist_ok=True)
            # results.json last: a sweep that looks in between sees no finished run, not a half-copied one
            for m in sorted(ms, key=lambda m: m.name.endswith("/results.json")):
                tar.extract(m, runs_dir, filter="data")
            put.append(rid)
    print(f"unpacked {len(put)} run(s) into {runs_dir}, skipped {len(skipped)}", flush=True)
    return {"unpacked": put, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["unpack"]:
        if len(argv) != 3:
            raise SystemExit("usage: deadline_share.py unpack TARBALL SWEEP_OUT/runs")
        unpack(Path(argv[1]), Path(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paper")
    ap.add_argument("table")
    ap.add_argument("scale")
    ap.add_argument("out", type=Path)
    ap.add_argument("tarball", type=Path)
    ap.add_argument("run_ids", nargs="+")
    ap.add_argument("--deadline-s", type=float, required=True, help="seconds from now to pack what finished")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--num-iters", type=int, required=True, help="K of these runs (to turn history rows into rates)")
    ap.add_argument("--seeds", type=int, default=2, help="the table's --seeds (run ids carry the seed)")
    ap.add_argument("--warmup-s", type=float, default=90.0, help="no run is dropped before this")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, FLOWER_DP_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs: dict[str, subprocess.Popen] = {}
    for rid in args.run_ids:
        log = open(args.out / f"{rid}.log", "w")
        procs[rid] = subprocess.Popen([sys.executable, "-c", CHILD, args.paper, args.table, args.scale,
                                       str(args.out / rid), rid, args.device, str(args.seeds)],
                                      stdout=log, stderr=subprocess.STDOUT, env=env)
    first_seen: dict[str, tuple[float, int]] = {}
    dropped: list[str] = []

    def run_dir(rid: str) -> Path:
        return args.out / rid / "runs" / rid

    while time.monotonic() < deadline:
        try:
            if not _check(args, procs, run_dir, first_seen, dropped, t0, deadline):
                break
        except Exception as exc:  # the runs go on: a failed check never loses them
            print(f"  check failed: {exc!r}", flush=True)
        time.sleep(10)
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    done = [r for r in procs if _finished(run_dir(r))]
    with tarfile.open(args.tarball, "w:gz") as tar:
        for r in done:
            for f in sorted(run_dir(r).iterdir()):
                if f.name != "checkpoint.pt":
                    tar.add(f, arcname=f"{r}/{f.name}")
    summary = {"finished": done, "dropped": dropped, "unfinished": [r for r in procs if r not in done],
               "wall_s": round(time.monotonic() - t0, 1), "k": {r: _k_done(run_dir(r)) for r in procs}}
    args.tarball.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
