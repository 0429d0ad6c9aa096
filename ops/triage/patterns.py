"""The kernel-log pattern library: which lines mean what on an AMD or NVIDIA GPU node.

Each Rule names one event, its category, severity and causal tier, the regex groups that make its
signature, lines that may follow it and add detail (the process behind a page fault), what it means and
the first thing to check. Written from the drivers' own message formats (amdgpu/KFD, the NVIDIA open
kernel modules, the PCI AER, EDAC and MCE cores). Patterns use bounded quantifiers only: every line is
capped (logline.MAX_LINE) and no pattern backtracks over more than a few hundred characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

# The regex parser: used only to find a literal every match must contain.
import re._parser as _sre_parse
from re._constants import LITERAL as _LITERAL

from gpuwarden.ops.triage.findings import CAUSE, CONSEQUENCE, FIRMWARE, HARDWARE, INIT, OTHER

FOLLOW_WINDOW = 16  # lines after a header that may still carry its detail


@dataclass(frozen=True)
class Rule:
    id: str
    category: str
    severity: str
    regex: re.Pattern[str]
    # str.format over the named groups (+ {device}, {place}); unknown names print ""; a [[...]] part is kept
    # only when a field in it matched
    title: str
    key: tuple[str, ...] = ()  # groups that, with the device, make two matches the same finding
    meaning: str = ""
    check: str = ""  # the first thing to check
    tier: int = OTHER
    gpu: bool = False  # a GPU driver message: may take the device of a nearby driver line
    victim: tuple[str, ...] = ()  # groups recorded per occurrence as the affected process
    follow: tuple[re.Pattern[str], ...] = field(default=())  # detail lines after the match
    window: int = FOLLOW_WINDOW
    # Lower-case text every match contains: a cheap `in` test skips the regex on most lines.
    hint: str | tuple[str, ...] | None = None
    adjust: Callable[[dict[str, str | None]], str | None] | None = None  # severity from the groups (e.g. -14 is benign)
    follow_hints: tuple[str | None, ...] = ()  # the literal each follow pattern needs, like hint

    def __post_init__(self) -> None:
        if len(self.follow_hints) != len(self.follow):
            object.__setattr__(self, "follow_hints", tuple(required_literal(p.pattern) for p in self.follow))


def required_literal(pattern: str, flags: int = 0) -> str | None:
    """The longest run of literal characters at the pattern's top level (so every match has it)."""
    try:
        parsed = _sre_parse.parse(pattern, flags)
    except Exception:  # a private module that changes between versions: no literal only means no fast skip
        return None
    best, run = "", []
    for op, arg in list(parsed) + [(None, None)]:
        if op == _LITERAL:
            run.append(chr(arg))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    return best.lower() if len(best) >= 3 else None


def _r(id: str, category: str, severity: str, pattern: str, title: str, *, tier: int, meaning: str, check: str,
       key: Iterable[str] = (), gpu: bool = False, victim: Iterable[str] = (), follow: Iterable[str] = (),
       window: int = FOLLOW_WINDOW, hint: str | tuple[str, ...] | None = None,
       adjust: Callable[[dict[str, str | None]], str | None] | None = None, flags: int = 0) -> Rule:
    return Rule(id, category, severity, re.compile(pattern, flags), title, tuple(key), meaning, check, tier, gpu,
                tuple(victim), tuple(re.compile(p) for p in follow), window,
                hint or required_literal(pattern, flags), adjust)


# The process behind a GPU job: "Process information: process X pid N thread Y pid M" (amdgpu_job.c up to
# 6.9), " Process X pid N thread Y pid M" (amdgpu_vm_print_task_info, 6.10+), " for process X ... pid M)"
# (6.x page faults), "in process X pid N thread ..." (older gmc).
PROCESS_LINE = (r"(?:^|\s)(?:Process information: process|Process|for process|in process) (?P<proc>[^\n]{0,64}?) "
                r"pid (?P<pid>\d+) thread (?P<thread>[^\n]{0,64}?) pid (?P<tid>\d+)\)?\s*$")
# Detail lines amdgpu prints after a page-fault header (gmc_v9_0/v10/v11/v12, gfxhub/mmhub).
PF_DETAIL = (
    r"in page starting at address (?P<fault_addr>0x[0-9a-fA-F]+) from (?:IH )?client (?P<client>\S+)(?: \((?P<client_name>\w+)\))?",
    r"^\s*at page (?P<fault_addr>0x[0-9a-fA-F]+) from (?P<client>\d+)",
    r"(?P<status_reg>\w+_PROTECTION_FAULT_STATUS):(?P<status>0x[0-9a-fA-F]+)",
    r"Faulty UTCL2 client ID: (?P<utcl2_client>[^\n]{1,40}?)\s*(?:\(0x[0-9a-fA-F]+\))?\s*$",
    r"(?:^|\s)(?P<field>MORE_FAULTS|WALKER_ERROR|PERMISSION_FAULTS|MAPPING_ERROR|RW): (?P<value>0x[0-9a-fA-F]+)\s*$",
    r"cookie node_id (?P<node_id>\d+) fault from die (?P<die>\w+)",
)
_PF_FOLLOW = (PROCESS_LINE,) + PF_DETAIL
_HUNG_FOLLOW = (r"^\s*task:(?P<task>\S+)\s+state:(?P<task_state>\w)", r"Workqueue: (?P<workqueue>[^\n]{1,120}?)\s*$",
                r"\[(?P<gpu_driver>amdgpu|amdkfd|amd_sched|amdkcl|amdttm|gpu_sched|nvidia(?:_uvm|_modeset|_drm)?)\]")
_APEI_FOLLOW = (r"event severity: (?P<event_severity>\w+)", r"section_type: (?P<section>[^\n]{1,60}?)\s*$",
                r"device_id: (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])")
_GPU_FW = ("amdgpu/", "radeon/", "nvidia/", "amdtee/")


def _userptr_severity(g: dict[str, str | None]) -> str | None:
    # -14 (EFAULT): the host range was unmapped while still registered; KFD retries. AMD calls it normal.
    return "info" if g.get("rc") == "-14" else None


def _firmware_severity(g: dict[str, str | None]) -> str | None:
    fw = g.get("fw") or g.get("fw2") or ""
    return None if fw.startswith(_GPU_FW) else "info"


def _apei_severity(g: dict[str, str | None]) -> str | None:
    return {"corrected": "warning", "recoverable": "error", "fatal": "critical"}.get(
        (g.get("event_severity") or "").lower())


_RESET = "every process on this GPU lost its queues; a reset that does not complete leaves the GPU unusable"

