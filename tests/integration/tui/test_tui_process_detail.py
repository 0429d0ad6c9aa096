"""The console's process view (Enter / i on a process) and its signal menu, against real processes: the whole
command line redacted, load per engine, a signal that is handled sent without a dialog, one that ends the process
asked for first (Cancel focused), and a recycled PID refused right before sending."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

from helpers.journal import read_journal
from gpuwarden.ops.foundation.model import GpuLoad, GpuProcess, ProcessLoad
from gpuwarden.ops.node.procs import ProcReader
from helpers.simnode import wait_for as wait_until
from helpers.tui_support import fixed_snapshot, make_app, open_processes, screen_text, wait_for

HANDLER = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGUSR1, lambda *a: out.write_text("USR1"))
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def run(coro):
    asyncio.run(coro)


def _tenant(tmp_path: Path):
    out = tmp_path / "got"
    proc = subprocess.Popen([sys.executable, "-c", HANDLER, str(out), "--api-key=hunter2secret", "--model", "m"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    info = ProcReader(Path("/proc")).read(proc.pid)
    gp = GpuProcess(pid=proc.pid, start_time=info.start_time, user=info.user, command=info.command, state="sleeping",
                    ppid=info.ppid, vram={2: 6 << 30}, sources={2: "kfd"}, device_files=("/dev/dri/renderD130",))
    return proc, out, gp


def _snapshot(gp: GpuProcess):
    base = fixed_snapshot()
    load = ProcessLoad(pid=gp.pid, cpu_percent=3.0, cpu_time_s=7.52, rss_bytes=300 << 20, threads=4, source="fdinfo",
                       gpus={2: GpuLoad(percent=37.0, engines={"gfx": 30.0, "compute": 7.0},
                                        engine_ns={"gfx": 12_300_000_000, "compute": 2_000_000_000}, clients=1,
                                        vram_bytes=6 << 30, shared_with=(gp.pid + 1,))})
    return dataclasses.replace(base, processes=base.processes + (gp,), process_load={gp.pid: load})


async def _open_view(app, pilot, pid: int):
    await wait_for(pilot, lambda: app.snapshot is not None, what="first snapshot")
    procs = await open_processes(app, pilot)
    keys = [k for k, _ in procs.rows]
    procs.cursor_row = keys.index(next(k for k in keys if k.startswith(f"{pid}:")))
    await pilot.press("i")
    await wait_for(pilot, lambda: type(app.screen).__name__ == "ProcessDetailScreen", what="the process view")
    await wait_for(pilot, lambda: app.screen.facts is not None, what="the /proc facts")


def test_the_view_shows_the_redacted_command_line_load_per_engine_and_its_gpu(settings, tmp_path):
    proc, _, gp = _tenant(tmp_path)
    snap = _snapshot(gp)
    try:
        async def go():
            app = make_app(settings, source=lambda: snap)
            async with app.run_test(size=(140, 40)) as pilot:
                procs = app.query_one("#processes")
                await wait_for(pilot, lambda: app.snapshot is not None)
                assert {"GPU%", "CPU%", "RSS", "TIME"} <= {c.rstrip("▲▼") for c in procs.columns}
                await _open_view(app, pilot, gp.pid)
                shown = screen_text(app)
                assert "hunter2secret" not in shown and "--model m" in shown  # the whole line, the secret redacted
                assert f"cwd {Path.cwd()}" in shown and "threads 1" in shown and "handles: " in shown
                assert "USR1" in shown.split("handles: ")[1].split("ignores")[0]
                assert "GPU 2 Simulated MI300X   VRAM 6.0 GiB (kfd)   GPU 37%   compute 7%  gfx 30%" in shown
                assert "gfx 12.3 s" in shown and f"also held by pid {gp.pid + 1}" in shown
                assert "host CPU 3%" in shown and "CPU time 0:07.52" in shown
        run(go())
    finally:
        proc.kill()
        proc.wait()


def test_a_handled_usr1_is_sent_at_once_and_term_asks_first(settings, tmp_path):
    proc, out, gp = _tenant(tmp_path)
    snap = _snapshot(gp)
    try:
        async def go():
            app = make_app(settings, source=lambda: snap)
            async with app.run_test(size=(140, 40)) as pilot:
                await _open_view(app, pilot, gp.pid)
                menu = app.screen.query_one("#signals")
                assert app.focused is menu
                menu.highlighted = 3  # USR1: it handles it, so nothing ends: no dialog
                await pilot.press("enter")
                await wait_for(pilot, lambda: app.current_run is not None and not app.current_run.running,
                               what="the signal playbook")
                assert app.current_run.result.ok
                wait_until(lambda: out.exists(), what="the handler's file")
                await pilot.press("escape")  # the progress view
                await wait_for(pilot, lambda: type(app.screen).__name__ == "ProcessDetailScreen", what="back")
                app.current_run = None
                menu = app.screen.query_one("#signals")
                menu.focus()
                menu.highlighted = 0  # TERM ends it: asked first, Cancel focused
                await pilot.press("enter")
                await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "cancel", what="dialog")
                assert "send SIGTERM to pid" in screen_text(app)
                await pilot.press("enter")  # Cancel
                await wait_for(pilot, lambda: app.current_run is not None and not app.current_run.running,
                               what="the cancelled run")
                assert proc.poll() is None  # still running: nothing was sent
        run(go())
    finally:
        proc.kill()
        proc.wait()
    lines = read_journal(settings.state_dir)
    sent = [x for x in lines if x["action"] == "reaper-signal"]
    assert [(x["signal"], x["result"], x["pid"]) for x in sent] == [("SIGUSR1", "ok", gp.pid)]


def test_a_recycled_pid_is_refused_right_before_sending(settings, tmp_path):
    from gpuwarden.playbooks.framework import run as run_playbook
    from gpuwarden.playbooks.signalproc import SignalProcessPlaybook
    proc, out, gp = _tenant(tmp_path)
    try:
        # The snapshot saw a process that started earlier under this PID: the PID names another process now.
        old = dataclasses.replace(gp, start_time=gp.start_time - 3600)
        result = run_playbook(SignalProcessPlaybook(old, "KILL"), settings, assume_yes=True)
        assert not result.ok and "its PID now names another process" in result.refused
        # The identity checked again at the very send: changed between the plan and the signal.
        pb = SignalProcessPlaybook(gp, "USR1", ends=False)
        real = pb.plan

        def plan(ctx):
            pb._ticks += 1  # as if the process was replaced after the preconditions
            return real(ctx)
        pb.plan = plan
        result = run_playbook(pb, settings, assume_yes=True)
        assert not result.ok and proc.poll() is None and not out.exists()
    finally:
        proc.kill()
        proc.wait()
    lines = read_journal(settings.state_dir)
    assert any(x["action"] == "reaper-signal" and x["result"] == "skipped" and x["signal"] == "SIGUSR1"
               for x in lines)
