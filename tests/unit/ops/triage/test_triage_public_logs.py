"""Triage patterns checked against more real kernel-log lines, quoted from public issue threads.

Each block is copied line for line from the thread named above it (only the lines shown); these are
events the shared fixtures do not contain: PCIe AER, userptr failures, init failures, hung tasks, Xid 79.
"""

from __future__ import annotations

from gpuwarden.ops.triage import analyze_text

# github.com/ROCm/legacy-rocm-build/issues/32 (description, 2016-09-25)
AER_FATAL = """\
[  942.180230] pcieport 0000:00:1c.4: AER: Uncorrected (Fatal) error received: id=00e4
[  942.180239] pcieport 0000:00:1c.4: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=00e4(Receiver ID)
[  942.180327] pcieport 0000:00:1c.4:   device [8086:a114] error status/mask=00040000/00000000
[  942.180392] pcieport 0000:00:1c.4:    [18] Malformed TLP          (First)
[  942.180444] pcieport 0000:00:1c.4:   TLP Header: 6c000002 06000000 0000000f b76e6008
[  942.180511] pcieport 0000:00:1c.4: broadcast error_detected message
[  942.180513] amdgpu 0000:06:00.0: device has no AER-aware driver
[  942.180514] snd_hda_intel 0000:06:00.1: device has no AER-aware driver
[  943.188998] pcieport 0000:00:1c.4: Root Port link has been reset
[  943.189001] pcieport 0000:00:1c.4: AER: Device recovery failed
"""

# github.com/pop-os/pop/issues/3363 (comment by Vetpetmon): syslog format, "Correctable" wording
AER_CORRECTABLE = """\
Sep 19 16:18:02 bubz kernel: [68183.615790] pcieport 0000:00:03.1: AER: Correctable error message received from 0000:00:00.0
Sep 19 16:18:02 bubz kernel: [68183.615810] pcieport 0000:00:03.1: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitter ID)
Sep 19 16:18:02 bubz kernel: [68183.615818] pcieport 0000:00:03.1:   device [1022:1453] error status/mask=00001000/00006000
Sep 19 16:18:02 bubz kernel: [68183.615826] pcieport 0000:00:03.1:    [12] Timeout               
Sep 19 16:18:02 bubz kernel: [68183.637883] pcieport 0000:00:03.1: AER: Correctable error message received from 0000:00:00.0
"""

# github.com/ROCm/legacy-rocm-build/issues/343 (description, 2018-02-21)
USERPTR = """\
[ 2276.529269] Evicting PASID 1 queues
[ 2276.535340] kfd2kgd: update_invalid_user_pages: Failed to get user pages: -14
[ 2276.535357] kfd2kgd: update_invalid_user_pages: Failed to get user pages: -14
[ 2276.535433] Restoring PASID 1 queues
"""

# github.com/ellyq/coreboot/issues/4 (comment by ellyq)
INIT_FAILURE = """\
[    5.101754] amdgpu 0000:03:00.0: [drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring mes_kiq_3.1.0 test failed (-110)
[    5.112738] [drm:amdgpu_gfx_enable_kcq [amdgpu]] *ERROR* KCQ enable failed
[    5.119896] [drm:amdgpu_device_init [amdgpu]] *ERROR* hw_init of IP block <gfx_v11_0> failed -110
[    5.129027] amdgpu 0000:03:00.0: amdgpu: amdgpu_device_ip_init failed
[    5.135530] amdgpu 0000:03:00.0: amdgpu: Fatal error during GPU init
"""

# github.com/ROCm/amdgpu/issues/150 (comment by kotee4ko)
HUNG_TASK = """\
[279123.179003] INFO: task ipython3:827204 blocked for more than 120 seconds.
[279123.180183]       Tainted: G        W  OE      6.2.0-35-generic #35~22.04.1-Ubuntu
[279123.181403] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[279123.182617] task:ipython3        state:D stack:0     pid:827204 ppid:742680 flags:0x00004002
[279123.182617] Call Trace:
"""

