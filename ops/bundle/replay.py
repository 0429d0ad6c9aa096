"""Read a bundle back as the NodeSnapshot it recorded: through the sysfs backend when it holds a tree.

The tree is re-read by the same code that reads a live node (gpuwarden.ops.sampling over tree/sys and
tree/proc), so replay checks the parsers too; without a tree the stored snapshot.json is used.
A bundle may come from anywhere: the archive's members, its manifest (against the published schema)
and its snapshot (strictly, field by field) are checked first, and any fault is one line, exit 2.
Bounds: each member at most MAX_MEMBER_BYTES (1 GiB, refused from its header), the whole archive at most
MAX_TOTAL_BYTES (2 GiB) unpacked, JSON members 64 MiB and jsondoc.MAX_DEPTH (64) levels deep.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from gpuwarden.ops.foundation import inputs, jsondoc
from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.foundation.model import NodeSnapshot, as_warning
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.node.backends.sysfs import SysfsBackend
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.sampling import take_snapshot
from gpuwarden.ops.bundle import snapshot_reader

MANIFEST = "manifest.json"
MAX_MEMBERS = 200_000
MAX_MEMBER_BYTES = 1 << 30  # bundles cap each output far below this (--max-bytes, default 16 MiB)
MAX_TOTAL_BYTES = 2 << 30
MAX_JSON_BYTES = 64 << 20
_DAMAGED = (tarfile.TarError, EOFError, zlib.error, OSError, ValueError)
_HINT = "was it copied while still being written? take a new one with `gpuwarden bundle`"


class BundleTar(tarfile.TarFile):
    """A TarFile that also closes the checked file it was opened on."""

    source: BinaryIO | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.source is not None:
                self.source.close()
                self.source = None


GZIP_MAGIC = b"\x1f\x8b"
_SNIFF_READ = 64 << 10


def is_tar(path: Path | str) -> bool:
    """Whether `path` is a tar archive, gzipped or not; a gzip file cut short or corrupt is one GpuwardenError
    naming it (tarfile would raise EOFError, which the CLI framework mistakes for an aborted prompt).

    Only the first 512 bytes of the tar are looked at: the whole stream is checked when it is opened."""
    path = Path(path)
    fd = inputs.open_regular(path, "bundle")
    try:
        head = os.pread(fd, 512, 0)
        if head[:2] == GZIP_MAGIC:
            head = _gunzip_head(fd, path, 512)
    finally:
        os.close(fd)
    if len(head) < 512:
        return False
    try:
        tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")  # checks the header's checksum
    except tarfile.HeaderError:
        return False
    return True


def _gunzip_head(fd: int, path: Path, want: int) -> bytes:
    """The first `want` decompressed bytes of the gzip file behind `fd` (fewer only if the stream ends)."""
    unzip = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = b""
    pos = 0
    while len(out) < want and not unzip.eof:
        data = os.pread(fd, _SNIFF_READ, pos)
        if not data:
            raise _truncated_gzip(path, pos)
        pos += len(data)
        try:
            out += unzip.decompress(data, want - len(out))
            while unzip.unconsumed_tail and len(out) < want:
                out += unzip.decompress(unzip.unconsumed_tail, want - len(out))
        except zlib.error as exc:
            raise GpuwardenError(f"{path} is a corrupt gzip file ({exc})", _HINT) from None
    return out


def _truncated_gzip(path: Path, size: int) -> GpuwardenError:
    return GpuwardenError(f"{path} is a truncated gzip file: its compressed stream ends after {size} bytes, "
                          "before its end marker", _HINT)


def open_stream(path: Path | str) -> BundleTar:
    """The archive at `path` (a regular file only: a FIFO or a device is refused, never waited on)."""
    path = Path(path)
    try:
        fd = inputs.open_regular(path, "bundle")
    except NotFound:
        raise NotFound(f"no bundle at {path}", "give the path `gpuwarden bundle` printed") from None
    source = os.fdopen(fd, "rb")
    if os.pread(fd, 2, 0) == GZIP_MAGIC:
        try:
            _gunzip_head(fd, path, 512)  # a gzip cut short says so, by name, before tarfile tries every format
        except BaseException:
            source.close()
            raise
    try:
        tar = BundleTar.open(fileobj=source, mode="r:*")
    except tarfile.TarError:
        source.close()
        # tarfile's own message lists every compression it tried, over several lines
        raise GpuwardenError(f"{path} is not a readable bundle (not a tar archive)",
                             "give the .tar.gz that `gpuwarden bundle` wrote") from None
    except _DAMAGED:
        source.close()
        raise GpuwardenError(f"the bundle {path} is truncated or damaged", _HINT) from None
    tar.source = source
    return tar


def open_bundle(path: Path | str) -> BundleTar:
    """open_stream, read through once: a truncated archive or an absurd member fails here, in one line."""
    tar = open_stream(path)
    try:
        check_members(tar, Path(path))
    except BaseException:
        tar.close()
        raise
    return tar


def check_members(tar: tarfile.TarFile, path: Path) -> None:
    """Walk every member header once, refusing absurd sizes and counts before anything is extracted."""
    total = count = 0
    try:
        while True:
            member = tar.next()
            if member is None:
                break
            count += 1
            total += max(0, member.size)
            if count > MAX_MEMBERS:
                raise GpuwardenError(f"the bundle {path} has more than {MAX_MEMBERS} members; gpuwarden writes far fewer",
                                     "it is not a gpuwarden bundle")
            if member.size < 0 or member.size > MAX_MEMBER_BYTES:
                raise GpuwardenError(f"the bundle {path} has a member of {member.size} bytes "
                                     f"({_printable(member.name)}); gpuwarden caps each at {MAX_MEMBER_BYTES} "
                                     f"({fmt_bytes(MAX_MEMBER_BYTES)})",
                                     "it is damaged or not a gpuwarden bundle")
            if total > MAX_TOTAL_BYTES or tar.offset > MAX_TOTAL_BYTES + MAX_MEMBER_BYTES:
                raise GpuwardenError(f"the bundle {path} unpacks to more than {fmt_bytes(MAX_TOTAL_BYTES)} "
                                     f"(the most gpuwarden reads; it stopped there)",
                                     "it is damaged, a decompression bomb, or not a gpuwarden bundle")
    except EOFError:  # gzip's: the compressed stream stops before its end marker
        raise GpuwardenError(f"the bundle {path} is truncated: its gzip stream ends early", _HINT) from None
    except (zlib.error, gzip.BadGzipFile):  # bad deflate data, or a CRC or length that does not match
        raise GpuwardenError(f"the bundle {path} is a corrupt gzip file", _HINT) from None
    except _DAMAGED:
        raise GpuwardenError(f"the bundle {path} is truncated or damaged", _HINT) from None


def top_dir(tar: tarfile.TarFile) -> str:
    for m in tar.getmembers():
        if m.name.endswith("/" + MANIFEST) and m.name.count("/") == 1:
            return m.name.split("/", 1)[0]
    raise GpuwardenError(f"{os.fsdecode(tar.name) if tar.name else 'the bundle'} has no {MANIFEST}",
                         "it was not made by `gpuwarden bundle`")


def read_member(tar: tarfile.TarFile, top: str, rel: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
    try:
        f = tar.extractfile(f"{top}/{rel}")
    except KeyError:
        return None
    try:
        return f.read(limit) if f else None
    except _DAMAGED:
        raise GpuwardenError(f"the bundle's {rel} cannot be read (truncated or damaged)", _HINT) from None


def extract(tar: tarfile.TarFile, dest: Path) -> Path:
    """Extract regular files and dirs safely; recreate fd symlinks (they are only read, never followed)."""
    top = top_dir(tar)
    root = dest.resolve()
    try:
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
    except _DAMAGED as exc:
        if isinstance(exc, OSError) and exc.errno is not None and getattr(exc, "filename", None):
            raise GpuwardenError(f"cannot unpack the bundle into {dest}: {exc.strerror}",
                                 "free space in the temporary directory (TMPDIR)") from None
        raise GpuwardenError(f"the bundle {getattr(tar, 'name', '')} is truncated or damaged", _HINT) from None
    return dest / top


def read_manifest(base: Path, path: Path) -> dict[str, Any]:
    """The bundle's manifest, checked against ops/schemas/bundle-manifest.v1.json."""
    manifest = _json(base / MANIFEST, path)
    if not isinstance(manifest, dict):
        raise GpuwardenError(f"{path}: manifest.json is not a JSON object", "it was not made by `gpuwarden bundle`")
    doc = manifest if "schema" in manifest else jsondoc.document("bundle-manifest", manifest)  # wave-1 bundles
    try:
        jsondoc.validate(doc)
    except ValueError as exc:
        raise GpuwardenError(f"{path}: manifest.json is not what gpuwarden writes ({_printable(str(exc))[:200]})",
                             "it is damaged or not a gpuwarden bundle") from None
    return doc


