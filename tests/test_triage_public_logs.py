"""Triage patterns checked against more real kernel-log lines, quoted from public issue threads.

Each block is copied line for line from the thread named above it (only the lines shown); these are
events the shared fixtures do not contain: PCIe AER, userptr failures, init failures, hung tasks, Xid 79.
"""

from __future__ import annotations

from ops.triage import analyze_text

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
