"""The state dir: its layout, and the one way gpuwarden opens, reads and writes anything inside it.

Directories are opened through fds checked to be ours, not writable by others and not symlinks; files
are opened relative to them with O_NOFOLLOW, so nothing planted in the state dir redirects a write.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import stat
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Iterator

# Layout, relative to the state dir. One place so that every module agrees.
JOURNAL = "journal.log"
LOCKS = "locks"
DRAINED = "drained.json"
BASELINE = "baseline.json"
SIM = "sim"
ENGINES = "engines"
GATE = "gate"
BUNDLES = "bundles"

# No JSON state file gpuwarden writes comes near this; a bigger one was not written by gpuwarden.
MAX_JSON_BYTES = 4 << 20
_HINT_OWN = "point --state-dir / GPUWARDEN_STATE_DIR at a directory you own"


class UnsafeStateDir(GpuwardenError):
    """The state dir (or something in it) is not safe to write through: not ours, shared, a symlink."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_dir(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateDir(f"{path} in the state dir is not a directory", "move it aside; gpuwarden recreates it")
    if st.st_uid != os.geteuid():
        raise UnsafeStateDir(f"{path} belongs to {_owner(st.st_uid)}, not to you ({_owner(os.geteuid())}); "
                             "gpuwarden keeps state only in directories of its own user",
                             f"remove it if it is stale, or {_HINT_OWN}")
    shared_group = st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid()
    if st.st_mode & stat.S_IWOTH or shared_group:
        raise UnsafeStateDir(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                             "anyone could plant files there", f"chmod go-w {path}, or {_HINT_OWN}")


