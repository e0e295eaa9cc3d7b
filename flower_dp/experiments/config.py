"""Experiment configs: plain TOML files with defaults, validated all at once.

A config has seven tables::

    [run]        name, seed, num_iters (K), eval_every, out_dir, checkpoint, eval_nodes, progress,
                 device ("cpu", "cuda", "cuda:1" or "auto"), debug_metrics (default false: per-node
                 training statistics of private data stay on the node; see flower_dp.releases),
                 reproducible (default false: privacy noise and private sampling come from each node's
                 secret; true: a simulation mode keyed by the published seed, see flower_dp.rng),
                 prefetch_noise (default false: true draws each CPU node's next Gaussian noise on a
                 background thread while it computes; the same numbers, faster with a free core),
                 noise_sampler ("float" default | "exact": integers on a grid plus the exact discrete
                 Gaussian from a ChaCha20 keystream, see docs/privacy.md "Floating point"),
                 backend ("inprocess" | "ray": the nodes on Ray host actors, flower_dp.experiments.ray_cluster),
                 ray_address ("HEAD:PORT" or "auto" of a running cluster; default none: a local Ray),
                 ray_num_hosts (host actors; default one per CPU, or GPU share, of the cluster),
                 ray_num_gpus_per_host (default 0), ray_placement ("SPREAD" | "STRICT_SPREAD")
    [data]       dataset, root, partition, alpha, samples_per_node, test_samples, scaling ("standard" | "unit")
    [model]      name (+ keyword arguments of ``flower_dp.models.build_model``)
    [topology]   name (+ keyword arguments of ``flower_dp.topology.make_topology``), n_nodes
    [algorithm]  name, and [algorithm.params] checked by the algorithm's own parameter class
    [privacy]    party: whom the eps is stated for and the noise calibrated to (flower_dp.privacy.parties):
                 "out_neighbour" (default), "relay" (needs run.checkpoint = false) or "model_observer"
    [network]    mode ("sync" default: every node at iteration k together | "async": the emulated asynchronous
                 network of flower_dp.gossip.asynchronous, in virtual time, in process), delay ("exponential" |
                 "uniform" | "constant"), delay_mean (virtual seconds), loss, duplicate (probabilities in [0, 1)),
                 step_time (virtual seconds of a speed-1 step; run.eval_every counts such steps), speeds (one per
                 node), stragglers (table node = times slower), jitter, horizon (virtual seconds; default: until
                 every node has taken run.num_iters steps, its plan's K); an async run keeps no checkpoint

Every unknown key or bad value is collected and reported together in one
:class:`flower_dp.errors.ConfigError`, naming the key, the value and what is valid.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["ExperimentConfig", "load_config", "config_from_dict", "SECTIONS", "PLACE_KEYS", "placeless"]

#: ``[run]`` keys that say where and how the nodes run, not what they compute: a run's identity leaves them out
#: (a run checkpointed in process may resume on Ray and the reverse; its numbers are the same)
PLACE_KEYS = ("backend", "ray_address", "ray_num_hosts", "ray_num_gpus_per_host", "ray_placement")


def placeless(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict without its :data:`PLACE_KEYS`."""
    return {**config, "run": {k: v for k, v in config.get("run", {}).items() if k not in PLACE_KEYS}}

