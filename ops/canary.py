"""The canary engine: map the arena, verify it, register it with one GPU, copy it to the device, serve until SIGTERM.

Speaks the status protocol at each phase and takes a registration-gate slot around the register call only.
Fault switches (--crash-at/--crash-signal, --hang-at) make it a drill target. --share keeper|import: one keeper
holds the arena in VMM host memory and passes its descriptor over a unix socket; importers map it (register/share.py). Run: python -m gpuwarden.ops.canary --help.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, TextIO

from gpuwarden.ops.foundation import gate
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.interrupts import signal_number
from gpuwarden.ops.foundation.status_protocol import PHASES, StatusWriter
from gpuwarden.ops.foundation.units import fmt_bytes, parse_size
from gpuwarden.ops import register
from gpuwarden.ops.arena import verify as verifier
from gpuwarden.ops.arena.mapping import MappedArena
from gpuwarden.ops.register import share
from gpuwarden.ops.register.base import Runtime, physical_gpu
from gpuwarden.ops.register.share import Keeper
from gpuwarden.ops.node.sim import registrations

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
    share: str | None = None  # "keeper" or "import": the shared-by-descriptor mode
    share_socket: str | None = None
    # After "session is up": one pinned host allocation of this size (the engine's verifier buffer), as the
    # arena incident's engines made next; modelled by the sim runtime (its KFD ledger charges it).
    pin: int | None = None
    pin_after_peers: int | None = None  # sim: first wait until this many processes registered this arena
    on_pin_failure: str = "segv"  # "segv": die in a simulated runtime frame, as the incident did; "report"


PIN_FAILURE_MODES = ("segv", "report")
PEER_WAIT_S = 30.0


class _Stop:
    requested = False


def _signal_number(name: str) -> int:
    number = signal_number(name)
    if number is None:
        shown = name.strip().upper()
        raise GpuwardenError(f"unknown signal {shown if shown.startswith('SIG') else 'SIG' + shown!r}",
                             "e.g. SEGV, ABRT, KILL, BUS")
    return number


class Canary:
    def __init__(self, opts: Options, out: TextIO = sys.stdout):
        self.o = opts
        self.out = out
        self.status = StatusWriter()
        self.stop = _Stop()
        self.started = time.time()
        self._keep_charges = False
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
        def on_term(signum: int, frame: FrameType | None) -> None:
            self.stop.requested = True
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

        self.phase("starting", arena=self.o.arena)
        runtime = register.get(self.o.runtime)
        runtime.open(self.o.gpu)
        if self.o.share:
            return self._run_shared(runtime)
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
            if self.o.pin:
                self._pin(runtime)
            deadline = None if self.o.serve_seconds is None else time.monotonic() + self.o.serve_seconds
            while not self.stop.requested and (deadline is None or time.monotonic() < deadline):
                time.sleep(0.05)
            return self._finish(runtime, arena, reg)
        except BaseException:
            if reg is not None and not self._keep_charges:
                try:
                    runtime.unregister(reg)
                except GpuwardenError:
                    pass
            arena.close()
            raise

    def _pin(self, runtime: Any) -> None:
        """The engine's next allocation after it is up: a pinned host buffer, charged by KFD like the arena."""
        # deferred: keeps `gpuwarden canary --help` cheap (9.6 ms there)
        from gpuwarden.ops.register.sim import PinFailed
        assert self.o.pin is not None
        used = registrations.charged(runtime.state_dir)
        if self.o.pin_after_peers:
            # Engines load for a while after registering; the incident's four all registered before any allocated.
            # Peers that registered since this canary started count even if one has died since: the charges are
            # what they were when the last peer registered.
            deadline = time.monotonic() + PEER_WAIT_S
            while not self.stop.requested:
                peers = registrations.registered_since(runtime.state_dir, self.o.arena, self.started - PEER_WAIT_S)
                if len({p["pid"] for p in peers}) >= self.o.pin_after_peers or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            # The ledger now, then the peers again: a peer that died since the wait's last look (its pin failed
            # first) left its charge behind on a real node for a moment, so it counts once as stale. In the other
            # order it could be missed by both reads; in this one it is at worst counted twice, which fails the
            # pin as the incident's peers all failed.
            now = registrations.charged(runtime.state_dir)
            peers = registrations.registered_since(runtime.state_dir, self.o.arena, self.started - PEER_WAIT_S)
            used = max(used, now + sum(p["bytes"] for p in peers if p["stale"]))
        if self.stop.requested:
            return
        self.say(f"allocating a {fmt_bytes(self.o.pin)} pinned host buffer (hipHostMalloc); the KFD ledger holds "
                 f"{fmt_bytes(used)}")
        try:
            runtime.pin(self.o.pin, seen=used)
        except PinFailed as exc:
            record_failed_call(runtime.state_dir, call="hipHostMalloc", size=exc.size, result=exc.code,
                               used=exc.used, limit=exc.limit, gpu=self.node_gpu)
            self.say(f"sim: {exc}")
            if self.o.on_pin_failure == "report":
                # Exit with the registration held: the process's teardown frees it, as KFD does, so peers
                # allocating at the same moment still see it charged (the sim record goes stale at exit).
                self._keep_charges = True
                raise GpuwardenError(f"{exc}", "see `gpuwarden arena budget`: registrations and pinned host "
                                     "allocations draw on the same KFD limit") from None
            # What the operator saw: the runtime goes on with the NULL it got and faults at a small offset.
            self.say("sim: SIGSEGV: segfault at 8 ip 00007f3a1c2b71c9 sp 00007ffd5a1e0c40 error 6 in "
                     "libamdhip64.so.7[7f3a1c200000+400000] (simulated runtime frame: hipHostMalloc -> "
                     "amd::Memory::create, NULL dereference after the failed allocation)")
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(5)
        else:
            self.say(f"pinned {fmt_bytes(self.o.pin)}")
            self.phase("serving", pinned=self.o.pin)  # tells a waiting probe the next allocation is done

    def _run_shared(self, runtime: Runtime) -> int:
        """--share: the keeper loads and verifies the arena once; importers map the keeper's allocation."""
        sock_path = self.o.share_socket or default_socket(self.o.arena)
        shared = keeper = None
        try:
            if self.o.share == "keeper":
                shared, keeper = self._keep(runtime, sock_path)
            else:
                shared = self._import(runtime, share, sock_path)
            copy = None
            if self.o.share == "import" and self.o.copy_buffer > 0 and not self.stop.requested:
                copy = runtime.share_copy_to_device(shared, self.o.copy_buffer)
                self.say(f"copied {fmt_bytes(copy.bytes)} to the device in {copy.seconds:.3f}s: {copy.gbps:.1f} GB/s")
            self.phase("serving", bytes=shared.payload or shared.size, register_seconds=round(shared.seconds, 4), share=self.o.share,
                       socket=sock_path, copy_seconds=round(copy.seconds, 4) if copy else None,
                       gbps=round(copy.gbps, 3) if copy else None)
            self.say("session is up, serving until SIGTERM" + (f"; importers join at {sock_path}" if keeper else ""))
            deadline = None if self.o.serve_seconds is None else time.monotonic() + self.o.serve_seconds
            while not self.stop.requested and (deadline is None or time.monotonic() < deadline):
                if keeper is not None and keeper.serve():
                    self.say(f"passed the descriptor to an importer ({keeper.served} so far)")
                time.sleep(0.05)
            self.phase("stopping")
        finally:
            if keeper is not None:
                keeper.close()  # first: nobody may join an allocation being released
            if shared is not None:
                runtime.share_release(shared)
        runtime.close()
        self.phase("exited", code=0)
        self.say("stopped cleanly")
        return 0

    def _keep(self, runtime: Runtime, sock_path: str) -> tuple[share.Shared, Keeper]:
        self.phase("mapping", arena=self.o.arena)
        arena = MappedArena(self.o.arena)
        shared = None
        try:
            self.phase("verifying", mode=self.o.verify, bytes=arena.payload_size)
            if self.o.verify == "full":
                # The only verification: importers get these bytes from the keeper's memory, not from the file.
                v = verifier.verify(self.o.arena)
                self.say(f"verified {fmt_bytes(arena.payload_size)} in {v.seconds:.2f}s (once, for every importer)")
            slot = gate.acquire_from_env(who=f"canary keeper gpu{self.o.gpu} pid{os.getpid()}", timeout_s=self.o.gate_timeout)
            try:
                self.phase("registering", bytes=arena.payload_size, share="keeper")
                shared = runtime.share_create(arena.payload_size)
                shared.payload = arena.payload_size
                load = runtime.share_fill(shared, arena.payload_address, arena.payload_size)
                self.phase("registered", bytes=shared.size, seconds=round(shared.seconds, 4), chunks=1,
                           arena=self.o.arena, slot=slot.index if slot else None, share="keeper",
                           load_seconds=round(load.seconds, 4))
            finally:
                if slot is not None:
                    slot.release()
            self.say(f"allocated and pinned {fmt_bytes(shared.size)} in {shared.seconds:.3f}s, "
                     f"loaded the arena in {load.seconds:.3f}s")
            keeper = Keeper(sock_path, shared.fd, {
                "arena": os.path.realpath(self.o.arena), "bytes": shared.size, "payload_bytes": arena.payload_size,
                "runtime": runtime.name, "verified": self.o.verify, "keeper_pid": os.getpid()})
            return shared, keeper
        except BaseException:
            if shared is not None:
                runtime.share_release(shared)
            raise
        finally:
            arena.close()  # the file's pages are no longer needed: the arena lives in the keeper's allocation now

    def _import(self, runtime: Runtime, share: ModuleType, sock_path: str) -> share.Shared:
        self.phase("mapping", arena=self.o.arena, share="import", socket=sock_path)
        fd, meta = share.join(sock_path)
        want = os.path.realpath(self.o.arena)
        problem = None
        if meta.get("arena") != want:
            problem = (f"the keeper at {sock_path} serves {meta.get('arena')}, not {want}",
                       "point --share-socket at this arena's keeper")
        elif meta.get("runtime") != runtime.name:
            problem = (f"the keeper at {sock_path} allocated with the {meta.get('runtime')} runtime, this canary "
                       f"uses {runtime.name}", f"run the importer with --runtime {meta.get('runtime')}")
        if problem:
            os.close(fd)
            raise GpuwardenError(*problem)
        # Verification happened once, in the keeper; the file is not read again here.
        self.phase("verifying", mode="keeper", keeper_verified=meta.get("verified"), keeper_pid=meta.get("keeper_pid"))
        slot = gate.acquire_from_env(who=f"canary import gpu{self.o.gpu} pid{os.getpid()}", timeout_s=self.o.gate_timeout)
        try:
            self.phase("registering", bytes=meta["bytes"], share="import")
            shared = runtime.share_import(fd, int(meta["bytes"]))
            shared.payload = int(meta.get("payload_bytes", shared.size))
            self.phase("registered", bytes=shared.payload, seconds=round(shared.seconds, 4), chunks=1, arena=self.o.arena,
                       slot=slot.index if slot else None, share="import", keeper_pid=meta.get("keeper_pid"))
        finally:
            if slot is not None:
                slot.release()
        self.say(f"imported the keeper's (pid {meta.get('keeper_pid')}) {fmt_bytes(shared.payload)} in {shared.seconds:.3f}s")
        return shared

    def _finish(self, runtime: Runtime, arena: Any, reg: Any) -> int:
        self.phase("stopping")
        if reg is not None:
            runtime.unregister(reg)
        arena.close()
        runtime.close()
        self.phase("exited", code=0)
        self.say("stopped cleanly")
        return 0


