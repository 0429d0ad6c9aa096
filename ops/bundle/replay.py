"""Read a bundle back as the NodeSnapshot it recorded: through the sysfs backend when it holds a tree.

The tree is re-read by the same code that reads a live node (ops.snapshot over tree/sys and
tree/proc), so replay checks the parsers too; without a tree the stored snapshot.json is used.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Any

from ..errors import GpuwardenError, NotFound
from ..model import NodeSnapshot, snapshot_from_dict
from ..settings import Settings

MANIFEST = "manifest.json"


def open_bundle(path: Path) -> tarfile.TarFile:
    path = Path(path)
    if not path.exists():
        raise NotFound(f"no bundle at {path}", "give the path `gpuwarden bundle` printed")
    try:
        tar = tarfile.open(path, "r:*")
    except tarfile.TarError:
        # tarfile's own message lists every compression it tried, over several lines
        raise GpuwardenError(f"{path} is not a readable bundle (not a tar archive)",
                             "give the .tar.gz that `gpuwarden bundle` wrote") from None
    except OSError as exc:
        raise GpuwardenError(f"cannot read the bundle {path}: {exc.strerror or exc}",
                             "check the path and its permissions") from None
    try:
        tar.getmembers()  # read it through now: a truncated archive fails here, not halfway through a replay
    except (tarfile.TarError, EOFError, zlib.error, OSError):
        tar.close()
        raise GpuwardenError(f"the bundle {path} is truncated or damaged",
                             "was it copied while still being written? take a new one with `gpuwarden bundle`") from None
    return tar


def top_dir(tar: tarfile.TarFile) -> str:
    for m in tar.getmembers():
        if m.name.endswith("/" + MANIFEST) and m.name.count("/") == 1:
            return m.name.split("/", 1)[0]
    raise GpuwardenError(f"{tar.name} has no {MANIFEST}", "it was not made by `gpuwarden bundle`")


def read_member(tar: tarfile.TarFile, top: str, rel: str) -> bytes | None:
    try:
        f = tar.extractfile(f"{top}/{rel}")
    except KeyError:
        return None
    return f.read() if f else None


def extract(tar: tarfile.TarFile, dest: Path) -> Path:
    """Extract regular files and dirs safely; recreate fd symlinks (they are only read, never followed)."""
    top = top_dir(tar)
    root = dest.resolve()
    for m in tar.getmembers():
        target = (dest / m.name).resolve()
        if not str(target).startswith(str(root) + os.sep):
            continue  # a name that climbs out: not ours
        if m.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif m.isfile():
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            with open(target, "wb") as out:
                shutil.copyfileobj(src, out)  # type: ignore[arg-type]
        elif m.issym() and "/fd/" in m.name:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(m.linkname, target)
    return dest / top


def snapshot_from_bundle(path: Path | str, settings: Settings) -> NodeSnapshot:
    """The node as the bundle saw it; source is "bundle:<path>"."""
    path = Path(path)
    with open_bundle(path) as tar, tempfile.TemporaryDirectory(prefix="gpuwarden-replay-") as tmp:
        base = extract(tar, Path(tmp))
        manifest = _json(base / MANIFEST) or {}
        stored = _json(base / "gpuwarden/snapshot.json")
        sys_tree, proc_tree = base / "tree/sys", base / "tree/proc"
        snap: NodeSnapshot | None = None
        if (sys_tree / "class").is_dir():
            try:
                snap = _from_tree(settings, path, sys_tree, proc_tree, manifest)
            except GpuwardenError:
                snap = None  # fall back to the stored snapshot below
        if snap is None:
            if stored is None:
                raise GpuwardenError(f"{path} holds neither a sysfs tree nor a snapshot",
                                     "the bundle's collectors failed; see its manifest.json")
            snap = snapshot_from_dict(stored)
        if stored is not None:
            snap = _keep_recorded(snap, stored)
        return dataclasses.replace(snap, source=f"bundle:{path}")


def _from_tree(settings: Settings, path: Path, sys_tree: Path, proc_tree: Path, manifest: dict) -> NodeSnapshot:
    from ..backends.sysfs import SysfsBackend
    from ..snapshot import take_snapshot
    tree = manifest.get("tree", {})
    dev_roots = tree.get("dev_roots") or ["/dev"]
    # Device globs must match the fd link targets as recorded; dev_root is only matched, never opened.
    dev_root = Path(dev_roots[-1])
    # The baseline and drained GPUs as they were: residual VRAM is judged against the recorded baseline.
    state = sys_tree.parent.parent / "gpuwarden" / "state"
    state.mkdir(parents=True, exist_ok=True)
    replay = settings.with_(sysfs_root=sys_tree, proc_root=proc_tree, dev_root=dev_root, backend="sysfs",
                            replay=str(path), state_dir=state)
    backend = SysfsBackend(sysfs_root=sys_tree, dev_root=dev_root, simulated=bool(tree.get("simulated")),
                           name="sim" if tree.get("simulated") else None)
    return take_snapshot(replay, backend)


def _keep_recorded(snap: NodeSnapshot, stored: dict[str, Any]) -> NodeSnapshot:
    """What a tree cannot hold (engines, arenas, drained GPUs, time taken) comes from the stored snapshot."""
    recorded = snapshot_from_dict(stored)
    return dataclasses.replace(
        snap, taken_at=recorded.taken_at, hostname=recorded.hostname, engines=recorded.engines or snap.engines,
        arenas=recorded.arenas or snap.arenas, drained=recorded.drained or snap.drained,
        baseline_recorded=recorded.baseline_recorded)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
