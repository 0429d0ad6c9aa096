"""The kernel-log pattern library: which lines mean what on an AMD or NVIDIA GPU node.

Each Rule names one event, its category and severity, the regex groups that make its signature,
and lines that may follow it and add detail (the process behind a page fault, its address).
Covers at least the events in AMD node-scraper's dmesg checks, plus ring timeouts, resets that
succeed, KFD evictions, MES/KIQ failures, NVIDIA Xids and OOM kills. Segfaults and Xids are
decoded in their own modules (segfault.py, xid.py) because their signatures need arithmetic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The regex parser: used only to find a literal every match must contain.
import re._parser as _sre_parse  # type: ignore[import-not-found]
from re._constants import LITERAL as _LITERAL  # type: ignore[import-not-found]


@dataclass(frozen=True)
class Rule:
    id: str
    category: str
    severity: str
    regex: re.Pattern
    title: str  # str.format over the named groups (+ {device}); unknown names print "?"
    key: tuple[str, ...] = ()  # groups that, with the device, make two matches the same finding
    meaning: str = ""
    victim: tuple[str, ...] = ()  # groups recorded per occurrence as the affected process
    follow: tuple[re.Pattern, ...] = field(default=())  # detail lines after the match
    # Lower-case text every match contains: a cheap `in` test skips the regex on most lines.
    hint: str | None = None


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


def _r(id, category, severity, pattern, title, key=(), meaning="", victim=(), follow=(), flags=0):
    return Rule(id, category, severity, re.compile(pattern, flags), title, tuple(key), meaning,
                tuple(victim), tuple(re.compile(p) for p in follow), required_literal(pattern, flags))


# Detail lines that amdgpu prints after a page-fault header.
_PF_FOLLOW = (
    r"(?:^|:\s)\s*(?:Process|in process) (?P<proc>\S+) pid (?P<pid>\d+) thread (?P<thread>.+?) pid (?P<tid>\d+)\s*$",
    r"in page starting at address (?P<fault_addr>0x[0-9a-fA-F]+) from (?:client|IH client) (?P<client>\S+)(?: \((?P<client_name>\w+)\))?",
    r"(?P<status_reg>\w+_PROTECTION_FAULT_STATUS):(?P<status>0x[0-9a-fA-F]+)",
    r"Faulty UTCL2 client ID: (?P<utcl2_client>.+?)\s*(?:\(0x[0-9a-fA-F]+\))?\s*$",
    r"(?:^|\s)(?P<field>MORE_FAULTS|WALKER_ERROR|PERMISSION_FAULTS|MAPPING_ERROR|RW): (?P<value>0x[0-9a-fA-F]+)\s*$",
)
_RING_FOLLOW = (
    r"Process information: process (?P<proc>\S*) pid (?P<pid>\d+) thread (?P<thread>\S*) pid (?P<tid>\d+)",
)

RULES: tuple[Rule, ...] = (
    # --- GPU page faults -------------------------------------------------------------------
    _r("amdgpu.page_fault", "gpu-page-fault", "error",
       r"\[(?P<hub>gfxhub|mmhub|vmc|gfx|mmhub\d*|gfxhub\d*)\]\s+(?:(?P<retry>retry|no-retry)\s+)?page fault"
       r"\s*\(src_id:(?P<src_id>\d+) ring:(?P<ring>\d+) vmid:(?P<vmid>\d+) pasid:(?P<pasid>\d+)"
       r"(?:, for process (?P<proc>\S*) pid (?P<pid>\d+) thread (?P<thread>\S*) pid (?P<tid>\d+))?",
       "GPU page fault on {device} ({hub})", key=("hub",), victim=("proc", "pid", "thread"),
       meaning="a GPU queue touched an address its page table does not map: usually a kernel/runtime "
               "bug or freed memory still in use; the process named below owned the faulting queue "
               "(pasid 0 = a kernel/firmware queue, not a process)",
       follow=_PF_FOLLOW),
    _r("hsa.memory_access_fault", "gpu-page-fault", "error",
       r"Memory access fault by GPU node-(?P<node>\d+) \(Agent handle: (?P<agent>0x[0-9a-fA-F]+)\) on address "
       r"(?P<fault_addr>0x[0-9a-fA-F]+)\. Reason: (?P<reason>.+?)\.?\s*$",
       "ROCr reported a GPU memory access fault on node-{node}: {reason}", key=("node", "reason"),
       meaning="the HSA runtime saw a GPU page fault in this application and aborted it; the kernel log "
               "has the matching [gfxhub] page fault"),
    _r("iommu.io_page_fault", "gpu-page-fault", "error", r"IO_PAGE_FAULT",
       "IOMMU I/O page fault on {device}",
       meaning="a device DMA'd to an address the IOMMU does not map (check iommu=pt / amd_iommu settings)"),
    _r("kernel.page_fault_oops", "kernel", "critical",
       r"BUG: unable to handle (?:page fault|kernel (?:NULL pointer dereference|paging request)) (?:for address|at)\b",
       "kernel oops: unable to handle a page fault", meaning="a kernel bug; the trace after it names the module"),

    # --- ring timeouts, fences, hangs ------------------------------------------------------
    _r("amdgpu.ring_timeout", "ring-timeout", "error",
       r"ring (?P<ring>\S+) timeout, (?:but soft recovered|signaled seq=(?P<signaled>\d+), emitted seq=(?P<emitted>\d+))",
       "ring {ring} timeout on {device}", key=("ring",),
       meaning="a job on this GPU ring did not finish in time (lockup_timeout); the driver resets the "
               "ring or the GPU next", follow=_RING_FOLLOW),
    _r("amdgpu.ring_test_failed", "ring-timeout", "error",
       r"(?:ring (?P<ring>\S+) test failed|IB test failed on (?P<ib_ring>\S+?)\.?) \((?P<rc>-?\d+)\)",
       "ring test failed on {device}: {ring}{ib_ring} ({rc})", key=("ring", "ib_ring"),
       meaning="the engine did not answer a test submission (-110 = timed out): the block is hung"),
    _r("amdgpu.ib_ring_test_failed", "ring-timeout", "error", r"ib ring test failed \((?P<rc>-?\d+)\)",
       "IB ring tests failed on {device} ({rc})"),
    _r("amdgpu.ring_reset", "ring-timeout", "warning", r"Starting (?P<ring>\S+) ring reset",
       "ring {ring} reset started on {device}", key=("ring",)),
    _r("amdgpu.ring_reset_result", "ring-timeout", "info",
       r"Ring (?P<ring>\S+) reset (?P<result>succeeded|failed)", "ring {ring} reset {result} on {device}",
       key=("ring", "result")),
    _r("amdgpu.qcm_fence_timeout", "ring-timeout", "error", r"qcm fence wait loop timeout expired",
       "QCM fence wait timed out on {device} (queue preemption failed)",
       meaning="the compute firmware (CP) did not preempt the queues in time; KFD cannot evict or "
               "suspend processes and usually escalates to a GPU reset"),
    _r("amdgpu.cp_unrecoverable", "ring-timeout", "error",
       r"The cp might be in an unrecoverable state", "command processor may be unrecoverable on {device}"),
    _r("amdgpu.vm_flush_timeout", "ring-timeout", "error", r"Timeout waiting for VM flush (?:hub|ACK)[: ]*(?P<hub>\d*)",
       "VM flush timed out on {device} (hub {hub})", key=("hub",)),
    _r("amdgpu.sq_intr", "ring-timeout", "warning", r"sq_intr: error",
       "shader (SQ) error interrupts on {device}",
       meaning="waves raised errors (illegal instruction, memory violation); read with the page faults"),
    _r("kernel.hung_task", "hung-task", "error",
       r"INFO: task (?P<proc>.+?):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds",
       "hung task {proc} (blocked > {secs}s)", key=("proc",), victim=("proc", "pid"),
       meaning="a task sat in uninterruptible sleep (D) too long; with a GPU this is often a wedged ioctl",
       follow=(r"^\s*task:(?P<task>\S+)\s+state:(?P<task_state>\w)", r"Workqueue: (?P<workqueue>.+?)\s*$")),
    _r("kernel.hung_task_state", "hung-task", "error",
       r"^\s*task:(?P<proc>\S+)\s+state:(?P<state>D)\s+.*?\bpid:\s*(?P<pid>\d+)",
       "task {proc} stuck in D state", key=("proc",), victim=("proc", "pid"),
       meaning="the scheduler dumped a blocked task; the call trace after it shows where it waits"),
    _r("kernel.soft_lockup", "hung-task", "error",
       r"soft lockup - CPU#(?P<cpu>\d+) stuck for (?P<secs>\d+)s! \[(?P<proc>.+?):(?P<pid>\d+)\]",
       "soft lockup on CPU {cpu} in {proc}", key=("proc",), victim=("proc", "pid")),
    _r("kernel.rcu_stall", "hung-task", "error",
       r"rcu(?:_preempt|_sched|:)\s*(?:INFO: rcu_(?:preempt|sched) )?(?:self-)?detected (?:stalls?|expedited stalls)",
       "RCU stall detected"),
    _r("kernel.workqueue_hog", "hung-task", "info",
       r"workqueue: (?P<work>\S+) .*hogged CPU for >(?P<us>\d+)us", "workqueue {work} hogged a CPU",
       key=("work",)),
    _r("kernel.rt_throttling", "kernel", "warning", r"sched: RT throttling activated", "RT throttling activated"),

    # --- GPU resets ------------------------------------------------------------------------
    _r("amdgpu.reset_begin", "gpu-reset", "error",
       r"GPU reset begin!(?:\.?\s*Source:\s*(?P<reset_source>\d+))?", "GPU reset began on {device}",
       meaning="the driver reset the GPU: every process using it lost its queues (and maybe VRAM)"),
    _r("amdgpu.reset_succeeded", "gpu-reset", "info",
       r"GPU reset(?:\((?P<reset_no>\d+)\))? succeeded(?!, trying)", "GPU reset succeeded on {device}"),
    _r("amdgpu.reset_resuming", "gpu-reset", "info", r"GPU reset succeeded, trying to resume",
       "GPU reset done, resuming on {device}"),
    _r("amdgpu.reset_failed", "gpu-reset", "critical",
       r"(?:GPU reset(?:\((?P<reset_no>\d+)\))? failed|(?P<method>[Mm][Oo][Dd][Ee] ?[012]|BACO) reset failed"
       r"|asic reset on init failed|GPU Recovery Failed)", "GPU reset FAILED on {device}",
       meaning="the GPU did not come back: the node needs a reboot (or a power cycle)"),
    _r("amdgpu.reset_method", "gpu-reset", "info",
       r"(?:^|: )(?P<method>MODE[012]|BACO|PCI CONFIG) reset\s*$",
       "{method} reset on {device}", key=("method",)),
    _r("amdgpu.recovery_disabled", "gpu-reset", "error", r"GPU recovery disabled",
       "GPU recovery is disabled on {device} (amdgpu.gpu_recovery=0?): hangs will not be reset"),
    _r("amdgpu.wedged", "gpu-reset", "warning", r"device wedged, but recovered through reset",
       "device was wedged and recovered through a reset ({device})"),
    _r("amdgpu.vram_lost", "gpu-reset", "error", r"VRAM is lost due to GPU reset",
       "VRAM contents lost in a GPU reset on {device}",
       meaning="every buffer in VRAM is gone: engines on this GPU must restart"),
    _r("amdgpu.devcoredump", "gpu-reset", "info",
       r"Check your (?P<path>/sys/class/drm/card\d+/device/devcoredump/data)",
       "device coredump written: {path}", key=("path",),
       meaning="read it before the next reset overwrites it (it is kept only a few minutes)"),
    _r("nvidia.gpu_reset", "gpu-reset", "error", r"NVRM: .*GPU (?:reset|recovery) (?:failed|required)",
       "NVIDIA GPU reset/recovery needed or failed on {device}"),

    # --- RAS / ECC / machine checks ---------------------------------------------------------
    _r("ras.correctable", "ras", "warning",
       r"(?P<n>\d+) (?:new )?correctable hardware errors? detected in (?:total in )?(?P<block>\w+) [Bb]lock",
       "RAS correctable errors in {block} on {device}", key=("block",)),
    _r("ras.uncorrectable", "ras", "critical",
       r"(?P<n>\d+) (?:new )?uncorrectable hardware errors? detected in (?:total in )?(?P<block>\w+) [Bb]lock",
       "RAS UNCORRECTABLE errors in {block} on {device}", key=("block",),
       meaning="data in this block may be wrong; the GPU resets or needs replacement if it repeats"),
    _r("ras.uncorrectable_event", "ras", "critical",
       r"uncorrectable hardware error\((?P<event>\w+)\) detected", "uncorrectable hardware error {event} on {device}",
       key=("event",), meaning="a RAS interrupt: the driver resets the GPU to contain it"),
    _r("ras.deferred", "ras", "error",
       r"(?P<n>\d+) (?:new )?deferred hardware errors? detected in (?:total in )?(?P<block>\w+) [Bb]lock",
       "RAS deferred errors in {block} on {device}", key=("block",)),
    _r("ras.poison_consumed", "ras", "critical", r"[Pp]oison is consumed by client (?P<client>\d+)",
       "RAS poison consumed by client {client} on {device}", key=("client",)),
    _r("ras.poison_created", "ras", "error", r"Poison is created", "RAS poison created on {device}"),
    _r("ras.bad_page_threshold", "ras", "critical",
       r"Saved bad pages (?P<pages>\d+) reaches threshold value (?P<limit>\d+)",
       "bad-page threshold reached on {device} ({pages} pages)",
       meaning="the GPU has retired as many pages as allowed: plan its replacement"),
    _r("ras.ecc_fatal", "ras", "critical", r"GPU detected ECC Fatal Error", "ECC fatal error on {device}"),
    _r("ras.whole_gpu_reset", "ras", "error", r"Issuing Whole GPU reset", "whole-GPU reset issued on {device}"),
    _r("ras.ecc_active", "ras", "info", r"(?P<kind>MEM|SRAM) ECC is (?P<state>active|not presented)",
       "{kind} ECC {state} on {device}", key=("kind", "state")),
    _r("ras.ip_lost", "ras", "warning", r"state may lost due to RAS (?P<event>\w+)",
       "engine state lost because of RAS event {event}", key=("event",)),
    _r("ras.sram_ecc", "ras", "warning", r"sram_ecc", "SRAM ECC event on {device}"),
    _r("ras.cper_severity", "ras", "warning", r"\[Hardware Error\]:\s+event severity: (?P<sev>\w+)",
       "platform hardware error record: severity {sev}", key=("sev",)),
    _r("ras.aca", "ras", "error", r"Accelerator Check Architecture", "ACA error record (AMD accelerator check)"),
    _r("ras.hw_error_corrected", "ras", "warning", r"\[Hardware Error\]: Corrected error",
       "platform corrected hardware error"),
    _r("ras.apei", "ras", "error", r"Hardware error from APEI Generic Hardware Error Source",
       "APEI hardware error (firmware-first)"),
    _r("ras.error_address", "ras", "error", r"Error Address", "hardware error address reported"),
    _r("ras.mce", "ras", "error",
       r"(?:Machine check events logged|\[Hardware Error\]: (?:CPU \d+: )?Machine Check)",
       "machine check exception logged"),
    _r("ras.edr", "ras", "error", r"EDR: EDR event received", "PCIe EDR event"),

    # --- PCIe AER / link ----------------------------------------------------------------------
    _r("pcie.aer_corrected", "pcie-aer", "warning",
       r"AER: (?P<kind>(?:Multiple )?Correct(?:ed|able)) error(?: message)? received(?: from|:)\s*(?:id=)?(?P<from>\S+)",
       "PCIe AER corrected errors reported by {from}", key=("from",),
       meaning="the link recovered by itself; many of them mean a marginal link (riser, slot, cable, speed)"),
    _r("pcie.aer_uncorrected", "pcie-aer", "error",
       r"AER: (?P<kind>(?:Multiple )?Uncorrect(?:ed|able) \((?:Non-Fatal|Fatal)\)) error(?: message)? received"
       r"(?: from|:)\s*(?:id=)?(?P<from>\S+)",
       "PCIe AER {kind} error reported by {from}", key=("kind", "from"),
       meaning="a PCIe transaction was lost; the device below it may have been reset or dropped"),
    _r("pcie.recovery_failed", "pcie-aer", "critical", r"AER: Device recovery failed",
       "PCIe device recovery FAILED after an AER error ({device})",
       meaning="the device behind this port did not come back: expect it to be gone until a reboot"),
    _r("pcie.bus_error", "pcie-aer", "warning",
       r"PCIe Bus Error: severity=(?P<sev>[\w ()-]+?), type=(?P<type>[\w ]+?)(?:,|$)",
       "PCIe bus error on {device}: {sev} / {type}", key=("sev", "type")),
    _r("pcie.aer_status", "pcie-aer", "warning",
       r"(?P<which>aer_status|aer_cor_status|aer_uncor_status): (?P<status>0x[0-9a-fA-F]+)",
       "PCIe AER {which} on {device}", key=("which",)),
    _r("pcie.aer_uncor_severity", "pcie-aer", "error", r"aer_uncor_severity: (?P<sev>0x[0-9a-fA-F]+)",
       "PCIe AER uncorrectable severity on {device}"),
    _r("pcie.tlp_header", "pcie-aer", "info", r"TLP Header: ", "PCIe TLP header logged on {device}"),
    _r("pcie.card_not_present", "pcie-aer", "critical", r"Slot\((?P<slot>[^)]+)\): Card not present",
       "PCIe slot {slot}: card not present", key=("slot",)),
    _r("pcie.link_down", "pcie-aer", "critical", r"Slot\((?P<slot>[^)]+)\): Link Down",
       "PCIe slot {slot}: link down", key=("slot",)),
    _r("pcie.dpc", "pcie-aer", "error", r"DPC: (?P<what>containment event|.+)", "PCIe DPC: {what}", key=("what",)),
    _r("pcie.clock_config", "pcie-aer", "warning", r"current common clock configuration is inconsistent",
       "PCIe common clock configuration inconsistent on {device}"),

    # --- KFD (compute) ------------------------------------------------------------------------
    _r("kfd.evict_pasid", "kfd", "info", r"Evicting PASID (?P<pasid>\w+) queues",
       "KFD evicted the queues of PASID {pasid}", key=("pasid",),
       meaning="memory pressure or a userptr invalidation moved this process's buffers"),
    _r("kfd.restore_pasid", "kfd", "info", r"Restoring PASID (?P<pasid>\w+) queues",
       "KFD restored the queues of PASID {pasid}", key=("pasid",)),
    _r("kfd.evict_failed", "kfd", "error", r"Failed to evict (?:process queues|queue (?P<queue>\d+))",
       "KFD failed to evict queues on {device}",
       meaning="the scheduler firmware did not respond; KFD escalates to a GPU reset"),
    _r("kfd.quiesce_failed", "kfd", "error", r"Failed to quiesce KFD", "KFD failed to quiesce (before reset)"),
    _r("kfd.restore_failed", "kfd", "error",
       r"(?:Failed to restore (?:process queues|queue (?P<queue>\d+))|Failed to restore queues of process pid (?P<pid>\d+)"
       r"|Restore process pid (?P<rpid>\d+) failed during resume)",
       "KFD failed to restore queues on {device}", victim=("pid", "rpid")),
    _r("kfd.suspend_failed", "kfd", "error", r"Failed to suspend process pid (?P<pid>\d+)",
       "KFD failed to suspend process {pid}", key=("pid",), victim=("pid",)),
    _r("kfd.queue_evicted", "kfd", "warning", r"Freeing queue vital buffer (?P<addr>0x[0-9a-fA-F]+), queue evicted",
       "KFD freed vital buffers of evicted queues",
       meaning="a process freed memory its (evicted) queue still needed"),
    _r("kfd.sdma_oversubscription", "kfd", "warning", r"Over-subscription is not allowed for SDMA",
       "SDMA queue over-subscription refused",
       meaning="more SDMA queues were requested than the hardware has; some DMA work queued behind others"),
    _r("kfd.userptr", "kfd", "error",
       r"(?i)(?:\buser ?(?:ptr|pages)\b.*\b(?:fail\w*|invalid\w*)\b|\bfail\w*\b.*\buser ?(?:ptr|pages)\b"
       r"|Failed to register MMU notifier)",
       "userptr (host memory registration) failure on {device}",
       meaning="pinning or mapping registered host memory failed: check the KFD system-memory limit "
               "(amdgpu.no_system_mem_limit), memlock limits and how many GPUs each process sees"),
    _r("kfd.gpuvm_map_failed", "kfd", "error",
       r"(?:Failed to map bo to gpuvm|update_gpuvm_pte\(\) failed|amdgpu_vm_bo_update failed"
       r"|Failed to map peer:(?P<peer>\S+) mem_domain:(?P<domain>\d+))",
       "mapping buffers into the GPU's VM failed on {device}",
       meaning="KFD could not map memory into a GPU page table (often after a hang or with host memory "
               "registered to many GPUs)"),
    _r("kfd.validate_failed", "kfd", "error", r"failed to validate (?P<what>PT BOs|PD|BOs?)\b",
       "KFD failed to validate {what} on {device}", key=("what",),
       meaning="page-table buffers could not be made resident (memory pressure or a dying GPU)"),
    _r("amdgpu.vm_stats_leak", "kfd", "warning",
       r"VM memory stats for proc (?P<proc>.+?)\((?P<pid>\d+)\) task .*? is non-zero when fini",
       "GPU memory still accounted to {proc} when its VM was torn down", key=("proc",), victim=("proc", "pid"),
       meaning="the process exited with GPU buffers still charged to it: look for residual VRAM"),
    _r("amdgpu.cs_no_memory", "kfd", "warning", r"Not enough memory for command submission",
       "not enough memory for command submission on {device}",
       meaning="VRAM/GTT was exhausted for a submission: see residual VRAM and the OOM kills"),

    # --- MES / KIQ (scheduler firmware) -------------------------------------------------------
    _r("mes.no_response", "mes-kiq", "error",
       r"MES failed to respon(?:d|se) (?:to )?msg=(?P<msg>\S+(?: \([A-Z_]+\))?)",
       "MES firmware did not answer {msg} on {device}", key=("msg",),
       meaning="the micro-engine scheduler is stuck; queues cannot be added/removed until a GPU reset"),
    _r("mes.remove_queue_failed", "mes-kiq", "error",
       r"(?:failed to remove hardware queue from MES|(?:remove_all_(?:kfd_)?queues_mes: )?Failed to remove queue (?P<queue>\d+))",
       "removing a hardware queue through MES failed on {device}"),
    _r("mes.unrecoverable", "mes-kiq", "error", r"MES might be in unrecoverable state",
       "MES may be unrecoverable on {device} (reset requested)"),
    _r("mes.ring_full", "mes-kiq", "error", r"MES ring buffer is full", "MES ring buffer full on {device}"),
    _r("mes.misc_failed", "mes-kiq", "error",
       r"failed to (?P<op>unmap legacy queue|reg_write_reg_wait|set_shader_debugger|suspend (?:all )?gangs(?: from MES)?)",
       "MES operation failed on {device}: {op}", key=("op",)),
    _r("mes.suspend_queues_failed", "mes-kiq", "error", r"Suspending all queues failed",
       "suspending all queues failed on {device}"),
    _r("kiq.fence_timeout", "mes-kiq", "error", r"timeout waiting for kiq fence",
       "KIQ fence timed out on {device}",
       meaning="the kernel interface queue did not complete a register write: the GPU is hung"),
    _r("amdgpu.vpe_reset_failed", "mes-kiq", "warning", r"VPE queue reset failed", "VPE queue reset failed on {device}"),

    # --- amdgpu firmware / init / power -------------------------------------------------------
    _r("amdgpu.smu_msg_failed", "firmware", "error",
       r"Failed to send message (?P<msg>0x[0-9a-fA-F]+), response (?P<resp>0x[0-9a-fA-F]+)",
       "SMU did not accept message {msg} on {device}", key=("msg",),
       meaning="the power-management firmware is not answering (often after a failed reset)"),
    _r("amdgpu.powerplay_failed", "firmware", "error", r"\[powerplay\].*?(?P<what>Failed to [^!]+)",
       "powerplay (SMU) operations failed on {device}"),
    _r("amdgpu.ip_init_failed", "firmware", "critical",
       r"(?P<stage>hw_init|sw_init|resume|suspend) of IP block <(?P<block>\w+)> failed",
       "amdgpu {stage} of IP block {block} failed", key=("stage", "block")),
    _r("amdgpu.fatal_init", "firmware", "critical", r"Fatal error during GPU init",
       "fatal error during GPU init on {device}"),
    _r("amdgpu.tmr_terminate", "firmware", "error", r"Failed to terminate tmr", "PSP: failed to terminate TMR"),
    _r("amdgpu.cf_state", "firmware", "error", r"Failed to disallow cf state", "failed to disallow CF state"),
    _r("amdgpu.throttled", "firmware", "warning", r"WARN: GPU is throttled", "GPU throttled on {device}"),

    # --- NVIDIA (Xids are decoded in analyze via xid.py) ------------------------------------------
    _r("nvidia.fallen_off_bus", "xid", "critical",
       r"NVRM: (?:The NVIDIA GPU (?P<dev1>\S+)|GPU at (?:PCI:)?(?P<dev2>[\w:.]+)|GPU (?P<dev3>[\w:.]+):).*?fallen off the bus",
       "NVIDIA GPU {device} has fallen off the bus",
       meaning="the GPU stopped answering on PCIe (power, thermal, riser/slot or hardware): every process on "
               "it is lost; reset or reboot, and check the board if it repeats"),
    _r("nvidia.probe_failed", "xid", "error", r"NVRM: The NVIDIA probe routine failed for (?P<n>\d+) device",
       "NVIDIA driver could not initialise {n} device(s)"),
    _r("nvidia.rm_init_failed", "xid", "critical", r"NVRM: .*RmInitAdapter failed", "NVIDIA RmInitAdapter failed on {device}"),
    _r("nvidia.peermem", "xid", "warning", r"nvidia-peermem .*ERROR (?P<what>.+)", "nvidia-peermem: {what}",
       key=("what",)),

    # --- application output (a runtime's stderr given to triage) ---------------------------------
    _r("app.segmentation_fault", "segfault", "error", r"[Ss]egmentation [Ff]ault",
       "a process reported a segmentation fault",
       meaning="application output: the kernel's segfault line (with library and offset) is in dmesg"),
    _r("app.core_dumped", "segfault", "warning", r"(?P<how>Aborted|Segmentation fault|Bus error) \(core dumped\)",
       "a process died with a core dump ({how})", key=("how",),
       meaning="look for it with coredumpctl list (in the bundle under node/)"),

    # --- host memory ------------------------------------------------------------------------
    _r("oom.invoked", "oom", "info",
       r"(?P<proc>\S+) invoked oom-killer: gfp_mask=(?P<gfp>\S+), order=(?P<order>\d+)",
       "{proc} triggered the OOM killer", key=("proc",)),
    _r("oom.reaped", "oom", "info", r"oom_reaper: reaped process (?P<pid>\d+) \((?P<proc>[^)]*)\)",
       "OOM reaper freed {proc}", key=("proc",)),

    # --- other kernel trouble (node-scraper parity) --------------------------------------------
    _r("kernel.panic", "kernel", "critical", r"(?i)\bkernel panic\b(?: - not syncing: (?P<why>.*))?",
       "kernel panic"),
    _r("kernel.gpf", "kernel", "error", r"^(?!traps: ).*general protection fault", "kernel general protection fault"),
    _r("fs.ext4_error", "storage", "error", r"EXT4-fs error \(device (?P<dev>[^)]+)\)",
       "ext4 filesystem error on {dev}", key=("dev",)),
    _r("fs.buffer_io", "storage", "error", r"Buffer I/O error on dev(?:ice)? (?P<dev>\w+)",
       "buffered I/O error on {dev}", key=("dev",)),
    _r("fs.journal", "storage", "warning",
       r"(?:Failed to read journal file|journal corrupted or uncleanly shut down)", "systemd journal damaged"),
    _r("bios.acpi", "bios", "warning", r"ACPI (?P<kind>BIOS Error|Error)", "ACPI {kind}", key=("kind",)),
    _r("bios.mmp", "bios", "warning", r"Failed to load MMP firmware (?P<fw>\S+)", "MMP firmware {fw} failed to load"),
    _r("bios.sgx", "bios", "info", r"x86/cpu: SGX disabled by BIOS", "SGX disabled by BIOS"),
    _r("io.lnet", "io", "warning", r"(?i)LNetError:.*(?:No matching interfaces|starting up LNI)", "LNet error"),
    _r("io.lustre", "io", "warning", r"(?i)LustreError:.*network initiali[sz]ation failed",
       "Lustre network initialisation failed"),
)