def record_failed_call(state_dir: Any, **call: Any) -> None:
    """The sim ledger's failed calls (<state dir>/sim/failed-calls.jsonl), which triage reads as node context."""
    path = Path(state_dir) / "sim" / "failed-calls.jsonl"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"ts": time.time(), "pid": os.getpid(), **call}) + "\n")
    except OSError:
        pass  # the call's failure is also in the log; the ledger file is a convenience


def default_socket(arena: str) -> str:
    """The keeper's socket beside the arena: one keeper per arena file."""
    return os.path.realpath(arena) + ".keeper.sock"


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
    p.add_argument("--share", choices=("keeper", "import"), default=None,
                   help="shared-by-descriptor mode: keeper allocates host memory once (VMM), loads the arena into it "
                        "and passes its descriptor over a unix socket; import maps the keeper's allocation")
    p.add_argument("--share-socket", default=None, help="the keeper's unix socket (default: ARENA.keeper.sock)")
    p.add_argument("--pin", default=None, help="sim runtime: after the session is up, allocate a pinned host buffer "
                   "of this size (hipHostMalloc), charged against the simulated KFD limit like the registration")
    p.add_argument("--pin-after-peers", type=int, default=None,
                   help="sim runtime: before --pin, wait (up to 30 s) until this many processes registered the arena")
    p.add_argument("--on-pin-failure", choices=PIN_FAILURE_MODES, default="segv",
                   help="segv (default): die of SIGSEGV in a simulated runtime frame, as the arena incident's "
                        "engines did; report: exit 2 naming the failed call")
    return p


def options_from(ns: argparse.Namespace) -> Options:
    return Options(arena=ns.arena, gpu=ns.gpu, runtime=ns.runtime, verify=ns.verify,
                   register_chunk=parse_size(ns.register_chunk) if ns.register_chunk else None,
                   copy_buffer=parse_size(ns.copy_buffer), crash_at=ns.crash_at, crash_signal=ns.crash_signal,
                   hang_at=ns.hang_at, serve_seconds=ns.serve_seconds, gate_timeout=ns.gate_timeout,
                   share=ns.share, share_socket=ns.share_socket, pin=parse_size(ns.pin) if ns.pin else None,
                   pin_after_peers=ns.pin_after_peers, on_pin_failure=ns.on_pin_failure)


def run(opts: Options) -> int:
    """Run a canary; expected failures print one line, emit "exited" with the error, and return 2."""
    if opts.pin and opts.runtime != "sim":
        print("gpuwarden: error: --pin is modelled by the sim runtime only", file=sys.stderr)
        print("  hint: use --runtime sim, or watch a real engine's pinned allocations with progress = \"preload\"",
              file=sys.stderr)
        return 2
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
