"""CLI: `gpuwarden canary` — run the canary engine in the foreground (same as `python -m gpuwarden.ops.canary`).

The engine itself lives in gpuwarden.ops.canary so the shim can spawn it without Typer.
"""

from __future__ import annotations

from typing import Optional

import typer

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import parse_size


def register(app: typer.Typer) -> None:
    @app.command("canary")
    def canary_cmd(
        arena: str = typer.Option(..., "--arena", help="The arena file to map."),
        gpu: int = typer.Option(0, "--gpu", help="Device index as this process sees it."),
        runtime: str = typer.Option("host", "--runtime", help="hip, cuda, host (mlock, no GPU) or sim."),
        verify: str = typer.Option("full", "--verify", help="full (hash every chunk), header, or none."),
        register_chunk: Optional[str] = typer.Option(None, "--register-chunk", help="Register in pieces of this size."),
        copy_buffer: str = typer.Option("1GiB", "--copy-buffer", help="Device buffer to copy through; 0 skips the copy."),
        crash_at: Optional[str] = typer.Option(None, "--crash-at", help="Fault switch: die on entering this phase."),
        crash_signal: str = typer.Option("SEGV", "--crash-signal", help="Signal for --crash-at."),
        hang_at: Optional[str] = typer.Option(None, "--hang-at", help="Fault switch: hang (ignoring SIGTERM) at this phase."),
        serve_seconds: Optional[float] = typer.Option(None, "--serve-seconds", help="Stop by itself after serving this long."),
        gate_timeout: Optional[float] = typer.Option(None, "--gate-timeout", help="Give up waiting for a gate slot."),
        share: Optional[str] = typer.Option(None, "--share", help="keeper: hold the arena in VMM host memory and pass "
                                            "its descriptor; import: map a keeper's (shared-by-descriptor mode)."),
        share_socket: Optional[str] = typer.Option(None, "--share-socket", help="The keeper's unix socket (default ARENA.keeper.sock)."),
    ) -> None:
        """The canary engine: map the arena, verify, register with one GPU, copy it to the device (GB/s), serve.

        Serves until SIGTERM, then unregisters and exits 0. Reports phases (starting, mapping, verifying,
        registering, registered, serving, stopping, exited) through the status protocol
        (GPUWARDEN_STATUS_FILE or GPUWARDEN_STATUS_FD) and holds a registration-gate slot
        (GPUWARDEN_GATE_DIR, GPUWARDEN_GATE_SLOTS) only around the register call.
        """
        # deferred: the CLI imports every command module at start; this code loads only when the command runs
        from gpuwarden.ops.canary import FAULT_PHASES, VERIFY_MODES, Options, run
        for name, value, allowed in (("--runtime", runtime, ("hip", "cuda", "host", "sim")),
                                     ("--verify", verify, VERIFY_MODES),
                                     ("--crash-at", crash_at, FAULT_PHASES), ("--hang-at", hang_at, FAULT_PHASES),
                                     ("--share", share, ("keeper", "import"))):
            if value is not None and value not in allowed:
                raise GpuwardenError(f"{name} {value!r} is not one of: {', '.join(allowed)}")
        opts = Options(arena=str(arena), gpu=gpu, runtime=runtime, verify=verify,
                       register_chunk=parse_size(register_chunk) if register_chunk else None,
                       copy_buffer=parse_size(copy_buffer), crash_at=crash_at, crash_signal=crash_signal,
                       hang_at=hang_at, serve_seconds=serve_seconds, gate_timeout=gate_timeout,
                       share=share, share_socket=share_socket)
        raise typer.Exit(run(opts))
