"""The driver's own books for a snapshot: KFD system memory used/limit and each GPU's VRAM free space.

Read through the allow-listed reader every refresh (two small files per GPU at most); a source that cannot be
read is said once, with why, and the numbers are None: callers fall back to what they compute.
"""

from __future__ import annotations

from gpuwarden.ops.foundation.deadline import LANES, LateRead, Lanes
from gpuwarden.ops.node.debugfs import parse
from gpuwarden.ops.node.debugfs.reader import ERROR, TIMEOUT, DebugfsReader, ReadResult

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` reads debugfs too
if TYPE_CHECKING:
    from typing import Any, Callable

    from gpuwarden.ops.foundation.deadline import Mark


def read(reader: DebugfsReader, gpu_indices: list[int]) -> dict[str, Any]:
    """The books once (each file read in a thread of its own under the reader's timeout)."""
    return _books(str(reader.root), reader.read("kfd_mem_limit"), [(i, reader.read("vram_mm", i)) for i in gpu_indices],
                  _parse)


class Books:
    """The books refresh after refresh, for one sampler. While every file answers, one job on the debugfs lane reads
    them all (one thread handoff a refresh); when one is late, the ones after it are read on lanes of their own, each
    file's, waited for at once, and so on until every lane is free again: a hung VRAM manager holds one thread, not
    one more each refresh, and the other GPUs' books still show. A file is parsed again only when its bytes changed."""

    def __init__(self, reader: DebugfsReader, lanes: Lanes = LANES) -> None:
        self.reader = reader
        self._lanes = lanes
        self._parsed: dict[str, tuple[bytes, dict[str, Any] | None]] = {}  # path -> last bytes, what they gave
        # gpu indexes -> the files to read, their lanes' jobs (made once for one set of GPUs)
        self._plan: tuple[list[int], list[tuple[str, int | None]], list[Any]] | None = None
        self._apart = False  # since a late read: each file on its own lane

    def read(self, gpu_indices: list[int]) -> dict[str, Any]:
        reader = self.reader
        root = str(reader.root)
        plan = self._plan
        if plan is None or plan[0] != gpu_indices:
            wanted: list[tuple[str, int | None]] = [("kfd_mem_limit", None)] + [("vram_mm", i) for i in gpu_indices]
            plan = self._plan = (list(gpu_indices), wanted, [(("debugfs", root, name, minor), self._job(name, minor),
                                                              "debugfs", minor) for name, minor in wanted])
        _, wanted, jobs = plan
        together = ("debugfs-books", root)
        stuck = self._lanes.poll(together)  # the file the shared job is still blocked in: no second reader for it
        if self._apart and stuck is None and not any(self._lanes.poll(j[0]) for j in jobs):
            self._apart = False  # every lane is free again: one job reads them all
        got: list[ReadResult] = []
        results: list[ReadResult | None] = [None] * len(wanted)
        if not self._apart:
            try:
                self._lanes.run(together, lambda mark: self._read_all(wanted, got, mark), reader.timeout_s,
                                source="debugfs")
            except LateRead as late:
                self._apart = True
                stuck = late
            results[:len(got)] = got[:len(wanted)]  # what the job read before a late file (it may add more later)
        todo = [k for k, r in enumerate(results) if r is None and
                (stuck is None or stuck.path != reader.path_of(*wanted[k]))]
        for k, answer in zip(todo, self._lanes.run_all([jobs[k] for k in todo], reader.timeout_s)):
            if isinstance(answer, ReadResult):
                results[k] = answer
            elif not isinstance(answer, LateRead):
                results[k] = ReadResult(wanted[k][0], reader.path_of(*wanted[k]), ERROR, error=repr(answer))
        done = [r if r is not None else ReadResult(wanted[k][0], reader.path_of(*wanted[k]), TIMEOUT)
                for k, r in enumerate(results)]
        return _books(root, done[0], list(zip(gpu_indices, done[1:])), self._parse_once)

    def _read_all(self, wanted: list[tuple[str, int | None]], into: list[ReadResult], mark: Mark) -> list[ReadResult]:
        """(lane job) every file in turn, each answer kept in `into` as it comes (a caller that stops waiting keeps
        the ones before the late file)."""
        reader = self.reader
        for name, minor in wanted:
            mark(name, reader.path_of(name, minor), minor)
            into.append(reader.read_inline(name, minor))
        return into

    def _job(self, name: str, minor: int | None) -> Callable[[Mark], ReadResult]:
        reader = self.reader

        def job(mark: Mark) -> ReadResult:
            mark(name, reader.path_of(name, minor), minor)
            return reader.read_inline(name, minor)
        return job

    def _parse_once(self, name: str, data: bytes, path: str) -> dict[str, Any] | None:
        last = self._parsed.get(path)
        if last is not None and last[0] == data:
            return last[1]
        value = _parse(name, data, path)
        self._parsed[path] = (data, value)
        return value


def _parse(name: str, data: bytes, path: str) -> dict[str, Any] | None:
    """One file's numbers as the snapshot carries them (callers copy: a memo may hand the same dict out again)."""
    if name == "kfd_mem_limit":
        limit = parse.mem_limit(data)
        return {**limit.to_dict(), "source": path} if limit is not None else None
    free = parse.vram_mm(data)
    return free.to_dict() if free is not None else None


def _books(root: str, r: ReadResult, vram: list[tuple[int, ReadResult]],
           parsed: Callable[[str, bytes, str], dict[str, Any] | None]) -> dict[str, Any]:
    out: dict[str, Any] = {"debugfs": root, "kfd_mem_limit": None, "kfd_mem_limit_unavailable": None,
                           "vram_free": [], "vram_free_unavailable": None}
    limit = parsed(r.name, r.data, r.path) if r.ok and r.data is not None else None
    if limit is not None:
        out["kfd_mem_limit"] = dict(limit)
    else:
        out["kfd_mem_limit_unavailable"] = r.why() if not r.ok else f"{r.path}: not in the format of kfd_debugfs_kfd_mem_limits"
    why = None
    for i, v in vram:
        free = parsed(v.name, v.data, v.path) if v.ok and v.data is not None else None
        if free is None:
            why = why or (v.why() if not v.ok else f"{v.path}: not a drm_buddy or drm_mm print")
            continue
        out["vram_free"].append({"gpu": i, **free})
    if not out["vram_free"]:
        out["vram_free_unavailable"] = why
    return out


def holders(reader: DebugfsReader, gpu_index: int) -> tuple[dict[int, dict[str, Any]], str | None]:
    """Per pid, the VRAM/GTT amdgpu_gem_info charges on one GPU; ({}, why) when it cannot be read."""
    r = reader.read("gem_info", gpu_index)
    if not r.ok or r.data is None:
        return {}, r.why()
    return parse.holders(parse.gem_info(r.data)), None
