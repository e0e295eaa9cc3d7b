"""Private step cost: one DP-SGD step / one non-private step, same model, batch and optimizer.

DP step = per-sample clipped gradient sum (vmap reference, or the ghost/book-keeping fast
path) + Gaussian noise on the sum, drawn the way the nodes draw it (``PushSumNode.gaussian``: a
generator seeded per iteration from the stream (node secret, node, "noise", k), torch's sampler,
here into a reused buffer) + the SGD step ``p -= (lr / B) (sum + noise)``, the division by the
batch size folded into the step size (plain SGD: the same update as dividing first, up to
rounding).  Non-private step = ``zero_grad; cross_entropy(model(x), y).backward(); opt.step()``.
All variants are timed interleaved in one loop (see ``_common.interleaved_times``).

Peers: when Opacus is installed (``pip install flower-dp[bench]``), its three per-sample
modes (``grad_sample_mode`` "hooks", "ghost" and "functorch", each set up as its users do with
``PrivacyEngine.make_private``: same model, batch, clip bound 1, noise multiplier 1, mean loss,
SGD with learning rate 0) are timed in a third interleaved loop together with our DP step and a
non-private yardstick, so every ratio of that loop saw the same machine load.  Without Opacus
the entry says ``skipped: opacus not installed`` and its keys are null.

The optimizer runs with learning rate 0: every repeat does the same arithmetic at the
initial point.  (Training on one fixed batch for hundreds of repeats drives the gradients
into denormal floats, which made timings data-dependent by up to 8x.)
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.nn.functional as F

import statistics

from ._common import interleaved_times

__all__ = ["run", "make_steps", "make_opacus_steps", "profile_fast_step", "OPACUS_MODES"]

MODELS = {"cnn": "shallow_cnn", "mlp": "mlp_2layer"}

#: Consecutive steps per timed call of the prefetch comparison (``*_chain``).
PREFETCH_CHAIN = 5

#: Opacus ``grad_sample_mode`` values timed beside our step.
OPACUS_MODES = ("hooks", "ghost", "functorch")


def make_steps(model_name: str, batch: int, *, seed: int = 0, clip: float = 1.0, noise_multiplier: float = 1.0,
               device: str = "cpu", input_shape: tuple[int, ...] = (1, 28, 28)):
    """Step callables on private copies of one model: non-private, DP vmap, DP fast, and the parts
    (noise alone, fast clipping alone) for the breakdown.

    ``device``: where the models, the batch and the noise buffers live (the noise is drawn on the CPU and
    copied there, as the nodes draw it: :func:`flower_dp.mechanisms.noise.gaussian_noise`); the callables
    do not synchronize a GPU (the caller times them with ``torch.cuda.synchronize``).  ``input_shape``: one
    sample's shape (``(3, 32, 32)`` for the CIFAR models)."""
    from flower_dp.mechanisms.clipping import per_sample_clipped_grad_sum
    from flower_dp.mechanisms.ghost_clipping import ghost_clipped_grad_sum
    from flower_dp.mechanisms.noise import NoisePrefetcher, gaussian_noise
    from flower_dp.models import build_model
    from flower_dp.rng import node_secret, noise_generator

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *input_shape, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)

    def nonprivate():
        model = build_model(model_name, seed=seed).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the update is computed but parameters stay put: identical work per repeat

        def step():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    lr = 0.0  # the update is computed but parameters stay put: identical work per repeat
    key = node_secret(False, seed)  # the node's secret key (secret mode, the default)

    def private(clip_fn, prefetch: bool = False):
        """One DP step of one node; ``prefetch``: its noise drawn ahead (``run.prefetch_noise``: the next step's
        standard normals drawn on the noise thread while this one computes its gradient)."""
        model = build_model(model_name, seed=seed).to(device)
        params = [p for p in model.parameters() if p.requires_grad]
        d = sum(p.numel() for p in params)
        noise = torch.empty(d, device=device)
        pre = NoisePrefetcher(noise_generator) if prefetch else None
        k = [0]

        def step():
            gsum, _ = clip_fn(model, F.cross_entropy, x, y, clip)
            k[0] += 1  # one stream per iteration, as PushSumNode.gaussian
            if pre is None:
                gsum.add_(gaussian_noise(d, noise_multiplier * clip, noise_generator(key, 0, k[0]), device=device,
                                         out=noise))
            else:
                gsum.add_(pre.noise(key, 0, k[0], noise_multiplier * clip, d, next_k=k[0] + 1))
            views, start = [], 0
            for p in params:
                views.append(gsum[start : start + p.numel()].view_as(p))
                start += p.numel()
            with torch.no_grad():  # SGD: p -= lr * (sum + noise) / B in one pass
                torch._foreach_add_(params, views, alpha=-lr / batch)

        return step

    def chained(step, chain: int):
        def steps():
            for _ in range(chain):
                step()
        return steps

    model = build_model(model_name, seed=seed).to(device)
    d = sum(p.numel() for p in model.parameters())
    buf, kn = torch.empty(d, device=device), [0]

    def noise_only():
        kn[0] += 1
        return gaussian_noise(d, noise_multiplier * clip, noise_generator(key, 1, kn[0]), device=device, out=buf)

    return {
        "noise": noise_only,
        "clip_fast_only": lambda: ghost_clipped_grad_sum(model, F.cross_entropy, x, y, clip),
        "nonprivate": nonprivate(),
        "dp_vmap": private(per_sample_clipped_grad_sum),
        "dp_fast": private(ghost_clipped_grad_sum),
        # blocks of PREFETCH_CHAIN consecutive steps (per step: divide by it), with their own yardstick
        "nonprivate_chain": chained(nonprivate(), PREFETCH_CHAIN),
        "dp_fast_chain": chained(private(ghost_clipped_grad_sum), PREFETCH_CHAIN),
        # consecutive steps: the noise thread has only one gradient computation to draw the next step's noise in
        "dp_fast_prefetch_chain": chained(private(ghost_clipped_grad_sum, prefetch=True), PREFETCH_CHAIN),
    }


