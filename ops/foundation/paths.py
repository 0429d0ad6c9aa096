"""Where gpuwarden's files are by default, and the one check a state dir must pass before it is trusted.

No dataclasses, no JSON: `status` finds the agent's socket with this module alone.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: status finds the agent's socket here
if TYPE_CHECKING:
    from typing import Mapping

BACKENDS = ("amdsmi", "sysfs", "nvml", "sim")
DEFAULT_CONFIG = Path("/etc/gpuwarden/node.toml")
AGENT_SOCKET = "agent.sock"  # in the state dir


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """/run/gpuwarden for root, $XDG_RUNTIME_DIR/gpuwarden otherwise (a per-user fallback in /tmp)."""
    if os.geteuid() == 0:
        return Path("/run/gpuwarden")
    runtime = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "gpuwarden"
    return Path(f"/tmp/gpuwarden-{os.geteuid()}")


def refuse_squatted(state_dir: Path) -> None:
    """Refuse a state dir that another user made in a shared directory such as /tmp."""
    # The non-root fallback is /tmp/gpuwarden-<uid>: any user can create that name first and read or
    # plant our journal, gate and engine records. In a sticky world-writable parent, only our own dir will do.
    try:
        st, parent = os.stat(state_dir), os.stat(state_dir.resolve().parent)
    except OSError:
        return
    shared_parent = parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH
    if shared_parent and st.st_uid != os.geteuid():
        raise GpuwardenError(
            f"the state dir {state_dir} belongs to uid {st.st_uid}, not to you, in a directory anyone can write",
            "remove it if it is stale, or point --state-dir / GPUWARDEN_STATE_DIR at a directory you own",
        )


# Carries the operator's own PYTHONPATH past the shim, which needs gpuwarden's: the engine gets it back.
ORIG_PYTHONPATH = "GPUWARDEN_ORIG_PYTHONPATH"


def child_pythonpath(env: dict[str, str]) -> dict[str, str]:
    """`env` for a Python child that must import this very gpuwarden (the sim's helpers, the probe's canaries).

    The folder that *holds* the package goes first on PYTHONPATH, never the package's own folder (that one would
    make its ops/, tui/ and playbooks/ importable as top-level names and shadow PyPI's projects of those names).
    An editable install's finder needs nothing: the same interpreter's site-packages hold it.
    """
    package = Path(__file__).parents[2]  # not resolved: a link named gpuwarden (tests/device) is the package
    out = dict(env)
    if package.name == "gpuwarden":
        rest = out.get("PYTHONPATH", "")
        out["PYTHONPATH"] = str(package.parent) + (os.pathsep + rest if rest else "")
    return out
