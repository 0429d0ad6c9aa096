"""`triage --explain RULE`: what each finding means and the first thing to check, for every rule there is.

The rules carry their own text (patterns.py, engine.py); the findings built in code (crashes, Xids, OOM,
residual VRAM, engine deaths) are described here, in the same shape.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from gpuwarden.ops.triage import engine, xid
from gpuwarden.ops.triage.findings import CAUSE, HARDWARE, OTHER, SHARED_CRASH, TIER_NAMES
from gpuwarden.ops.triage.patterns import RULES


@dataclass(frozen=True)
class Entry:
    id: str
    category: str
    severity: str
    tier: int
    meaning: str
    check: str
    example: str = ""


_SPECIAL = (
    Entry("userspace.crash", "segfault", "error (critical when several processes share it)", CAUSE,
          "a user-space process died of a fault the kernel logged (segfault, general protection, trap) with the "
          "library and the offset of the faulting instruction; processes with the same library+offset hit "
          "one bug (a shared cause)",
          "what the processes had in common just before (the same library call, e.g. registering the same shared "
          "memory); the core dump's backtrace (`gpuwarden bundle` collects it)",
          "4 processes crashed with the same signature: segfault in libamdhip64.so.7 at offset 0xb71c9"),
    Entry("nvidia.xid", "xid", "per Xid number (`--explain xid79`)", HARDWARE,
          "an NVIDIA driver error event (Xid) with its number, the GPU's bus id and often the process; hardware "
          "Xids (ECC, NVLink, fallen off the bus, GSP) are ordered before the application Xids they cause",
          "the Xid number's own entry (`gpuwarden triage --explain xidN`)", "NVIDIA Xid 79 on 0000:2b:00: GPU has "
          "fallen off the bus"),
    Entry("oom.kill", "oom", "error", CAUSE,
          "the kernel's OOM killer killed a process: host memory (or a cgroup's limit) ran out",
          "which process grew (the task table before the kill, or the cgroup's memory.peak); a cgroup OOM means "
          "the container limit, not the node, was hit", "OOM killer killed python (pid 7899)"),
    Entry("unclassified", "other", "warning", OTHER,
          "an error-level kernel line no pattern knows (dmesg -x level err or worse, or *ERROR*)",
          "read it in context; at most 20 distinct ones are kept"),
    Entry("snapshot.residual_vram", "residual-vram", "error", CAUSE,
          "VRAM used on a GPU that no live process accounts for (minus the idle baseline), at collection time",
          "`gpuwarden purge` removes the holders named; an ownerless leak needs `gpuwarden reset`"),
    Entry("bundle.collector_timeout", "ring-timeout", "error (vendor tools) or warning", OTHER,
          "a bundle collector did not finish within its timeout; a vendor tool (amd-smi, rocm-smi, nvidia-smi) "
          "blocking is a classic sign of a hung GPU or driver",
          "the kernel-log findings; collect with --safe-mode while it lasts"),
    Entry("engine.died", "engine", "error", CAUSE,
          "a supervised engine ended by a signal or a failing exit code; the finding joins what its shim recorded "
          "(signal, phase), the kernel's fault line (library + offset), its core dump's backtrace and the last "
          "error in its log",
          "the library and function named, and the engine's log tail in the bundle (engines/NAME/engine.log)",
          "engine dp0 died of SIGSEGV in libamdhip64.so.7 at offset 0xb71c9 after registering; when a registration "
          "of the engine had failed just before, the failed call leads: dp3: hipHostRegister of 64.0 GiB returned "
          "hipErrorOutOfMemory at 12:00:03.1; SIGSEGV in libamdhip64.so.7 at 0xb71c9 0.4 s later: the engine used "
          "a buffer it failed to register"),
    Entry("engine.register_failed", "engine", "error", CAUSE,
          "a supervised engine's host-registration call (hipHostRegister, cudaHostRegister, cuMemHostRegister) "
          "returned an error and the engine went on running (phase failed-registration): most engines ignore the "
          "result and crash when they use that memory",
          "the error named: out of memory means KFD's system-memory limit (`gpuwarden arena budget`); stop the "
          "engine or restart it once the cause is fixed",
          "dp3: hipHostRegister of 64.0 GiB returned hipErrorOutOfMemory at 12:00:03.1; the engine runs on "
          "without that memory registered"),
    Entry("engine.crash_storm", "engine", "critical", SHARED_CRASH,
          "several engines died of the same signal at the same place within seconds: one shared cause (for "
          "example every engine registering the same shared arena), not independent crashes",
          "what they shared: the arena and its registration budget (`gpuwarden arena budget`), the runtime "
          "version; reproduce with `gpuwarden arena probe` and stagger with `launch --stagger 1`",
          "4 engines died of SIGSEGV in libamdhip64.so.7 at offset 0xb71c9 within 1 s, after registering a "
          "shared arena"),
)


def entries() -> list[Entry]:
    out = [Entry(r.id, r.category, r.severity, r.tier, r.meaning, r.check, r.title)
           for r in RULES + engine.RULES + (engine.TRACEBACK_RULE,)]
    return out + list(_SPECIAL)


def _xid_entry(number: int) -> Entry:
    meaning, severity = xid.describe(number)
    hw = xid.is_hardware(number)
    return Entry(f"xid{number}", "xid", severity, HARDWARE if hw else CAUSE,
                 f"NVIDIA Xid {number}: {meaning}" + (" (hardware or firmware: the GPU is suspect)" if hw else
                                                       " (usually the application's fault; the GPU stays usable)"),
                 xid.CHECK_HARDWARE if hw else xid.CHECK_APPLICATION)


def lookup(name: str) -> Entry | None:
    key = name.strip().lower()
    for e in entries():
        if e.id.lower() == key:
            return e
    digits = key.removeprefix("nvidia.").removeprefix("xid").lstrip(":. ")
    if key.startswith(("xid", "nvidia.xid")) and digits.isdigit():
        return _xid_entry(int(digits))
    return None


def suggestions(name: str) -> list[str]:
    return difflib.get_close_matches(name.strip().lower(), [e.id for e in entries()], n=4, cutoff=0.4)


def text(e: Entry) -> str:
    tier = TIER_NAMES[e.tier] if 0 <= e.tier < len(TIER_NAMES) else str(e.tier)
    lines = [f"{e.id}  ({e.category}; {e.severity}; ordered as: {tier})", "",
             f"What it means: {e.meaning}", "", f"First thing to check: {e.check}"]
    if e.example:
        lines += ["", f"Looks like: {e.example}"]
    return "\n".join(lines) + "\n"


def listing() -> str:
    rows = [f"{e.id:34} {e.meaning[:90]}" for e in sorted(entries(), key=lambda e: e.id)]
    return "\n".join(rows) + "\n(and xidN for any NVIDIA Xid number)\n"
