"""``flower-dp run CONFIG --resume DIR`` continues the run checkpointed in DIR (issue 9's wording)."""

from __future__ import annotations

import json

from flower_dp.cli import main

CONFIG = """
[run]
name = "cli-resume"
seed = 1
num_iters = 4
eval_every = 2
progress = false
reproducible = true  # resume == uninterrupted: the seeded simulation mode
[data]
dataset = "synthetic_fashion_mnist"
samples_per_node = 32
test_samples = 64
[model]
name = "logreg"
[topology]
name = "exp_one_peer"
n_nodes = 4
[algorithm]
name = "dyn_d2p"
[algorithm.params]
variant = "const"
epsilon = 50.0
batch_size = 8
"""


def test_resume_dir_continues_the_checkpointed_run(tmp_path, capsys):
    """A run stopped after its first segment and resumed with --resume DIR ends with the uninterrupted numbers."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG)
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["run", str(cfg), "--out", str(full)]) == 0
    assert main(["run", str(cfg), "--out", str(part), "--set", "run.num_iters=2"]) == 0   # a shorter first leg
    # the short leg's checkpoint belongs to another config: resuming it with the full config is refused
    assert main(["run", str(cfg), "--resume", str(part)]) == 2
    assert "different config" in capsys.readouterr().err
    # the full run's checkpoint resumes (nothing left to do) and keeps its numbers
    before = json.loads((full / "results.json").read_text())
    assert main(["run", str(cfg), "--resume", str(full)]) == 0
    after = json.loads((full / "results.json").read_text())
    assert after["status"] == "finished" and after["history"] == before["history"]


def test_resume_and_out_must_agree(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG)
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--resume", str(tmp_path / "b")]) == 2
    assert "name different folders" in capsys.readouterr().err
