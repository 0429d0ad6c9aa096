"""The optional parts of the install (pyproject's extras) and the one check every command that needs one makes.

A missing extra is an expected failure: one line naming the command and the extra, a pip hint, exit 2.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from gpuwarden.ops.foundation.errors import GpuwardenError

# Which extra brings each top-level module gpuwarden imports only in some commands (pyproject.toml's
# [project.optional-dependencies]; keep the two in step).
EXTRA_OF = {
    "lightkube": "kubernetes",
    "grpc": "kubernetes",
    "google.protobuf": "kubernetes",
    "asyncssh": "fleet",
    "ClusterShell": "fleet",
    "textual_serve": "serve",
    "aiohttp": "serve",
}

# What each extra must make importable before a command that needs it starts.
MODULES = {
    "kubernetes": ("lightkube", "grpc", "google.protobuf"),
    "fleet": ("asyncssh", "ClusterShell"),
    "serve": ("textual_serve", "aiohttp"),
}


class MissingExtra(GpuwardenError):
    """A command needs an extra that is not installed: `extra` is its name in `pip install 'gpuwarden[extra]'`."""

    def __init__(self, feature: str, extra: str):
        super().__init__(f"{feature} needs the {extra} extra", f"pip install 'gpuwarden[{extra}]'")
        self.feature = feature
        self.extra = extra


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a half-removed one without a spec
        return False


def need(extra: str, feature: str) -> None:
    """Raise MissingExtra unless every module of `extra` can be imported; cheap (nothing is imported)."""
    for module in MODULES[extra]:
        if not _installed(module):
            raise MissingExtra(feature, extra)


def require(module: str, feature: str) -> ModuleType:
    """`module` imported, or MissingExtra naming the extra that brings it. When the module is there but one of
    its own dependencies is not (an install made with --no-deps, a half-removed one), the message names that too:
    installing the extra again is the fix either way."""
    extra = EXTRA_OF.get(module) or EXTRA_OF[module.split(".")[0]]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = exc.name or ""
        error = MissingExtra(feature, extra)
        if missing and module != missing and not module.startswith(missing + "."):
            error.message += f" ({missing}, which {module.split('.')[0]} needs, is missing)"
        raise error from None
