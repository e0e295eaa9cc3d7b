"""The reported eps checked from two independent paths (issue 12, "Tests from an independent path").

Path 1: ``tests/independent_pld.py``, our own two-sided FFT PLD (numpy/scipy only, pessimistic and
optimistic rounding), validated here on the closed form of the Gaussian mechanism (Balle & Wang 2018).
Path 2: ``prv-accountant`` 0.2.0 (Gopi, Lee, Wutschitz 2021; a test dependency), whose
``compute_epsilon`` returns ``(eps_lower, eps_estimate, eps_upper)`` for the "remove" order of the pair.

For every algorithm's calibrated schedule at ``ci`` settings (flower_dp/reproduce/papers/*.py) we take
the steps a node is charged (``Plan.steps``, and a node's ledger after a short real run), translate
each into its dominating pair, and assert

    independent lower bound - tiny  <=  reported eps  <=  1.05 * independent lower bound,

and, for replace-one with a subsampled step, reported eps >= the symmetrised pair's eps from our own PLD.

Pairs (``Pair(q, sigma, s)``: ``((1-q) N(0, sigma^2) + q N(s, sigma^2), N(0, sigma^2))``, both orders):
Poisson add/remove -> ``Pair(q, nu, 1)`` (tight); fixed-size blocks / B of N under replace-one ->
``Pair(q, nu, 2)``, which is attained (the target at +C against -C, every other record at -C) and so
a lower bound; the proven bound is its symmetrisation (``independent_pld.symmetrised_bracket``);
a non-sampled Gaussian under replace-one -> ``Pair(1, nu, 2)``.  PrivSGP-VR's table carries its block draws
into later releases; its bound (GDP given the draws, mixed over their binomial law) is checked against
:func:`table_delta`, computed here from the Gaussian's closed form.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from independent_pld import Pair, eps_bracket, gaussian_delta, gaussian_epsilon, symmetrised_bracket  # noqa: E402

from flower_dp.privacy.accountant import GaussianStep, LaplaceStep, rigorous_epsilon  # noqa: E402

import prv_accountant  # noqa: E402,F401  (a declared test dependency: fail loudly, never skip, without it)

#: float round-off allowed below the independent lower bound (relative)
FLOAT_TOL = 1e-6
#: the reported eps must be within 5 % of the independent lower bound (issue 12)
WITHIN = 1.05


def to_pairs(steps, adjacency: str) -> list[tuple[Pair, int]]:
    """The dominating pair of each charged step (module doc)."""
    out = []
    for s in steps:
        if isinstance(s, LaplaceStep):
            raise AssertionError(f"no independent path for Laplace steps, got {s}")
        if not math.isfinite(s.noise_multiplier) or s.count == 0:
            continue
        if s.sampling == "fixed_size":
            assert adjacency == "replace_one", "fixed-size sampling is accounted under replace-one only"
        sens = 2.0 if adjacency == "replace_one" else 1.0
        out.append((Pair(float(s.q), float(s.noise_multiplier), sens), int(s.count)))
    return out


def prv_bracket(pairs, delta: float, eps_error: float) -> tuple[float, float, float]:
    """prv-accountant's (lower, estimate, upper) eps of the "remove" order (sensitivity scaled into nu)."""
    from prv_accountant import GaussianMechanism, PoissonSubsampledGaussianMechanism, PRVAccountant

    merged: dict[tuple[float, float], int] = {}
    for p, c in pairs:
        key = (p.q, p.sigma / p.s)
        merged[key] = merged.get(key, 0) + c
    prvs = [GaussianMechanism(nu) if q == 1.0 else PoissonSubsampledGaussianMechanism(q, nu) for q, nu in merged]
    counts = list(merged.values())
    acc = PRVAccountant(prvs=prvs, max_self_compositions=counts, eps_error=eps_error, delta_error=delta * 1e-4)
    lo, est, hi = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
    return float(lo), float(est), float(hi)


def independent(pairs, delta: float, eps_guess: float, rel_width: float = 0.004):
    """Our bracket with a grid fine enough that its width (<= steps * h) is ~rel_width * eps."""
    n = sum(c for _, c in pairs)
    h = min(1e-3, max(2e-6, rel_width * eps_guess / n))
    return eps_bracket(pairs, delta, h=h)