RULES: tuple[Rule, ...] = (
    # --- GPU page faults -------------------------------------------------------------------
    _r("amdgpu.page_fault", "gpu-page-fault", "error",
       r"\[(?P<hub>(?:gfx|mm)hub\d*|vmc|gfx|sdma\d+)\]\s+(?:(?P<retry>retry|no-retry)\s+)?(?:VMC )?page fault"
       r"\s*\(src_id:(?P<src_id>\d+) ring:(?P<ring>\d+) vm_?id:(?P<vmid>\d+) pas_?id:(?P<pasid>\d+)"
       r"(?:, for process (?P<proc>[^\n]{0,64}?) pid (?P<pid>\d+) thread (?P<thread>[^\n]{0,64}?) pid (?P<tid>\d+))?",
       "GPU page fault on {device} ({hub})", key=("hub",), victim=("proc", "pid", "thread"), tier=CAUSE, gpu=True,
       meaning="a GPU queue touched an address its page table does not map: usually a kernel/runtime bug or "
               "memory freed while a kernel still used it; the process named owned the faulting queue "
               "(pasid 0 = a kernel or firmware queue, not a process)",
       check="the process named below: its runtime log (HSA 'Memory access fault by GPU node'), then whether it "
             "freed or unregistered memory still in flight; the UTCL2 client says which engine faulted",
       follow=_PF_FOLLOW),
    _r("hsa.memory_access_fault", "gpu-page-fault", "error",
       r"Memory access fault by GPU node-(?P<node>\d+) \(Agent handle: (?P<agent>0x[0-9a-fA-F]+)\) on address "
       r"(?P<fault_addr>0x[0-9a-fA-F]+)\. Reason: (?P<reason>[^\n]{1,120}?)\.?\s*$",
       "ROCr reported a GPU memory access fault on node-{node}: {reason}", key=("node", "reason"), tier=CAUSE,
       meaning="the HSA runtime saw a GPU page fault in this application and aborted it",
       check="the kernel log's matching [gfxhub] page fault (same time) names the engine and address"),
    _r("iommu.io_page_fault", "gpu-page-fault", "error", r"IO_PAGE_FAULT", "IOMMU I/O page fault on {device}",
       tier=CAUSE, meaning="a device DMA'd to an address the IOMMU does not map",
       check="iommu=pt / amd_iommu settings on the kernel command line, and which device the domain belongs to"),
    _r("iommu.event", "gpu-page-fault", "warning",
       r"Event logged \[(?P<event>INVALID_DEVICE_REQUEST|ILLEGAL_DEV_TABLE_ENTRY|DEV_TAB_HARDWARE_ERROR|"
       r"PAGE_TAB_HARDWARE_ERROR|ILLEGAL_COMMAND_ERROR|COMMAND_HARDWARE_ERROR|IOTLB_INV_TIMEOUT|INVALID_PPR_REQUEST)",
       "IOMMU event {event}", key=("event",), tier=OTHER,
       meaning="the IOMMU refused or could not complete a device request",
       check="read it with the GPU events around it: during a GPU reset these are a side effect"),
    _r("kernel.page_fault_oops", "kernel", "critical",
       r"BUG: unable to handle (?:page fault|kernel (?:NULL pointer dereference|paging request)) (?:for address|at)\b",
       "kernel oops: unable to handle a page fault", tier=CAUSE,
       meaning="a kernel bug: the kernel touched memory it must not; the module on the IP/RIP line is the suspect",
       check="the IP:/RIP: line and the call trace below it (a module in [brackets], e.g. [amdgpu]); the node "
             "should be rebooted", follow=(r"R?IP: (?:0010:)?(?:\[<[0-9a-f]+>\] )?(?P<ip>\S+)(?: \[(?P<module>\w+)\])?",)),

    # --- ring timeouts, fences, hangs ------------------------------------------------------
    _r("amdgpu.ring_timeout", "ring-timeout", "error",
       r"ring (?P<ring>\S+) timeout, (?:but soft recovered|signaled seq=(?P<signaled>\d+), emitted seq=(?P<emitted>\d+))",
       "ring {ring} timeout on {device}", key=("ring",), tier=CAUSE, gpu=True,
       meaning="a job on this GPU ring did not finish within lockup_timeout: the GPU (or this queue) hung; the "
               "driver resets the ring or the whole GPU next; the process named submitted the job",
       check="the process named: what it ran when it hung (its log, a devcoredump if one was written); "
             "the same ring timing out again means a GPU or firmware problem",
       follow=(PROCESS_LINE, r"Process information: process\s*$")),
    _r("amdgpu.ring_test_failed", "ring-timeout", "error",
       r"(?:ring (?P<ring>\S+) test failed|IB test failed on (?P<ib_ring>\S+?)\.?) \((?P<rc>-?\d+)\)",
       "ring test failed on {device}: {ring}{ib_ring} ({rc})", key=("ring", "ib_ring"), tier=CONSEQUENCE, gpu=True,
       hint="test failed",
       meaning="the engine did not answer a test submission (-110 = timed out): the block is hung",
       check="whether a GPU reset followed and completed; at boot this means the GPU cannot be used"),
    _r("amdgpu.ib_ring_test_failed", "ring-timeout", "error", r"ib ring test failed \((?P<rc>-?\d+)\)",
       "IB ring tests failed on {device} ({rc})", tier=CONSEQUENCE, gpu=True,
       meaning="the rings did not execute test command buffers", check="the ring test lines above it"),
    _r("amdgpu.ring_reset", "ring-timeout", "warning", r"Starting (?P<ring>\S+) ring reset",
       "ring {ring} reset started on {device}", key=("ring",), tier=CONSEQUENCE, gpu=True,
       meaning="the driver tries to reset only the hung queue before resetting the GPU",
       check="the 'Ring ... reset succeeded/failed' line after it"),
    _r("amdgpu.ring_reset_result", "ring-timeout", "info",
       r"Ring (?P<ring>\S+) reset (?P<result>succeeded|failed)", "ring {ring} reset {result} on {device}",
       key=("ring", "result"), tier=CONSEQUENCE, gpu=True,
       meaning="a per-queue reset finished; 'failed' escalates to a full GPU reset",
       check="if it failed: the GPU reset that follows"),
    _r("amdgpu.qcm_fence_timeout", "ring-timeout", "error", r"qcm fence wait loop timeout expired",
       "QCM fence wait timed out on {device} (queue preemption failed)", tier=FIRMWARE, gpu=True,
       meaning="the compute firmware (CP) did not preempt the queues in time; KFD cannot evict or suspend "
               "processes and usually escalates to a GPU reset",
       check="the process whose queues were being evicted (KFD lines around it); repeated = firmware hang"),
    _r("amdgpu.cp_unrecoverable", "ring-timeout", "error", r"The cp might be in an unrecoverable state",
       "command processor may be unrecoverable on {device}", tier=FIRMWARE, gpu=True,
       meaning="queue preemption failed and the driver gives up on the CP firmware",
       check="whether the GPU reset that should follow succeeded"),
    _r("amdgpu.vm_flush_timeout", "ring-timeout", "error", r"Timeout waiting for VM flush (?:hub|ACK)[: ]*(?P<hub>\d*)",
       "VM flush timed out on {device} (hub {hub})", key=("hub",), tier=FIRMWARE, gpu=True,
       meaning="the GPU did not acknowledge a page-table (TLB) flush: it is hung",
       check="the reset state of this GPU"),
    _r("amdgpu.sq_intr", "ring-timeout", "warning", r"sq_intr: error", "shader (SQ) error interrupts on {device}",
       tier=OTHER, gpu=True, meaning="waves raised errors (illegal instruction, memory violation)",
       check="read with the page faults and the application that ran"),
    _r("amdgpu.cp_halt_failed", "ring-timeout", "warning", r"failed to halt cp (?P<cp>\w+)",
       "failed to halt the {cp} command processor on {device}", key=("cp",), tier=CONSEQUENCE, gpu=True,
       meaning="while resetting, the driver could not stop the CP: the engine is hung",
       check="whether the GPU reset completed"),
    _r("amdgpu.queue_disable_failed", "ring-timeout", "warning", r"(?P<q>KGQ|KCQ) disable failed",
       "{q} disable failed on {device}", key=("q",), tier=CONSEQUENCE, gpu=True,
       meaning="the kernel could not unmap the graphics/compute queues through the KIQ (it is hung)",
       check="whether the GPU reset completed"),
    _r("kernel.hung_task", "hung-task", "error",
       r"INFO: task (?P<proc>[^\n]{1,64}?):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds",
       "hung task {proc} (blocked > {secs}s)", key=("proc",), victim=("proc", "pid"), tier=CAUSE,
       meaning="a task sat in uninterruptible sleep (D) too long; in a GPU driver this is usually a wedged "
               "ioctl or a fence that never signals",
       check="the call trace below it: a GPU module in [brackets] ties it to the GPU; its process cannot be "
             "killed until that wait ends", follow=_HUNG_FOLLOW, window=60),
    _r("kernel.hung_task_state", "hung-task", "error",
       r"^\s*task:(?P<proc>\S+)\s+state:(?P<state>D)\s+[^\n]{0,80}?\bpid:\s*(?P<pid>\d+)",
       "task {proc} stuck in D state", key=("proc",), victim=("proc", "pid"), tier=CAUSE,
       meaning="the scheduler dumped a blocked task", check="the call trace after it shows where it waits",
       follow=_HUNG_FOLLOW[1:], window=60),
    _r("kernel.soft_lockup", "hung-task", "error",
       r"soft lockup - CPU#(?P<cpu>\d+) stuck for (?P<secs>\d+)s! \[(?P<proc>[^\n\]]{1,64}):(?P<pid>\d+)\]",
       "soft lockup on CPU {cpu} in {proc}", key=("proc",), victim=("proc", "pid"), tier=CAUSE,
       meaning="a CPU ran kernel code without scheduling for too long", check="the RIP and call trace below it"),
    _r("kernel.rcu_stall", "hung-task", "error",
       r"rcu(?:_preempt|_sched|:)\s*(?:INFO: rcu_(?:preempt|sched) )?(?:self-)?detected (?:stalls?|expedited stalls)",
       "RCU stall detected", tier=OTHER, hint="detected",
       meaning="a CPU did not pass through a quiescent state: a kernel hang or interrupt storm",
       check="the task and trace the stall report names"),
    _r("kernel.workqueue_hog", "hung-task", "info",
       r"workqueue: (?P<work>\S+) [^\n]{0,40}?hogged CPU for >(?P<us>\d+)us", "workqueue {work} hogged a CPU",
       key=("work",), tier=OTHER, meaning="a work item ran long without yielding (a hint, not a failure)",
       check="only if it names a GPU driver function and repeats"),
    _r("kernel.rt_throttling", "kernel", "warning", r"sched: RT throttling activated", "RT throttling activated",
       tier=OTHER, meaning="real-time tasks used their CPU budget", check="which RT task spins"),

    # --- GPU resets ------------------------------------------------------------------------
    _r("amdgpu.reset_begin", "gpu-reset", "error",
       r"GPU reset begin!(?:\.?\s*Source:\s*(?P<reset_source>\d+))?", "GPU reset began on {device}",
       tier=CONSEQUENCE, gpu=True, meaning="the driver reset the GPU: " + _RESET,
       check="what came just before (ring timeout, MES/KIQ failure, RAS error): that is the cause"),
    _r("amdgpu.reset_succeeded", "gpu-reset", "info",
       r"GPU reset(?:\((?P<reset_no>\d+)\))? succeeded!", "GPU reset succeeded on {device}", tier=CONSEQUENCE,
       gpu=True, meaning="the GPU came back", check="whether VRAM was lost (engines must restart)"),
    _r("amdgpu.reset_resuming", "gpu-reset", "info", r"GPU reset succeeded, trying to resume",
       "GPU reset done, resuming on {device}", tier=CONSEQUENCE, gpu=True, meaning="the ASIC reset worked",
       check="the resume lines after it"),
    _r("amdgpu.reset_failed", "gpu-reset", "critical",
       r"(?:GPU reset(?:\((?P<reset_no>\d+)\))? failed|(?P<method>[Mm][Oo][Dd][Ee] ?[012]|BACO) reset failed"
       r"|asic reset on init failed|GPU Recovery Failed)", "GPU reset FAILED on {device}", tier=CONSEQUENCE,
       gpu=True, hint="failed", meaning="the GPU did not come back: it stays unusable until a reboot (or a power cycle)",
       check="drain the node and reboot; if it repeats, the board (or its XGMI hive) is suspect"),
    _r("amdgpu.reset_method", "gpu-reset", "info",
       r"(?:^|: )(?P<method>MODE[012]|BACO|PCI CONFIG) reset\s*$", "{method} reset on {device}", key=("method",),
       tier=CONSEQUENCE, gpu=True, meaning="which kind of reset the driver used", check="nothing by itself"),
    _r("amdgpu.recovery_disabled", "gpu-reset", "error", r"GPU recovery disabled",
       "GPU recovery is disabled on {device} (amdgpu.gpu_recovery=0?): hangs will not be reset", tier=CONSEQUENCE,
       gpu=True, meaning="a hang stays a hang: the GPU is not reset",
       check="the amdgpu.gpu_recovery module parameter"),
    _r("amdgpu.wedged", "gpu-reset", "warning", r"device wedged, but recovered through reset",
       "device was wedged and recovered through a reset ({device})", tier=CONSEQUENCE, gpu=True,
       meaning="a reset recovered the device", check="what hung before it"),
    _r("amdgpu.vram_lost", "gpu-reset", "error", r"VRAM is lost due to GPU reset",
       "VRAM contents lost in a GPU reset on {device}", tier=CONSEQUENCE, gpu=True,
       meaning="every buffer in VRAM is gone: engines on this GPU must restart",
       check="restart the engines of this GPU; `gpuwarden status` for residual VRAM afterwards"),
    _r("amdgpu.cs_after_reset", "gpu-reset", "warning", r"Failed to initialize parser (?P<rc>-125)",
       "a command submission was refused after a reset on {device} (-125)", tier=CONSEQUENCE, gpu=True,
       meaning="the submitting context was lost in the reset (ECANCELED)",
       check="the application must recreate its context (restart it)"),
    _r("amdgpu.devcoredump", "gpu-reset", "info",
       r"Check your (?P<path>/sys/class/drm/card\d+/device/devcoredump/data)",
       "device coredump written: {path}", key=("path",), tier=CONSEQUENCE,
       meaning="the GPU state at the hang was saved", check="copy it before the next hang overwrites it"),
    _r("nvidia.gpu_reset", "gpu-reset", "error", r"NVRM: [^\n]{0,200}?GPU (?:reset|recovery) (?:failed|required)",
       "NVIDIA GPU reset/recovery needed or failed on {device}", tier=CONSEQUENCE,
       meaning="the driver needs (or failed) a GPU reset", check="nvidia-smi -q (recovery action), then reset"),

    # --- RAS / ECC / machine checks ---------------------------------------------------------
    _r("ras.correctable", "ras", "warning",
       r"(?P<n>\d+) (?:new )?correctable hardware errors? detected in (?:total in )?(?P<block>\w+) [Bb]lock",
       "RAS correctable errors in {block} on {device}", key=("block",), tier=HARDWARE, gpu=True,
       meaning="the GPU corrected memory/SRAM errors itself", check="the trend: many of them precede bad pages"),
    _r("ras.uncorrectable", "ras", "critical",
       r"(?P<n>\d+) (?:new )?uncorrectable hardware errors? detected in (?:total in )?(?P<block>\w+) [Bb]lock",
       "RAS UNCORRECTABLE errors in {block} on {device}", key=("block",), tier=HARDWARE, gpu=True,
       meaning="data in this block may be wrong; the GPU resets or needs replacement if it repeats",
       check="amd-smi metric --ecc / bad pages of this GPU; drain it"),
    _r("ras.uncorrectable_event", "ras", "critical",
       r"uncorrectable hardware error\((?P<event>\w+)\) detected", "uncorrectable hardware error {event} on {device}",
       key=("event",), tier=HARDWARE, gpu=True, meaning="a RAS interrupt: the driver resets the GPU to contain it",
       check="the ACA/MCA records around it and the GPU's ECC counters"),
    _r("ras.deferred", "ras", "error",
       r"(?P<n>\d+) (?:new )?deferred hardware errors? detected in (?:total in )?(?P<block>\w+) [Bb]lock",
       "RAS deferred errors in {block} on {device}", key=("block",), tier=HARDWARE, gpu=True,
       meaning="an error was deferred (poisoned) for whoever reads the data", check="the ECC counters"),
    _r("ras.poison_consumed", "ras", "critical", r"[Pp]oison is consumed by client (?P<client>\d+)",
       "RAS poison consumed by client {client} on {device}", key=("client",), tier=HARDWARE, gpu=True,
       meaning="a block read poisoned data: results are wrong and the GPU resets", check="ECC counters, bad pages"),
    _r("ras.poison_created", "ras", "error", r"Poison is created", "RAS poison created on {device}", tier=HARDWARE,
       gpu=True, meaning="an uncorrectable error marked data as poisoned", check="ECC counters"),
    _r("ras.bad_page_threshold", "ras", "critical",
       r"Saved bad pages (?P<pages>\d+) reaches threshold value (?P<limit>\d+)",
       "bad-page threshold reached on {device} ({pages} pages)", tier=HARDWARE, gpu=True,
       meaning="the GPU has retired as many pages as allowed", check="plan the board's replacement"),
    _r("ras.ecc_fatal", "ras", "critical", r"GPU detected ECC Fatal Error", "ECC fatal error on {device}",
       tier=HARDWARE, gpu=True, meaning="an unrecoverable memory error", check="drain and reset the GPU"),
    _r("ras.whole_gpu_reset", "ras", "error", r"Issuing Whole GPU reset", "whole-GPU reset issued on {device}",
       tier=CONSEQUENCE, gpu=True, meaning="RAS recovery resets the GPU", check="the RAS error before it"),
    _r("ras.ecc_active", "ras", "info", r"(?P<kind>MEM|SRAM) ECC is (?P<state>active|not presented)",
       "{kind} ECC {state} on {device}", key=("kind", "state"), tier=OTHER, gpu=True,
       meaning="whether ECC protects this GPU's memory", check="nothing by itself"),
    _r("ras.ip_lost", "ras", "warning", r"state may lost due to RAS (?P<event>\w+)",
       "engine state lost because of RAS event {event}", key=("event",), tier=CONSEQUENCE, gpu=True,
       meaning="a RAS event reset an engine's state", check="the RAS event"),
    _r("ras.sram_ecc", "ras", "warning", r"sram_ecc", "SRAM ECC event on {device}", tier=HARDWARE, gpu=True,
       meaning="an on-chip SRAM ECC event", check="ECC counters"),
    _r("ras.cper_severity", "ras", "warning", r"\[Hardware Error\]:\s+event severity: (?P<sev>\w+)",
       "platform hardware error record: severity {sev}", key=("sev",), tier=HARDWARE,
       meaning="a firmware (CPER) error record", check="the record's section and device lines",
       adjust=lambda g: {"fatal": "critical", "recoverable": "error"}.get((g.get("sev") or "").lower())),
    _r("ras.aca", "ras", "error", r"Accelerator Check Architecture", "ACA error record on {device}", tier=HARDWARE,
       gpu=True, meaning="an AMD accelerator machine-check record", check="the aca entry STATUS/IPID lines"),
    _r("ras.hw_error_corrected", "ras", "warning", r"\[Hardware Error\]: Corrected error",
       "platform corrected hardware error", tier=HARDWARE, meaning="corrected, no action required",
       check="only the trend"),
    _r("ras.apei", "ras", "error", r"Hardware error from APEI Generic Hardware Error Source",
       "APEI hardware error record (firmware-first)", tier=HARDWARE, adjust=_apei_severity,
       meaning="the platform firmware reported a hardware error; its section names the component",
       check="the record's section_type and device_id lines (a PCIe device, memory, a CPU)",
       follow=_APEI_FOLLOW, window=24),
    _r("ras.error_address", "ras", "error", r"Error Address", "hardware error address reported", tier=HARDWARE,
       meaning="the physical address of a hardware error", check="the error record around it"),
    _r("ras.mce", "ras", "warning",
       r"(?:Machine check events logged|\[Hardware Error\]: (?:CPU \d+: )?Machine Check(?!:))",
       "machine check exception logged", tier=OTHER, hint="machine check",
       meaning="the CPU reported a machine check; the EDAC/mcelog decode says which component",
       check="the EDAC lines after it (which DIMM), or `ras-mc-ctl --errors`"),
    _r("ras.edac_ce", "ras", "warning",
       r"EDAC (?:\w+ )?MC(?P<mc>\d+): (?P<n>\d+) CE (?P<what>[^\n]{0,80}?) on (?P<dimm>\S+)",
       "corrected memory errors on {dimm} (EDAC MC{mc})", key=("dimm",), tier=HARDWARE, hint=" ce ",
       meaning="host memory corrected errors: the DIMM still works, but many of them predict failure",
       check="the DIMM named; `edac-util -v` or ras-mc-ctl for the count over time"),
    _r("ras.edac_ue", "ras", "critical",
       r"EDAC (?:\w+ )?MC(?P<mc>\d+): (?P<n>\d+) UE (?P<what>[^\n]{0,80}?) on (?P<dimm>\S+)",
       "UNCORRECTED memory error on {dimm} (EDAC MC{mc})", key=("dimm",), tier=HARDWARE, hint=" ue ",
       meaning="host memory lost data: whatever used that page (maybe a GPU engine's host buffer) read garbage",
       check="replace the DIMM named; the node's results since are suspect"),
    _r("ras.cmci_storm", "ras", "warning", r"CMCI storm detected", "corrected machine-check interrupt storm",
       tier=HARDWARE, meaning="corrected errors arrive so fast that the kernel polls instead",
       check="the EDAC lines: usually one failing DIMM"),
    _r("ras.edr", "ras", "error", r"EDR: EDR event received", "PCIe EDR event", tier=HARDWARE,
       meaning="firmware-first PCIe downstream port containment", check="the PCIe device behind the port"),

    # --- PCIe AER / link ----------------------------------------------------------------------
    _r("pcie.aer_corrected", "pcie-aer", "warning",
       r"AER: (?P<kind>(?:Multiple )?Correct(?:ed|able)) error(?: message)? received(?: from|:)\s*(?:id=)?(?P<from>\S+)",
       "PCIe AER corrected errors reported by {from}", key=("from",), tier=HARDWARE,
       meaning="the link recovered by itself; many of them mean a marginal link (riser, slot, cable, speed)",
       check="the count over time; lspci -vvv LnkSta of the device for a downgraded speed/width"),
    _r("pcie.aer_uncorrected", "pcie-aer", "error",
       r"AER: (?P<kind>(?:Multiple )?Uncorrect(?:ed|able) \((?:Non-Fatal|Fatal)\)) error(?: message)? received"
       r"(?: from|:)\s*(?:id=)?(?P<from>\S+)",
       "PCIe AER {kind} error reported by {from}", key=("kind", "from"), tier=HARDWARE,
       meaning="a PCIe transaction was lost; the device below the port may be reset or dropped",
       check="whether recovery succeeded (the lines after it) and which device sits below the port"),
    _r("pcie.recovery_failed", "pcie-aer", "critical", r"AER: [Dd]evice recovery failed",
       "PCIe device recovery FAILED after an AER error ({device})", tier=HARDWARE,
       meaning="the devices behind this port did not come back: expect them gone until a reboot",
       check="lspci for the devices below this port; reboot, and reseat/replace if it repeats"),
    _r("pcie.no_error_handler", "pcie-aer", "error",
       r"^(?P<driver>[\w-]+) (?P<dev1>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]): AER: can't recover "
       r"\(no error_detected callback\)",
       "{driver} {device} cannot recover from PCIe errors (no AER handler)", key=("driver",), tier=HARDWARE,
       meaning="the driver has no PCIe error handler, so an uncorrectable error on its link is fatal to the device",
       check="the AER error above it (its cause); the device needs a reset or reboot"),
    _r("pcie.link_reset", "pcie-aer", "info", r"(?:Root|Downstream) Port link has been reset",
       "PCIe port link reset ({device})", tier=CONSEQUENCE, meaning="AER recovery reset the link",
       check="whether recovery then succeeded"),
    _r("pcie.bus_error", "pcie-aer", "warning",
       r"PCIe Bus Error: severity=(?P<sev>[\w ()-]{1,40}?), type=(?P<type>[\w ]{1,40}?)(?:,|$)",
       "PCIe bus error on {device}: {sev} / {type}", key=("sev", "type"), tier=HARDWARE,
       meaning="the AER decode of an error", check="the AER line before it"),
    _r("pcie.aer_status", "pcie-aer", "warning",
       r"(?P<which>aer_status|aer_cor_status|aer_uncor_status): (?P<status>0x[0-9a-fA-F]+)",
       "PCIe AER {which} on {device}", key=("which",), tier=HARDWARE, meaning="raw AER status registers",
       hint="status: 0x",
       check="the AER error it belongs to"),
    _r("pcie.aer_uncor_severity", "pcie-aer", "error", r"aer_uncor_severity: (?P<sev>0x[0-9a-fA-F]+)",
       "PCIe AER uncorrectable severity on {device}", tier=HARDWARE, meaning="raw AER severity register",
       check="the AER error it belongs to"),
    _r("pcie.tlp_header", "pcie-aer", "info", r"TLP Header: ", "PCIe TLP header logged on {device}", tier=HARDWARE,
       meaning="the header of the failed transaction (all ff = device unresponsive)", check="nothing by itself"),
    _r("pcie.card_not_present", "pcie-aer", "critical", r"Slot\((?P<slot>[^)]{1,40})\): Card not present",
       "PCIe slot {slot}: card not present", key=("slot",), tier=HARDWARE,
       meaning="the card left the bus (hot-unplug or link loss)", check="power and seating of the card"),
    _r("pcie.link_down", "pcie-aer", "critical", r"Slot\((?P<slot>[^)]{1,40})\): Link Down",
       "PCIe slot {slot}: link down", key=("slot",), tier=HARDWARE, meaning="the PCIe link went down",
       check="power and seating of the card"),
    _r("pcie.dpc", "pcie-aer", "error", r"DPC: (?P<what>containment event|[^\n]{1,80})", "PCIe DPC: {what}",
       key=("what",), tier=HARDWARE, meaning="downstream port containment isolated a device",
       check="the device below the port"),
    _r("pcie.clock_config", "pcie-aer", "warning", r"current common clock configuration is inconsistent",
       "PCIe common clock configuration inconsistent on {device}", tier=OTHER,
       meaning="the BIOS left the link's clock setting inconsistent (the kernel fixes it)", check="nothing usually"),

    # --- KFD (compute) ------------------------------------------------------------------------
    _r("kfd.evict_pasid", "kfd", "info", r"Evicting PASID (?P<pasid>\w+) queues",
       "KFD evicted the queues of PASID {pasid}", key=("pasid",), tier=CONSEQUENCE,
       meaning="memory pressure or a userptr invalidation moved this process's buffers", check="nothing alone"),
    _r("kfd.restore_pasid", "kfd", "info", r"Restoring PASID (?P<pasid>\w+) queues",
       "KFD restored the queues of PASID {pasid}", key=("pasid",), tier=CONSEQUENCE,
       meaning="the process runs again after an eviction", check="nothing"),
    _r("kfd.evict_failed", "kfd", "error", r"Failed to evict (?:process queues|queue (?P<queue>\d+))",
       "KFD failed to evict queues on {device}", tier=FIRMWARE, gpu=True,
       meaning="the scheduler firmware did not respond; KFD escalates to a GPU reset",
       check="the MES/HWS failure before it"),
    _r("kfd.quiesce_failed", "kfd", "error", r"Failed to quiesce KFD", "KFD failed to quiesce (before reset)",
       tier=FIRMWARE, gpu=True, meaning="queues could not be stopped before a reset", check="the reset after it"),
    _r("kfd.restore_failed", "kfd", "error",
       r"(?:Failed to restore (?:process queues|queue (?P<queue>\d+))|Failed to restore queues of process pid (?P<pid>\d+)"
       r"|Restore process pid (?P<rpid>\d+) failed during resume)",
       "KFD failed to restore queues on {device}", victim=("pid", "rpid"), tier=CONSEQUENCE, gpu=True, hint="restore",
       meaning="after an eviction or reset a process's queues could not run again", check="restart that process"),
    _r("kfd.suspend_failed", "kfd", "error", r"Failed to suspend process pid (?P<pid>\d+)",
       "KFD failed to suspend process {pid}", key=("pid",), victim=("pid",), tier=FIRMWARE, gpu=True,
       meaning="the process's queues could not be preempted", check="the MES/HWS failure around it"),
    _r("kfd.queue_evicted", "kfd", "warning", r"Freeing queue vital buffer (?P<addr>0x[0-9a-fA-F]+), queue evicted",
       "KFD freed vital buffers of evicted queues", tier=CONSEQUENCE,
       meaning="a process freed memory its (evicted) queue still needed", check="the process that exited"),
    _r("kfd.sdma_oversubscription", "kfd", "warning", r"Over-subscription is not allowed for SDMA",
       "SDMA queue over-subscription refused", tier=OTHER,
       meaning="more SDMA queues were requested than the hardware has", check="how many processes share the GPU"),
    _r("kfd.userptr", "kfd", "error",
       r"(?i)(?:\buser ?(?:ptr|pages)\b[^\n]{0,120}?\b(?:fail\w*|invalid\w*)\b|\bfail\w*\b[^\n]{0,120}?\buser ?(?:ptr|pages)\b"
       r"|Failed to register MMU notifier)(?:[^\n]{0,40}?: (?P<rc>-\d+))?",
       "userptr (host memory registration) failure on {device}", tier=FIRMWARE, gpu=True,
       hint=("userptr", "user ptr", "user pages", "userpages", "mmu notifier"),
       adjust=_userptr_severity,
       meaning="pinning or mapping registered host memory failed (-14 alone is benign: the range was freed "
               "while still registered and KFD retries)",
       check="the KFD system-memory limit (amdgpu.no_system_mem_limit), memlock limits and how many GPUs each "
             "process sees (`gpuwarden arena budget`)"),
    _r("kfd.gpuvm_map_failed", "kfd", "error",
       r"(?:Failed to map bo to gpuvm|update_gpuvm_pte\(\) failed|amdgpu_vm_bo_update failed"
       r"|Failed to map peer:(?P<peer>\S*) mem_domain:(?P<domain>\d*))",
       "mapping buffers into the GPU's VM failed on {device}", tier=FIRMWARE, gpu=True, hint="fail",
       meaning="KFD could not map memory into a GPU page table (often after a hang, or with host memory "
               "registered to many GPUs)", check="the userptr/pin failures and the process doing it"),
    _r("kfd.validate_failed", "kfd", "error", r"failed to validate (?P<what>PT BOs|PD|BOs?)\b",
       "KFD failed to validate {what} on {device}", key=("what",), tier=FIRMWARE, gpu=True,
       meaning="page-table buffers could not be made resident (memory pressure or a dying GPU)",
       check="VRAM use and resets on this GPU"),
    _r("amdgpu.vm_stats_leak", "kfd", "warning",
       r"VM memory stats for proc (?P<proc>[^\n]{1,64}?)\((?P<pid>\d+)\) task [^\n]{0,80}? is non-zero when fini",
       "GPU memory still accounted to {proc} when its VM was torn down", key=("proc",), victim=("proc", "pid"),
       tier=CONSEQUENCE, gpu=True, meaning="the process exited with GPU buffers still charged to it",
       check="`gpuwarden status` for residual VRAM"),
    _r("amdgpu.cs_no_memory", "kfd", "warning", r"Not enough memory for command submission",
       "not enough memory for command submission on {device}", tier=CAUSE, gpu=True,
       meaning="VRAM/GTT was exhausted for a submission", check="residual VRAM and the OOM kills"),
    _r("amdgpu.bo_pin_failed", "kfd", "error",
       r"(?:Failed to pin bo\.? ret (?P<ret>-?\d+)|Failed to pin framebuffer with error (?P<err>-?\d+)"
       r"|failed to pin (?P<what>userptr|bo|wptr bo|[\w ]{1,30}? bo)\b)",
       "amdgpu failed to pin a buffer object on {device}", tier=FIRMWARE, gpu=True, hint="to pin",
       meaning="a buffer could not be pinned in memory (no room in VRAM/GTT, or the GPU is in a bad state)",
       check="GTT/VRAM use (`gpuwarden status`), the GTT size (amdgpu.gttsize) and the registrations on it"),
    _r("amdgpu.bo_map_failed", "kfd", "error", r"Failed to map (?P<what>wptr bo to GART|bo to GART|[\w ]{1,30}? to GART)",
       "amdgpu failed to map a buffer to GART ({what}) on {device}", key=("what",), tier=FIRMWARE, gpu=True,
       meaning="a queue's buffer could not be mapped into the GPU's GART aperture: queue creation fails",
       check="the pin failures before it; GART exhaustion from many queues or registrations"),

    # --- MES / KIQ (scheduler firmware) -------------------------------------------------------
    _r("mes.no_response", "mes-kiq", "error",
       r"MES(?:\(\d+\))? failed to respon(?:d|se) (?:to )?msg=(?P<msg>\S+(?: \([A-Z_]+\))?)",
       "MES firmware did not answer {msg} on {device}", key=("msg",), tier=FIRMWARE, gpu=True,
       meaning="the micro-engine scheduler is stuck; queues cannot be added/removed until a GPU reset",
       check="the MES firmware version (amdgpu_firmware_info) against known fixes; the process that ran"),
    _r("mes.remove_queue_failed", "mes-kiq", "error",
       r"(?:failed to remove hardware queue from MES|Failed to remove queue (?P<queue>\d+))",
       "removing a hardware queue through MES failed on {device}", tier=FIRMWARE, gpu=True, hint="remove",
       meaning="MES did not unmap a queue", check="the MES failure before it"),
    _r("mes.unrecoverable", "mes-kiq", "error", r"MES might be in unrecoverable state",
       "MES may be unrecoverable on {device} (reset requested)", tier=FIRMWARE, gpu=True,
       meaning="the driver gives up on MES and resets", check="the reset after it"),
    _r("mes.ring_full", "mes-kiq", "error", r"MES ring buffer is full", "MES ring buffer full on {device}",
       tier=FIRMWARE, gpu=True, meaning="MES stopped consuming requests", check="the MES failures around it"),
    _r("mes.misc_failed", "mes-kiq", "error",
       r"failed to (?P<op>unmap legacy queue|reg_write_reg_wait|set_shader_debugger|suspend (?:all )?gangs(?: from MES)?)",
       "MES operation failed on {device}: {op}", key=("op",), tier=FIRMWARE, gpu=True,
       meaning="a scheduler firmware request failed", check="the MES failure before it"),
    _r("mes.suspend_queues_failed", "mes-kiq", "error", r"Suspending all queues failed",
       "suspending all queues failed on {device}", tier=FIRMWARE, gpu=True, meaning="MES did not suspend queues",
       check="the MES failure before it"),
    _r("kiq.fence_timeout", "mes-kiq", "error", r"timeout waiting for kiq fence", "KIQ fence timed out on {device}",
       tier=FIRMWARE, gpu=True, meaning="the kernel interface queue did not complete a register write: the GPU "
       "is hung", check="the reset state of the GPU"),
    _r("amdgpu.vpe_reset_failed", "mes-kiq", "warning", r"VPE queue reset failed", "VPE queue reset failed on {device}",
       tier=CONSEQUENCE, gpu=True, meaning="the video processing engine queue did not reset", check="the reset"),

    # --- amdgpu firmware: SMU, PSP, init --------------------------------------------------------
    _r("amdgpu.smu_no_response", "firmware", "error",
       r"SMU: (?:No response msg_reg: (?P<msg_reg>\d+)|I'm not done with your previous command)",
       "SMU (power management firmware) not answering on {device}", tier=FIRMWARE, gpu=True,
       meaning="the SMU did not complete a request: clocks, power and resets through it fail",
       check="whether the GPU also hangs (ring timeouts); a reset or reboot clears it; SMU firmware version"),
    _r("amdgpu.smu_op_failed", "firmware", "error",
       r"(?P<op>(?:Failed|Fail) to (?:export SMU metrics table|get current clock freq|disable gfxoff|enable gfxoff"
       r"|enable requested dpm features|setup smc hw|disable smu features|disable dpm features|set power limit"
       r"|set workload mask|get gpu metrics|set soft freq range|set hard freq range|set power profile mode))",
       "SMU operation failed on {device}: {op}", key=("op",), tier=FIRMWARE, gpu=True, hint="fail",
       meaning="a power-management request to the SMU failed (usually because it stopped answering)",
       check="the SMU 'not done'/'No response' lines before it"),
    _r("amdgpu.smu_msg_failed", "firmware", "error",
       r"(?:Failed to send message (?P<msg>0x[0-9a-fA-F]+), response (?P<resp>0x[0-9a-fA-F]+)"
       r"|failed to send message (?P<msg2>\d+) ret is (?P<ret>-?\d+))",
       "SMU did not accept message {msg}{msg2} on {device}", key=("msg", "msg2"), tier=FIRMWARE, gpu=True,
       hint="send message", meaning="the power-management firmware is not answering (often after a failed reset)",
       check="reset or power-cycle the GPU; repeated = firmware or board problem"),
    _r("amdgpu.powerplay_failed", "firmware", "error", r"\[powerplay\][^\n]{0,120}?(?P<what>Failed to [^!\n]{1,80})",
       "powerplay (SMU) operations failed on {device}", tier=FIRMWARE, gpu=True,
       meaning="legacy power management failed", check="the SMU state"),
    _r("amdgpu.psp_ring_failed", "firmware", "critical",
       r"(?P<what>PSP create ring failed|Fail(?:ed)? to stop psp ring)",
       "PSP (security processor) ring failed on {device}: {what}", key=("what",), tier=INIT, gpu=True, hint="psp",
       meaning="the driver could not talk to the PSP, which loads every other firmware: the GPU cannot start",
       check="a cold power cycle; a bad XGMI bridge or board (one MI210 report); PSP firmware files present"),
    _r("amdgpu.psp_fw_failed", "firmware", "error",
       r"(?P<what>PSP firmware loading failed|Failed to load psp firmware|failed to init (?P<fw>\w+) firmware"
       r"|failed to load ucode id \((?P<ucode>\d+)\)|failed loading with status \((?P<status>-?\d+)\) and ucode id"
       r" \((?P<ucode2>\d+)\))", "PSP firmware load failed on {device}: {what}", key=("what",), tier=INIT, gpu=True,
       hint="fail", meaning="the PSP rejected or could not load a firmware image",
       check="the firmware files (/lib/firmware/amdgpu) match the kernel/amdgpu-dkms version"),
    _r("amdgpu.psp_cmd_failed", "firmware", "warning",
       r"psp (?:gfx )?command (?P<cmd>\w+)?(?:\(0x[0-9A-Fa-f]+\))? ?failed and response status is \((?P<status>[^)]{1,20})\)",
       "PSP command {cmd} failed on {device} (status {status})", key=("cmd",), tier=INIT, gpu=True,
       hint="failed and response status", meaning="a PSP command returned an error status",
       check="the firmware load or reset it belongs to"),
    _r("firmware.load_failed", "firmware", "error",
       r"(?:Direct firmware load for (?P<fw>\S+) failed with error (?P<err>-?\d+)"
       r"|could not load firmware image '(?P<fw2>[^'\n]{1,120})')",
       "firmware file {fw}{fw2} could not be loaded ({device})", key=("fw", "fw2"), tier=INIT,
       adjust=_firmware_severity, hint="firmware",
       meaning="the kernel did not find (or could not read) a firmware file the driver asked for; for a GPU "
               "firmware the device fails to initialise",
       check="the file under /lib/firmware (package linux-firmware / amdgpu-dkms-firmware) and the initramfs"),
    _r("amdgpu.ip_init_failed", "firmware", "critical",
       r"(?P<stage>hw_init|sw_init|resume|suspend) of IP block <(?P<block>\w+)> failed",
       "amdgpu {stage} of IP block {block} failed", key=("stage", "block"), tier=INIT, gpu=True,
       meaning="one hardware block of the GPU did not initialise (or resume)",
       check="the first failure before it (firmware, PSP, SMU); the block named"),
    _r("amdgpu.fatal_init", "firmware", "critical", r"Fatal error during GPU init",
       "fatal error during GPU init on {device}", tier=INIT, gpu=True,
       meaning="the GPU is not usable: amdgpu gave up initialising it",
       check="the first error above it; for -12/-19 at probe: BAR/IOMMU/PCIe resources; else firmware"),
    _r("amdgpu.probe_failed", "firmware", "critical",
       r"amdgpu: probe of (?P<dev1>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]) failed with error (?P<err>-?\d+)",
       "amdgpu probe of {device} failed ({err})", tier=INIT, gpu=True,
       meaning="the driver did not bind to this GPU", check="the fatal init error before it"),
    _r("amdgpu.tmr_terminate", "firmware", "error", r"Failed to terminate tmr", "PSP: failed to terminate TMR",
       tier=FIRMWARE, gpu=True, meaning="the PSP did not release its memory region", check="the PSP state"),
    _r("amdgpu.cf_state", "firmware", "error", r"Failed to disallow cf state", "failed to disallow CF state",
       tier=FIRMWARE, gpu=True, meaning="a data-fabric power state change failed", check="the SMU state"),
    _r("amdgpu.throttled", "firmware", "warning", r"WARN: GPU is throttled", "GPU throttled on {device}", tier=OTHER,
       gpu=True, meaning="the GPU runs slower (thermal or power)", check="temperature and power limits"),
    _r("amdgpu.dmub_timeout", "firmware", "warning", r"Error waiting for DMUB idle", "display firmware (DMUB) "
       "not idle on {device}", tier=OTHER, gpu=True, meaning="the display microcontroller did not go idle",
       check="only relevant for display hangs"),

    # --- NVIDIA (Xids are decoded in analyze via xid.py) ------------------------------------------
    _r("nvidia.fallen_off_bus", "xid", "critical",
       r"NVRM: (?:The NVIDIA GPU (?P<dev1>\S+)|GPU at (?:PCI:)?(?P<dev2>[\w:.]+)|GPU (?P<dev3>[\w:.]+):)[^\n]{0,300}?"
       r"fallen off the bus",
       "NVIDIA GPU {device} has fallen off the bus", tier=HARDWARE,
       meaning="the GPU stopped answering on PCIe (power, thermal, riser/slot or hardware): every process on "
               "it is lost", check="power cables, temperature history and the slot; reset or reboot"),
    _r("nvidia.gsp_timeout", "xid", "critical",
       r"NVRM: (?P<gpu_no>GPU\d+)? ?[^\n]{0,80}?(?:GSP Timeout|Heartbeat timed out|Timeout (?:after \d+s )?(?:of )?"
       r"waiting for RPC (?:response )?from (?:GPU\d+ )?GSP)",
       "NVIDIA GSP firmware timed out on {place}", key=("gpu_no",), tier=HARDWARE,
       hint=("gsp timeout", "heartbeat timed out", "from gsp"),
       meaning="the GPU System Processor (firmware that runs the driver's core on the GPU) stopped answering: "
               "every call into the GPU hangs or fails",
       check="reset the GPU (nvidia-smi -r) or reboot; then the driver release notes for GSP fixes, or "
             "NVreg_EnableGpuFirmware=0 on drivers that allow it"),
    _r("nvidia.memsys_error", "xid", "error", r"NVRM: [^\n]{0,80}?Memory Subsystem Error detected",
       "NVIDIA memory subsystem error ({device})", tier=HARDWARE, hint="memory subsystem error",
       meaning="the GPU's memory subsystem did not answer a barrier", check="the GSP/Xid lines around it"),
    _r("nvidia.probe_failed", "xid", "error", r"NVRM: The NVIDIA probe routine failed for (?P<n>\d+) device",
       "NVIDIA driver could not initialise {n} device(s)", tier=INIT,
       meaning="the driver did not bind to a GPU", check="the lines before it (fallen off the bus, RmInitAdapter)"),
    _r("nvidia.rm_init_failed", "xid", "critical", r"NVRM: [^\n]{0,120}?RmInitAdapter failed",
       "NVIDIA RmInitAdapter failed on {device}", tier=INIT, hint="rminitadapter failed",
       meaning="the GPU failed to initialise", check="power, firmware, and the lines before it"),
    _r("nvidia.peermem", "xid", "warning", r"nvidia-peermem [^\n]{0,80}?ERROR (?P<what>[^\n]{1,120})",
       "nvidia-peermem: {what}", key=("what",), tier=OTHER, meaning="GPUDirect RDMA peer-memory complaint",
       check="only with RDMA failures"),

    # --- application output (a runtime's stderr given to triage) ---------------------------------
    _r("app.segmentation_fault", "segfault", "error", r"[Ss]egmentation [Ff]ault",
       "a process reported a segmentation fault", tier=CAUSE,
       meaning="application output: the kernel's segfault line (with library and offset) is in dmesg",
       check="the kernel log for '<name>[pid]: segfault at'; a core dump (coredumpctl list)"),
    _r("app.core_dumped", "segfault", "warning", r"(?P<how>Aborted|Segmentation fault|Bus error) \(core dumped\)",
       "a process died with a core dump ({how})", key=("how",), tier=CAUSE,
       meaning="the process died of a signal and left a core", check="coredumpctl list (in the bundle under node/)"),

    # --- host memory ------------------------------------------------------------------------
    _r("oom.invoked", "oom", "info",
       r"(?P<proc>\S+) invoked oom-killer: gfp_mask=(?P<gfp>\S+), order=(?P<order>\d+)",
       "{proc} triggered the OOM killer", key=("proc",), tier=CONSEQUENCE,
       meaning="this allocation found no memory", check="the kill line after it"),
    _r("oom.reaped", "oom", "info", r"oom_reaper: reaped process (?P<pid>\d+) \((?P<proc>[^)\n]{0,64})\)",
       "OOM reaper freed {proc}", key=("proc",), tier=CONSEQUENCE, meaning="the victim's memory was reclaimed",
       check="nothing"),

    # --- other kernel trouble (node-scraper parity) --------------------------------------------
    _r("kernel.panic", "kernel", "critical", r"(?i)\bkernel panic\b(?: - not syncing: (?P<why>[^\n]{0,200}))?",
       "kernel panic", tier=HARDWARE, meaning="the kernel stopped", check="the lines before it"),
    _r("kernel.gpf", "kernel", "error", r"general protection fault",
       "kernel general protection fault", tier=CAUSE, hint="general protection fault",
       meaning="a kernel bug touched a non-canonical address", check="the RIP and module in the trace"),
    _r("fs.ext4_error", "storage", "error", r"EXT4-fs error \(device (?P<dev>[^)\n]{1,40})\)",
       "ext4 filesystem error on {dev}", key=("dev",), tier=OTHER, meaning="filesystem corruption or I/O error",
       check="the disk and fsck"),
    _r("fs.buffer_io", "storage", "error", r"Buffer I/O error on dev(?:ice)? (?P<dev>\w+)",
       "buffered I/O error on {dev}", key=("dev",), tier=OTHER, meaning="a block device failed a read or write",
       check="the disk (smartctl)"),
    _r("fs.journal", "storage", "warning",
       r"(?:Failed to read journal file|journal corrupted or uncleanly shut down)", "systemd journal damaged",
       tier=OTHER, hint="journal", meaning="journald found a damaged file", check="nothing unless it repeats"),
    _r("bios.acpi", "bios", "warning", r"ACPI (?P<kind>BIOS Error|Error)", "ACPI {kind}", key=("kind",), tier=OTHER,
       meaning="firmware table bugs (usually harmless)", check="only if a device is missing"),
    _r("bios.mmp", "bios", "warning", r"Failed to load MMP firmware (?P<fw>\S+)", "MMP firmware {fw} failed to load",
       tier=OTHER, meaning="a QAT firmware is missing", check="the firmware package"),
    _r("bios.sgx", "bios", "info", r"x86/cpu: SGX disabled by BIOS", "SGX disabled by BIOS", tier=OTHER,
       meaning="informational", check="nothing"),
    _r("io.lnet", "io", "warning", r"(?i)LNetError:[^\n]{0,200}?(?:No matching interfaces|starting up LNI)",
       "LNet error", tier=OTHER, hint="lneterror", meaning="Lustre networking failed", check="the LNet config"),
    _r("io.lustre", "io", "warning", r"(?i)LustreError:[^\n]{0,200}?network initiali[sz]ation failed",
       "Lustre network initialisation failed", tier=OTHER, hint="lustreerror", meaning="Lustre cannot start",
       check="the LNet config"),
)

BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
