"""The registration interposer (native/, libgwpreload.so): where it is and the environment that turns it on.

The shim preloads it into engines with progress = "preload"; README "Engines nobody changed" documents it.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuwarden.ops.errors import GpuwardenError
from gpuwarden.ops.nodeconfig import EngineConfig

# Built by `pip install` (setup.py) next to this module.
LIBRARY = Path(__file__).resolve().with_name("libgwpreload.so")

ENV_THRESHOLD = "GPUWARDEN_PRELOAD_THRESHOLD"
ENV_RELEASE = "GPUWARDEN_GATE_RELEASE"
ENV_READY_FILE = "GPUWARDEN_GATE_READY_FILE"
ENV_TIMEOUT = "GPUWARDEN_REGISTRATION_TIMEOUT"

# The shim creates this file in the engine's directory once the engine serves (gate_release = "ready").
READY_FILE = "gate-ready"


def missing() -> str | None:
    """Why the interposer cannot be used here, in one line; None when it can."""
    if not LIBRARY.is_file():
        return (f"the registration interposer {LIBRARY} is not built; reinstall gpuwarden "
                "(pip install -e . builds it and needs a C compiler)")
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
        raise GpuwardenError(problem, "run `pip install -e .` in gpuwarden's checkout on this node")
    earlier = env.get("LD_PRELOAD", "").strip()
    return {
        # First, so that its exports come before any other preloaded library's.
        "LD_PRELOAD": f"{LIBRARY} {earlier}".strip(),
        ENV_THRESHOLD: str(engine.register_threshold),
        ENV_RELEASE: engine.gate_release,
        ENV_READY_FILE: str(ready_file),
        ENV_TIMEOUT: f"{registration_timeout:g}",
    }