#: prv-accountant discretizes every distinct level on its own domain: ~0.7 s per level (Dyn-D2P's 100 levels:
#: 70 s), so schedules with more levels than this use our path only (and one slow test runs prv on them)
PRV_MAX_LEVELS = 4


def _levels(pairs) -> int:
    return len({(p.q, p.sigma / p.s) for p, _ in pairs})


def _replace_one_subsampled(pairs) -> bool:
    return any(p.s == 2.0 and p.q < 1 for p, _ in pairs)


def check(name: str, reported: float, pairs, delta: float, *, use_prv: bool | None = None):
    """Assert the reported eps against the independent bounds; returns our (lower, upper) of the attained pair.

    Every case: attained lower bound <= reported.  Add/remove (the attained pair is the tight one): reported
    <= 1.05 x that lower bound.  Replace-one with a subsampled step (fixed-size blocks, B of N): reported >=
    the symmetrised pair's value from our own PLD (its optimistic rounding, a lower bound on the proven pair's
    eps), so no number is below the proven bound, and reported <= 1.05 x that value.  The proven pair can sit
    well above the attained one (Gau-LRQ's MNIST setting +1.6 %, PrivSGP's Fig. 10 blocks at eps 1 about
    +20 %): no realisable pair we know composes above the attained one, and no proof that it is the worst
    case exists here, so the proven bound is what is reported.
    """
    lo, hi = independent(pairs, delta, reported)
    assert lo <= hi
    lower = lo
    if use_prv is None:
        use_prv = _levels(pairs) <= PRV_MAX_LEVELS
    if use_prv:
        try:
            p_lo, p_est, p_hi = prv_bracket(pairs, delta, eps_error=max(1e-3, 1e-3 * reported))
        except RuntimeError as exc:  # prv 0.2.0's mean check fails at very small noise (eps ~ 50, q = 0.2)
            assert "mean" in str(exc), exc
            p_lo = p_est = p_hi = None
    if use_prv and p_est is not None:
        # the two independent paths agree: prv's estimate lies in (a slightly widened) our bracket
        assert lo - 2e-3 * max(1, lo) <= p_est <= hi + 2e-3 * max(1, hi), (name, (lo, hi), (p_lo, p_est, p_hi))
        lower = max(lo, p_lo)
    assert reported >= lower * (1 - FLOAT_TOL), f"{name}: reported eps {reported} below the independent lower bound {lower}"
    if _replace_one_subsampled(pairs):
        n = sum(c for _, c in pairs)
        s_lo, s_hi = symmetrised_bracket(pairs, delta, h=min(1e-3, max(2e-6, 0.004 * reported / n)))
        assert lo <= s_lo <= s_hi
        assert reported >= s_lo * (1 - FLOAT_TOL), (
            f"{name}: reported eps {reported} below the symmetrised pair's {s_lo} (the proven bound)")
        lower = s_lo
    assert reported <= WITHIN * lower, f"{name}: reported eps {reported} more than 5 % above the bound {lower}"
    return lo, hi


def table_delta(eps: float, q: float, nu: float, count: int, nus_always) -> float:
    """PrivSGP-VR's bound, computed independently: ``sum_n Binom(n; K, q) delta_G(eps; mu(n))`` with
    ``mu(n)^2 = n (2/nu)^2 + sum (2/nu_a)^2`` (the Balle-Wang closed form of the Gaussian, log-gamma binomial)."""
    mu_a2 = sum((2.0 / v) ** 2 for v in nus_always)
    total = 0.0
    for n in range(count + 1):
        logw = (math.lgamma(count + 1) - math.lgamma(n + 1) - math.lgamma(count - n + 1)
                + n * math.log(q) + (count - n) * math.log1p(-q))
        if logw < -60:
            continue
        mu = math.sqrt(n * (2.0 / nu) ** 2 + mu_a2)
        total += math.exp(logw) * (gaussian_delta(eps, 1.0, mu) if mu > 0 else 0.0)
    return total