def read_stored_snapshot(data: Any, path: Path) -> NodeSnapshot:
    """The bundle's gpuwarden/snapshot.json as a NodeSnapshot.

    The one call site to switch to jsondoc.validate(...) against ops/schemas/snapshot.v1.json once that
    schema is published; until then the model's own types are the schema (gpuwarden.ops.bundle.snapshot_reader)."""
    try:
        return snapshot_reader.read_snapshot(data)
    except ValueError as exc:
        raise GpuwardenError(f"{path}: gpuwarden/snapshot.json is not what gpuwarden writes ({str(exc)[:200]})",
                             "it is damaged or not a gpuwarden bundle") from None


def snapshot_from_bundle(path: Path | str, settings: Settings) -> NodeSnapshot:
    """The node as the bundle saw it; source is "bundle:<path>"."""
    path = Path(path)
    with open_bundle(path) as tar, tempfile.TemporaryDirectory(prefix="gpuwarden-replay-") as tmp:
        base = extract(tar, Path(tmp))
        manifest = read_manifest(base, path)
        raw = _json(base / "gpuwarden/snapshot.json", path)
        stored = read_stored_snapshot(raw, path) if raw is not None else None
        sys_tree, proc_tree = base / "tree/sys", base / "tree/proc"
        snap: NodeSnapshot | None = None
        problem = None
        if (sys_tree / "class").is_dir():
            try:
                snap = snapshot_reader.clean(_from_tree(settings, path, sys_tree, proc_tree, manifest))
            except Exception as exc:  # noqa: BLE001 - a stranger's tree may break any parser; the stored snapshot stays
                problem = f"the bundle's sysfs tree could not be read ({_printable(str(exc))[:120]}): " \
                          "showing the snapshot it stored"
                snap = None
        if snap is None:
            if stored is None:
                raise GpuwardenError(f"{path} holds neither a sysfs tree nor a snapshot",
                                     "the bundle's collectors failed; see its manifest.json")
            snap = stored
        if stored is not None:
            snap = _keep_recorded(snap, stored)
        if problem:
            snap = dataclasses.replace(snap, warnings=(*snap.warnings, as_warning(problem)))
        return dataclasses.replace(snap, source=f"bundle:{path}")


