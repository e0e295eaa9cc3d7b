"""Shared helpers of the benchmark suite: interleaved timing, machine description, versions.

Every figure of the suite is a ratio against a yardstick measured in the same run, side by
side (interleaved repeats, median), so that load from other processes on a shared machine
cancels out as far as possible.  Absolute numbers are reported too, but only ratios compare.
"""

from __future__ import annotations

import os
import platform
import random
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["interleaved_times", "interleaved_medians", "machine_info", "versions", "rss_mb", "missing", "timed",
           "proc_memory_mb", "ray_worker_pids", "PeakSampler"]


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each callable (see :func:`interleaved_times`)."""
    return {k: statistics.median(v) for k, v in interleaved_times(fns, repeats, warmup).items()}


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2,
                      shuffle_seed: int | None = None) -> dict[str, list[float]]:
    """Wall times (seconds) of each zero-argument callable, timed in round-robin order.

    Parameters
    ----------
    fns : dict name -> callable
        Each call is one unit of work (e.g. one training step).
    repeats : int
        Timed calls per callable; each round calls every callable once, in order.
    warmup : int
        Untimed rounds first (allocator, lazy init, caches).
    shuffle_seed : int, optional
        Call the callables of each timed round in a fresh random order (seeded): then no callable
        always runs right after the same one (one that leaves the caches cold, e.g. a step that
        materializes per-sample gradients, would otherwise always slow down the same successor).

    Returns
    -------
    dict name -> list of float
        Seconds of each timed call.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    rng = None if shuffle_seed is None else random.Random(shuffle_seed)
    for _ in range(repeats):
        if rng is not None:
            rng.shuffle(order)
        for name in order:
            fn = fns[name]
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """Run ``fn`` once; returns (result, seconds)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux ``ru_maxrss`` is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Current resident set size in MiB (from /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return rss_mb()


def proc_memory_mb(pid: int, pss: bool = False) -> dict[str, float]:
    """``{"rss", "hwm"}`` (VmRSS, VmHWM: the process's peak) of process ``pid`` in MiB from /proc; with ``pss`` also
    ``"pss"`` (its proportional share of shared pages: the sum over processes counts a shared page once).
    Empty when the process is gone."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{int(pid)}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line[2:5].lower()] = int(line.split()[1]) / 1024.0
        if pss:
            with open(f"/proc/{int(pid)}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        out["pss"] = int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def ray_worker_pids(root: int | None = None) -> dict[int, str]:
    """The Ray worker processes this process started (``ray::...`` descendants of ``root``, default this
    process): ``{pid: process title}`` (host actors ``ray::_Host``, Flower's ``ray::ClientAppActor``, idle
    workers; not Ray's agents, raylet or GCS).  Other users' Ray instances on the machine are not descendants, so
    they are left out."""
    kids = _children()
    out: dict[int, str] = {}
    stack = list(kids.get(os.getpid() if root is None else int(root), []))
    while stack:
        pid = stack.pop()
        stack.extend(kids.get(pid, []))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                title = fh.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        name = title.split()[0] if title else ""
        if name.startswith("ray::") and not name.endswith("Agent"):  # not the dashboard / runtime-env agents
            out[pid] = name
    return out


class PeakSampler:
    """Polls ``measure() -> MiB`` every ``period_s`` in a thread; :meth:`stop` returns the largest value seen
    (the peak of a sum of processes' RSS, which their own VmHWM cannot give)."""

    def __init__(self, measure: Callable[[], float], period_s: float = 0.25) -> None:
        self.measure, self.period_s, self.peak = measure, float(period_s), 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.peak = max(self.peak, float(self.measure()))
            except Exception:  # noqa: BLE001 - a process vanished mid-read: next sample
                pass
            if self._stop.wait(self.period_s):
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        try:
            self.peak = max(self.peak, float(self.measure()))
        except Exception:  # noqa: BLE001
            pass
        return self.peak


def machine_info() -> str:
    """One line: CPU model, logical cores, load average, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = "load avg %.1f/%.1f/%.1f" % os.getloadavg()
    except OSError:
        load = "load avg n/a"
    return f"{cpu}; {os.cpu_count()} logical cores; {load}; {platform.system()} {platform.release()}"


def versions() -> dict[str, str]:
    """Versions of Python and of the libraries the figures depend on (absent ones omitted)."""
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "numpy", "scipy", "flwr", "ray", "dp_accounting", "flower_dp"):
        try:
            m = __import__(mod)
            ver = getattr(m, "__version__", None)
            if ver is None:  # dp_accounting has no __version__: its distribution's metadata has it
                from importlib.metadata import PackageNotFoundError, version

                try:
                    ver = version(mod.replace("_", "-"))
                except PackageNotFoundError:
                    ver = "unknown"
            out[mod] = str(ver)
        except Exception:  # noqa: BLE001 -- a missing optional library is just not listed
            continue
    return out


def missing(what: str, exc: BaseException | None = None) -> dict:
    """The entry for a benchmark whose code under test does not exist (yet)."""
    note = f"missing: {what}"
    if exc is not None:
        note += f" ({type(exc).__name__}: {exc})"
    return {"value": None, "note": note}
