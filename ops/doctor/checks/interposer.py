"""Is the registration interposer (libgwpreload.so) there for the engines that use progress = "preload"?

A source install without a C compiler has everything but it; ops/engines/preload.py says what to install.
"""

from __future__ import annotations

from gpuwarden.ops.engines import preload
from gpuwarden.ops.doctor.model import Result, fail, passed, skip, warn
from gpuwarden.ops.doctor.node import node_config
from gpuwarden.ops.doctor.probe import CheckIO


def check_interposer(io: CheckIO) -> Result:
    if not io.live:
        return skip("the interposer is part of this machine's gpuwarden install, not of the captured node")
    cfg = node_config(io)
    users = [e.name for e in (cfg.engines if cfg else []) if e.progress == "preload"]
    problem = preload.missing()
    if problem is None and not users:
        return skip("no engine in the node config uses progress = \"preload\"", library=str(preload.LIBRARY))
    if problem is None:
        return passed(f"{preload.LIBRARY} is installed for {', '.join(users)}", library=str(preload.LIBRARY),
                      engines=users)
    if users:
        return fail(f"engines {', '.join(users)} use progress = \"preload\", but {problem}", preload.HOW_TO_GET,
                    library=str(preload.LIBRARY), engines=users)
    return warn(problem, preload.HOW_TO_GET, library=str(preload.LIBRARY), engines=users)
