"""The README's FedAvg -> GauLRQ diff, read from the README, applied to Flower's PyTorch template app
(``tests/flower_template.py``: the app ``flwr new`` makes, with synthetic data) and run with ``flwr run`` (local
simulation: a SuperLink and a Ray head of the test's own on 127.0.0.1), at the README's setting: the model learns.
"""

from __future__ import annotations

import stat

import pytest

from flower_template import apply_readme_diff, last_global_accuracy, template_app

MARKER = "**FedAvg -> GauLRQ**"
NUM_SUPERNODES = 100  # the README's setting: num_clients=100, fraction_train 0.5 -> B = 50
RUN_CONFIG = "num-server-rounds=5 local-epochs=2"  # the README's run line


def test_readme_diff_applies_to_the_template_layout(tmp_path):
    """Every line the diff removes or keeps is in the template app, and the result names GauLRQ and the mod."""
    texts = apply_readme_diff(template_app(tmp_path), MARKER)
    assert set(texts) == {"pyproject.toml", "pytorchexample/client_app.py", "pytorchexample/server_app.py"}
    assert "ClientApp(mods=[gau_lrq_mod])" in texts["pytorchexample/client_app.py"]
    assert "GauLRQ(" in texts["pytorchexample/server_app.py"] and "FedAvg(" not in texts["pytorchexample/server_app.py"]
    compile(texts["pytorchexample/server_app.py"], "server_app.py", "exec")
    compile(texts["pytorchexample/client_app.py"], "client_app.py", "exec")


@pytest.mark.slow
def test_readme_diff_runs_as_written_with_flwr_run_and_learns(tmp_path, monkeypatch):
    """Template app + the README's diff -> `flwr run` (100 SuperNodes, the README's run line): GauLRQ creates the
    master secret file (0600, path logged) and one key file per client (0600, folder 0700), trains 5 rounds at eps 8
    (each ClientApp reading its own key), and the template's ``global_evaluate`` on held-out data ends well above
    chance (0.1)."""
    from flwr_run_helper import flwr_run

    app = template_app(tmp_path)
    apply_readme_diff(app, MARKER)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # "~/.flower_dp/gau_lrq.secret" of the diff lands here
    text = flwr_run(app, tmp_path, federation_config=f"num-supernodes={NUM_SUPERNODES}",
                    run_config=RUN_CONFIG, timeout=600)
    secret = home / ".flower_dp" / "gau_lrq.secret"
    assert secret.is_file(), text[-5000:]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and str(secret) in text
    assert secret.read_bytes().hex() not in text
    keys = home / ".flower_dp" / "gau_lrq.keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert sorted(p.name for p in keys.iterdir()) == sorted(f"client-{i}.key" for i in range(NUM_SUPERNODES))
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys.iterdir())
    assert "FINAL_ARRAYS ['conv1.bias', 'conv1.weight'" in text, text[-5000:]
    assert "learning is implausible" not in text  # the README's setting is below the warning threshold
    acc = last_global_accuracy(text)
    print(f"README setting: global_evaluate accuracy {acc:.3f} after 5 rounds (chance 0.1)")
    assert acc > 0.3, (acc, text[-3000:])
