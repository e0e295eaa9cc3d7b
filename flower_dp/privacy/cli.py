"""``flower-dp accountant``: eps of a (subsampled) Gaussian history, or the noise for a target eps.

One line per bound (PLD, RDP) and a last line with the one flower-dp reports (the smaller), each naming
the bound that gave it (:data:`flower_dp.privacy.accountant.BOUNDS`).  The
sampler is given as it runs: ``--sampling poisson --q Q`` or ``--sampling fixed_size --batch B
--population N`` (B of N without replacement, or one of N fixed blocks with ``--batch 1``), the
latter only under ``--adjacency replace_one``.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _sampler(args: argparse.Namespace) -> tuple[float, str, int | None, str]:
    """(q, sampling, dataset_size, description) from the arguments, with errors that name the fix."""
    if args.sampling == "poisson":
        if args.q is None:
            if args.batch is None or args.population is None:
                raise ValueError("--sampling poisson needs --q, or --batch and --population (q = batch / population)")
            args.q = args.batch / args.population
        return args.q, "poisson", None, f"Poisson q = {args.q:g}"
    if args.batch is None or args.population is None:
        raise ValueError("--sampling fixed_size needs --batch B and --population N (B of N without replacement), "
                         f"got --batch {args.batch} --population {args.population}")
    if not 1 <= args.batch <= args.population:
        raise ValueError(f"--batch must be in [1, --population = {args.population}], got {args.batch}")
    if args.adjacency != "replace_one":
        raise ValueError("--sampling fixed_size is accounted under --adjacency replace_one only (removing a record "
                         f"would change the batch size), got --adjacency {args.adjacency}")
    return (args.batch / args.population, "fixed_size", args.population,
            f"{args.batch} of {args.population} without replacement")


def _cmd(args: argparse.Namespace) -> int:
    from .accountant import BOUNDS, GaussianStep, epsilon_and_bound
    from .calibration import calibrate_noise_multiplier

    if (args.noise_multiplier is None) == (args.epsilon is None):
        raise ValueError("give exactly one of --noise-multiplier (to get eps) or --epsilon (to get the noise multiplier)")
    q, sampling, size, what = _sampler(args)
    kinds = ["pld", "rdp", "auto"] if args.accountant == "both" else [args.accountant]
    label = {"pld": "pld", "rdp": "rdp", "auto": "reported (the smaller valid bound)"}
    for kind in kinds:
        if args.noise_multiplier is not None:
            eps, bound = epsilon_and_bound([GaussianStep(q, args.noise_multiplier, args.steps, sampling, size)], args.delta,
                                           accountant=kind, adjacency=args.adjacency)
            print(f"{label[kind]}: eps = {eps:.4f} at delta = {args.delta:g} (noise multiplier {args.noise_multiplier:g}, {what}, "
                  f"{args.steps} steps, {args.adjacency}); bound: {bound}, {BOUNDS[bound]}")
        else:
            nu = calibrate_noise_multiplier(args.epsilon, args.delta, q, args.steps, accountant=kind,
                                            adjacency=args.adjacency, sampling=sampling, dataset_size=size)
            _, bound = epsilon_and_bound([GaussianStep(q, nu, args.steps, sampling, size)], args.delta,
                                         accountant=kind, adjacency=args.adjacency)
            print(f"{label[kind]}: noise multiplier = {nu:.4f} gives eps <= {args.epsilon:g} at delta = {args.delta:g} "
                  f"({what}, {args.steps} steps, {args.adjacency}); bound: {bound}, {BOUNDS[bound]}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "accountant",
        help="rigorous eps of a subsampled Gaussian mechanism, for the sampler you run (or the noise for a target eps)",
        description="Examples: flower-dp accountant --noise-multiplier 1 --q 0.01 --steps 1000 --delta 1e-5;  "
                    "flower-dp accountant --noise-multiplier 0.51624 --batch 80 --population 1920 --steps 30 --delta 1e-5 "
                    "--sampling fixed_size --adjacency replace_one",
    )
    p.add_argument("--noise-multiplier", dest="noise_multiplier", type=float,
                   help="noise multiplier (noise std / per-record clip bound)")
    p.add_argument("--epsilon", type=float, help="target eps: print the noise multiplier that meets it")
    p.add_argument("--sampling", choices=["poisson", "fixed_size"], default="poisson",
                   help="poisson: each record kept w.p. q; fixed_size: exactly --batch of --population records")
    p.add_argument("--q", type=float, help="Poisson sampling rate (1 = no subsampling)")
    p.add_argument("--batch", type=int, help="batch size B (fixed_size; or with --population for Poisson q = B/N)")
    p.add_argument("--population", type=int, help="records (or clients, or blocks) the batch is drawn from")
    p.add_argument("--steps", type=int, required=True, help="number of noisy steps")
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--accountant", choices=["pld", "rdp", "auto", "both"], default="both",
                   help="both (default): one line per bound and the reported one")
    p.add_argument("--adjacency", choices=["add_remove", "replace_one"], default="add_remove")
    p.set_defaults(func=_cmd)
