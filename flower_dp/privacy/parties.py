"""The parties a run's eps is stated for: who they are, what reaches each, what each is charged and why.

An eps is an upper bound for one adversary: the one whose view the proof covers.  This module declares, once, the
parties of each family of algorithms (:data:`PARTIES`), the view of each (what reaches it: messages, their senders,
byte counts, results fields, log records, checkpoints), the bound that charges it or the reason no eps holds for it,
and computes every party's eps of a run (:func:`gau_lrq_eps_by_party`, :func:`push_sum_eps_by_party`).  A run
calibrates its noise to one party (``party``, default :data:`DEFAULT_PARTY`) and reports every other beside it
(``results.json["eps_by_party"]``: party name -> ``{"eps", "delta", "bound"}`` or ``{"eps": None, "reason"}``).

Gau-LRQ (B of N clients per round, noise ``N(0, (z_k S2)^2 I)`` on the sum of the clipped updates, replace-one client):

- ``model_observer`` (the Gau-LRQ paper's adversary): sees the released global models and the results' public
  fields, not who was sampled.  Charged the fixed-size subsampled Gaussian, q = B/N (:mod:`.gau_lrq`, bound
  ``fixed_size_pair``).
- ``client`` (another client): sees the global models it is sent (the released ones), its own messages, and whether
  it was itself sampled.  With per-client keys (each client's dither, layers and noise from a key only it and the
  server hold) the target's inclusion is, given the observer's own status, uniform over the other N-1 clients with B
  slots (observer not sampled) or B-1 slots (sampled); in the second case the observer also knows its own share of
  the noise, so the rest has std ``z_k S2 sqrt((B-1)/B)``.  Both cases are dominated by the fixed-size pair at
  ``q = min(B, N-1)/(N-1)`` and ``z_k sqrt((B-1)/B)`` (joint convexity of the hockey-stick divergence for the larger
  q, post-processing for the smaller noise; B = 1: a sampled observer leaves no slot for the target, so z_k is
  kept), bound ``fixed_size_pair_other_client``.  Without per-client keys every client holds the run secret and
  re-simulates the sample, the layers and the noise: no eps (None, with the reason).
- ``network_observer``: sees who sends and when (so the sample), the byte counts, and the released models (message
  contents under TLS).  The sample is independent of the data and equal in both neighbouring worlds, so conditioned
  on it the run is a composition of Gaussian releases: ``mu^2 = n (2/z)^2`` (sensitivity 2 S2 at noise z S2, rounds
  at several z charged at the smallest) with n the rounds that sampled the target, n ~ Binomial(K, B/N); by joint
  convexity ``delta(eps) <= E_n[delta_G(eps; mu(n))]`` (bound ``gdp_sample_known``,
  :func:`flower_dp.privacy.table_bound.table_epsilon`, the mixture PrivSGP-VR's table uses).  No amplification.
- ``server``: decodes each sampled client's update with that client's layer width and dither, so it sees each
  clipped update up to an error of known width: no eps (the Gau-LRQ paper's scope is an observer of the aggregate).

Push-sum (each node perturbs what it sends; the per-node eps is record-level, the largest over the nodes):

- ``out_neighbour``: receives a node's shares (the per-node eps, bound of the node's accountant).
- ``relay``: the orchestrator relaying every share (``transport="relay"``): sees every node's shares, the same
  charge as an out-neighbour (the per-node eps covers every share a node sends).  With ``checkpoint=True`` the
  nodes' states (their parameters before noise) come back to the server after each round: no eps.
- ``model_observer``: the network-average model: a post-processing of the shares, at most the out-neighbour's eps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_int
from .accountant import DEFAULT_ACCOUNTANT, GaussianStep, epsilon_and_bound

__all__ = ["Party", "PARTIES", "DEFAULT_PARTY", "FAMILIES", "check_party", "gau_lrq_party_epsilon",
           "gau_lrq_party_steps", "gau_lrq_eps_by_party", "gau_lrq_party_epsilon_and_bound",
           "network_observer_epsilon", "push_sum_eps_by_party",
           "NO_PER_CLIENT_KEYS", "SERVER_DECODES", "RELAY_CHECKPOINT", "party_label",
           "push_sum_eps_by_party_from_reports", "check_push_sum_party"]

FAMILIES = ("gau_lrq", "push_sum")


@dataclass(frozen=True)
class Party:
    """One party of a family: its ``name``, what reaches it (``sees``), the ``bound`` that charges it (None when no
    eps holds for it) and, then, ``reason``."""

    name: str
    sees: str
    bound: str | None
    reason: str | None = None


#: Why the server of a Gau-LRQ run has no eps.
SERVER_DECODES = ("the server decodes each sampled client's update with that client's layer width and dither (or "
                  "knows its Gaussian noise), so it sees each clipped update up to an error of known width: no "
                  "differential privacy against the server (the Gau-LRQ paper's adversary observes the aggregate only)")
#: Why another client has no eps while every client holds the run secret.
NO_PER_CLIENT_KEYS = ("every client holds the run secret, from which the sample, every client's layers and dither and "
                      "the server's noise derive: another client re-simulates the round and tells the neighbouring "
                      "worlds apart; it is charged an eps only with per-client keys")
#: Why the relay has no eps when the nodes' states are checkpointed to the server.
RELAY_CHECKPOINT = ("checkpoint=True brings every node's state (its parameters before noise) to the server after each "
                    "round: no differential privacy against the orchestrator; checkpoint=False keeps the states on "
                    "the nodes")

PARTIES: dict[str, dict[str, Party]] = {
    "gau_lrq": {
        "model_observer": Party(
            "model_observer", "the released global models and the results' public fields (z_k, counts); not who was "
            "sampled", "fixed_size_pair: PLD of the symmetrised dominating pair of B-of-N sampling without "
            "replacement (or RDP's bound for it, whichever is smaller), replace-one client, q = B/N"),
        "client": Party(
            "client", "the global models it is sent (the released ones), its own messages and whether it was "
            "sampled; with per-client keys, its own key only",
            "fixed_size_pair_other_client: the fixed-size pair at q = min(B, N-1)/(N-1) over the other N-1 clients "
            "and noise multiplier z_k sqrt((B-1)/B) (its own share of the noise known), replace-one client"),
        "network_observer": Party(
            "network_observer", "who sends and when (the sample), the byte counts, and the released global models; "
            "message contents under TLS",
            "gdp_sample_known: GDP conditioned on the (data-independent) sample, mu^2 = n (2/z)^2, mixed over "
            "n ~ Binomial(K, B/N): delta(eps) = E_n[delta_G(eps; mu(n))]; no amplification"),
        "server": Party(
            "server", "every sampled client's message with the keys that decode it, and the sample", None,
            SERVER_DECODES),
    },
    "push_sum": {
        "out_neighbour": Party(
            "out_neighbour", "the shares a node sends it (perturbed parameters and push-sum weights), their sender "
            "and size", "the node's accountant (per-node record-level eps, largest over the nodes)"),
        "relay": Party(
            "relay", "with transport='relay', every node's shares, senders and sizes; the per-round metrics; with "
            "checkpoint=True, every node's state",
            "the node's accountant: every share a node sends is charged, so seeing all of them costs what an "
            "out-neighbour's view costs"),
        "model_observer": Party(
            "model_observer", "the network-average model (and the results' public fields)",
            "post-processing of the shares: at most the out-neighbour's eps"),
    },
}

#: The party a run calibrates to unless told otherwise: Gau-LRQ's paper adversary; push-sum's out-neighbour.
DEFAULT_PARTY = {"gau_lrq": "model_observer", "push_sum": "out_neighbour"}


def check_party(family: str, party: str | None) -> str:
    """``party`` if it is one of ``family``'s parties (None: the family's default), else a ``ValueError`` listing
    them."""
    if family not in PARTIES:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    if party is None:
        return DEFAULT_PARTY[family]
    if party not in PARTIES[family]:
        raise ValueError(f"party must be one of {sorted(PARTIES[family])} for {family.replace('_', '-')} runs, got "
                         f"{party!r}; pass one of them (default {DEFAULT_PARTY[family]!r})")
    return party


def party_label(family: str, party: str) -> str:
    """``"party 'x'"`` (``"party 'x' (no eps)"`` where none holds): how an ``accounting_method`` and a summary line
    name the party."""
    return f"party {party!r}" + ("" if PARTIES[family][party].bound else " (no eps)")


# -- Gau-LRQ ---------------------------------------------------------------------------------------------------------

def _z(noise_multiplier) -> np.ndarray:
    return np.asarray(noise_multiplier, dtype=np.float64).ravel()


def _other_client_factor(B: int) -> float:
    """The noise an observing client does not know, as a multiple of z: ``sqrt((B-1)/B)`` (1 for B = 1)."""
    return 1.0 if B == 1 else math.sqrt((B - 1) / B)


def gau_lrq_party_steps(party: str, noise_multiplier, *, B: int, N: int) -> list[GaussianStep]:
    """The accountant steps charging ``party`` (``model_observer`` or ``client``) for rounds at ``noise_multiplier``."""
    z = _z(noise_multiplier)
    vals, counts = np.unique(z, return_counts=True)
    if party == "model_observer":
        return [GaussianStep(B / N, float(v), int(c), "fixed_size", N) for v, c in zip(vals, counts)]
    if party == "client":
        f, n_other = _other_client_factor(B), N - 1
        return [GaussianStep(min(B, n_other) / n_other, float(v) * f, int(c), "fixed_size", n_other)
                for v, c in zip(vals, counts)]
    raise ValueError(f"party {party!r} is not charged with subsampled steps; use gau_lrq_party_epsilon")


def network_observer_epsilon(noise_multiplier, delta: float, *, B: int, N: int) -> float:
    """eps at ``delta`` against an observer who knows the sample (bound ``gdp_sample_known``, module docstring):
    ``E_n[delta_G(eps; sqrt(n) 2/z_min)]``, n ~ Binomial(K, B/N), through :func:`.table_bound.table_epsilon`."""
    from .table_bound import table_epsilon

    z = _z(noise_multiplier)
    if z.size == 0:
        return 0.0
    return float(table_epsilon(B / N, int(z.size), (2.0 / float(z.min())) ** 2, 0.0, delta)[0])


def gau_lrq_party_epsilon_and_bound(party: str, noise_multiplier, delta: float, *, B: int, N: int,
                                    per_client_keys: bool = False,
                                    accountant: str = DEFAULT_ACCOUNTANT) -> tuple[float | None, str | None]:
    """eps at ``delta`` charged to ``party`` for rounds at ``noise_multiplier`` (z_k, shape (k,)) and the key of
    :data:`.accountant.BOUNDS` that gave it; ``(0.0, "none")`` for no rounds; ``(None, None)`` where no eps holds
    (the server; another client without per-client keys; N = 1: no other client)."""
    party = check_party("gau_lrq", party)
    N = check_int("N", N, minimum=1)
    B = check_int("B", B, minimum=1, maximum=N)
    z = _z(noise_multiplier)
    if party == "server" or (party == "client" and (not per_client_keys or N == 1)):
        return None, None
    if z.size == 0:
        return 0.0, "none"
    if party == "network_observer":
        return network_observer_epsilon(z, delta, B=B, N=N), "gdp_sample_known"
    return epsilon_and_bound(gau_lrq_party_steps(party, z, B=B, N=N), delta, accountant=accountant,
                             adjacency="replace_one")


def gau_lrq_party_epsilon(party: str, noise_multiplier, delta: float, *, B: int, N: int,
                          per_client_keys: bool = False, accountant: str = DEFAULT_ACCOUNTANT) -> float | None:
    """eps of :func:`gau_lrq_party_epsilon_and_bound` (None where no eps holds for ``party``)."""
    return gau_lrq_party_epsilon_and_bound(party, noise_multiplier, delta, B=B, N=N, per_client_keys=per_client_keys,
                                           accountant=accountant)[0]


def _none_reason(party: str, N: int, per_client_keys: bool) -> str:
    if party == "server":
        return SERVER_DECODES
    if N == 1:
        return "N = 1: there is no other client"
    return NO_PER_CLIENT_KEYS if not per_client_keys else ""


def gau_lrq_eps_by_party(noise_multiplier, delta: float, *, B: int, N: int, per_client_keys: bool = False,
                         heuristic_note: str | None = None) -> dict[str, dict]:
    """Every Gau-LRQ party's entry for rounds at ``noise_multiplier``: ``{"eps", "delta", "bound"}`` (``bound``: the
    key of :data:`.accountant.BOUNDS` that gave eps), or ``{"eps": None, "reason"}``.  ``heuristic_note`` (a
    mechanism without a DP proof, e.g. BQ-SGD): every entry has ``eps`` None and the variance-matched figure as
    ``eps_heuristic``, with the note as its reason."""
    out: dict[str, dict] = {}
    for name in PARTIES["gau_lrq"]:
        eps, bound = gau_lrq_party_epsilon_and_bound(name, noise_multiplier, delta, B=B, N=N,
                                                     per_client_keys=per_client_keys)
        if eps is None:
            out[name] = {"eps": None, "reason": _none_reason(name, N, per_client_keys)}
        elif heuristic_note is not None:
            out[name] = {"eps": None, "eps_heuristic": float(eps), "delta": float(delta), "bound": bound,
                         "reason": heuristic_note}
        else:
            out[name] = {"eps": float(eps), "delta": float(delta), "bound": bound}
    return out


# -- push-sum --------------------------------------------------------------------------------------------------------

def push_sum_eps_by_party(eps: float | None, delta: float | None, bound: str, *, transport: str | None,
                          checkpoint: bool, heuristic: bool = False) -> dict[str, dict]:
    """Every push-sum party's entry from the per-node eps (``eps``, the largest over the nodes at ``delta``, by
    ``bound``): ``out_neighbour`` and ``model_observer`` (post-processing) are charged it; ``relay`` too, except with
    ``checkpoint=True`` (None with :data:`RELAY_CHECKPOINT`) or without a relaying orchestrator (``transport`` not
    ``"relay"``: the entry says it relays nothing and is charged nothing beyond the out-neighbour's eps).
    ``heuristic``: the per-node figure has no DP proof (``eps`` None, ``eps_heuristic``)."""
    def entry(reason: str | None = None) -> dict:
        if eps is None or (isinstance(eps, float) and math.isinf(eps)):
            return {"eps": None, "reason": "not private: no noise is added"}
        if heuristic:
            return {"eps": None, "eps_heuristic": float(eps), "delta": delta, "bound": bound,
                    "reason": "the nodes' eps is heuristic (no DP proof)"}
        return {"eps": float(eps), "delta": None if delta is None else float(delta), "bound": bound,
                **({"note": reason} if reason else {})}

    out = {"out_neighbour": entry(), "model_observer": entry("post-processing of the shares")}
    if checkpoint:
        out["relay"] = {"eps": None, "reason": RELAY_CHECKPOINT}
    else:
        out["relay"] = entry(None if transport == "relay" else
                             f"transport={transport!r}: no orchestrator relays the shares")
    return {name: out[name] for name in PARTIES["push_sum"]}


def push_sum_eps_by_party_from_reports(per_node: list[dict], *, transport: str | None,
                                       states_to_server: bool) -> dict[str, dict]:
    """:func:`push_sum_eps_by_party` of the nodes' privacy reports (the largest eps over the nodes at their delta,
    :func:`flower_dp.privacy.reports.largest_node_spend`); ``states_to_server``: the nodes' states come back to the
    server (a checkpoint, or Ray's in-memory restarts).  No report: every entry None, saying so."""
    reps = [r for r in per_node or [] if r.get("eps_rigorous") is not None or r.get("eps_heuristic") is not None]
    if not reps:
        return {name: {"eps": None, "reason": "the nodes report no privacy (no privacy plan)"}
                for name in PARTIES["push_sum"]}
    rep = max(reps, key=lambda r: float(r.get("eps_rigorous") if r.get("eps_rigorous") is not None
                                        else r["eps_heuristic"]))
    heuristic = rep.get("eps_rigorous") is None
    eps = float(rep["eps_heuristic"] if heuristic else rep["eps_rigorous"])
    bound = (f"node accountant ({rep.get('accountant', 'auto')}, {rep.get('adjacency', '')} record-level, largest "
             "over the nodes)")
    return push_sum_eps_by_party(eps, rep.get("delta"), bound, transport=transport, checkpoint=states_to_server,
                                 heuristic=heuristic)


def check_push_sum_party(party: str | None, *, states_to_server: bool) -> str:
    """``party`` checked for a push-sum run (None: ``"out_neighbour"``); ``"relay"`` is refused when the nodes'
    states come back to the server (no eps holds for it then)."""
    party = check_party("push_sum", party)
    if party == "relay" and states_to_server:
        raise ValueError(f"party='relay' has no eps in this run: {RELAY_CHECKPOINT}; pass checkpoint=False (and "
                         "max_retries=0 on Ray) or calibrate to 'out_neighbour'")
    return party
