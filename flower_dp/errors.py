"""Exception types of flower-dp.

Every error message names the offending value, the valid range and the fix, and uses
the word "got" for the value received.  User-input problems raise
``ValueError``/``TypeError`` subclasses so that ordinary ``except ValueError`` works;
domain failures have their own types so callers can catch exactly what they expect.
"""

from __future__ import annotations

__all__ = [
    "FlowerDPError",
    "ConfigError",
    "BudgetExceededError",
    "UnsupportedEventError",
    "GossipTimeoutError",
    "DecodeError",
    "NonFiniteError",
    "CheckpointError",
]


class FlowerDPError(Exception):
    """Base class of every error raised by flower-dp."""


class ConfigError(FlowerDPError, ValueError):
    """A configuration value or key is invalid.

    ``problems`` lists every problem found (config validation reports all at once).
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [message])


class BudgetExceededError(FlowerDPError):
    """A step would spend more than the declared (epsilon, delta) budget.

    Raised *before* the noise of the offending step is drawn, so nothing was released.
    """

    def __init__(
        self,
        message: str,
        *,
        node: int | None = None,
        step: int | None = None,
        epsilon_spent: float | None = None,
        epsilon_limit: float | None = None,
    ) -> None:
        super().__init__(message)
        self.node = node
        self.step = step
        self.epsilon_spent = epsilon_spent
        self.epsilon_limit = epsilon_limit


class UnsupportedEventError(FlowerDPError, ValueError):
    """An accountant was asked to compose a privacy event it cannot account for."""


class GossipTimeoutError(FlowerDPError, TimeoutError):
    """A node waited too long for shares from its in-neighbours.

    The message names the missing senders, the iteration and the likely cause.
    """


class DecodeError(FlowerDPError, ValueError):
    """A quantized message failed its integrity check (wrong stream or tampered)."""


class NonFiniteError(FlowerDPError, FloatingPointError):
    """A loss, gradient or model became NaN or infinite; names the node and step."""

    def __init__(self, message: str, *, node: int | None = None, step: int | None = None) -> None:
        super().__init__(message)
        self.node = node
        self.step = step


class CheckpointError(FlowerDPError):
    """A checkpoint is missing, corrupted (checksum mismatch) or from another run."""
