"""A careless process family for the residual drill: a tenant whose parent never reaps it, kept by a subreaper.

Run detached by `gpuwarden sim scenario residual`: kill the tenant and it stays a zombie holding its VRAM,
as a crashed worker under a careless launcher does; purge ends the parent and this keeper reaps the orphan.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str] | None = None) -> int:
    """`python -m gpuwarden.ops.node.sim.family STATE_DIR GPU BYTES`: prints "<parent pid> <tenant pid>" once the tenant
    holds its VRAM, then reaps whatever is orphaned to it until SIGTERM."""
    state_dir, gpu, nbytes = (sys.argv[1:] if argv is None else argv)[:3]
    # Orphans come to us, not to PID 1 (which in a container may never reap them).
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    r, w = os.pipe()
    if os.fork() == 0:  # the careless parent
        os.close(r)
        tenant = subprocess.Popen([sys.executable, "-m", "gpuwarden.ops.node.sim.tenant", state_dir, gpu, nbytes],
                                  stdout=subprocess.PIPE, text=True)
        assert tenant.stdout is not None
        tenant.stdout.readline()  # "holding ...": the VRAM is charged
        os.write(w, f"{os.getpid()} {tenant.pid}\n".encode())
        # Never wait for it, not even from Popen's finaliser (a CPython-private flag typeshed does not declare).
        tenant._child_created = False  # type: ignore[attr-defined]
        while True:
            time.sleep(3600)
    os.close(w)
    sys.stdout.write(os.read(r, 100).decode())
    sys.stdout.flush()
    os.close(r)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
