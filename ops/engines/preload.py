"""The registration interposer (native/, libgwpreload.so): where it is and the environment that turns it on.

The shim preloads it into engines with progress = "preload"; README "Engines nobody changed" documents it.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

from gpuwarden.ops import __version__
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.config.nodeconfig import EngineConfig

# Built by `pip install` (setup.py) next to this module, or prebuilt in the manylinux wheels.
LIBRARY = Path(__file__).resolve().with_name("libgwpreload.so")
HOW_TO_GET = (f"install the prebuilt wheel (pip install gpuwarden-{__version__}-py3-none-manylinux2014_"
              f"{platform.machine()}.whl, made by deploy/wheel/build.py), or install a C compiler "
              "(apt-get install gcc) and reinstall gpuwarden")

ENV_THRESHOLD = "GPUWARDEN_PRELOAD_THRESHOLD"
ENV_RELEASE = "GPUWARDEN_GATE_RELEASE"
ENV_READY_FILE = "GPUWARDEN_GATE_READY_FILE"
ENV_TIMEOUT = "GPUWARDEN_REGISTRATION_TIMEOUT"

# The shim creates this file in the engine's directory once the engine serves (gate_release = "ready").
READY_FILE = "gate-ready"


def missing() -> str | None:
    """Why the interposer cannot be used here, in one line; None when it can."""
    if not LIBRARY.is_file():
        return (f"the registration interposer (progress = \"preload\") is not installed: {LIBRARY} is missing, "
                f"as when gpuwarden is installed from source without a C compiler; {HOW_TO_GET}")
    if re.search(r"[\s:]", str(LIBRARY)):
        return f"the registration interposer's path {LIBRARY} has a space or ':', which LD_PRELOAD cannot carry"
    return None


def release_after_s(release: str) -> float | None:
    """N of gate_release = "<N>s"; None for "registered" and "ready"."""
    return float(release[:-1]) if release.endswith("s") and release != "registered" else None


def engine_env(engine: EngineConfig, env: dict[str, str], ready_file: Path, registration_timeout: float) -> dict[str, str]:
    """The variables that preload the interposer into `engine`, given the environment it would get otherwise."""
    problem = missing()
    if problem:
        raise GpuwardenError(problem, HOW_TO_GET)
    earlier = env.get("LD_PRELOAD", "").strip()
    return {
        # First, so that its exports come before any other preloaded library's.
        "LD_PRELOAD": f"{LIBRARY} {earlier}".strip(),
        ENV_THRESHOLD: str(engine.register_threshold),
        ENV_RELEASE: engine.gate_release,
        ENV_READY_FILE: str(ready_file),
        ENV_TIMEOUT: f"{registration_timeout:g}",
    }