# github.com/ROCm/legacy-rocm-build/issues/2642 (description): inline process info, IOMMU fault
PAGE_FAULT_INLINE = """\
[  262.094619] amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:158 vmid:0 pasid:0, for process  pid 0 thread  pid 0)
[  262.094625] amdgpu 0000:03:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0010 address=0x64a7f000 flags=0x0000]
[  262.094626] amdgpu 0000:03:00.0: amdgpu:   in page starting at address 0x0000000000000000 from client 10
[  262.094630] amdgpu 0000:03:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00000B3C
[  262.094634] amdgpu 0000:03:00.0: amdgpu:    Faulty UTCL2 client ID: CPC (0x5)
"""

# github.com/ROCm/legacy-rocm-build/issues/1399 (comment by dshm): mmhub no-retry fault with a process
MMHUB_FAULT = """\
[443872.200966] amdgpu 0000:3d:00.0: amdgpu: [mmhub0] no-retry page fault (src_id:0 ring:40 vmid:8 pasid:32770, for process python pid 54841 thread python pid 54841)
[443872.200970] amdgpu 0000:3d:00.0: amdgpu:   in page starting at address 0x00007fe7bc301000 from client 18
[443872.200973] amdgpu 0000:3d:00.0: amdgpu: VM_L2_PROTECTION_FAULT_STATUS:0x00840051
"""

# github.com/NVIDIA/open-gpu-kernel-modules/issues/1151 (description)
XID_79 = """\
May 18 19:02:39 kernel: NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae
May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
May 18 19:02:39 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.
"""

# github.com/ROCm/legacy-rocm-build/issues/365 (comment by DiamondLovesYou)
OOPS = "[  236.421417] BUG: unable to handle kernel NULL pointer dereference at 0000000000000018\n"


def rules(text: str) -> dict:
    return {f.rule: f for f in analyze_text(text).findings}


def test_pcie_aer_fatal_and_failed_recovery():
    r = rules(AER_FATAL)
    assert r["pcie.aer_uncorrected"].title == "PCIe AER Uncorrected (Fatal) error reported by 00e4"
    assert r["pcie.bus_error"].title == "PCIe bus error on 0000:00:1c.4: Uncorrected (Fatal) / Transaction Layer"
    assert r["pcie.recovery_failed"].severity == "critical"
    assert "pcie.tlp_header" in r


def test_pcie_aer_correctable_in_syslog():
    r = rules(AER_CORRECTABLE)
    f = r["pcie.aer_corrected"]
    assert f.count == 2 and f.severity == "warning" and "0000:00:00.0" in f.title


def test_userptr_failures():
    r = rules(USERPTR)
    assert r["kfd.userptr"].count == 2
    assert {"kfd.evict_pasid", "kfd.restore_pasid"} <= set(r)


def test_driver_init_failure():
    r = rules(INIT_FAILURE)
    assert "gfx_v11_0" in r["amdgpu.ip_init_failed"].title
    assert r["amdgpu.fatal_init"].severity == "critical"
    assert "mes_kiq_3.1.0" in r["amdgpu.ring_test_failed"].title


def test_hung_task_with_its_state_line_is_one_finding():
    r = rules(HUNG_TASK)
    f = r["kernel.hung_task"]
    assert f.victims == [{"process": "ipython3", "pid": 827204}]
    assert f.details["task_state"] == ["D"]
    assert "kernel.hung_task_state" not in r


def test_page_fault_inline_process_forms():
    r = rules(PAGE_FAULT_INLINE)
    f = r["amdgpu.page_fault"]
    assert f.victims == [] and f.details["pasid"] == ["0"] and f.details["utcl2_client"] == ["CPC"]
    assert "iommu.io_page_fault" in r
    f = rules(MMHUB_FAULT)["amdgpu.page_fault"]
    assert "mmhub0" in f.title and f.victims == [{"process": "python", "pid": 54841, "thread": "python"}]
    assert f.details["retry"] == ["no-retry"] and f.details["status_reg"] == ["VM_L2_PROTECTION_FAULT_STATUS"]


def test_xid_79_and_fallen_off_the_bus():
    report = analyze_text(XID_79)
    r = {f.rule: f for f in report.findings}
    assert r["nvidia.xid"].details["xid"] == 79 and r["nvidia.xid"].severity == "critical"
    assert r["nvidia.fallen_off_bus"].devices == ["0000:2b:00.0"]
    assert any("GPU-0b11d014" in n for n in report.notes)


def test_kernel_oops():
    assert rules(OOPS)["kernel.page_fault_oops"].severity == "critical"