def _from_tree(settings: Settings, path: Path, sys_tree: Path, proc_tree: Path,
               manifest: dict[str, Any]) -> NodeSnapshot:
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


def _keep_recorded(snap: NodeSnapshot, recorded: NodeSnapshot) -> NodeSnapshot:
    """What a tree cannot hold (engines, arenas, drained GPUs, time taken) comes from the stored snapshot."""
    return dataclasses.replace(
        snap, taken_at=recorded.taken_at, hostname=recorded.hostname, engines=recorded.engines or snap.engines,
        arenas=recorded.arenas or snap.arenas, drained=recorded.drained or snap.drained,
        baseline_recorded=recorded.baseline_recorded)


def _json(path: Path, bundle: Path) -> Any:
    """A JSON member as extracted; None when missing; unreadable JSON is the bundle's fault, in one line."""
    try:
        data = inputs.read_regular(path, "bundle member", MAX_JSON_BYTES)
    except GpuwardenError as exc:
        if not path.exists():
            return None
        raise GpuwardenError(f"{bundle}: {exc.message}", "it is damaged or not a gpuwarden bundle") from None
    try:
        return jsondoc.loads(data)
    except jsondoc.TooDeep as exc:
        raise GpuwardenError(f"{bundle}: {path.name} is refused: {exc}", "it is damaged or not a gpuwarden bundle") \
            from None
    except ValueError:
        raise GpuwardenError(f"{bundle}: {path.name} is not valid JSON", "it is damaged or not a gpuwarden bundle") \
            from None


def _printable(text: str) -> str:
    return printable(text)
