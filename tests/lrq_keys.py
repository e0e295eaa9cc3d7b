"""Client key folders for the Gau-LRQ tests: one key file per partition (``client-<i>.key``, mode 0600) in a private
folder (0700), derived from a test's master secret, as ``GauLRQ(key_dir=...)`` writes them in a simulation."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from flower_dp.clients.lrq_mod import make_gau_lrq_mod
from flower_dp.mechanisms.gau_lrq_codec import write_client_keys


@functools.lru_cache(maxsize=None)
def key_dir(secret: bytes, num_clients: int = 64) -> str:
    """A folder holding the key files of partitions 0..num_clients-1 under ``secret`` (removed when pytest exits)."""
    home = tempfile.mkdtemp(prefix="flower-dp-test-keys-")
    atexit.register(shutil.rmtree, home, True)
    return str(write_client_keys(secret, num_clients, Path(home) / "keys"))


def keyed_mod(secret: bytes, num_clients: int = 64, **kw):
    """``make_gau_lrq_mod`` whose nodes each read their own key file, derived from ``secret``."""
    return make_gau_lrq_mod(key_dir=key_dir(secret, num_clients), **kw)
