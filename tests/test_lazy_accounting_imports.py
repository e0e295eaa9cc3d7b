"""A ClientApp process does not import dp-accounting or scipy until a node accounts (issue 14).

Under Flower's deployment engine every message starts a fresh ``flwr-clientapp`` process that imports the
ClientApp; dp-accounting (which pulls in scipy.stats and scipy.signal) was ~30 % of that start-up, and a node
needs it only when it reports its eps at flush.  :mod:`flower_dp.privacy` imports them inside the functions
that use them.  Checked in a fresh interpreter (this test process has long imported both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import json, sys
import flower_dp.privacy, flower_dp.clients.push_sum_app, flower_dp.clients.lrq_mod, push_sum_example.client_app
before = {m: m in sys.modules for m in ("dp_accounting", "scipy")}
from flower_dp.privacy import GaussianStep, NodeAccountant
acc = NodeAccountant()
for nu in (1.0, 1.5):
    acc.charge_gaussian(q=0.01, noise_multiplier=nu, count=10)
eps = acc.epsilon(1e-5)
after = {m: m in sys.modules for m in ("dp_accounting", "scipy")}
print(json.dumps({"before": before, "after": after, "eps": eps}))
"""


def test_client_apps_import_neither_dp_accounting_nor_scipy():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples" / "push_sum"),
                                                         os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == {"dp_accounting": False, "scipy": False}, got
    # the first eps loads them: the accountant still works
    assert got["after"] == {"dp_accounting": True, "scipy": True} and 0 < got["eps"] < 10, got


def test_strategies_load_each_strategy_on_first_use():
    """A push-sum ServerApp imports PushSumStrategy without Gau-LRQ's codec and without torch (a ServerApp process
    loads it when the first network average arrives); the package's names all resolve."""
    code = ("import json, sys; import flower_dp.strategies as s; bare = 'torch' in sys.modules; "
            "from flower_dp.strategies import PushSumStrategy; "
            "codec = 'flower_dp.mechanisms.gau_lrq_codec' in sys.modules; push_torch = 'torch' in sys.modules; "
            "names = [getattr(s, n).__name__ for n in s.__all__]; "
            "print(json.dumps({'bare': bare, 'codec': codec, 'push_torch': push_torch, 'names': names, "
            "'sub': s.push_sum.__name__}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"bare": False, "codec": False, "push_torch": False, "sub": "flower_dp.strategies.push_sum",
                   "names": ["GauLRQ", "Schedule", "gau_lrq_schedule", "client_level_epsilon", "PushSumStrategy"]}, got
