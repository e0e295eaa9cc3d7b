"""The ``flower-dp`` command line.

Sub-commands live in their own modules, each exposing ``register(subparsers)`` which
adds a parser whose ``func`` attribute runs the command.  Modules are imported lazily,
so ``flower-dp --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import FlowerDPError

__all__ = ["main", "build_parser"]

#: (module, attribute) pairs providing ``register(subparsers)``, in help order.
COMMANDS: list[tuple[str, str]] = [
    ("flower_dp.experiments.cli_run", "register"),
    ("flower_dp.experiments.cli_lrq_keys", "register"),
    ("flower_dp.privacy.cli", "register"),
    ("flower_dp.audit_cli", "register"),
    ("flower_dp.bench_cli", "register"),
    ("flower_dp.reproduce.cli", "register"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flower-dp",
        description="Differentially private decentralized and federated learning for Flower.",
    )
    parser.add_argument("--version", action="version", version=f"flower-dp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module, attr in COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue  # command not built yet
            raise
        getattr(mod, attr)(sub)
    return parser


def _quiet_absl() -> None:
    """dp-accounting's RDP code logs every order it drops through absl; the eps stays an upper bound."""
    try:
        from absl import logging as absl_logging
    except ImportError:  # pragma: no cover
        return
    absl_logging.set_verbosity(absl_logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    _quiet_absl()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FlowerDPError) as exc:
        print(f"flower-dp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
