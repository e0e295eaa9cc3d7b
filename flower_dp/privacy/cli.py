"""``flower-dp accountant``: eps of a (subsampled) Gaussian history, or the noise for a target eps."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from .accountant import GaussianStep, rigorous_epsilon
    from .calibration import calibrate_noise_multiplier

    kinds = ["pld", "rdp"] if args.accountant == "both" else [args.accountant]
    if (args.sigma is None) == (args.epsilon is None):
        raise ValueError("give exactly one of --sigma (to get eps) or --epsilon (to get the noise multiplier)")
    for kind in kinds:
        if args.sigma is not None:
            eps = rigorous_epsilon([GaussianStep(args.q, args.sigma, args.steps)], args.delta, accountant=kind,
                                   adjacency=args.adjacency)
            print(f"{kind}: eps = {eps:.4f} at delta = {args.delta:g} (noise multiplier {args.sigma:g}, q = {args.q:g}, "
                  f"{args.steps} steps, {args.adjacency})")
        else:
            nu = calibrate_noise_multiplier(args.epsilon, args.delta, args.q, args.steps, accountant=kind,
                                            adjacency=args.adjacency)
            print(f"{kind}: noise multiplier = {nu:.4f} gives eps <= {args.epsilon:g} at delta = {args.delta:g} "
                  f"(q = {args.q:g}, {args.steps} steps, {args.adjacency})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "accountant",
        help="rigorous eps of a Poisson-subsampled Gaussian mechanism (or the noise for a target eps)",
        description="Example: flower-dp accountant --sigma 1 --q 0.01 --steps 1000 --delta 1e-5",
    )
    p.add_argument("--sigma", type=float, help="noise multiplier (noise std / clip bound)")
    p.add_argument("--epsilon", type=float, help="target eps: print the noise multiplier that meets it")
    p.add_argument("--q", type=float, required=True, help="Poisson sampling rate B/J (1 = no subsampling)")
    p.add_argument("--steps", type=int, required=True, help="number of noisy steps")
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--accountant", choices=["pld", "rdp", "both"], default="both")
    p.add_argument("--adjacency", choices=["add_remove", "replace_one"], default="add_remove")
    p.set_defaults(func=_cmd)
