"""A Ray that flower-dp starts stays on 127.0.0.1 (flower_dp._ray_local), even with Ray imported first."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flower_dp._ray_local import LOOPBACK_ENV

_CODE = """
import ray  # imported first: use_loopback must still apply
from flower_dp.gossip.ray_backend import ensure_ray
ensure_ray(num_cpus=1)
print("NODE_IP", ray.util.get_node_ip_address())
ray.shutdown()
"""


def _node_ip(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != LOOPBACK_ENV}
    if env_value is not None:
        env[LOOPBACK_ENV] = env_value
    out = subprocess.run([sys.executable, "-c", _CODE], env=env, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("NODE_IP ")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    return lines[0].split()[1]


@pytest.mark.flower
def test_local_ray_binds_loopback():
    assert _node_ip(None) == "127.0.0.1"  # Ray alone would pick the machine's routable address


def test_use_loopback_respects_an_explicit_setting(monkeypatch):
    import flower_dp._ray_local as rl

    monkeypatch.setenv(LOOPBACK_ENV, "1")
    assert rl.use_loopback() is False and os.environ[LOOPBACK_ENV] == "1"
    monkeypatch.delenv(LOOPBACK_ENV)
    assert rl.use_loopback() is True and os.environ[LOOPBACK_ENV] == "0"
