"""The README's "My own Flower app -> private push-sum" diff, read from the README, applied to Flower's PyTorch
template app (``tests/flower_template.py``: the app ``flwr new`` makes, with synthetic data) and run with ``flwr run``
in a local simulation: the README and what runs cannot drift.
"""

from __future__ import annotations

import re
import time

import pytest

from flower_template import apply_readme_diff, template_app
from flwr_run_helper import flwr_run

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(600)]

MARKER = "**My own Flower app -> private push-sum**"
N = 4  # the README diff's n (= num-supernodes)
CLIENT, SERVER = "pytorchexample/client_app.py", "pytorchexample/server_app.py"


def test_readme_diff_parses_into_the_two_template_files(tmp_path):
    texts = apply_readme_diff(template_app(tmp_path), MARKER)
    assert set(texts) == {CLIENT, SERVER}
    assert "make_client_app(" in texts[CLIENT]
    assert "FedAvg(" not in texts[SERVER].split("strategy.start")[0].split("# Load global model")[1]


def test_readme_push_sum_diff_runs_on_the_pytorch_template_with_flwr_run(tmp_path):
    """The diffed template app runs under `flwr run --stream` (local simulation, 4 SuperNodes, 2 rounds): a
    [ROUND r/2] line per segment with the iterations, global_evaluate's accuracy and the eps spent (<= 3)."""
    app = template_app(tmp_path)
    apply_readme_diff(app, MARKER)
    t0 = time.monotonic()
    text = flwr_run(app, tmp_path, federation_config=f"num-supernodes={N}", run_config="num-server-rounds=2",
                    timeout=480)
    wall = time.monotonic() - t0
    for r in (1, 2):
        assert f"[ROUND {r}/2]" in text, text[-6000:]
        assert f"iterations {10 * r}/20 done" in text, text[-6000:]
    eps = [float(e) for e in re.findall(r"privacy spent \(largest over 4 nodes at delta 1e-05\): eps_rigorous ([0-9.]+)",
                                        text)]
    assert len(eps) == 2 and 0 < eps[0] < eps[1] <= 3.0 + 1e-9, text[-6000:]
    assert len(re.findall(r"network average: accuracy [0-9.]+, loss", text)) == 2, text[-6000:]
    assert "FINAL_ARRAYS ['conv1.bias', 'conv1.weight'" in text, text[-6000:]
    print(f"README push-sum diff on the PyTorch template: flwr run {wall:.1f} s; eps per round {eps}; its log:")
    print("\n".join(line for line in text.splitlines() if "[ROUND" in line or "──>" in line))
