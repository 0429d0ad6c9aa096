"""What every benchmark here repeats: describing the machine it ran on, and timing a call.

Bench scripts run as `python tests/bench/<script>.py`, which puts this folder on sys.path: `import benchlib`.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path


def cpu_model() -> str:
    """The CPU's marketing name as /proc/cpuinfo gives it (what RESULTS.md quotes)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, object]:
    """nproc, CPU model and Python version, for a bench's JSON output."""
    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version()}


def load() -> str:
    """The 1/5/15-minute load averages: on a shared machine they say how far to trust a timing."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line() -> str:
    m = machine()
    return f"machine: {m['nproc']} cores (nproc), {m['cpu']}, Python {m['python']}; load {load()}"


def times_ms(fn, runs: int, warmup: int = 2, clock=time.perf_counter) -> list[float]:
    """Milliseconds of `runs` calls of fn (after `warmup` untimed ones), in call order."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t = clock()
        fn()
        out.append((clock() - t) * 1e3)
    return out


def median_ms(fn, runs: int, warmup: int = 2) -> float:
    return statistics.median(times_ms(fn, runs, warmup))


def tree_env(pkgs: Path) -> dict[str, str]:
    """The environment that runs the `gpuwarden` linked at pkgs/gpuwarden (a tree under test or a peer): PYTHONPATH's
    path finder comes before the editable install's. No GPUWARDEN_* leaks in; bytecode is written as installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: compiled once, then read from __pycache__
    env["PYTHONPATH"] = str(pkgs)
    return env


def export_tree(repo: Path, ref: str, dest: Path) -> Path:
    """The files of `ref` (git archive) under dest/peer: a peer tree to run the code before a change."""
    import subprocess
    root = dest / "peer"
    root.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def linked_env(tree: Path, where: Path) -> dict[str, str]:
    """The environment that runs the gpuwarden at `tree` (this checkout or an exported peer): `where` is made to
    hold the package link that PYTHONPATH points at."""
    where.mkdir()
    (where / "gpuwarden").symlink_to(tree)
    return tree_env(where)


def compared_trees(repo: Path, ref: str, dest: Path) -> dict[str, Path]:
    """This tree and the peer `ref` (exported under dest), under the names the benches print."""
    return {"this tree": repo, f"peer ({ref})": export_tree(repo, ref, dest)}
