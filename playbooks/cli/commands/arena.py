"""CLI: `gpuwarden arena create|verify|inspect|budget|probe` — the shared weight arena.

Each reports with --json; verify and create show progress on a terminal; errors are one line and an exit code.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes, parse_size
from gpuwarden.ops.foundation import interrupts
from gpuwarden.ops.arena import memcheck

arena_app = typer.Typer(
    name="arena", no_args_is_help=True, rich_markup_mode=None,
    help="The shared weight arena: a MAP_SHARED file (tmpfs or disk) several engines map and register with "
         "their GPUs. Create it, verify every chunk's hash on every core, see who maps and registered it, "
         "check the KFD registration budget, and reproduce N concurrent registrations with canaries.")


def _progress(label: str, enabled: bool):
    """A one-line progress meter on stderr when it is a terminal; None otherwise."""
    if not enabled or not sys.stderr.isatty():
        return None
    t0 = time.perf_counter()
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] < 0.1 and done < total:
            return
        last[0] = now
        pct = 100.0 * done / total if total else 100.0
        rate = done / (now - t0) / 1e9 if now > t0 else 0.0
        sys.stderr.write(f"\r{label} {fmt_bytes(done)} / {fmt_bytes(total)} ({pct:5.1f}%) {rate:6.2f} GB/s")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


def _doc(name: str, body: dict) -> dict:
    """A result as its gpuwarden.<name>/1 document, with an ISO-8601 twin of the arena's creation time."""
    if isinstance(body.get("created"), (int, float)):
        body = {**body, "created_iso": iso(body["created"])}
    return document(name, body)


def _fail_json(exc: GpuwardenError, path: str | None = None) -> None:
    """With --json, an arena failure is still one JSON object on stdout (and the same exit code), naming the path."""
    obj = document("arena-error", {"ok": False, "path": path, "error": exc.message, "hint": exc.hint,
                                   "kind": getattr(exc, "kind", None), **getattr(exc, "detail", {}),
                                   "exit_code": exc.exit_code})
    sys.stdout.write(json.dumps(obj) + "\n")
    raise typer.Exit(exc.exit_code)


def _interrupted_json(exc: KeyboardInterrupt, path: str) -> None:
    """With --json, an interrupt is a document too; the interrupt then goes on to its usual end (exit 128+N)."""
    code = 128 + interrupts.signal_of(exc)
    obj = document("arena-error", {"ok": False, "path": path, "error": f"{interrupts.describe(exc)}: {path} was not "
                                   "finished", "hint": "run the command again", "kind": "interrupted",
                                   "exit_code": code})
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


@arena_app.command("create")
def create_cmd(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Arena file to create, e.g. /dev/shm/weights.arena."),
    size: Optional[str] = typer.Option(None, "--size", help="Payload size filled with a test pattern, e.g. 32GiB."),
    source: Optional[str] = typer.Option(None, "--from", help="Copy this file's bytes in as the payload."),
    chunk_size: str = typer.Option("16MiB", "--chunk-size", help="Bytes per hashed chunk (multiple of 4 KiB)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Threads (default: every core)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress meter."),
) -> None:
    """Create an arena: payload first (on every core), then the header with per-chunk xxh3 hashes.

    Written under a temporary name and renamed at the end: a failure (e.g. a full tmpfs) leaves nothing behind.
    Mode 0640: engines of your group map it (read-only when they may not write), other users cannot read the
    weights; `chgrp GROUP FILE` shares it with another group. On tmpfs it warns when the arena takes more than
    half of this host's memory or more than is available, and when the tmpfs has less free than it needs.
    """
    settings: Settings = ctx.find_root().obj
    held = interrupts.Held()  # create() holds interrupts from just before its rename; released once reported
    try:
        _create_and_report(settings, held, path, size, source, chunk_size, force, workers, json_out, quiet)
    finally:
        late = held.release()
    if late is not None:
        what = "interrupted" if late == signal.SIGINT else f"{signal.Signals(late).name} came"
        typer.echo(f"gpuwarden: {what} after the arena was created: {printable(path)} is complete", err=True)


def _warn_memory(settings: Settings, path: str, size: Optional[str], source: Optional[str]) -> None:
    """Say before a tmpfs arena is written when it takes much of this host's memory or more than the tmpfs has
    free (ops/arena/memcheck.py); create() itself refuses what cannot be."""
    try:
        need = parse_size(size) if size else os.stat(source).st_size if source else 0
    except (GpuwardenError, OSError):
        return  # create() says what is wrong with --size or --from
    if need > 0:
        for line in memcheck.check(Path(path), need, settings.proc_root):
            typer.echo(f"gpuwarden: warning: {line}", err=True)