def check_table(name: str, reported: float, steps, delta: float) -> None:
    """The table bound (``sampling="fixed_size_table"``) against :func:`table_delta`: delta at the reported eps is
    at most the target (up to round-off), and 0.1 % less eps would exceed it."""
    table = [s for s in steps if s.sampling == "fixed_size_table"]
    always = [s for s in steps if s.q == 1.0]
    assert table and len(table) + len(always) == len(steps), name
    q, nu, count = table[0].q, min(s.noise_multiplier for s in table), sum(s.count for s in table)
    nus_always = [s.noise_multiplier for s in always for _ in range(s.count)]
    assert table_delta(reported, q, nu, count, nus_always) <= delta * (1 + 1e-6), name
    assert table_delta(reported * 0.999, q, nu, count, nus_always) > delta, name


def test_table_bound_is_above_the_per_step_composition_at_the_papers_settings():
    """PrivSGP-VR at Fig. 7's K* = 575 (paper calibration): the table bound is the reported one, and it is far above
    what composing per-step subsampled pairs would say (15.9), since the hidden draws cost the amplification."""
    from flower_dp.privacy.calibration_algos import privsgp_vr_calibration

    cal = privsgp_vr_calibration(1.0, 1e-5, num_iters=575, J=1200, G=0.5, block=40, vr=True, calibration="paper",
                                 c2=0.3724)
    steps = cal.steps()
    check_table("fig7-K575", cal.eps_rigorous, steps, 1e-5)
    per_step = [GaussianStep(s.q, s.noise_multiplier, s.count, "fixed_size", s.dataset_size) if s.q < 1 else s for s in steps]
    assert cal.eps_rigorous > 3 * rigorous_epsilon(per_step, 1e-5, adjacency="replace_one")


# ----------------------------------------------------------------------------------- the independent path itself
@pytest.mark.parametrize("sigma,k,s", [(1.0, 1, 1.0), (2.0, 1, 1.0), (0.8, 1, 2.0), (1.0, 50, 1.0), (4.0, 400, 1.0)])
def test_bracket_contains_the_analytic_gaussian(sigma, k, s):
    """k Gaussians of std sigma = one of std sigma / sqrt(k); Balle & Wang's exact eps lies in the bracket."""
    for delta in (1e-5, 1e-3):
        exact = gaussian_epsilon(delta, sigma / math.sqrt(k), s)
        lo, hi = eps_bracket([(Pair(1.0, sigma, s), k)], delta, h=1e-4)
        assert lo <= exact <= hi, (lo, exact, hi)
        assert hi - lo <= 1.01 * k * 1e-4 + 1e-6


def test_bracket_brackets_prv_accountant_on_subsampled_gaussians():
    """Poisson-subsampled Gaussian, remove order (what prv-accountant computes): the brackets overlap."""
    for q, nu, k in [(0.01, 1.0, 1000), (1 / 300, 0.4, 400), (0.05, 2.0, 200)]:
        lo, hi = eps_bracket([(Pair(q, nu), k)], 1e-5, h=4e-5, orders=("remove",))
        p_lo, p_est, p_hi = prv_bracket([(Pair(q, nu), k)], 1e-5, eps_error=1e-3)
        assert p_lo <= hi and lo <= p_hi, ((lo, hi), (p_lo, p_est, p_hi))
        assert lo - 1e-3 <= p_est <= hi + 1e-3
        assert p_est >= 0.999 * eps_bracket([(Pair(q, nu), k)], 1e-5, h=2e-4, orders=("add",))[0]  # remove dominates


def test_bracket_is_monotone_in_the_noise_and_composition():
    a = eps_bracket([(Pair(0.02, 1.0), 100)], 1e-5, h=1e-3)
    b = eps_bracket([(Pair(0.02, 1.1), 100)], 1e-5, h=1e-3)
    c = eps_bracket([(Pair(0.02, 1.0), 100), (Pair(0.02, 1.1), 50)], 1e-5, h=1e-3)
    assert b[1] < a[0] and c[0] > a[1]


# ------------------------------------------------------------------------------------------- plans at ci settings
def _prepare(algorithm, params, *, n, J, K):
    from flower_dp.clients import registry

    return registry.prepare(algorithm, params, n_nodes=n, samples_per_node=[J] * n, num_iters=K, dim=1000, seed=0)