#: Allowed keys per section with their defaults (None = required or "use the library default").
SECTIONS: dict[str, dict[str, Any]] = {
    "run": {
        "name": "run",
        "seed": 0,
        "num_iters": 100,
        "eval_every": 50,
        "out_dir": None,
        "checkpoint": True,
        "eval_nodes": False,
        "progress": True,
        "device": "cpu",
        "debug_metrics": False,
        "reproducible": False,
        "prefetch_noise": False,
        "noise_sampler": "float",
        "backend": "inprocess",
        "ray_address": None,
        "ray_num_hosts": None,
        "ray_num_gpus_per_host": 0.0,
        "ray_placement": "SPREAD",
    },
    "data": {
        "dataset": "fashion_mnist",
        "root": None,
        "partition": "shuffle_split",
        "alpha": 0.5,
        "samples_per_node": None,
        "test_samples": None,
        "scaling": "standard",
    },
    "model": {"name": "shallow_cnn"},
    "topology": {"name": "exp_one_peer", "n_nodes": 8},
    "algorithm": {"name": "dyn_d2p", "params": {}},
    "privacy": {"party": "out_neighbour"},
    "network": {
        "mode": "sync",
        "delay": "exponential",
        "delay_mean": 0.0,
        "loss": 0.0,
        "duplicate": 0.0,
        "step_time": 1.0,
        "speeds": [],
        "stragglers": {},
        "jitter": 0.0,
        "horizon": None,
    },
}
#: Sections whose extra keys are passed through as keyword arguments.
_PASSTHROUGH = {"model", "topology"}


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment configuration (see the module docstring for the keys)."""

    run: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    topology: dict[str, Any] = field(default_factory=dict)
    algorithm: dict[str, Any] = field(default_factory=dict)
    privacy: dict[str, Any] = field(default_factory=lambda: {"party": "out_neighbour"})
    network: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(SECTIONS["network"]))

    @property
    def n_nodes(self) -> int:
        return int(self.topology["n_nodes"])

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))

    def with_overrides(self, overrides: dict[str, Any]) -> ExperimentConfig:
        """A new config with dotted-key overrides applied, e.g. ``{"run.num_iters": 10}``."""
        raw = self.to_dict()
        for dotted, value in overrides.items():
            parts = dotted.split(".")
            target = raw
            for p in parts[:-1]:
                target = target.setdefault(p, {})
            target[parts[-1]] = value
        return config_from_dict(raw)


def _check_int(problems: list[str], key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"{key} must be an integer >= {minimum}, got {value!r}")


def config_from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    """Validate a raw dict (as parsed from TOML) and fill defaults.

    Raises
    ------
    ConfigError
        Listing every unknown section/key and every invalid value found.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a table of sections, got {type(raw).__name__}")
    problems: list[str] = []
    for section in raw:
        if section not in SECTIONS:
            problems.append(f"unknown section [{section}]; valid sections are {sorted(SECTIONS)}")
    out: dict[str, dict[str, Any]] = {}
    for section, defaults in SECTIONS.items():
        given = raw.get(section, {})
        if not isinstance(given, dict):
            problems.append(f"[{section}] must be a table, got {given!r}")
            given = {}
        merged = copy.deepcopy(defaults)
        for key, value in given.items():
            if key not in defaults and section not in _PASSTHROUGH:
                problems.append(f"unknown key {section}.{key}; valid keys are {sorted(defaults)}")
                continue
            merged[key] = value
        out[section] = merged

    run, data, topo, alg = out["run"], out["data"], out["topology"], out["algorithm"]
    _check_int(problems, "run.seed", run["seed"], 0)
    _check_int(problems, "run.num_iters", run["num_iters"], 1)
    _check_int(problems, "run.eval_every", run["eval_every"], 1)
    if not isinstance(run["debug_metrics"], bool):
        problems.append(f"run.debug_metrics must be true or false, got {run['debug_metrics']!r}")
    for key in ("reproducible", "prefetch_noise"):
        if not isinstance(run[key], bool):
            problems.append(f"run.{key} must be true or false, got {run[key]!r}")
    if run["noise_sampler"] not in ("float", "exact"):
        problems.append(f"run.noise_sampler must be 'float' or 'exact', got {run['noise_sampler']!r}")
    if run["backend"] not in ("inprocess", "ray"):
        problems.append(f"run.backend must be 'inprocess' or 'ray', got {run['backend']!r} (the Flower simulation "
                        "is `flower-dp reproduce --backend flower` / train_private(backend='flower'))")
    if run["ray_address"] is not None and (not isinstance(run["ray_address"], str) or not run["ray_address"]):
        problems.append(f"run.ray_address must be 'HEAD:PORT' or 'auto', got {run['ray_address']!r}")
    if run["ray_num_hosts"] is not None:
        _check_int(problems, "run.ray_num_hosts", run["ray_num_hosts"], 1)
    g = run["ray_num_gpus_per_host"]
    if isinstance(g, bool) or not isinstance(g, (int, float)) or not g >= 0:
        problems.append(f"run.ray_num_gpus_per_host must be a number >= 0, got {g!r}")
    if run["ray_placement"] not in ("SPREAD", "STRICT_SPREAD"):
        problems.append(f"run.ray_placement must be 'SPREAD' or 'STRICT_SPREAD', got {run['ray_placement']!r}")
    _check_int(problems, "topology.n_nodes", topo["n_nodes"], 1)
    if data["scaling"] not in ("standard", "unit"):
        problems.append(f"data.scaling must be 'standard' or 'unit', got {data['scaling']!r}")
    for key in ("samples_per_node", "test_samples"):
        if data[key] is not None:
            _check_int(problems, f"data.{key}", data[key], 1)
    for section in ("model", "topology", "algorithm"):
        if not isinstance(out[section].get("name"), str):
            problems.append(f"{section}.name must be a string, got {out[section].get('name')!r}")
    from ..privacy.parties import PARTIES

    if out["privacy"]["party"] not in PARTIES["push_sum"]:
        problems.append(f"privacy.party must be one of {sorted(PARTIES['push_sum'])}, got {out['privacy']['party']!r}")
    elif out["privacy"]["party"] == "relay" and run["checkpoint"]:
        problems.append("privacy.party = 'relay' needs run.checkpoint = false: a checkpoint brings every node's state "
                        "to the server, so no eps holds against the relaying orchestrator")
    if not isinstance(alg.get("params"), dict):
        problems.append(f"algorithm.params must be a table, got {alg.get('params')!r}")
    problems.extend(_network_problems(out["network"], run["backend"], topo["n_nodes"], alg.get("name")))
    if problems:
        raise ConfigError(
            "invalid experiment config:\n  - " + "\n  - ".join(problems) + "\nfix these keys and run again",
            problems,
        )
    return ExperimentConfig(**out)