def valid_name(name: str) -> str:
    """`name` when it can name one entry of a state-dir directory (no '/', '..', NUL); else GpuwardenError."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise GpuwardenError(f"{name!r} cannot name a file in the state dir",
                             "names are letters, digits, '.', '_' or '-' (see `gpuwarden engines list`)")
    return name


class Dir:
    """One directory of the state dir, open as a checked fd; every file in it is opened relative to it."""

    def __init__(self, fd: int, path: Path):
        self.fd = fd
        self.path = path

    def __enter__(self) -> "Dir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # --- directories -------------------------------------------------------------------------
    def subdir(self, name: str, create: bool = False) -> "Dir":
        name = valid_name(name)
        path = self.path / name
        if create:
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
            except PermissionError:
                raise GpuwardenError(f"no permission to create {path} (the state dir is {self.path})",
                                     f"run as the state dir's owner, or {_HINT_OWN}") from None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _open_error(exc, path, directory=True) from None
        try:
            _check_dir(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return Dir(fd, path)

    def listdir(self) -> list[str]:
        return os.listdir(self.fd)

    def stat(self, name: str) -> os.stat_result | None:
        """lstat of a name in this directory; None when missing."""
        try:
            return os.stat(valid_name(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    # --- files -------------------------------------------------------------------------------
    def open(self, name: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
        """An fd on a regular file of this directory, never through a symlink; FileNotFoundError when missing."""
        path = self.path / valid_name(name)
        # O_NONBLOCK: a FIFO planted under a state file's name must not hang the open.
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK, mode,
                         dir_fd=self.fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _open_error(exc, path, directory=False) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeStateDir(f"{path} is not a regular file ({_kind(st.st_mode)})",
                                     "move it aside; gpuwarden recreates it")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
        """The file's bytes (None when missing); a file over `limit` is refused, never read whole."""
        try:
            fd = self.open(name)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise StateFileError(self.path / name, f"{size} bytes, more than gpuwarden ever writes there ({limit})")
            return read_bounded(fd, limit, self.path / name)
        finally:
            os.close(fd)

    def write_atomic(self, name: str, data: bytes | str, mode: int = 0o600) -> None:
        """Write a temp file beside `name`, fsync, rename over it: readers see the old or the new file whole."""
        if isinstance(data, str):
            data = data.encode()
        name = valid_name(name)
        tmp = f".{name}.{os.urandom(4).hex()}"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            try:
                write_all(fd, data)
                os.fchmod(fd, mode)  # the umask may have taken bits away
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)  # replaces a symlink, never follows it
        except BaseException:
            self.unlink(tmp)
            raise

    def write_json(self, name: str, obj: Any, mode: int = 0o600) -> None:
        self.write_atomic(name, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", mode)

    def append(self, name: str, data: bytes, *, lock: bool = False, mode: int = 0o600) -> None:
        """Append with one write (O_APPEND); `lock` takes flock around it so concurrent lines never interleave."""
        fd = self.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
        try:
            if lock:
                fcntl.flock(fd, fcntl.LOCK_EX)
            write_all(fd, data)
        finally:
            os.close(fd)

    def unlink(self, name: str) -> bool:
        try:
            os.unlink(valid_name(name), dir_fd=self.fd)
            return True
        except FileNotFoundError:
            return False

    def rename(self, src: str, dst: str) -> None:
        os.replace(valid_name(src), valid_name(dst), src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def link(self, src: str, dst: str) -> None:
        os.link(valid_name(src), valid_name(dst), src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)


class StateFileError(GpuwardenError):
    """A state file that is there but cannot be what gpuwarden wrote; names the file and what is wrong."""

    def __init__(self, path: Path | str, problem: str):
        super().__init__(f"state file {path} is corrupt: {problem}", "move it aside; gpuwarden recreates it")
        self.path = str(path)
        self.problem = problem


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a plain file"


def _open_error(exc: OSError, path: Path, directory: bool) -> GpuwardenError:
    if exc.errno == errno.ELOOP or (directory and exc.errno == errno.ENOTDIR and os.path.islink(path)):
        return UnsafeStateDir(f"{path} is a symbolic link inside the state dir; gpuwarden never writes through one",
                              "remove the link (gpuwarden did not make it) and run again")
    if exc.errno == errno.ENOTDIR:
        return UnsafeStateDir(f"{path} in the state dir is not a directory", "move it aside; gpuwarden recreates it")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return GpuwardenError(f"no permission to open {path}", f"run as the state dir's owner, or {_HINT_OWN}")
    if exc.errno == errno.EISDIR:
        return UnsafeStateDir(f"{path} is a directory where gpuwarden keeps a file", "move it aside")
    return GpuwardenError(f"cannot open {path}: {exc.strerror or exc}", "check the state dir's file system")


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_bounded(fd: int, limit: int, what: Path | str) -> bytes:
    """Read to EOF, but never more than `limit` bytes (a file growing under us is refused)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise StateFileError(what, f"more than {limit} bytes")


# --- opening the state dir ---------------------------------------------------------------------

def _open_root(state_dir: Path, create: bool) -> Dir:
    if create:
        try:
            # The state dir itself only: a mistyped --state-dir must not leave a tree of new directories.
            state_dir.mkdir(exist_ok=True, mode=0o700)
        except FileNotFoundError as exc:
            if state_dir.parent.is_dir():  # /proc answers ENOENT for any new name in it
                raise GpuwardenError(f"cannot create the state dir {state_dir}: {exc.strerror or exc}",
                                     "point --state-dir / GPUWARDEN_STATE_DIR at a writable directory") from None
            raise GpuwardenError(
                f"the state dir {state_dir} cannot be made: {state_dir.parent} does not exist",
                f"check the spelling of --state-dir / GPUWARDEN_STATE_DIR, or create it first "
                f"(`mkdir -p -m 700 {state_dir}`)") from None
        except PermissionError as exc:
            raise GpuwardenError(
                f"no permission to create {exc.filename or state_dir} (the state dir is {state_dir})",
                "run as root, or point --state-dir / GPUWARDEN_STATE_DIR at a directory you own") from None
        except FileExistsError:
            pass  # a file or a dangling link in the way: the open below says which
        except OSError as exc:  # under /proc, a read-only file system, a file where a directory should be
            raise GpuwardenError(f"cannot create the state dir {state_dir}: {exc.strerror or exc}",
                                 "point --state-dir / GPUWARDEN_STATE_DIR at a writable directory") from None
    try:
        lst = os.lstat(state_dir)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise GpuwardenError(f"cannot reach the state dir {state_dir}: {exc.strerror}", _HINT_OWN) from None
    # The state dir itself may be reached through a link (/var/run -> /run), but not one a stranger made.
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (0, os.geteuid()):
        raise UnsafeStateDir(f"the state dir {state_dir} is a symbolic link made by {_owner(lst.st_uid)}",
                             f"remove it, or {_HINT_OWN}")
    try:
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except NotADirectoryError:
        raise GpuwardenError(f"the state dir {state_dir} is not a directory", _HINT_OWN) from None
    except PermissionError:
        raise GpuwardenError(f"no permission to read the state dir {state_dir}",
                             f"run as its owner (or root), or {_HINT_OWN}") from None
    except OSError as exc:
        raise GpuwardenError(f"cannot open the state dir {state_dir}: {exc.strerror or exc}", _HINT_OWN) from None
    try:
        _check_dir(fd, state_dir)
    except UnsafeStateDir as exc:
        os.close(fd)
        exc.message = exc.message.replace(f"{state_dir} ", f"the state dir {state_dir} ", 1)
        raise
    return Dir(fd, state_dir)


def open_dir(state_dir: Path, *parts: str, create: bool = False) -> Dir:
    """The directory state_dir/parts, every level checked; FileNotFoundError when it is missing and not `create`."""
    names = [valid_name(name) for part in parts for name in str(part).split("/")]  # ".." never climbs out
    d = _open_root(Path(state_dir), create)
    try:
        for name in names:
            sub = d.subdir(name, create)
            d.close()
            d = sub
    except BaseException:
        d.close()
        raise
    return d


def check(state_dir: Path) -> None:
    """Refuse, in one line, a state dir that exists but is not ours, is shared, or cannot be read."""
    try:
        _open_root(Path(state_dir), create=False).close()
    except FileNotFoundError:
        pass


def ensure(state_dir: Path, *parts: str) -> Path:
    """Create state_dir/parts (mode 0700, every level checked) and return the path."""
    open_dir(state_dir, *parts, create=True).close()
    return Path(state_dir).joinpath(*parts)


def _split(path: Path, root: Path) -> tuple[tuple[str, ...], str]:
    try:
        rel = Path(path).relative_to(root)
    except ValueError:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    parts = rel.parts
    if not parts:
        raise ValueError(f"{path} names the state dir itself, not a file in it")
    return parts[:-1], valid_name(parts[-1])


def parent(path: Path, *, root: Path, create: bool = False) -> tuple[Dir, str]:
    """(the checked directory holding `path`, its file name); `path` must lie under `root`."""
    dirs, name = _split(path, root)
    return open_dir(root, *dirs, create=create), name


# --- path-style helpers for one-off reads and writes -------------------------------------------

def atomic_write(path: Path, data: bytes | str, mode: int = 0o600, *, root: Path) -> None:
    d, name = parent(path, root=root, create=True)
    with d:
        d.write_atomic(name, data, mode)


def write_json(path: Path, obj: Any, mode: int = 0o600, *, root: Path) -> None:
    d, name = parent(path, root=root, create=True)
    with d:
        d.write_json(name, obj, mode)


def append(path: Path, data: bytes, *, root: Path, lock: bool = False) -> None:
    d, name = parent(path, root=root, create=True)
    with d:
        d.append(name, data, lock=lock)


def read_bytes(path: Path, *, root: Path, limit: int = MAX_JSON_BYTES) -> bytes | None:
    """A state file's bytes, None when it (or its directory) does not exist."""
    try:
        d, name = parent(path, root=root)
    except FileNotFoundError:
        return None
    with d:
        return d.read(name, limit)


def unlink(path: Path, *, root: Path) -> bool:
    try:
        d, name = parent(path, root=root)
    except FileNotFoundError:
        return False
    with d:
        return d.unlink(name)


def listdir(path: Path, *, root: Path) -> list[str]:
    """Names in a directory of the state dir ([] when it does not exist)."""
    try:
        parts = () if Path(path) == Path(root) else _split(path, root)[0] + (_split(path, root)[1],)
        with open_dir(root, *parts) as d:
            return d.listdir()
    except FileNotFoundError:
        return []


def parse_json(data: bytes, path: Path | str) -> Any:
    """JSON from a state file's bytes; anything else (not UTF-8, not JSON, too deep) is a StateFileError."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StateFileError(path, f"not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise StateFileError(path, f"not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise StateFileError(path, "JSON nested too deeply") from None


def read_json(path: Path, default: Any = None, kind: type | None = None, *, root: Path) -> Any:
    """A JSON state file; missing gives `default`, unreadable or of another JSON type a StateFileError.

    `kind` (else the type of a default that is not None) fixes the top-level type."""
    data = read_bytes(path, root=root)
    if data is None:
        return default
    value = parse_json(data, path)
    kind = kind or (type(default) if default is not None else None)
    if kind is not None and not isinstance(value, kind):
        raise StateFileError(path, f"a JSON {type(value).__name__}, not the {kind.__name__} gpuwarden writes")
    return value


def walk_lines(fd: int, max_line: int) -> Iterator[bytes]:
    """Lines of an open file, each cut at `max_line` bytes (the rest of a longer line is skipped)."""
    buf = b""
    skipping = False
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            if buf and not skipping:
                yield buf
            return
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > max_line:
                    if not skipping:
                        yield buf[:max_line]
                    skipping, buf = True, b""
                break
            line, buf = buf[:nl], buf[nl + 1:]
            if not skipping:
                yield line[:max_line]
            skipping = False