def _plan_reported(plan, i=0):
    steps = plan.steps(i)
    reported = float(plan.eps_rigorous[i])
    again = rigorous_epsilon(steps, plan.delta_of(i), accountant=plan.accountant, adjacency=plan.adjacency)
    assert reported == pytest.approx(again, rel=1e-9), "Plan.eps_rigorous is the eps of Plan.steps"
    return steps, reported


def _ci(module):
    import importlib

    return importlib.import_module(f"flower_dp.reproduce.papers.{module}")


def _dyn_d2p_cases():
    m = _ci("dyn_d2p")
    s = m.SETTINGS["table2"]["ci"]
    J = 60000 // s["n"]
    for eps in s["eps"]:
        for variant in s["algs"]:
            params = dict(batch_size=s["B"], lr=s["lr"], delta=m.DELTA, rho_c=2.0, rho_mu=2.0, **m.CLIP["table2"],
                          variant=variant, epsilon=eps, calibration="rigorous")
            yield f"dyn_d2p-{variant}-eps{eps:g}", ("dyn_d2p", params, s["n"], J, s["K"])


def _dp_csgp_cases():
    m = _ci("dp_csgp")
    s = m.SETTINGS["ci"]
    J = 60000 // s["n"]
    for eps in sorted(set(s["eps"] + s["tradeoff_eps"])):
        params = {"batch_size": s["B"], "lr": s["lr"], "epsilon": eps, "delta": m.DELTA, "G": s["G"],
                  "compressor": "rand_0.5", "gamma_c": 0.5, "calibration": "rigorous"}
        yield f"dp_csgp-eps{eps:g}", ("dp_csgp", params, s["n"], J, s["T"])


def _privsgp_cases():
    m = _ci("privsgp_vr")
    s = m.SETTINGS["ci"]
    base = dict(batch_size=s["block"], G=s["G"], lr=s["lr"], delta=m.DELTA, epsilon=s["eps"])
    # Fig. 10's baselines at equal (eps, delta), rigorous calibration; PrivSGP at the same settings
    for alg in ("privsgp_vr", "privsgp", "dp2_sgd", "adp2_sgd"):
        yield f"{alg}-fig10", (alg, {**base, "calibration": "rigorous"}, s["n"], s["J"], s["baseline_K"])
    # Fig. 7: the paper's eq. (11) noise (not calibrated to the target; its eps is reported as it is)
    yield "privsgp_vr-fig7-paper", ("privsgp_vr", {**base, "calibration": "paper", "c2": m.C2}, s["n"], s["J"], 575)
    # Fig. 9: fixed noise sigma^2 = 0.01 on g, blocks of 4, K = 400
    for alg in ("privsgp", "privsgp_vr"):
        p = {**base, "batch_size": s["vr_block"], "noise_std": 0.1}
        p.pop("epsilon")
        yield f"{alg}-fig9", (alg, p, s["n"], s["J"], s["vr_K"])


CASES = dict([*_dyn_d2p_cases(), *_dp_csgp_cases(), *_privsgp_cases()])


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_eps_matches_the_independent_bracket(case):
    alg, params, n, J, K = CASES[case]
    plan = _prepare(alg, params, n=n, J=J, K=K)
    assert plan.private and not plan.heuristic
    steps, reported = _plan_reported(plan)
    if alg in ("privsgp", "privsgp_vr"):
        assert plan.sampling == "fixed_size" and plan.adjacency == "replace_one"
        want = "fixed_size_table" if alg == "privsgp_vr" else "fixed_size"
        assert all(s.sampling == want for s in steps if s.q < 1)
    else:
        assert plan.sampling == "poisson"
    if alg == "privsgp_vr":  # the table average is charged at every step, sampled or not
        assert sum(s.count for s in steps if s.q == 1.0) == plan.num_iters
        check_table(case, reported, steps, plan.delta_of(0))
    else:
        check(case, reported, to_pairs(steps, plan.adjacency), plan.delta_of(0))
    if "eps" in params and params.get("calibration") == "rigorous":
        assert reported <= params["epsilon"] * (1 + 1e-6)