# One line per event class that AMD node-scraper's dmesg analyzer checks (its ERROR_REGEX messages, as
# listed in tests/fixtures/node_scraper_dmesg_patterns.md), written in the kernel's wording: our
# library must name each of them too.
NODE_SCRAPER_PARITY = {
    "Out of memory error": ("Out of memory: Killed process 4242 (python3) total-vm:1024kB, anon-rss:512kB, "
                            "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0", "oom.kill"),
    "I/O Page Fault": ("amdgpu 0000:03:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0010 address=0x1 "
                       "flags=0x0000]", "iommu.io_page_fault"),
    "Kernel Panic": ("Kernel panic - not syncing: Fatal exception", "kernel.panic"),
    "SQ Interrupt": ("amdgpu 0000:65:00.0: amdgpu: sq_intr: error, detail 0x00000000, type 2", "amdgpu.sq_intr"),
    "SRAM ECC": ("amdgpu 0000:e3:00.0: amdgpu: sram_ecc error count 1", "ras.sram_ecc"),
    "IP hardware init error": ("[drm:amdgpu_device_init [amdgpu]] *ERROR* hw_init of IP block <gfx_v9_0> failed -110",
                               "amdgpu.ip_init_failed"),
    "IP software init error": ("[drm:amdgpu_device_init [amdgpu]] *ERROR* sw_init of IP block <psp> failed -22",
                               "amdgpu.ip_init_failed"),
    "Real Time throttling activated": ("sched: RT throttling activated", "kernel.rt_throttling"),
    "RCU preempt detected stalls": ("rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:", "kernel.rcu_stall"),
    "RCU preempt self-detected stall": ("rcu: INFO: rcu_preempt self-detected stall on CPU", "kernel.rcu_stall"),
    "QCM fence timeout": ("amdgpu: qcm fence wait loop timeout expired", "amdgpu.qcm_fence_timeout"),
    "General protection fault": ("general protection fault, probably for non-canonical address 0xdead: 0000 [#1]",
                                 "kernel.gpf"),
    "Segmentation fault": ("Segmentation fault (core dumped)", "app.segmentation_fault"),
    "Failed to disallow cf state": ("amdgpu: Failed to disallow cf state", "amdgpu.cf_state"),
    "Failed to terminate tmr": ("[drm:psp_hw_fini [amdgpu]] *ERROR* Failed to terminate tmr", "amdgpu.tmr_terminate"),
    "Suspend of IP block failed": ("[drm] *ERROR* suspend of IP block <gfx_v9_0> failed -110", "amdgpu.ip_init_failed"),
    "Page Fault": ("BUG: unable to handle page fault for address: ffffb0d4c0a7f000", "kernel.page_fault_oops"),
    "Fatal error during GPU init": ("amdgpu 0000:03:00.0: amdgpu: Fatal error during GPU init", "amdgpu.fatal_init"),
    "PCIe AER Error Status": ("pcieport 0000:00:01.1: AER: aer_status: 0x00000040, aer_mask: 0x00002000",
                              "pcie.aer_status"),
    "PCIe AER Correctable Error Status": ("pcieport 0000:00:01.1: aer_cor_status: 0x00000040, aer_cor_mask: 0x00002000",
                                          "pcie.aer_status"),
    "PCIe AER Uncorrectable Error Status": ("pcieport 0000:00:01.1: aer_uncor_status: 0x00100000, aer_uncor_mask: 0x0",
                                            "pcie.aer_status"),
    "PCIe AER Uncorrectable Error Severity": ("pcieport 0000:00:01.1: aer_uncor_severity: 0x00440030",
                                              "pcie.aer_uncor_severity"),
    "Failed to read journal file": ("systemd-journald[512]: Failed to read journal file /var/log/journal/x.journal",
                                    "fs.journal"),
    "ACPI BIOS Error": ("ACPI BIOS Error (bug): Could not resolve symbol [\\_SB.PCI0], AE_NOT_FOUND", "bios.acpi"),
    "ACPI Error": ("ACPI Error: Aborting method \\_SB.PCI0 due to previous error (AE_NOT_FOUND)", "bios.acpi"),
    "Filesystem corrupted!": ("EXT4-fs error (device nvme0n1p2): ext4_lookup:1855: inode #2: comm ls: bad entry",
                              "fs.ext4_error"),
    "Error in buffered IO": ("Buffer I/O error on dev sda1, logical block 0, async page read", "fs.buffer_io"),
    "PCIe card no longer present": ("pcieport 0000:00:03.1: pciehp: Slot(2): Card not present", "pcie.card_not_present"),
    "PCIe Link Down": ("pcieport 0000:00:03.1: pciehp: Slot(2): Link Down", "pcie.link_down"),
    "Mismatched clock configuration": ("pcieport 0000:00:03.1: ASPM: current common clock configuration is "
                                       "inconsistent, reconfiguring", "pcie.clock_config"),
    "RAS Correctable Error": ("amdgpu 0000:05:00.0: amdgpu: 3 correctable hardware errors detected in total in umc block",
                              "ras.correctable"),
    "RAS Uncorrectable Error": ("amdgpu 0000:05:00.0: amdgpu: 1 uncorrectable hardware errors detected in umc block",
                                "ras.uncorrectable"),
    "RAS Deferred Error": ("amdgpu 0000:05:00.0: amdgpu: 2 deferred hardware errors detected in umc block",
                           "ras.deferred"),
    "RAS Corrected PCIe Error": ("{1}[Hardware Error]: event severity: corrected", "ras.cper_severity"),
    "GPU Reset": ("amdgpu 0000:05:00.0: amdgpu: GPU reset begin!", "amdgpu.reset_begin"),
    "GPU reset failed": ("amdgpu 0000:05:00.0: amdgpu: GPU reset(2) failed", "amdgpu.reset_failed"),
    "ACA Error": ("amdgpu 0000:05:00.0: amdgpu: HW error detected by Accelerator Check Architecture",
                  "ras.aca"),
    "MCE Corrected/Uncorrected Error": ("mce: [Hardware Error]: Machine check events logged", "ras.mce"),
    "Mode 2 Reset Failed": ("amdgpu 0000:05:00.0: amdgpu: Mode2 reset failed", "amdgpu.reset_failed"),
    "RAS Corrected Error": ("{1}[Hardware Error]: Corrected error, no action required.", "ras.hw_error_corrected"),
    "SGX Error": ("x86/cpu: SGX disabled by BIOS.", "bios.sgx"),
    "MMP Error": ("4xxx 0000:6b:00.0: Failed to load MMP firmware qat_4xxx_mmp.bin", "bios.mmp"),
    "GPU Throttled": ("amdgpu 0000:05:00.0: amdgpu: WARN: GPU is throttled, expect performance decrease.",
                      "amdgpu.throttled"),
    "RAS Poison Consumed": ("amdgpu 0000:05:00.0: amdgpu: poison is consumed by client 12, kick off gpu reset flow",
                            "ras.poison_consumed"),
    "RAS Poison created": ("amdgpu 0000:05:00.0: amdgpu: Poison is created", "ras.poison_created"),
    "Bad page threshold exceeded": ("amdgpu: Saved bad pages 128 reaches threshold value 128",
                                    "ras.bad_page_threshold"),
    "RAS Hardware Error": ("{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1",
                           "ras.apei"),
    "Error Address": ("[Hardware Error]: Error Address: 0x0000000123456000", "ras.error_address"),
    "RAS EDR Event": ("pcieport 0000:00:01.1: EDR: EDR event received", "ras.edr"),
    "DPC Event": ("pcieport 0000:00:01.1: DPC: containment event, status:0x1f01 source:0x0000", "pcie.dpc"),
    "LNet: ko2iblnd": ("LNetError: 120-3: Refusing connection from 10.0.0.1 ko2iblnd: No matching interfaces",
                       "io.lnet"),
    "LNet: Error starting up LNI": ("LNetError: 105-4: Error -100 starting up LNI o2ib", "io.lnet"),
    "Lustre network init": ("LustreError: 1234:0:(events.c:540:ptlrpc_init_portals()) network initialisation failed",
                            "io.lustre"),
}


def test_node_scraper_parity():
    missing = {}
    for what, (line, rule) in NODE_SCRAPER_PARITY.items():
        found = {f.rule for f in analyze_text(f"[  100.000000] {line}\n").findings}
        if rule not in found:
            missing[what] = sorted(found)
    assert not missing, missing
