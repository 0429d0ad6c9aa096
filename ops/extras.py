"""The optional parts of the install (pyproject's extras) and the one check every command that needs one makes.

A missing extra is an expected failure: one line naming the command and the extra, a pip hint, exit 2.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from gpuwarden.ops.errors import GpuwardenError

# Which extra brings each top-level module gpuwarden imports only in some commands (pyproject.toml's
# [project.optional-dependencies]; keep the two in step).
EXTRA_OF = {
    "kubernetes": "kubernetes",
    "urllib3": "kubernetes",  # the official client's transport; its errors are caught by name in ops/k8s/kube.py
    "grpc": "kubernetes",
    "google.protobuf": "kubernetes",
    "asyncssh": "fleet",
    "ClusterShell": "fleet",
    "textual_serve": "serve",
    "aiohttp": "serve",
}

# What each extra must make importable before a command that needs it starts.
MODULES = {
    "kubernetes": ("kubernetes", "grpc", "google.protobuf"),
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
    """`module` imported, or MissingExtra naming the extra that brings it. An ImportError from inside an installed
    module (a broken install) is not a missing extra and is raised as it is."""
    top = module.split(".")[0]
    extra = EXTRA_OF.get(module) or EXTRA_OF[top]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = exc.name or ""
        if missing and not (module == missing or module.startswith(missing + ".")
                            or missing.split(".")[0] in {m.split(".")[0] for m in MODULES[extra]}):
            raise
        raise MissingExtra(feature, extra) from None
