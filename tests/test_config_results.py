"""Config validation, atomic results files and checksummed checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from flower_dp.errors import CheckpointError, ConfigError
from flower_dp.experiments.config import config_from_dict, load_config
from flower_dp.results import load_checkpoint, save_checkpoint, write_csv, write_json, ensure_writable_dir


def test_defaults_filled_and_overrides():
    cfg = config_from_dict({"run": {"num_iters": 7}})
    assert cfg.run["num_iters"] == 7 and cfg.topology["n_nodes"] == 8
    cfg2 = cfg.with_overrides({"run.num_iters": 3, "algorithm.params.epsilon": 2.0})
    assert cfg2.run["num_iters"] == 3 and cfg2.algorithm["params"]["epsilon"] == 2.0
    assert cfg.run["num_iters"] == 7  # original unchanged


def test_every_problem_reported_at_once():
    """Unknown section, unknown key and a bad value are all listed in one ConfigError."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({"runn": {}, "run": {"num_iter": 5, "seed": -1}, "data": {"samples_per_node": 0}})
    problems = info.value.problems
    assert any("unknown section [runn]" in p for p in problems)
    assert any("unknown key run.num_iter" in p and "num_iters" in p for p in problems)
    assert any("run.seed must be an integer >= 0, got -1" in p for p in problems)
    assert any("data.samples_per_node" in p for p in problems)


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nx=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_json_csv_written_atomically(tmp_path):
    write_json(tmp_path / "r.json", {"a": float("inf"), "t": torch.tensor([1.0, 2.0])})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": "inf", "t": [1.0, 2.0]}
    write_csv(tmp_path / "h.csv", [{"k": 1, "acc": 0.5}, {"k": 2, "loss": 1.0}])
    assert (tmp_path / "h.csv").read_text().splitlines()[0] == "k,acc,loss"
    assert not list(tmp_path.glob(".*.tmp"))


def test_checkpoint_roundtrip_and_corruption_detected(tmp_path):
    state = {"k": 5, "x": torch.arange(4.0)}
    save_checkpoint(tmp_path, state)
    back = load_checkpoint(tmp_path)
    assert back["k"] == 5 and torch.equal(back["x"], state["x"])
    path = tmp_path / "checkpoint.pt"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "empty")


def test_unwritable_results_dir_is_a_clear_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="not writable"):
        ensure_writable_dir(f / "sub")