def _gau_lrq_cases():
    m = _ci("gau_lrq")
    s = m.SETTINGS["ci"]
    out = {}
    for eps in m.FIG5_EPS["ci"]:
        out[f"gau_lrq-fig5-eps{eps:g}"] = (eps, s["K"], s["B"], s["N"], 1.0)
    for N in s["t3_N"]:
        out[f"gau_lrq-t3-N{N}"] = (s["t3_eps"], s["K"], s["B"], N, 1.0)
    # Dynamic Gau-LRQ (tau = 0.9, 15 distinct levels): its rigorous calibration itself takes ~75 s (slow);
    # "-shape" checks the same accounting path on z_k proportional to tau^(k/4) without calibrating
    out["dynamic_gau_lrq-ci"] = (s["eps"], s["K"], s["B"], s["N"], 0.9)
    out["dynamic_gau_lrq-ci-shape"] = (s["eps"], s["K"], s["B"], s["N"], 0.9)
    return out


GAU_LRQ_CASES = _gau_lrq_cases()


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "dynamic_gau_lrq-ci" else c
                                  for c in sorted(GAU_LRQ_CASES)])
def test_gau_lrq_schedule_matches_the_independent_bracket(case):
    from flower_dp.privacy.gau_lrq import client_level_epsilon, client_level_steps, gau_lrq_schedule

    eps, K, B, N, tau = GAU_LRQ_CASES[case]
    if case.endswith("-shape"):
        z0 = gau_lrq_schedule(epsilon=eps, delta=1e-5, num_rounds=K, B=B, N=N).noise_multiplier[0]
        z = z0 * tau ** ((np.arange(K) - (K - 1) / 2) / 4)
        reported = client_level_epsilon(z, 1e-5, B=B, N=N)
        assert len(set(z.tolist())) == K
    else:
        sched = gau_lrq_schedule(epsilon=eps, delta=1e-5, num_rounds=K, B=B, N=N, tau=tau)
        assert sched.eps_rigorous <= eps * 1.001
        z, reported = sched.noise_multiplier, sched.eps_rigorous
    steps = client_level_steps(z, B=B, N=N)
    assert all(s.sampling == "fixed_size" and s.q == B / N for s in steps)
    check(case, reported, to_pairs(steps, "replace_one"), 1e-5)


# --------------------------------------------------------------------------------------- the headline numbers
def test_gau_lrq_paper_mnist_setting():
    """z = 0.51624, K = 30, N = 1920, B = 80, delta = 1e-5: the proven bound 51.23 (the attained pair 50.42;
    RDP's bound for sampling without replacement 290.5)."""
    from flower_dp.privacy.gau_lrq import client_level_epsilon

    reported = client_level_epsilon(np.full(30, 0.51624), 1e-5, B=80, N=1920)
    assert 51.2 <= reported <= 53.0
    pairs = [(Pair(80 / 1920, 0.51624, 2.0), 30)]
    lo, hi = check("gau_lrq-mnist", reported, pairs, 1e-5)
    assert 50.3 <= lo <= hi <= 50.5
    s_lo, s_hi = symmetrised_bracket(pairs, 1e-5)
    assert 51.2 <= s_lo <= reported <= s_hi * (1 + 1e-4)


def test_the_attained_pair_alone_is_not_dominating():
    """The realisable pair with every other record at 0 (target +C vs -C) beats the attained pair A's add order
    at eps = 1 (3.9e-3 > 0 at q = 80/1920, z = 0.51624), so A's two orders composed are no proof; the
    symmetrised pair covers it."""
    q, z, eps = 80 / 1920, 0.51624, 1.0
    x = np.linspace(-12, 14, 400001)
    dx = x[1] - x[0]

    def npdf(m):
        return np.exp(-0.5 * ((x - m) / z) ** 2) / (z * math.sqrt(2 * math.pi))

    def hockey(p, r):
        return float(np.maximum(p - math.exp(eps) * r, 0.0).sum() * dx)

    realisable = hockey((1 - q) * npdf(0) + q * npdf(1), (1 - q) * npdf(0) + q * npdf(-1))
    attained_add = hockey(npdf(0), (1 - q) * npdf(0) + q * npdf(2))
    assert attained_add == 0.0 and realisable == pytest.approx(3.9e-3, rel=0.05)
    from flower_dp.privacy.replace_one import profile_on_grid, step_pmf

    h = 1e-3
    lower, probs, inf = step_pmf("gaussian", q, z, h)
    assert profile_on_grid(lower, probs, inf, h, np.array([round(eps / h)]))[0] >= realisable


