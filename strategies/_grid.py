"""Send messages through a Flower Grid and collect the replies, polling every fraction of a second.

Flower's deployment Grid (``send_and_receive``) sleeps 3 s between pulls of the replies, so every round of a
strategy that uses it waits up to 3 s after its last reply arrived; its simulation Grid pulls every 0.1 s.
:func:`exchange` pushes the messages and pulls the replies every ``poll_s`` seconds on both, until every reply is
in or ``timeout_s`` has passed.  A Grid without ``push_messages`` / ``pull_messages`` (a test's stand-in) falls back
to its own ``send_and_receive``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message

__all__ = ["POLL_S", "exchange"]

#: seconds between pulls of the replies (the interval of Flower's simulation Grid)
POLL_S = 0.1


def exchange(grid: Any, msgs: Iterable[Message], timeout_s: float | None, poll_s: float = POLL_S) -> list[Message]:
    """Push ``msgs`` and return the replies that arrived within ``timeout_s`` seconds (``None``: wait for all)."""
    msgs = list(msgs)
    if not (hasattr(grid, "push_messages") and hasattr(grid, "pull_messages")):
        return list(grid.send_and_receive(msgs, timeout=timeout_s))
    ids = set(grid.push_messages(msgs))
    deadline = None if timeout_s is None else time.monotonic() + float(timeout_s)
    out: list[Message] = []
    while ids:
        got = list(grid.pull_messages(ids))
        out += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if not ids or (deadline is not None and time.monotonic() >= deadline):
            break
        if not got:
            time.sleep(poll_s)
    return out
