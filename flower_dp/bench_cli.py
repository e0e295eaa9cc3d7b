"""``flower-dp bench``: run the benchmark suite in ``benchmarks/`` (repository checkouts only).

The suite is a top-level package of the source tree, not part of the installed
distribution; from an editable install it is found next to ``flower_dp/``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

__all__ = ["register"]


def _import_benchmarks():
    try:
        return importlib.import_module("benchmarks")
    except ModuleNotFoundError as exc:
        if exc.name != "benchmarks":
            raise
    root = Path(__file__).resolve().parents[1]
    if not (root / "benchmarks" / "__init__.py").is_file():
        raise ValueError(
            f"flower-dp bench needs the source checkout's benchmarks/ package, got none at {root / 'benchmarks'}; "
            "run it from a git checkout installed with `pip install -e .`"
        )
    sys.path.insert(0, str(root))
    return importlib.import_module("benchmarks")


def _run(args) -> int:
    return _import_benchmarks().run_from_args(args)


def register(subparsers) -> None:
    """Add the ``bench`` sub-command (options as ``python -m benchmarks``)."""
    parser = subparsers.add_parser(
        "bench",
        help="run the benchmark suite (private step cost, engine overhead, accounting, LRQ, scale)",
        description="Run the flower-dp benchmark suite; prints a table and optionally writes JSON (--out).",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON document here")
    parser.add_argument("--only", nargs="+", default=None,
                        choices=("private_step", "engine_overhead", "accounting", "lrq_codec", "wire", "scale"),
                        help="run only these benchmarks")
    parser.add_argument("--skip-ray", action="store_true", help="do not start Ray")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--scale-plot", type=Path, default=None, help="draw the scale curves here (PNG)")
    parser.set_defaults(func=_run)
