"""What an inference engine's own log says it died of: GPU runtime errors, NCCL/RCCL, Python tracebacks.

Rules for HIP/HSA/CUDA/NCCL/C++ messages run in the same analyzer as the kernel rules (an engine log and
a kernel log can be triaged by one pass); the TracebackTracker follows Python tracebacks line by line
and reports the exception with its last frame. Prefixes vLLM and Ray put before every line are skipped.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from gpuwarden.ops.triage.findings import CAUSE
from gpuwarden.ops.triage.logline import LogLine
from gpuwarden.ops.triage.patterns import Rule, _r

_CHECK_RUNTIME = ("the engine's log just before it (which call failed); then the kernel log at the same time "
                  "for a GPU page fault, reset or Xid on its GPU")

_NCCL_CODES = r"nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage|RemoteError)"

RULES: tuple[Rule, ...] = (
    _r("engine.gpu_oom", "engine", "error",
       r"(?:(?P<rt>CUDA|HIP) out of memory\. Tried to allocate (?P<size>[\d.]+ [KMGT]?i?B)"
       r"|torch\.(?:cuda\.)?OutOfMemoryError(?:: (?P<rt3>CUDA|HIP) out of memory\. Tried to allocate (?P<size2>[\d.]+ [KMGT]?i?B))?"
       r"|(?P<rt2>CUDA|HIP) error: out of memory|\bhipErrorOutOfMemory\b|\bcudaErrorMemoryAllocation\b"
       r"|\bCUDA_ERROR_OUT_OF_MEMORY\b)",
       "the engine ran out of GPU memory[[ (tried to allocate {size}{size2})]]", tier=CAUSE, hint="memory",
       meaning="an allocation on the GPU failed: the model, its KV cache and other tenants did not fit",
       check="residual VRAM on that GPU (`gpuwarden status`), other processes on it, and the engine's memory "
             "settings (gpu_memory_utilization, max batch/sequence)"),
    _r("engine.hip_error", "engine", "error",
       r"(?:\b(?P<code>hipError(?!OutOfMemory)[A-Z]\w{2,60})\b|HIP error: (?!out of memory)(?P<msg>[^\n]{1,160}?)\s*$)",
       "HIP runtime error: {code}{msg}", key=("code", "msg"), tier=CAUSE, hint="hip",
       meaning="a HIP (ROCm) runtime call failed in the engine", check=_CHECK_RUNTIME),
    _r("engine.hsa_error", "engine", "error", r"\b(?P<code>HSA_STATUS_ERROR(?:_[A-Z_]{2,60})?)\b",
       "HSA runtime error {code}", key=("code",), tier=CAUSE, hint="hsa_status_error",
       meaning="the ROCr (HSA) runtime reported an error (MEMORY_APERTURE_VIOLATION = a GPU page fault)",
       check=_CHECK_RUNTIME),
    _r("engine.cuda_error", "engine", "error",
       r"(?:CUDA error: (?!out of memory)(?P<msg>[^\n]{1,160}?)\s*$|\b(?P<code>cudaError(?!MemoryAllocation)[A-Z]\w{2,60}"
       r"|CUDA_ERROR_(?!OUT_OF_MEMORY)[A-Z_]{2,60})\b|CUDA driver error: (?P<drv>[^\n]{1,160}?)\s*$)",
       "CUDA runtime error: {code}{msg}{drv}", key=("code", "msg", "drv"), tier=CAUSE, hint="cuda",
       meaning="a CUDA runtime or driver call failed in the engine (an illegal address is usually a kernel bug; "
               "'unspecified launch failure' or ECC errors point at the GPU)", check=_CHECK_RUNTIME),
    _r("engine.nccl_error", "engine", "error",
       r"(?:NCCL error in: (?P<where>\S{1,200})(?:[^\n]{0,400}?\b(?P<code>" + _NCCL_CODES + r"))?"
       r"|\b(?P<code2>" + _NCCL_CODES + r"))",
       "NCCL/RCCL error {code}{code2}[[ in {where}]]", key=("code", "code2"), tier=CAUSE, hint="nccl",
       meaning="a collective communication call failed (a peer died, a link failed, or a CUDA/HIP error inside)",
       check="the other ranks' logs: the first rank to fail is the cause; NCCL_DEBUG=INFO for the transport"),
    _r("engine.nccl_timeout", "engine", "error",
       r"Watchdog caught collective operation timeout: WorkNCCL\((?P<work>[^\n]{1,300}?)\) ran for (?P<ms>\d+) milliseconds",
       "a collective timed out after {ms} ms (NCCL watchdog)", tier=CAUSE,
       meaning="one rank stopped taking part in a collective: it hung, died, or its GPU did",
       check="which rank did not arrive (its log and its GPU's kernel log)"),
    _r("engine.nccl_warn", "engine", "warning", r"NCCL WARN (?P<warn>[^\n]{1,200})", "NCCL warning: {warn}",
       key=("warn",), tier=CAUSE, meaning="NCCL/RCCL reported a problem it may recover from",
       check="whether an NCCL error followed"),
    _r("engine.fatal_signal", "engine", "error",
       r"(?:Fatal Python error: (?P<what>Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction)"
       r"|\*\*\* (?P<sig>SIG[A-Z]{2,8}) received at time=|Caught signal (?P<signo>\d+) \((?P<signame>[A-Za-z ]{3,30})\))",
       "the engine got a fatal signal: {what}{sig}{signame}", key=("what", "sig", "signame"), tier=CAUSE,
       hint=("fatal python error", "received at time=", "caught signal"), meaning="the engine process died of a signal (its stack follows in the log)",
       check="the frames printed after it and the kernel's segfault line (library + offset)",
       follow=(r'^\s*File "(?P<frame_file>[^"]{1,300})", line (?P<frame_line>\d+) in (?P<frame_func>\S{1,120})',
               r"^\s*@\s+0x[0-9a-f]+\s+(?P<native_frame>[^\n]{1,200})"), window=40),
    _r("engine.cpp_terminate", "engine", "error",
       r"terminate called after throwing an instance of '(?P<type>[^'\n]{1,120})'",
       "the engine aborted on an uncaught C++ exception {type}", key=("type",), tier=CAUSE,
       meaning="a C++ exception escaped: std::terminate aborted the process",
       check="the what() line after it", follow=(r"^\s*what\(\):\s+(?P<what>[^\n]{1,300})",), window=3),
)

# vLLM: "(EngineCore_DP0 pid=123) ERROR 09-01 12:00:00 [core.py:588] ...", Ray: "(RayWorkerWrapper pid=9) "
_PREFIX = re.compile(r"^(?:\(\S{1,60} pid=\d+\)\s+)?(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d "
                     r"\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]\n]{0,80}\]\s?)?")
_START = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"\n]{1,300})", line (?P<line>\d+), in (?P<func>\S{1,120})')
_EXC = re.compile(r"^(?P<exc>[A-Za-z_][\w.]{0,100}(?:Error|Exception|Exit|Interrupt|Warning|Failure|Fault)\w{0,40})"
                  r"(?::\s?(?P<msg>[^\n]{0,300}))?\s*$")
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")
MAX_FRAMES_LINES = 400  # a traceback longer than this is given up (bounded state)

TRACEBACK_RULE = _r(
    "engine.python_exception", "engine", "error", r"Traceback \(most recent call last\)",
    "Python exception", tier=CAUSE,
    meaning="the engine raised an exception it did not handle; the last frame is where it was raised",
    check="the exception message and last frame; for a CUDA/HIP error in it, the GPU's kernel log at that time")

Emit = Callable[[Rule, LogLine, str, dict[str, Any], "dict[str, Any] | None"], None]


class TracebackTracker:
    """Follows one Python traceback at a time: frames, then the exception line that ends it."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.open = False
        self.start: LogLine | None = None
        self.frame: dict[str, Any] | None = None
        self.frames = 0
        self.seen = 0

    def feed(self, line: LogLine) -> bool:
        text = line.message
        if "Traceback" not in text and not self.open:
            return False
        body = _PREFIX.sub("", text, count=1)
        if body.startswith(_START):
            self.open, self.start, self.frame, self.frames, self.seen = True, line, None, 0, 0
            return True
        if not self.open:
            return False
        self.seen += 1
        if self.seen > MAX_FRAMES_LINES:
            self.open = False
            return False
        m = _FRAME.match(body)
        if m:
            self.frame = {"file": m["file"], "line": int(m["line"]), "func": m["func"]}
            self.frames += 1
            return True
        if body[:1] in (" ", "\t", "^", "~") or not body.strip():
            return True  # source line of a frame, or a caret marker
        m = _EXC.match(body)
        self.open = False
        if m:
            self._emit(line, m["exc"], (m["msg"] or "").strip())
            return False  # the message may hold a runtime error the rules name too (CUDA OOM, HIP error)
        return body.startswith(_CHAIN)

    def _emit(self, line: LogLine, exc: str, message: str) -> None:
        frame = self.frame or {}
        where = (f" at {os.path.basename(frame['file'])}:{frame['line']} in {frame['func']}" if frame else "")
        short = message if len(message) <= 160 else message[:157] + "..."
        title = f"Python exception {exc}" + (f": {short}" if short else "") + where
        details = {"signature": f"{exc}|{frame.get('file', '')}:{frame.get('func', '')}", "exception": exc,
                   "message": message, "frames": self.frames, **({"last_frame": frame} if frame else {}),
                   "short": f"{exc}" + (f" ({short})" if short else "")}
        self.emit(TRACEBACK_RULE, self.start or line, title, details, None)

    def close(self) -> None:
        self.open = False
