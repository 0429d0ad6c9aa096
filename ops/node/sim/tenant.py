"""A simulated tenant: a real process that holds simulated VRAM and the sim GPU device files.

It frees its VRAM on SIGTERM/SIGINT; SIGKILL leaves it to the sim driver (or a zombie's parent).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TextIO

from gpuwarden.ops.foundation import statedir
from gpuwarden.ops.foundation.errors import NotFound
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.node.sim.node import SimNode


def hold(state_dir: Path, gpus: list[int], nbytes: int, *, ready_fd: TextIO | None = None,
         busy: float | None = None) -> int:
    """Hold `nbytes` on each GPU until a signal; with `busy` (0-1), each render node is a DRM client whose gfx
    engine is busy that share of the time (what its fdinfo shows)."""
    node = SimNode(state_dir)
    cfg = node.config()
    for g in gpus:
        if not 0 <= g < cfg["gpus"]:
            raise NotFound(f"no GPU {g} on the simulated node (it has GPUs 0-{cfg['gpus'] - 1})")
    # Held open for as long as the tenant lives: that is what marks it a GPU holder.
    with statedir.open_dir(state_dir, statedir.SIM, "dev") as dev, dev.subdir("dri") as dri:
        files = [os.fdopen(dev.open("kfd"), "rb")]
        files += [os.fdopen(dri.open(node.render_node(g).name), "rb") for g in gpus]
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    pid = os.getpid()
    try:
        for g in gpus:
            node.allocate(pid, g, nbytes)
        if busy is not None:
            for g, f in zip(gpus, files[1:]):
                node.open_client(pid, f.fileno(), g, busy)
        out = ready_fd or sys.stdout
        out.write(f"holding {fmt_bytes(nbytes)} on GPU {','.join(map(str, gpus))} as pid {pid}\n")
        out.flush()
        while not stop.wait(3600):
            pass
    finally:
        node.free(pid)
        if busy is not None:
            node.close_clients(pid)
        for f in files:
            f.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m gpuwarden.ops.node.sim.tenant STATE_DIR GPU BYTES`: a tenant process without the CLI around it."""
    args = sys.argv[1:] if argv is None else argv
    return hold(Path(args[0]), [int(args[1])], int(args[2]))


if __name__ == "__main__":
    sys.exit(main())
