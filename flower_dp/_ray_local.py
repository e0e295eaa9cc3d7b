"""Keep a Ray instance that flower-dp starts on this machine bound to the loopback interface.

Ray 2.x replaces a requested ``_node_ip_address="127.0.0.1"`` by the machine's routable
address (``ray._private.services.resolve_ip_for_localhost``), so a "local" cluster would
talk over the machine's network address.  Ray picks 127.0.0.1 itself only when
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is false (the setting it uses on macOS and Windows).
:func:`use_loopback` sets that variable for this process and the Ray processes it starts,
unless the user has set it, and applies it to an already imported Ray.  Connecting to an
existing cluster (``address=...``) is not affected.
"""

from __future__ import annotations

import os
import sys

__all__ = ["LOOPBACK_ENV", "use_loopback"]

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def use_loopback() -> bool:
    """Make a Ray instance started from this process use 127.0.0.1; return whether it will.

    Returns False (and changes nothing) when the user set ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``
    to a true value: they asked for a routable node address.
    """
    value = os.environ.setdefault(LOOPBACK_ENV, "0")
    if value.strip().lower() not in ("0", "false", "no", "off", ""):
        return False
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray read the variable at import: apply it to the running module too
        constants.ENABLE_RAY_CLUSTER = False
    return True
