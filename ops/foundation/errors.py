"""Expected failures with a message and a hint for the operator.

Anything raised as GpuwardenError is shown as one line (plus a hint), never a traceback.
"""

from __future__ import annotations


class GpuwardenError(Exception):
    """A failure the operator can act on: `message` says what, `hint` says what to do."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class BackendUnavailable(GpuwardenError):
    """A GPU backend cannot run on this node; `reason` is one short clause."""


class ConfigError(GpuwardenError):
    """The node config is wrong; the message names file, line and key."""


class NotFound(GpuwardenError):
    """A named thing (GPU index, engine, bundle, file) does not exist."""


class Refused(GpuwardenError):
    """A safety check refused to act (precondition, lock held, no confirmation)."""

    exit_code = 1
