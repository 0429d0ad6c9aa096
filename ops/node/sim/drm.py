"""The simulated driver's DRM clients: the fdinfo files amdgpu shows for each open render node, with engine time.

A client is (pid, fd) -> client id, as the kernel's drm_file is; a fork or dup shows the same id through another
(pid, fd). tick() writes <sim>/root/proc/<pid>/fdinfo/<fd> in amdgpu's format, the gfx time growing at `busy`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuwarden.ops.foundation import statedir, statefiles
from gpuwarden.ops.node.sim import inplace
from gpuwarden.ops.node.procs import identity
from gpuwarden.ops.foundation.errors import NotFound

FILE = "drm-clients.json"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any


class SimDrm:
    """The DRM clients of one simulated node. The caller holds the node's lock around changes."""

    def __init__(self, state_dir: Path, proc_dir: Path):
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / statedir.SIM / FILE
        self.proc_dir = proc_dir  # <sim>/root/proc: what the backend reads as /proc/<pid>/fdinfo
        self._cache: tuple[tuple[int, int, int], list[dict[str, Any]]] | None = None

    def clients(self) -> list[dict[str, Any]]:
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._cache is not None and self._cache[0] == stamp:
            return self._cache[1]
        data = statefiles.load(self.path, statefiles.SIM_DRM, root=self.state_dir) or {"clients": []}
        clients = [dict(c) for c in data["clients"]]
        self._cache = (stamp, clients)
        return clients

    def _save(self, clients: list[dict[str, Any]]) -> None:
        statedir.write_json(self.path, {"clients": clients}, root=self.state_dir)

    def open(self, pid: int, fd: int, gpu: int, busy: float = 0.0, vram: int = 0) -> int:
        """A new client for `pid`'s open render node at `fd`; returns its client id."""
        clients = self.clients()
        client = 1 + max((c["client"] for c in clients), default=0)
        self._save(clients + [self._record(pid, fd, gpu, client, busy, time.time(), vram)])
        return client

    def open_many(self, items: list[tuple[int, int, int, float]]) -> None:
        """open() for each (pid, fd, gpu, busy), with one rewrite of the file (benchmarks set up thousands)."""
        clients = self.clients()
        client = max((c["client"] for c in clients), default=0)
        now = time.time()
        for i, (pid, fd, gpu, busy) in enumerate(items, 1):
            clients.append(self._record(pid, fd, gpu, client + i, busy, now, 0))
        self._save(clients)

    def share(self, client: int, pid: int, fd: int) -> None:
        """`pid` shows the existing `client` through its `fd` (it inherited or was passed the descriptor)."""
        clients = self.clients()
        first = next(c for c in clients if c["client"] == client)
        self._save(clients + [self._record(pid, fd, first["gpu"], client, first["busy"], first["opened"],
                                           first["vram"])])

    def close(self, pid: int) -> None:
        self._save([c for c in self.clients() if c["pid"] != pid])

    @staticmethod
    def _record(pid: int, fd: int, gpu: int, client: int, busy: float, opened: float, vram: int) -> dict[str, Any]:
        ticks = identity(pid)
        if ticks is None:
            raise NotFound(f"process {pid} does not exist")
        return {"pid": pid, "ticks": ticks, "fd": fd, "gpu": gpu, "client": client, "busy": busy,
                "opened": opened, "vram": vram}

    def tick(self, bus_of: dict[int, str], now: float | None = None) -> None:
        """Write every live holder's fdinfo with the engine time its client has used by `now`; forget the dead."""
        now = time.time() if now is None else now
        clients = self.clients()
        live = [c for c in clients if identity(c["pid"]) == c["ticks"]]
        if len(live) != len(clients):
            self._save(live)
        for c in live:
            busy_ns = int(c["busy"] * max(0.0, now - c["opened"]) * 1e9)
            self.write(c["pid"], c["fd"], fdinfo_text(c["client"], bus_of.get(c["gpu"], "0000:00:00.0"),
                                                      c["vram"], busy_ns))
        self.sweep({c["pid"] for c in live})

    def write(self, pid: int, fd: int, text: str) -> None:
        """One fdinfo file, rewritten in place (a reader holds it open and preads it, as it does /proc)."""
        d = self.proc_dir / str(pid) / "fdinfo"
        d.mkdir(parents=True, exist_ok=True)
        data = text.encode()
        f = os.open(d / str(fd), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o444)
        try:
            inplace.rewrite(f, data)
        finally:
            os.close(f)

    def sweep(self, live: set[int]) -> None:
        """Take away the fdinfo of processes that show no client any more."""
        try:
            names = os.listdir(self.proc_dir)
        except OSError:
            return
        # deferred: keeps `gpuwarden status --json` cheap (1.9 ms there)
        import shutil
        for name in names:
            if name.isdigit() and int(name) not in live:
                shutil.rmtree(self.proc_dir / name, ignore_errors=True)


def fdinfo_text(client: int, pdev: str, vram: int, gfx_ns: int) -> str:
    """An fdinfo file in the format of amdgpu_show_fdinfo (Linux 6.4-6.10): keys, TABs, units as it prints them."""
    lines = ["pos:\t0", "flags:\t02100002", "mnt_id:\t24", f"ino:\t{1000 + client}",
             f"pasid:\t{32768 + client}", "drm-driver:\tamdgpu", f"drm-pdev:\t{pdev}", f"drm-client-id:\t{client}",
             f"drm-memory-vram:\t{vram // 1024} KiB", "drm-memory-gtt: \t0 KiB", "drm-memory-cpu: \t0 KiB"]
    if gfx_ns:  # amdgpu prints an engine only once it has been busy
        lines.append(f"drm-engine-gfx:\t{gfx_ns} ns")
    return "\n".join(lines) + "\n"