def test_fig9_privsgp_record_reaccounted():
    """fig9-privsgp (J = 1200, b = 4, K = 400, G = 0.5, std 0.1 on the block mean): the old run reported 0.812
    (Poisson q = b/J, add/remove, nu = 0.1 / (G/b) = 0.8); one of 300 fixed blocks under replace-one is >= 10.03."""
    m = _ci("privsgp_vr")
    s = m.SETTINGS["ci"]
    b, J, K, G = s["vr_block"], s["J"], s["vr_K"], s["G"]
    nu = 0.1 / (G / b)
    old = rigorous_epsilon([GaussianStep(b / J, nu, K)], 1e-5, accountant="pld")
    assert old == pytest.approx(0.812, abs=0.005)
    p = dict(batch_size=b, G=G, lr=s["lr"], delta=1e-5, noise_std=0.1)
    plan = _prepare("privsgp", p, n=4, J=J, K=K)
    steps, reported = _plan_reported(plan)
    assert steps[0].noise_multiplier == pytest.approx(nu) and steps[0].q == pytest.approx(1 / (J // b))
    assert reported >= 10.03
    lo, hi = check("fig9-privsgp", reported, to_pairs(steps, plan.adjacency), 1e-5)
    assert lo >= 10.0  # the independent path alone: the old 0.812 was a twelve-fold understatement


# ------------------------------------------------------------------------------- what a node really charges (ledger)
LEDGER_CASES = {
    "dyn_d2p": ({"variant": "dyn", "clip0": 4.0, "clip_bar": 1.5}, "exp_one_peer"),
    "privsgp_vr": ({"G": 2.0}, "exp_one_peer"),
    "privsgp": ({"G": 2.0}, "exp_one_peer"),
    "dp2_sgd": ({"G": 2.0}, "undirected_ring"),
    "dp_csgp": ({"G": 2.0, "compressor": "rand_0.5", "gamma_c": 0.5}, "exp_all_hops"),
}


@pytest.mark.parametrize("alg", sorted(LEDGER_CASES))
def test_node_ledger_matches_the_independent_bracket(alg, tmp_path):
    """A short real run: every node's ledger is the plan's steps, and its reported eps is checked independently."""
    from flower_dp.experiments import config_from_dict, run_experiment

    params, topo = LEDGER_CASES[alg]
    cfg = config_from_dict({
        "run": {"name": alg, "seed": 0, "num_iters": 12, "eval_every": 12, "progress": False},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 64, "test_samples": 50},
        "model": {"name": "logreg"},
        "topology": {"name": topo, "n_nodes": 3},
        "algorithm": {"name": alg, "params": {"lr": 0.05, "batch_size": 8, "epsilon": 2.0, "delta": 1e-5, **params}},
    })
    res = run_experiment(cfg, out_dir=tmp_path)
    for node in res.nodes:
        plan = node.plan
        ledger = node.accountant.ledger
        assert sum(s.count for s in ledger) == sum(s.count for s in plan.steps(node.node_id))
        reported = float(node.privacy_report()["eps_rigorous"])
        again = rigorous_epsilon(ledger, plan.delta_of(node.node_id), accountant=plan.accountant,
                                 adjacency=plan.adjacency)
        assert reported == pytest.approx(again, rel=1e-9)
        if alg == "privsgp_vr":
            check_table(f"{alg}-node{node.node_id}", reported, ledger, plan.delta_of(node.node_id))
        else:
            check(f"{alg}-node{node.node_id}", reported, to_pairs(ledger, plan.adjacency),
                  plan.delta_of(node.node_id), use_prv=None if node.node_id == 0 else False)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dyn_d2p-dyn-eps0.3", "dyn_d2p-dyn-eps3"])
def test_many_level_schedules_against_prv_accountant(case):
    """The heterogeneous Dyn-D2P schedules (100 distinct levels) through prv-accountant too (~70 s each)."""
    alg, params, n, J, K = CASES[case]
    plan = _prepare(alg, params, n=n, J=J, K=K)
    steps, reported = _plan_reported(plan)
    pairs = to_pairs(steps, plan.adjacency)
    assert _levels(pairs) > PRV_MAX_LEVELS
    check(case, reported, pairs, plan.delta_of(0), use_prv=True)
