"""The node agent, when there is one: its unix socket exists, answers, and is not open to every user.

The socket is `<state dir>/agent.sock` (the agent of issue 10); without it the check does not apply.
"""

from __future__ import annotations

import os
import stat

from gpuwarden.ops.agent import client
from gpuwarden.ops.doctor.model import Result, fail, passed, skip, unknown, warn
from gpuwarden.ops.doctor.probe import CheckIO

SOCKET = "agent.sock"


def check_agent(io: CheckIO) -> Result:
    path = io.settings.state_dir / SOCKET
    if not io.live:
        return skip("a captured tree or bundle keeps no socket: whether an agent ran is not recorded")
    io.note(str(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return skip(f"no node agent here (no {path})")
    except OSError as exc:
        return unknown(f"cannot look at {path}: {exc.strerror}")
    if not stat.S_ISSOCK(st.st_mode):
        return fail(f"{path} is not a socket", "remove it and restart the agent (gpuwarden agent)")
    mode = stat.S_IMODE(st.st_mode)
    details = {"socket": str(path), "mode": oct(mode), "uid": st.st_uid}
    try:
        client.connect(path, 0.5).close()
    except (ConnectionRefusedError, FileNotFoundError):
        return fail(f"{path} exists but nothing listens on it: the agent died and left its socket",
                    "systemctl restart gpuwarden-agent  (or start `gpuwarden agent`)", **details)
    except OSError as exc:
        return unknown(f"cannot connect to {path}: {exc.strerror or exc}", **details)
    if mode & stat.S_IWOTH:
        return warn(f"the agent answers on {path}, but every user on the node may write to it (mode {oct(mode)})",
                    f"chmod o-w {path}, and set the agent's socket mode to 0660 with a group for operators",
                    **details)
    return passed(f"the agent answers on {path} (mode {oct(mode)})", **details)