def make_opacus_steps(model_name: str, batch: int, *, seed: int = 0, clip: float = 1.0,
                      noise_multiplier: float = 1.0, modes: tuple[str, ...] = OPACUS_MODES) -> dict:
    """One Opacus DP-SGD step per ``grad_sample_mode``, on the same model, batch and optimizer as
    :func:`make_steps` (raises ImportError without Opacus).

    Each mode is set up the way Opacus' users do it (``PrivacyEngine.make_private`` with a loader of
    the one batch, fixed-size batches, flat clipping at ``clip``, ``noise_multiplier``); the step is
    ``zero_grad; criterion(model(x), y).backward(); optimizer.step()`` (for "ghost" the criterion
    is Opacus' ``DPLossFastGradientClipping``, which runs its two backward passes).
    """
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from flower_dp.models import build_model

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    steps = {}
    for mode in modes:
        model = build_model(model_name, seed=seed)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # as in make_steps: identical work per repeat
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus' notes on secure RNG and on its accountant
            res = PrivacyEngine(accountant="rdp").make_private(
                module=model, optimizer=opt, data_loader=DataLoader(TensorDataset(x, y), batch_size=batch),
                noise_multiplier=noise_multiplier, max_grad_norm=clip, poisson_sampling=False,
                grad_sample_mode=mode, criterion=torch.nn.CrossEntropyLoss())
        if mode == "ghost":
            module, dp_opt, criterion, _ = res
        else:
            module, dp_opt, _ = res
            criterion = torch.nn.CrossEntropyLoss()

        def step(module=module, dp_opt=dp_opt, criterion=criterion):
            dp_opt.zero_grad(set_to_none=True)
            criterion(module(x), y).backward()
            dp_opt.step()

        steps[f"opacus_{mode}"] = step
    return steps


def _opacus_version() -> str | None:
    try:
        import opacus
    except ImportError:
        return None
    return str(getattr(opacus, "__version__", "unknown"))