def _create_and_report(settings: Settings, held, path: str, size: Optional[str], source: Optional[str],
                       chunk_size: str, force: bool, workers: Optional[int], json_out: bool, quiet: bool) -> None:
    # deferred: keeps `gpuwarden arena --help` cheap (4.5 ms there)
    from gpuwarden.ops.foundation import journal
    # deferred: keeps `gpuwarden arena --help` cheap (5.4 ms there)
    from gpuwarden.ops.arena.create import create
    _warn_memory(settings, path, size, source)
    try:
        made = create(path, size=parse_size(size) if size else None, source=source,
                      chunk_size=parse_size(chunk_size), force=force, workers=workers,
                      progress=_progress("creating", not quiet and not json_out), held=held)
    except GpuwardenError as exc:
        if Path(path).is_dir() and exc.message.endswith("is a directory"):
            # The pasteable form: this same command with a file name inside that directory.
            what = f"--size {size}" if size else f"--from {shlex.quote(str(source))}"
            exc.hint = f"name the arena file inside it: `gpuwarden arena create " \
                       f"{shlex.quote(str(Path(path) / 'weights.arena'))} {what}`"
        journal.write(settings.state_dir, "arena create", "failed", path=str(path), error=exc.message)
        if json_out:
            _fail_json(exc, path)
        raise
    except KeyboardInterrupt as exc:
        if json_out:
            _interrupted_json(exc, path)
        raise
    journal.write(settings.state_dir, "arena create", "ok", path=str(path), bytes=made.header.payload_size)
    if json_out:
        sys.stdout.write(json.dumps(_doc("arena-create", made.to_dict())) + "\n")
        return
    d = made.to_dict()
    typer.echo(f"created {path}: {fmt_bytes(d['payload_size'])} in {d['chunk_count']} chunks of "
               f"{fmt_bytes(d['chunk_size'])}, {d['seconds']:.2f}s ({d['gbps']:.2f} GB/s, {d['workers']} threads)")


