"""A tiny engine for supervision tests: speaks the status protocol and takes a gate slot around a fake register.

With --crash-at-overlap N it dies of SIGSEGV when N or more registrations overlap: the real node's failure.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

from gpuwarden.ops.foundation import gate
from gpuwarden.ops.foundation.status_protocol import StatusWriter


def overlapping(marker_dir: Path) -> int:
    """How many registrations are in progress now: marker files whose flock a live process holds."""
    count = 0
    for path in marker_dir.glob("reg-*"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            count += 1
        finally:
            os.close(fd)
    return count


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--register-s", type=float, default=0.5)
    p.add_argument("--startup-s", type=float, default=0.0)
    p.add_argument("--crash-at-overlap", type=int, default=0)
    p.add_argument("--marker-dir", type=Path)
    p.add_argument("--log-only", action="store_true", help="no status protocol, no gate: print lines only")
    p.add_argument("--exit-after-register", type=int, default=None, help="exit with this code once registered")
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (tests the SIGKILL after the grace)")
    p.add_argument("--spam", type=int, default=0, help="print this many bytes of filler once serving")
    args = p.parse_args()

    stop = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else on_term)

    status = StatusWriter() if not args.log_only else StatusWriter({})
    status.emit("starting")
    print(f"fake engine pid {os.getpid()} starting, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}",
          flush=True)
    time.sleep(args.startup_s)
    status.emit("mapping")
    slot = None if args.log_only else gate.acquire_from_env(who=f"fake:{os.getpid()}")
    status.emit("registering")
    print("registering", flush=True)
    marker_fd = None
    if args.marker_dir:
        args.marker_dir.mkdir(parents=True, exist_ok=True)
        marker_fd = os.open(args.marker_dir / f"reg-{os.getpid()}", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(marker_fd, fcntl.LOCK_EX)
    deadline = time.monotonic() + args.register_s
    while time.monotonic() < deadline:
        if args.crash_at_overlap and args.marker_dir and overlapping(args.marker_dir) >= args.crash_at_overlap:
            print(f"segfault: {overlapping(args.marker_dir)} registrations overlap", flush=True)
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(0.01)
    if marker_fd is not None:
        os.close(marker_fd)
        os.unlink(args.marker_dir / f"reg-{os.getpid()}")
    status.emit("registered", bytes=1 << 20)
    if slot is not None:
        slot.release()
    print("session is up", flush=True)
    if args.exit_after_register is not None:
        return args.exit_after_register
    status.emit("serving")
    print("serving", flush=True)
    for i in range(args.spam // 100):
        print(f"{i:08d} " + "x" * 90, flush=i % 50 == 0)
    sys.stdout.flush()
    while not stop:
        time.sleep(0.05)
    status.emit("stopping")
    print("stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
