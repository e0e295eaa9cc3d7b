"""Test-wide set-up: every Ray instance a test starts binds 127.0.0.1 (see :mod:`flower_dp._ray_local`).

Set here, before any test module imports Ray or Flower's simulation.
"""

from flower_dp._ray_local import use_loopback

use_loopback()
