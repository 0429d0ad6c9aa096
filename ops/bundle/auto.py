"""Automatic bundles when a supervised engine dies of a signal: at most one per few minutes per node.

The engine shim runs `python -m gpuwarden.ops.bundle.auto` (main() below), which calls maybe_collect(); a timestamp file under flock in <state dir>/bundles keeps
concurrent crashes (four engines dying together) to one safe-mode bundle, and every decision is journaled.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import os
import socket
import time

from gpuwarden.ops.foundation import journal, statedir
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.config import loader
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.bundle.collect import collect_bundle

MIN_INTERVAL_S = 300.0
AUTO_TIMEOUT_S = 5.0
# The state dir is often a tmpfs (/run): keep the newest automatic bundles only. Bundles an operator
# made by hand are never touched (only names with "-auto-" are pruned).
KEEP_AUTO = 10
LOCK = ".auto.lock"
STAMP = ".auto.last"


def _claim(settings: Settings, min_interval_s: float) -> tuple[bool, float | None]:
    """Take the node's slot for an automatic bundle: (claimed, when the last one was started)."""
    with statedir.open_dir(settings.state_dir, statedir.BUNDLES, create=True) as d:
        fd = d.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                last: float | None = float((d.read(STAMP, 64) or b"").decode().strip())
            except (ValueError, GpuwardenError):
                last = None
            now = time.time()
            if last is not None and 0 <= now - last < min_interval_s:
                return False, last
            d.write_atomic(STAMP, f"{now}\n", 0o600)
            return True, last
        finally:
            os.close(fd)  # closing drops the flock


def _prune(settings: Settings, keep: int = KEEP_AUTO) -> None:
    with statedir.open_dir(settings.state_dir, statedir.BUNDLES) as d:
        autos = []
        for name in d.listdir():
            st = d.stat(name)
            if fnmatch.fnmatchcase(name, "gpuwarden-bundle-*-auto-*.tar.gz") and st is not None:
                autos.append((st.st_mtime, name))
        autos.sort()
        for _, name in autos[:-keep] if len(autos) > keep else []:
            try:
                d.unlink(name)
                journal.write(settings.state_dir, "bundle.auto.prune", "ok", path=str(d.path / name),
                              why=f"keeping the newest {keep} automatic bundles")
            except OSError:
                pass


def maybe_collect(settings: Settings, engine: str, reason: str, *, min_interval_s: float = MIN_INTERVAL_S,
                  timeout_s: float = AUTO_TIMEOUT_S) -> str | None:
    """Collect a safe-mode bundle unless one was started recently; the path, or None. Never raises."""
    try:
        directory = statedir.ensure(settings.state_dir, statedir.BUNDLES)
        claimed, last = _claim(settings, min_interval_s)
        if not claimed:
            journal.write(settings.state_dir, "bundle.auto", "skipped", engine=engine, reason=reason,
                          why=f"another automatic bundle started {time.time() - (last or 0):.0f}s ago "
                              f"(at most one per {min_interval_s:.0f}s)")
            return None
        safe_engine = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in engine)[:40] or "engine"
        name = f"gpuwarden-bundle-{socket.gethostname()}-auto-{time.strftime('%Y%m%d-%H%M%S')}-{safe_engine}.tar.gz"
        result = collect_bundle(settings, output=directory / name, safe_mode=True, timeout_s=timeout_s,
                                subject={"engine": engine, "reason": reason})
        journal.write(settings.state_dir, "bundle.auto", "ok", engine=engine, reason=reason, path=str(result.path),
                      bytes=result.bytes, seconds=round(result.duration_s, 2), headline=result.report.headline(),
                      triage=result.report.summary()[:5])
        _prune(settings)
        return str(result.path)
    except Exception as exc:  # evidence gathering must never take the shim down
        try:
            journal.write(settings.state_dir, "bundle.auto", "failed", engine=engine, reason=reason,
                          error=getattr(exc, "message", None) or repr(exc))
        except Exception:  # an unwritable journal is no reason to take the shim down either
            pass
        return None


def main(argv: list[str] | None = None) -> int:
    """`python -m gpuwarden.ops.bundle.auto --state-dir D --engine E --reason R`: the bundle's path, or nothing."""
    parser = argparse.ArgumentParser(prog="python -m gpuwarden.ops.bundle.auto", description=main.__doc__)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--engine", required=True)
    parser.add_argument("--reason", required=True)
    args = parser.parse_args(argv)
    path = maybe_collect(loader.resolve({"state_dir": args.state_dir}, check=False), engine=args.engine, reason=args.reason)
    print(path or "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