def _network_problems(net: dict[str, Any], backend: Any, n_nodes: Any, algorithm: Any) -> list[str]:
    """The problems of a ``[network]`` table: its mode, a network key set without ``mode = "async"``, the network
    model's values (:meth:`flower_dp.gossip.asynchronous.NetworkModel.problems`) and what an asynchronous run needs
    (an algorithm whose mix is a linear sum, :func:`flower_dp.clients.registry.async_problem`; the nodes in process)."""
    mode = net["mode"]
    if mode not in ("sync", "async"):
        return [f"network.mode must be 'sync' or 'async', got {mode!r}"]
    if mode == "sync":
        set_keys = sorted(k for k, v in net.items() if k != "mode" and v != SECTIONS["network"][k])
        return [f"network.{k} = {net[k]!r} describes the asynchronous network, got network.mode = 'sync' (every "
                "message arrives); set network.mode = 'async' or drop the key" for k in set_keys]
    from ..clients.registry import async_problem
    from ..gossip.asynchronous import NetworkModel

    n = n_nodes if isinstance(n_nodes, int) and n_nodes >= 1 else 1
    try:
        out = NetworkModel.from_config(net).problems(n)
    except TypeError as exc:  # pragma: no cover - the keys are checked above
        return [f"[network] cannot be read: {exc}"]
    if isinstance(algorithm, str):
        why = async_problem(algorithm)
        if why is not None:
            out.append(why)
    if backend != "inprocess":
        out.append(f"network.mode = 'async' runs the nodes in this process, got run.backend = {backend!r}; "
                   "set run.backend = 'inprocess' (the asynchronous network on Ray actors is not built yet)")
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read a TOML config file and validate it (see :func:`config_from_dict`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass the path of a .toml file")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from exc
    cfg = config_from_dict(raw)
    return cfg.with_overrides(overrides) if overrides else cfg
