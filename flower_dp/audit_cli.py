"""``flower-dp audit``: an empirical LOWER bound on eps (canary audit) beside the rigorous eps.

Example::

    flower-dp audit --mechanism gaussian --trials 1000000 --delta 1e-5 --seed 0
    flower-dp audit --mechanism paper-gau-lrq-n5760 --trials 1000000 --seed 0 --json audit.json
    flower-dp audit --mechanism privsgp_blocks --trials 1000000 --seed 0   # fixed blocks vs Poisson accounting
"""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from .audit import MECHANISMS, run_audit

    params = {}
    if args.mechanism.startswith("paper-"):
        if any(getattr(args, a) is not None for a in ("noise_multiplier", "q", "adjacency", "steps", "blocks", "block")):
            raise ValueError("--noise-multiplier/--q/--adjacency/--steps are fixed by the paper's calibration for paper-* audits, "
                             f"got noise_multiplier={args.noise_multiplier}, q={args.q}, adjacency={args.adjacency}, steps={args.steps}; drop them")
        if args.noise is not None:
            params["noise"] = args.noise
    else:
        for name in ("noise_multiplier", "q", "adjacency", "steps", "blocks", "block"):
            value = getattr(args, name)
            if value is not None:
                if name not in MECHANISMS.get(args.mechanism, {}):
                    raise ValueError(f"--{name} does not apply to --mechanism {args.mechanism}, got {value}")
                params[name] = value
    res = run_audit(args.mechanism, trials=args.trials, delta=args.delta, seed=args.seed,
                    confidence=args.confidence, **params)
    print(f"mechanism        : {res.mechanism}  ({res.trials} trials per world, seed {args.seed})")
    shown = {k: v for k, v in res.params.items() if k not in ("name",)}
    print(f"parameters       : {shown}")
    print(f"test             : canary if score {'>' if res.direction == 'greater' else '<'} {res.threshold:.4f}; "
          f"held-out FP {res.fp}/{res.n_eval}, FN {res.fn}/{res.n_eval}")
    print(f"eps lower bound  : {res.eps_lower:.4f}  (delta {res.delta:g}, confidence {res.confidence:g}; "
          f"point estimate {res.eps_point:.4f})")
    print(f"eps rigorous     : {res.eps_rigorous:.4f}  (PLD, the audited mechanism)")
    if res.eps_paper is not None and "claim" in res.params:
        print(f"eps claimed      : {res.eps_paper:.4f}  ({res.params['claim']}, same noise)")
    elif res.eps_paper is not None:
        print(f"eps paper        : {res.eps_paper:g}  (claimed for all {res.params['rounds']} rounds; rigorous "
              f"all rounds {res.params['eps_rigorous_all_rounds']:.4f})")
    print(f"verdict          : {res.verdict}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(res.to_dict(), fh, indent=2, sort_keys=True)
        print(f"wrote {args.json}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``audit`` sub-command to ``flower-dp``."""
    from .audit import MECHANISMS, PAPER_CLAIMS

    choices = list(MECHANISMS) + ["paper-" + k for k in PAPER_CLAIMS]
    p = sub.add_parser(
        "audit",
        help="empirical lower bound on eps by canary auditing (checks the accountant; refutes paper claims)",
        description="Runs a mechanism many times with and without a canary record, picks a threshold test on "
                    "half of the trials, and turns its held-out error rates into a Clopper-Pearson lower bound "
                    "on eps.  Example: flower-dp audit --mechanism gaussian --trials 1000000 --delta 1e-5",
    )
    p.add_argument("--mechanism", required=True, choices=choices)
    p.add_argument("--trials", type=int, default=200_000, help="trials per world (default 200000)")
    p.add_argument("--delta", type=float, default=None, help="delta (default 1e-5, or the paper's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--noise-multiplier", dest="noise_multiplier", type=float, default=None, help="noise multiplier: std / sensitivity (default: the mechanism's, 1 or 1.5)")
    p.add_argument("--q", type=float, default=None, help="Poisson sampling rate (default 1)")
    p.add_argument("--steps", type=int, default=None,
                   help="gaussian, privsgp_blocks: noisy steps per trial (default 1)")
    p.add_argument("--blocks", type=int, default=None,
                   help="privsgp_blocks only: number of fixed blocks J/b (one drawn per step; default 2)")
    p.add_argument("--block", type=int, default=None, help="privsgp_blocks only: records per block b (default 4)")
    p.add_argument("--adjacency", choices=["add_remove", "replace_one"], default=None, help="lrq only")
    p.add_argument("--noise", choices=["lrq", "gaussian"], default=None,
                   help="paper-* only: draw the noise by LRQ encode/decode (default) or plain Gaussian")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON")
    p.set_defaults(func=_cmd)
