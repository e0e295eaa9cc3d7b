"""scripts/deadline_share.py: the deadline check drops the least advanced runs when the rest would miss it."""

import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("deadline_share", ROOT / "scripts" / "deadline_share.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Proc:
    def __init__(self):
        self.killed = False

    def poll(self):
        return 0 if self.killed else None

    def terminate(self):
        self.killed = True


def _history(d: Path, k: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "history.csv").write_text("k,acc_avg\n" + "".join(f"{j},0.5\n" for j in range(250, k + 1, 250)))


def test_check_keeps_the_runs_that_fit_and_drops_the_least_advanced(tmp_path, capsys):
    mod = _module()
    ids = [f"r-{i}" for i in range(4)]
    procs = {r: _Proc() for r in ids}
    run_dir = lambda r: tmp_path / r  # noqa: E731
    args = SimpleNamespace(num_iters=3000, warmup_s=0.0)
    now = time.monotonic()
    # 100 s ago each run was at k = 250; now at 500, 750, 1000, 1250: 2.5-10 it/s each, 25 it/s together
    first_seen = {r: (now - 100.0, 250) for r in ids}
    for i, r in enumerate(ids):
        _history(run_dir(r), 500 + 250 * i)
    dropped: list[str] = []
    # 200 s left: at 25 it/s in all, 4,500 iterations fit (90 %); the two most advanced need 1,750 + 2,000 = 3,750
    assert mod._check(args, procs, run_dir, first_seen, dropped, now - 300.0, now + 200.0)
    assert dropped == ["r-0", "r-1"] and procs["r-0"].killed and procs["r-1"].killed
    assert not procs["r-2"].killed and not procs["r-3"].killed
    assert set(first_seen) == {"r-2", "r-3"}  # rates are measured again without the dropped runs
    assert "dropped r-0 at k = 500" in capsys.readouterr().out
    # with time enough, nothing is dropped
    assert mod._check(args, procs, run_dir, first_seen, dropped, now - 300.0, now + 10_000.0)
    assert dropped == ["r-0", "r-1"]
    # no run left: the check says so
    for p in procs.values():
        p.terminate()
    assert not mod._check(args, procs, run_dir, {}, dropped, now, now + 10.0)


def test_unpack_never_mixes_a_packed_run_with_one_the_sweep_started(tmp_path):
    """unpack: a packed run goes in only where the sweep has not started it; a started one keeps its own files."""
    import json
    import tarfile

    mod = _module()
    share = tmp_path / "share"
    for rid in ("run-a", "run-b"):
        (share / rid).mkdir(parents=True)
        (share / rid / "results.json").write_text(json.dumps({"status": "finished", "from": "gpu"}))
        (share / rid / "history.csv").write_text("k,acc_avg\n3000,0.7\n")
    tarball = tmp_path / "share.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for rid in ("run-a", "run-b"):
            for f in sorted((share / rid).iterdir()):
                tar.add(f, arcname=f"{rid}/{f.name}")
    runs = tmp_path / "runs"
    (runs / "run-a").mkdir(parents=True)                      # made by the sweep, not started: takes the share
    (runs / "run-b").mkdir()
    (runs / "run-b" / "checkpoint.pt").write_bytes(b"cpu")     # started here: its own run stands
    got = mod.unpack(tarball, runs)
    assert got == {"unpacked": ["run-a"], "skipped": ["run-b"]}
    assert json.loads((runs / "run-a" / "results.json").read_text())["from"] == "gpu"
    assert not (runs / "run-b" / "results.json").exists() and (runs / "run-b" / "checkpoint.pt").read_bytes() == b"cpu"


def test_finished_counts_what_the_sweep_reuses(tmp_path):
    """A run is packed when the sweep would reuse it: finished or stopped by its privacy budget, not running."""
    import json

    from flower_dp.reproduce.core import _DONE

    mod = _module()
    for status in (*_DONE, "running", "stopped"):
        d = tmp_path / status
        d.mkdir()
        (d / "results.json").write_text(json.dumps({"status": status}))
        assert mod._finished(d) is (status in _DONE)
    assert not mod._finished(tmp_path / "missing")
