"""Trace one config value from ``flower-dp run CONFIG`` to the node objects, and count how often it climbs a layer.

Usage::

    python scripts/trace_config_value.py [--config CONFIG.toml] SECTION.KEY [--out DIR]

CONFIG defaults to ``scripts/trace_config_value.toml`` (two nodes, two iterations, synthetic data).  The value
of ``SECTION.KEY`` in CONFIG (e.g. ``algorithm.params.lr``) must be a float that no default or other
key of the config has, so that finding it identifies it.  The script runs ``flower-dp run CONFIG`` in this process
under ``sys.setprofile`` and stops tracing when node 0's constructor returns.  A frame *holds* the value when one
of its arguments is, or contains within three levels (dict values, list items, dataclass fields, attributes of
flower-dp objects), that float; a return *carries* it when its return value does.

The walk is the sequence of calls with the value and returns carrying it.  Each frame is placed in a layer of
docs/architecture.md (application: ``flower_dp.cli`` and ``flower_dp.experiments``; nodes/server: ``clients``
and ``strategies``; core: the rest).  A *climb* is a step of the walk that moves the value from a lower layer to
a higher one: a call with it from a lower-layer frame into a higher-layer function, or a return carrying it into
a higher-layer caller.  The script prints the walk (argument checks in ``flower_dp._checks`` left out) and the
climbs, each with the file and line of the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flower_dp", "clients", "strategies")
RANK = {"application": 0, "nodes/server": 1, "core": 2}
DEFAULT_CONFIG = ROOT / "scripts" / "trace_config_value.toml"


def layer(path: str) -> str:
    """The layer of a source file given relative to the repository root."""
    if path.startswith(("flower_dp/cli.py", "flower_dp/experiments/")):
        return "application"
    if path.startswith(("clients/", "strategies/", "flower_dp/clients/", "flower_dp/strategies/")):
        return "nodes/server"
    return "core"


def holds(obj, value: float, depth: int = 0) -> bool:
    """Whether ``obj`` is, or contains within three levels, the float ``value``."""
    if isinstance(obj, float):
        return obj == value
    if depth >= 3:
        return False
    if isinstance(obj, dict):
        return any(holds(v, value, depth + 1) for v in list(obj.values())[:200])
    if isinstance(obj, (list, tuple)) and len(obj) < 50:
        return any(holds(v, value, depth + 1) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return any(holds(getattr(obj, f.name, None), value, depth + 1) for f in dataclasses.fields(obj))
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict) and type(obj).__module__.split(".")[0] in PACKAGES:
        return any(holds(v, value, depth + 1) for v in list(attrs.values())[:100])
    return False


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the walk: a call with the value, or a return carrying it."""

    kind: str  # "call" or "return"
    depth: int
    where: str  # file:line of the callee (call) or of the caller's call site (return)
    name: str  # the function called or returning
    frm: str  # layer the value leaves
    to: str  # layer the value enters

    @property
    def climb(self) -> bool:
        return RANK[self.to] < RANK[self.frm]


def trace(config: Path, key: str, out_dir: Path) -> list[Step]:
    """Run ``flower-dp run config --out out_dir`` under the profiler and return the walk of ``key``'s value."""
    from flower_dp.cli import main

    raw = tomllib.loads(config.read_text())
    value = raw
    for part in key.split("."):
        value = value[part]
    if not isinstance(value, float):
        raise ValueError(f"{key} = {value!r} in {config}: pick a float value that nothing else in the run has")
    steps: list[Step] = []
    stack: list[tuple[str, int]] = []  # (relative file, line of the current call site) per project frame
    done = False

    prefix = str(ROOT) + os.sep
    files: dict[str, str | None] = {}

    def rel(filename: str) -> str | None:
        """The file relative to the repository root when it is flower-dp's own code, else None (cached)."""
        if filename not in files:
            path = filename[len(prefix):] if filename.startswith(prefix) else ""
            files[filename] = path if path.split(os.sep)[0] in PACKAGES else None
        return files[filename]

    def profile(frame, event, arg):
        nonlocal done
        if done or event not in ("call", "return"):
            return
        f = rel(frame.f_code.co_filename)
        if f is None:
            return
        depth = len(stack)
        if event == "call":
            caller = stack[-1][0] if stack else "flower_dp/cli.py"
            if any(holds(v, value) for v in frame.f_locals.values()):
                steps.append(Step("call", depth, f"{f}:{frame.f_code.co_firstlineno}", frame.f_code.co_name,
                                  layer(caller), layer(f)))
            stack.append((f, frame.f_code.co_firstlineno))
            return
        stack.pop()
        if stack and holds(arg, value):
            back = frame.f_back
            site = f"{stack[-1][0]}:{back.f_lineno if back else '?'}"
            steps.append(Step("return", depth, site, frame.f_code.co_name, layer(f), layer(stack[-1][0])))
        self = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and getattr(self, "node_id", None) == 0 and hasattr(self, "plan"):
            done = True

    sys.setprofile(profile)
    try:
        main(["run", str(config), "--out", str(out_dir)])
    finally:
        sys.setprofile(None)
    return steps


def report(steps: list[Step]) -> str:
    """The walk, one line per step (argument checks left out), then the climbs."""
    shown = [s for s in steps if not s.where.startswith("flower_dp/_checks.py")]
    base = min((s.depth for s in shown), default=0)
    lines = []
    for s in shown:
        arrow = f"-> {s.name}  ({s.where}, {s.to})" if s.kind == "call" else \
            f"<- {s.name} returns it to {s.where} ({s.to})"
        lines.append("  " * (s.depth - base) + arrow + ("   CLIMB" if s.climb else ""))
    climbs = [s for s in steps if s.climb]
    lines.append(f"climbs: {len(climbs)}")
    lines += [f"  {s.kind} {s.name} at {s.where}: {s.frm} -> {s.to}" for s in climbs]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="a run config (default: %(default)s)")
    parser.add_argument("key", help="SECTION.KEY of a float value, e.g. algorithm.params.lr")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        steps = trace(args.config, args.key, args.out or Path(tmp) / "run")
    print(report(steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
