"""The console with its main steps timed in CPU (each thread's own, time.thread_time): where a refresh's CPU goes on
a real GPU node, step by step, where a sampling profiler at 1 Hz gets too few samples to say. Writes the table to
$CPU_SPLIT_OUT when the console quits. Usage (in a terminal): python3 tests/device/tui_cpu_split.py ARGS-OF-gpuwarden
"""

from __future__ import annotations

import atexit
import collections
import functools
import os
import sys
import time

STATS: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])


def timed(cls: type, name: str, label: str) -> None:
    """Wrap cls.name so each call adds its thread's CPU time to STATS[label]."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        began = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            entry = STATS[label]
            entry[0] += 1
            entry[1] += time.thread_time() - began
    setattr(cls, name, wrapper)


def install() -> None:
    from textual._compositor import Compositor
    from textual.app import App
    from textual.screen import Screen

    from gpuwarden.ops.node.backends.nvml import NvmlBackend
    from gpuwarden.ops.sampling.attribution import Attribution
    from gpuwarden.ops.sampling.extras import NodeExtras
    from gpuwarden.ops.sampling.sampler import Sampler
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.tui.widgets.gpus import GpusPanel
    from gpuwarden.tui.widgets.processes import ProcessesPanel
    for cls, name, label in (
            (Screen, "_compositor_refresh", "main: Textual compositor refresh"),
            (Compositor, "render_update", "main:   of which render_update"),
            (App, "_display", "main: Textual write to the terminal"),
            (GpuwardenApp, "on_snapshot_arrived", "main: on_snapshot_arrived (all panels)"),
            (GpusPanel, "show", "main:   of which GpusPanel.show"),
            (ProcessesPanel, "show", "main:   of which ProcessesPanel.show"),
            (Sampler, "snapshot", "sampler: Sampler.snapshot (own thread)"),
            (Attribution, "sample", "sampler:   Attribution.sample"),
            (Attribution, "deep_scan", "sampler:   Attribution.deep_scan"),
            (NodeExtras, "sample", "sampler:   NodeExtras.sample"),
            (GpuwardenApp, "_deliver", "sampler: posting the snapshot to the app"),
            (NvmlBackend, "_gpu", "lane: NvmlBackend._gpu (per GPU)"),
            (NvmlBackend, "_process_usage", "lane: NvmlBackend._process_usage"),
    ):
        timed(cls, name, label)
    started = time.monotonic()
    main_began = time.thread_time()

    def report() -> None:
        wall = time.monotonic() - started
        lines = [f"{wall:.0f} s wall; the main thread used {1e3 * (time.thread_time() - main_began):.1f} ms of CPU"]
        for label, (calls, cpu) in sorted(STATS.items(), key=lambda kv: kv[0]):
            per = 1e3 * cpu / calls if calls else 0.0
            lines.append(f"{label:44s} {int(calls):6d} calls {1e3 * cpu:9.1f} ms  {per:7.3f} ms/call")
        with open(os.environ.get("CPU_SPLIT_OUT", "/tmp/tui_cpu_split.txt"), "w") as out:
            out.write("\n".join(lines) + "\n")
    atexit.register(report)


if __name__ == "__main__":
    install()
    from gpuwarden.tui.main import main
    sys.argv = ["gpuwarden", *sys.argv[1:]]
    main()
