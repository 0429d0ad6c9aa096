"""The canary engine: map the arena, verify it, register it with one GPU, copy it to the device, serve until SIGTERM.

Speaks the status protocol at each phase and takes a registration-gate slot around the register call only.
Fault switches (--crash-at/--crash-signal, --hang-at) make it a drill target. Run: python -m gpuwarden.ops.canary --help.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass

from gpuwarden.ops import gate
from gpuwarden.ops.errors import GpuwardenError
from gpuwarden.ops.status_protocol import PHASES, StatusWriter
from gpuwarden.ops.units import fmt_bytes, parse_size

VERIFY_MODES = ("full", "header", "none")
FAULT_PHASES = tuple(p for p in PHASES if p != "exited")


@dataclass
class Options:
    arena: str
    gpu: int = 0
    runtime: str = "host"
    verify: str = "full"
    register_chunk: int | None = None
    copy_buffer: int = 1 << 30
    crash_at: str | None = None
    crash_signal: str = "SEGV"
    hang_at: str | None = None
    serve_seconds: float | None = None
    gate_timeout: float | None = None


class _Stop:
    requested = False


def _signal_number(name: str) -> int:
    name = name.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(getattr(signal, name))
    except AttributeError:
        raise GpuwardenError(f"unknown signal {name!r}", "e.g. SEGV, ABRT, KILL, BUS") from None


class Canary:
    def __init__(self, opts: Options, out=sys.stdout):
        self.o = opts
        self.out = out
        self.status = StatusWriter()
        self.stop = _Stop()
        from gpuwarden.ops.register.base import physical_gpu
        # The node's number for the GPU, which differs from --gpu when *_VISIBLE_DEVICES narrow the view.
        self.node_gpu = physical_gpu(opts.gpu)

    def say(self, text: str) -> None:
        self.out.write(f"canary[{os.getpid()}] gpu {self.o.gpu}: {text}\n")
        self.out.flush()

    def phase(self, name: str, **data: object) -> None:
        if self.o.hang_at == name:
            # Before the phase is announced: whoever sees it may send SIGTERM at once.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.status.emit(name, gpu=self.o.gpu, node_gpu=self.node_gpu, runtime=self.o.runtime, **data)
        if self.o.crash_at == name:
            self.say(f"crashing at {name} with SIG{self.o.crash_signal.upper().removeprefix('SIG')} (fault switch)")
            sig = _signal_number(self.o.crash_signal)
            # No core file from a drill; a real crash keeps the node's core policy.
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            time.sleep(5)  # a signal the process ignores by default falls through to here
        if self.o.hang_at == name:
            self.say(f"hanging at {name} (fault switch): only SIGKILL ends this process now")
            while True:
                time.sleep(3600)

    def run(self) -> int:
        from gpuwarden.ops.arena import verify as verifier
        from gpuwarden.ops.arena.mapping import MappedArena
        from gpuwarden.ops.register import get

        def on_term(signum, frame):
            self.stop.requested = True
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

        self.phase("starting", arena=self.o.arena)
        runtime = get(self.o.runtime)
        runtime.open(self.o.gpu)
        self.phase("mapping", arena=self.o.arena)
        arena = MappedArena(self.o.arena)
        reg = None
        try:
            self.phase("verifying", mode=self.o.verify, bytes=arena.payload_size)
            if self.o.verify == "full":
                v = verifier.verify(self.o.arena)
                self.say(f"verified {fmt_bytes(arena.payload_size)} in {v.seconds:.2f}s")
            if self.stop.requested:
                return self._finish(runtime, arena, reg)
            # The protocol's "registering" means "about to call register" and "registered" that the call is done:
            # both are written while the slot is held, so no two engines' windows overlap under a 1-slot gate.
            slot = gate.acquire_from_env(who=f"canary gpu{self.o.gpu} pid{os.getpid()}", timeout_s=self.o.gate_timeout)
            try:
                self.phase("registering", bytes=arena.payload_size)
                reg = runtime.register(arena.payload_address, arena.payload_size,
                                       chunk_size=self.o.register_chunk, path=self.o.arena)
                self.phase("registered", bytes=reg.size, seconds=round(reg.seconds, 4), chunks=len(reg.chunks),
                           arena=self.o.arena, slot=slot.index if slot else None)
            finally:
                if slot is not None:
                    slot.release()
            self.say(f"registered {fmt_bytes(reg.size)} in {reg.seconds:.3f}s ({len(reg.chunks)} chunk(s))")
            copy = None
            if self.o.copy_buffer > 0 and not self.stop.requested:
                copy = runtime.copy_to_device(reg, self.o.copy_buffer)
                self.say(f"copied {fmt_bytes(copy.bytes)} to the device in {copy.seconds:.3f}s: {copy.gbps:.1f} GB/s")
            self.phase("serving", bytes=reg.size, register_seconds=round(reg.seconds, 4),
                       copy_seconds=round(copy.seconds, 4) if copy else None,
                       gbps=round(copy.gbps, 3) if copy else None)
            self.say("session is up, serving until SIGTERM")
            deadline = None if self.o.serve_seconds is None else time.monotonic() + self.o.serve_seconds
            while not self.stop.requested and (deadline is None or time.monotonic() < deadline):
                time.sleep(0.05)
            return self._finish(runtime, arena, reg)
        except BaseException:
            if reg is not None:
                try:
                    runtime.unregister(reg)
                except GpuwardenError:
                    pass
            arena.close()
            raise

    def _finish(self, runtime, arena, reg) -> int:
        self.phase("stopping")
        if reg is not None:
            runtime.unregister(reg)
        arena.close()
        runtime.close()
        self.phase("exited", code=0)
        self.say("stopped cleanly")
        return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuwarden.ops.canary", description=(
        "The canary engine: maps the arena, verifies it, registers it with one GPU, copies it to the device and "
        "reports GB/s, then serves until SIGTERM, unregisters and exits 0. Phases go to the status protocol "
        "(GPUWARDEN_STATUS_FILE / GPUWARDEN_STATUS_FD); a registration gate (GPUWARDEN_GATE_DIR/_SLOTS) is "
        "held around the register call only."))
    p.add_argument("--arena", required=True, help="the arena file")
    p.add_argument("--gpu", type=int, default=0, help="device index as this process sees it (default 0)")
    p.add_argument("--runtime", default="host", choices=("hip", "cuda", "host", "sim"), help="registration runtime")
    p.add_argument("--verify", default="full", choices=VERIFY_MODES,
                   help="full: hash every chunk; header: header and size only; none")
    p.add_argument("--register-chunk", default=None, help="register in pieces of this size (e.g. 1GiB)")
    p.add_argument("--copy-buffer", default="1GiB", help="device buffer the arena is copied through; 0 skips the copy")
    p.add_argument("--crash-at", choices=FAULT_PHASES, help="fault switch: kill itself with --crash-signal on entering this phase")
    p.add_argument("--crash-signal", default="SEGV", help="signal for --crash-at (default SEGV)")
    p.add_argument("--hang-at", choices=FAULT_PHASES, help="fault switch: hang on entering this phase (ignores SIGTERM)")
    p.add_argument("--serve-seconds", type=float, default=None, help="stop by itself after serving this long")
    p.add_argument("--gate-timeout", type=float, default=None, help="give up waiting for a gate slot after this many seconds")
    return p


def options_from(ns: argparse.Namespace) -> Options:
    return Options(arena=ns.arena, gpu=ns.gpu, runtime=ns.runtime, verify=ns.verify,
                   register_chunk=parse_size(ns.register_chunk) if ns.register_chunk else None,
                   copy_buffer=parse_size(ns.copy_buffer), crash_at=ns.crash_at, crash_signal=ns.crash_signal,
                   hang_at=ns.hang_at, serve_seconds=ns.serve_seconds, gate_timeout=ns.gate_timeout)


def run(opts: Options) -> int:
    """Run a canary; expected failures print one line, emit "exited" with the error, and return 2."""
    canary = Canary(opts)
    _signal_number(opts.crash_signal)
    try:
        return canary.run()
    except GpuwardenError as exc:
        canary.status.emit("exited", gpu=opts.gpu, code=exc.exit_code, error=exc.message)
        print(f"gpuwarden: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        opts = options_from(ns)
    except GpuwardenError as exc:
        print(f"gpuwarden: error: {exc.message}", file=sys.stderr)
        return 2
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
