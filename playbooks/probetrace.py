"""`arena probe --trace`: each canary's HIP/ROCr/thunk logging, and rocprofv3 around it when installed; the
logs are capped, redacted, kept beside the probe's report, and triaged (the failing call and its error).

Levels are chosen so a 64 GiB registration's log stays small: AMD_LOG_LEVEL=3 logs each HIP API call with its
arguments and result once (level 4 adds per-command detail), AMD_LOG_MASK limits it to API calls, resource
allocation and initialisation; HSAKMT_DEBUG_LEVEL=5 (notice) prints the thunk's failing KFD ioctls with their errno without
its per-call debug output; AMD_SERIALIZE_KERNEL/COPY=3 make an asynchronous error surface at the call that
caused it. CUDA has no comparable runtime log, so a cuda probe is traced only by its canaries' own output.
"""

from __future__ import annotations

import ctypes.util
import shutil
from pathlib import Path

from gpuwarden.ops.foundation import redact
from gpuwarden.ops.triage import analyze_text
from gpuwarden.ops.triage.render import sanitize

HIP_ENV = {
    "AMD_LOG_LEVEL": "3",
    "AMD_LOG_MASK": "0xc01",  # LOG_API | LOG_RESOURCE | LOG_INIT (HIP's documented LogMask bits)
    "HSAKMT_DEBUG_LEVEL": "5",
    "AMD_SERIALIZE_KERNEL": "3",
    "AMD_SERIALIZE_COPY": "3",
}
ROCPROF_ARGS = ("--hip-trace", "--hsa-trace", "--memory-copy-trace", "--output-format", "csv")
LOG_CAP = 8 << 20  # bytes of each canary's log kept: the head (init, the registration) and the tail (the end)


class Trace:
    """What --trace adds to one probe: environment, an argv prefix, and the collection after the run."""

    def __init__(self, runtime: str, work: Path):
        self.runtime = runtime
        self.dir = work / "trace"
        self.rocprof = shutil.which("rocprofv3") if runtime == "hip" else None
        self.hip_runtime = _has_hip()

    def env(self) -> dict[str, str]:
        return dict(HIP_ENV) if self.runtime == "hip" else {}

    def wrap(self, argv: list[str], index: int) -> list[str]:
        if not self.rocprof:
            return argv
        out = self.dir / f"rocprofv3-canary-{index}"
        return [self.rocprof, *ROCPROF_ARGS, "-d", str(out), "--", *argv]

    def plan(self) -> dict:
        """What this trace captures, or would capture on a ROCm node (said even when nothing can be)."""
        if self.runtime != "hip":
            why = (f"runtime {self.runtime}: HIP/ROCr/thunk logging applies to --runtime hip only; the canaries' "
                   "own logs are kept and triaged")
        elif not self.hip_runtime:
            why = ("ROCm's HIP runtime (libamdhip64.so) is not installed here: on a ROCm node each canary would run "
                   "with " + " ".join(f"{k}={v}" for k, v in HIP_ENV.items())
                   + " and under `rocprofv3 " + " ".join(ROCPROF_ARGS) + "` when rocprofv3 is installed")
        else:
            why = None
        return {"env": self.env(), "rocprofv3": (" ".join([self.rocprof, *ROCPROF_ARGS]) if self.rocprof else None),
                "rocprofv3_missing": self.runtime == "hip" and not self.rocprof, "runtime_traced": why is None,
                "note": why, "dir": str(self.dir)}

    def collect(self, logs: list[Path]) -> dict:
        """Cap and redact each canary log into the trace dir, and triage them together."""
        self.dir.mkdir(parents=True, exist_ok=True)
        files, texts = [], []
        for log in logs:
            try:
                data = log.read_bytes()
            except OSError:
                continue
            cut = len(data) > LOG_CAP
            if cut:
                data = data[:LOG_CAP // 2] + b"\n[... cut by gpuwarden: the log was over the cap ...]\n" + data[-LOG_CAP // 2:]
            text = redact.text(data.decode("utf-8", errors="replace"))
            dest = self.dir / log.name
            dest.write_text(text)
            dest.chmod(0o600)
            files.append({"path": str(dest), "bytes": len(text.encode()), "truncated": cut})
            texts.append(text)
        report = analyze_text("\n".join(texts), source="probe trace")
        return {**self.plan(), "files": files, "headline": sanitize(report.headline() or "") or None,
                "findings": [sanitize(s) for s in report.summary()[:10]]}


def _has_hip() -> bool:
    return ctypes.util.find_library("amdhip64") is not None