@arena_app.command("verify")
def verify_cmd(
    path: str = typer.Argument(..., help="Arena file."),
    expect_size: Optional[str] = typer.Option(None, "--size", help="Fail unless the payload is exactly this size "
                                             "(e.g. 32GiB; a plain number is bytes, as `arena inspect` prints them)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Threads (default: every core)."),
    method: str = typer.Option("pread", "--method", help="pread (default) or mmap."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress meter."),
) -> None:
    """Check the header and every chunk's hash, on every core; name the first bad chunk and its byte offset.

    Exit status: 0 good; 1 the arena is damaged (truncated, bad magic, newer version, size or hash mismatch);
    2 it cannot be read (missing, no permission).
    """
    # deferred: keeps `gpuwarden arena --help` cheap (4.6 ms there)
    from gpuwarden.ops.arena.format import ArenaError
    # deferred: keeps `gpuwarden arena --help` cheap (5.6 ms there)
    from gpuwarden.ops.arena.verify import verify
    try:
        try:
            done = verify(path, expect_size=None if expect_size is None else parse_size(expect_size, bare_bytes=True),
                          workers=workers, method=method, progress=_progress("verifying", not quiet and not json_out))
        except OSError as exc:  # one the reader did not expect: still one line (one document) naming the file
            raise ArenaError("unreadable", f"verifying arena {path} failed: {exc.strerror or os.strerror(errno.EIO)}",
                             "check the path and the device under it (dmesg)") from None
    except GpuwardenError as exc:
        if json_out:
            _fail_json(exc, path)
        raise
    except KeyboardInterrupt as exc:
        if json_out:
            _interrupted_json(exc, path)
        raise
    d = done.to_dict()
    if json_out:
        sys.stdout.write(json.dumps(_doc("arena-verify", d)) + "\n")
        return
    typer.echo(f"ok: {path}: {fmt_bytes(d['payload_size'])}, {d['chunk_count']} chunks verified in "
               f"{d['seconds']:.2f}s ({d['gbps']:.2f} GB/s, {d['workers']} threads)")


@arena_app.command("inspect")
def inspect_cmd(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Arena file."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Show the header, whether it checks out (no payload hashing), and every process that maps the file.

    For each mapper: resident (Rss) and proportional (Pss) share of the arena from /proc/<pid>/smaps, and
    whether it registered the arena, when its status-protocol file says so. Exit 1 when the header is bad.
    """
    # deferred: keeps `gpuwarden arena --help` cheap (9.1 ms there); only this path of the command needs it
    from gpuwarden.ops.arena.inspect import inspect
    settings: Settings = ctx.find_root().obj
    info = inspect(path, settings.proc_root, settings.state_dir)
    code = 0 if info["header_state"] == "ok" else (2 if info["header_state"] in ("missing", "no-permission", "unreadable") else 1)
    if json_out:
        sys.stdout.write(json.dumps(_doc("arena-inspect", info)) + "\n")
        raise typer.Exit(code)
    if info["header_state"] == "ok":
        typer.echo(f"{path}: arena v{info['version']}, {fmt_bytes(info['payload_size'])} payload in "
                   f"{info['chunk_count']} x {fmt_bytes(info['chunk_size'])} chunks, created "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['created']))} on {info['host']}")
    elif code == 2:  # not an arena problem but ours: the one-line error every command gives
        typer.echo(f"gpuwarden: error: {printable(info['problem'])}", err=True)
        typer.echo("  hint: check the path (an arena is a regular file); mappers are listed below", err=True)
    else:
        typer.echo(f"{path}: {info['header_state']}: {printable(info['problem'])}")
    mappers = info["mappers"]
    if not mappers:
        typer.echo("mapped by: nobody")
    else:
        typer.echo(f"mapped by {len(mappers)} process(es):")
        typer.echo(f"  {'pid':>8} {'rss':>10} {'pss':>10} {'gpu':>4} {'registered':>10}  command")
        for m in mappers:
            reg = {True: "yes", False: "no", None: "?"}[m["registered"]]
            gpu = "-" if m["gpu"] is None else str(m["gpu"])
            typer.echo(f"  {m['pid']:>8} {fmt_bytes(m['rss_bytes']):>10} {fmt_bytes(m['pss_bytes']):>10} {gpu:>4} "
                       f"{reg:>10}  {m['command'][:80]}")
    raise typer.Exit(code)


@arena_app.command("budget")
def budget_cmd(
    ctx: typer.Context,
    size: Optional[str] = typer.Option(None, "--size", help="Arena size (default: from the node config)."),
    engines: Optional[int] = typer.Option(None, "--engines", help="Engine processes registering it."),
    visible_gpus: Optional[int] = typer.Option(None, "--visible-gpus", help="GPUs each engine can see (changes the "
                                               "mappings, not KFD's charge)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Will the registrations and the engines' pinned allocations fit KFD's system-memory limit? Exit 0 fits, 1 not.

    KFD charges each engine process's registration once (N engines x size), whatever GPUs it sees: the other GPUs
    get DMA mappings of the same pages, not a second charge. The same node-wide limit (about RAM - RAM/64 - 1.5 GiB,
    unless amdgpu.no_system_mem_limit=1) also holds every engine's pinned host allocations (hipHostMalloc & co):
    the budget adds each engine's pinned headroom (its last run's ledger, `pinned_headroom` in the node config, or
    a stated 4 GiB default) and, when that headroom is only assumed, says the verdict is not certain and what
    decides it. Without flags the arena and engines come from the node config.
    """
    # deferred: keeps `gpuwarden arena --help` cheap (40.7 ms there); only this path of the command needs it
    from gpuwarden.ops.arena.budget import compute, engine_names, from_config
    settings: Settings = ctx.find_root().obj
    names: list[str] = []
    if size is None or engines is None:
        if not settings.config_path.exists():
            raise GpuwardenError(f"no node config at {settings.config_path} to take the arena and engines from",
                                 "pass --size and --engines (e.g. --size 64GiB --engines 4; --visible-gpus only "
                                 "changes the mappings, not the charge), or --config PATH")
        size_b, visible = from_config(settings, parse_size(size) if size else None)
        names = engine_names(settings)
        if engines is not None:
            visible = (visible * engines)[:engines] if visible else []
        if visible_gpus is not None:
            visible = [visible_gpus] * len(visible)
    else:
        size_b = parse_size(size)
        visible = [visible_gpus or 1] * engines
    result = compute(settings, size_b, visible, names)
    if json_out:
        sys.stdout.write(json.dumps(_doc("arena-budget", result.to_dict())) + "\n")
    else:
        for line in result.lines():
            typer.echo(line)
    raise typer.Exit(0 if result.fits else 1)


@arena_app.command("probe")
def probe_cmd(
    ctx: typer.Context,
    engines: int = typer.Option(..., "--engines", help="Canaries to run, one per GPU (GPU 0..N-1)."),
    concurrency: int = typer.Option(1, "--concurrency", help="At most this many register at once (a private gate)."),
    runtime: str = typer.Option("cuda", "--runtime", help="hip, cuda, host or sim."),
    arena: Optional[str] = typer.Option(None, "--arena", help="Use this arena (it is left in place)."),
    size: Optional[str] = typer.Option(None, "--size", help="Create a temporary arena this big (in /dev/shm when it fits)."),
    verify: str = typer.Option("header", "--verify", help="What each canary checks before registering: full, header, none."),
    register_chunk: Optional[str] = typer.Option(None, "--register-chunk", help="Register in pieces of this size."),
    copy_buffer: str = typer.Option("1GiB", "--copy-buffer", help="Device buffer each canary copies through (0: no copy)."),
    visibility: str = typer.Option("own", "--visibility",
                                   help="own: each canary sees only its GPU (CUDA_/ROCR_VISIBLE_DEVICES); all: every GPU."),
    hold: float = typer.Option(0.0, "--hold", help="Seconds to keep every canary serving before stopping them."),
    timeout: float = typer.Option(600.0, "--timeout", help="Give up waiting for canaries to serve after this long."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    trace: bool = typer.Option(False, "--trace", help="Run each canary with HIP/ROCr/thunk logging (AMD_LOG_LEVEL=3, "
                               "HSAKMT_DEBUG_LEVEL=5, serialized kernels/copies) and under rocprofv3 --hip-trace "
                               "--hsa-trace when installed; the capped, redacted logs are kept and triaged; as "
                               "root also KFD's memory-limit debug message (dynamic debug, restored after)."),
    on_pin_failure: str = typer.Option("segv", "--on-pin-failure",
                                       help="sim runtime: a canary whose pinned allocation fails after it is up dies "
                                            "of SIGSEGV in a simulated runtime frame, as the incident's engines did "
                                            "(segv, the default), or exits 2 naming the failed call (report)."),
) -> None:
    """Reproduce N concurrent arena registrations: N canaries, one per GPU, at most K registering at once.

    With --runtime sim (and no GPUWARDEN_SIM_KFD_LIMIT) it replays the arena incident: every registration fits,
    KFD's ledger ends near its limit, each canary's next pinned allocation fails and the canary dies of SIGSEGV.
    GPUs the node lacks are refused (exit 2).

    Reports per canary the register seconds, copy GB/s and how it ended (the signal's name if it crashed),
    then stops them all. Exit 0 when every canary registered, served and stopped cleanly, 1 otherwise.
    """
    # deferred: keeps `gpuwarden arena --help` cheap (70.4 ms there); only this path of the command needs it
    from gpuwarden.playbooks.probe import Probe, ProbeOptions, table
    settings: Settings = ctx.find_root().obj
    if runtime not in ("hip", "cuda", "host", "sim"):
        raise GpuwardenError(f"unknown runtime {runtime!r}", "choose one of: hip, cuda, host, sim")
    if visibility not in ("own", "all"):
        raise GpuwardenError(f"unknown visibility {visibility!r}", "own or all")
    if on_pin_failure not in ("segv", "report"):
        raise GpuwardenError(f"unknown --on-pin-failure {on_pin_failure!r}", "segv or report")
    say = (lambda s: None) if json_out else (lambda s: typer.echo(f"  · {s}", err=True))
    opts = ProbeOptions(engines=engines, concurrency=concurrency, runtime=runtime,
                        arena=str(arena) if arena else None, size=parse_size(size) if size else None,
                        verify=verify, register_chunk=register_chunk, copy_buffer=copy_buffer,
                        visibility=visibility, timeout_s=timeout, hold_s=hold, trace=trace,
                        pin_failure=on_pin_failure)
    report = Probe(settings, opts, say).run()
    if json_out:
        sys.stdout.write(json.dumps(_doc("arena-probe", report)) + "\n")
    else:
        for line in table(report):
            typer.echo(line)
        if "trace" in report:
            t = report["trace"]
            typer.echo(f"trace: {len(t['files'])} log(s) in {t['dir']}" + (f"; {t['note']}" if t["note"] else ""))
            if t["rocprofv3_missing"]:
                typer.echo("trace: rocprofv3 is not installed: HIP/HSA API traces were not recorded (install rocprofiler-sdk)")
            for line in t["findings"]:
                typer.echo(f"trace finding: {line}")
    raise typer.Exit(0 if report["ok"] else 1)