def profile_fast_step(model_name: str, batch: int, repeats: int) -> dict[str, float]:
    """Where the fast DP step's time goes: mean ms per stage (forward+per-sample loss, backward
    to layer outputs, norms, clipped sums, noise, optimizer), measured with torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    steps = make_steps(model_name, batch)
    fast = steps["dp_fast"]
    for _ in range(2):
        fast()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fast()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
    return {e.key: round(e.self_cpu_time_total / 1e3 / repeats, 4) for e in rows}


def _opacus_case(model_name: str, batch: int, steps: dict, repeats: int, short: str, version: str | None) -> dict:
    """Opacus' modes, our DP step and the non-private step in one interleaved loop (keys ``*_beside_opacus``
    for ours, ``opacus_{mode}_*`` for theirs; ratios against that loop's own non-private step)."""
    if version is None:
        return {"opacus": "skipped: opacus not installed"}
    try:
        theirs = make_opacus_steps(model_name, batch)
    except Exception as exc:  # noqa: BLE001 -- report, keep our own figures
        return {"opacus": f"failed: {type(exc).__name__}: {exc}"}
    fns = {"nonprivate_o": steps["nonprivate"], "dp_fast_o": steps["dp_fast"], **theirs}
    # Opacus hooks/functorch take 5-60x a non-private step: fewer rounds than the fast loop, still >= 3
    reps = max(3, repeats * 4 if short == "mlp" else repeats * 3 // 4)
    with warnings.catch_warnings():
        # "Full backward hook is firing ... no inputs require gradients": Opacus' hooks on the first layer
        warnings.simplefilter("ignore", UserWarning)
        # random order in every round: hooks/functorch leave the caches cold (B x d per-sample gradients),
        # so a fixed order would always slow down the same successor
        times = interleaved_times(fns, repeats=reps, shuffle_seed=0)
    mins = {k: min(v) for k, v in times.items()}
    meds = {k: statistics.median(v) for k, v in times.items()}
    res: dict = {"opacus": version, "opacus_repeats": reps,
                 "nonprivate_beside_opacus_ms": round(mins["nonprivate_o"] * 1e3, 4),
                 "ratio_fast_beside_opacus": round(mins["dp_fast_o"] / mins["nonprivate_o"], 3),
                 "median_ratio_fast_beside_opacus": round(meds["dp_fast_o"] / meds["nonprivate_o"], 3)}
    for mode in OPACUS_MODES:
        k = f"opacus_{mode}"
        res[f"{k}_ms"] = round(mins[k] * 1e3, 4)
        res[f"ratio_{k}"] = round(mins[k] / mins["nonprivate_o"], 3)
        res[f"median_ratio_{k}"] = round(meds[k] / meds["nonprivate_o"], 3)
    best = min(OPACUS_MODES, key=lambda m: meds[f"opacus_{m}"])
    res["opacus_best_mode"] = best
    # the issue's peer goal: ours <= 0.6x Opacus' best mode (by the median, both from this loop)
    res["median_ours_over_opacus_best"] = round(meds["dp_fast_o"] / meds[f"opacus_{best}"], 3)
    return res


def run(quick: bool = False) -> dict:
    """Measure the private-step ratios; returns a dict of results (ratios and absolute ms).

    ``*_ms`` and ``ratio_*`` use the minimum over repeats, ``median_*`` the median."""
    batches = (64,) if quick else (32, 64)
    repeats = 3 if quick else 40  # CNN steps; the 2-layer net's ~1 ms steps get 10x more (cheap, steadier minimum)
    opacus_version = _opacus_version()
    out: dict = {"opacus": opacus_version or "skipped: opacus not installed (pip install flower-dp[bench])",
                 "threads": torch.get_num_threads()}
    table = {}
    for short, name in MODELS.items():
        for b in batches:
            steps = make_steps(name, b)
            t0 = time.perf_counter()
            # two loops: the vmap path allocates B*d per-sample gradients (26 MB for the MLP at B = 64)
            # and leaves the caches cold for whatever runs next, so it is timed apart, with its own yardstick
            fast = {k: steps[k] for k in ("nonprivate", "dp_fast", "noise", "clip_fast_only")}
            reps = repeats * (10 if short == "mlp" else 1)
            times = interleaved_times(fast, repeats=reps)
            tv = interleaved_times({"nonprivate_v": steps["nonprivate"], "dp_vmap": steps["dp_vmap"]},
                                   repeats=max(3, repeats // 2))
            times.update(tv)
            # the noise drawn ahead: blocks of consecutive steps of one node, interleaved with in-line blocks and
            # non-private blocks (so the noise thread gets no idle time from the other variants)
            tc = interleaved_times({k: steps[k] for k in ("nonprivate_chain", "dp_fast_chain", "dp_fast_prefetch_chain")},
                                   repeats=max(3, reps // PREFETCH_CHAIN))
            times.update({k: [t / PREFETCH_CHAIN for t in v] for k, v in tc.items()})
            # min of repeats: the least-disturbed run of each step (timeit's advice on a shared machine);
            # medians are kept beside it
            med = {k: min(v) for k, v in times.items()}
            mdn = {k: statistics.median(v) for k, v in times.items()}
            base = med["nonprivate"]
            table[f"{short}_b{b}"] = {
                "median_ratio_vmap": round(mdn["dp_vmap"] / mdn["nonprivate_v"], 3),
                "median_ratio_fast": round(mdn["dp_fast"] / mdn["nonprivate"], 3),
                "median_nonprivate_ms": round(mdn["nonprivate"] * 1e3, 4),
                "nonprivate_ms": round(base * 1e3, 4),
                "dp_vmap_ms": round(med["dp_vmap"] * 1e3, 4),
                "dp_fast_ms": round(med["dp_fast"] * 1e3, 4),
                "ratio_vmap": round(med["dp_vmap"] / med["nonprivate_v"], 3),
                "ratio_fast": round(med["dp_fast"] / base, 3),
                "noise_ms": round(med["noise"] * 1e3, 4),
                "clip_fast_only_ms": round(med["clip_fast_only"] * 1e3, 4),
                "ratio_fast_without_noise": round((med["dp_fast"] - med["noise"]) / base, 3),
                # run.prefetch_noise: the noise drawn on a second thread while the gradient is computed
                "dp_fast_prefetch_ms": round(med["dp_fast_prefetch_chain"] * 1e3, 4),
                "ratio_fast_prefetch": round(med["dp_fast_prefetch_chain"] / med["nonprivate_chain"], 3),
                "median_ratio_fast_prefetch": round(mdn["dp_fast_prefetch_chain"] / mdn["nonprivate_chain"], 3),
                "median_ratio_fast_chain": round(mdn["dp_fast_chain"] / mdn["nonprivate_chain"], 3),
                "repeats": reps,
            }
            table[f"{short}_b{b}"].update(_opacus_case(name, b, steps, repeats, short, opacus_version))
            table[f"{short}_b{b}"]["wall_s"] = round(time.perf_counter() - t0, 2)
    out["cases"] = table
    if not quick:
        out["profile_fast_ms_per_step"] = {
            "cnn_b64": profile_fast_step("shallow_cnn", 64, 10),
            "mlp_b64": profile_fast_step("mlp_2layer", 64, 20),
        }
    return out
