"""Kernel and driver checks: kernel release, the GPU kernel module, ROCm user space against AMD's matrix, kernel config.

Facts: amdgpu's Kconfig (DRM_AMDGPU_USERPTR selects HMM_MIRROR and MMU_NOTIFIER: hipHostRegister is a userptr
registration; HSA_AMD_SVM needs ZONE_DEVICE/DEVICE_PRIVATE); AMD's IOMMU page (ROCm/amdgpu-docs
docs/conceptual/iommu.rst) lists CONFIG_PCI_P2PDMA, CONFIG_DMABUF_MOVE_NOTIFY and CONFIG_HSA_AMD_P2P for peer-to-peer DMA.
"""

from __future__ import annotations

import gzip
import io as _io

from gpuwarden.ops.doctor import compat
from gpuwarden.ops.doctor.model import Result, fail, passed, skip, unknown, warn
from gpuwarden.ops.doctor.node import amd_gpus, kernel_release, nvidia_present
from gpuwarden.ops.doctor.probe import CheckIO


def check_kernel(io: CheckIO) -> Result:
    release = kernel_release(io)
    if not release:
        return unknown("cannot read the kernel release (/proc/sys/kernel/osrelease, /proc/version)")
    return passed(f"Linux {release}", release=release)


def amdgpu_module(io: CheckIO) -> tuple[bool, str | None]:
    """(amdgpu loaded?, DKMS module version or None for the kernel's own driver)."""
    loaded = io.exists("gpu", "module/amdgpu")
    return loaded, io.line("gpu", "module/amdgpu/version") if loaded else None


def nvidia_version(io: CheckIO) -> str | None:
    version = io.line("gpu", "module/nvidia/version")
    if version:
        return version
    text = io.line("proc", "driver/nvidia/version") or ""
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Thu Sep ..."
    for word in text.split():
        if word[:1].isdigit() and word.count(".") >= 1:
            return word
    return None


def check_gpu_driver(io: CheckIO) -> Result:
    amd, dkms = amdgpu_module(io)
    nv = nvidia_present(io)
    gpus = amd_gpus(io)
    parts: list[str] = []
    details: dict[str, str | None] = {}
    if amd:
        parts.append(f"amdgpu {dkms} (AMD's DKMS driver)" if dkms else "amdgpu (the kernel's own driver, no version file)")
        details["amdgpu"] = dkms or "in-tree"
    if nv:
        version = nvidia_version(io)
        parts.append(f"nvidia {version or '(version unreadable)'}")
        details["nvidia"] = version
    if not parts:
        if gpus:
            return fail(f"{len(gpus)} AMD GPU(s) in sysfs but the amdgpu module is not loaded",
                        "modprobe amdgpu  (and look at `dmesg | grep amdgpu` for why it did not load)")
        return fail("no GPU kernel driver loaded (no /sys/module/amdgpu, no /sys/module/nvidia)",
                    "modprobe amdgpu (AMD) or modprobe nvidia (NVIDIA); `dmesg` says why it did not load")
    if amd and not gpus:
        return warn(f"{', '.join(parts)} loaded but no AMD GPU is enumerated (no amdgpu card, no KFD GPU node)",
                    "dmesg | grep -i amdgpu  (firmware load or PCI errors)", **details)
    return passed(", ".join(parts) + (f"; {len(gpus)} AMD GPU(s)" if gpus else ""), **details)


def rocm_installs(io: CheckIO) -> tuple[str | None, dict[str, str]]:
    """(version of /opt/rocm, {install dir: version}) from each /opt/rocm*/.info/version."""
    installs: dict[str, str] = {}
    for name in io.listdir("opt", ""):
        if name == "rocm" or name.startswith("rocm-"):
            version = io.line("opt", f"{name}/.info/version")
            if version:
                installs[f"/opt/{name}"] = version
    return installs.get("/opt/rocm"), installs


def check_rocm_compat(io: CheckIO) -> Result:
    if not amd_gpus(io):
        return skip("no AMD GPU")
    active, installs = rocm_installs(io)
    if not installs:
        return skip("no ROCm user space under /opt (no /opt/rocm*/.info/version)")
    rocm = active or sorted(installs.values())[-1]
    details: dict[str, object] = {"rocm": rocm, "installs": installs}
    loaded, dkms = amdgpu_module(io)
    if not loaded:
        return unknown(f"ROCm {rocm} installed but amdgpu is not loaded", "modprobe amdgpu", **details)
    if dkms is None:
        return unknown(f"ROCm {rocm} on the kernel's own amdgpu driver: AMD's matrix lists its own amdgpu driver "
                       f"releases, not in-tree kernels, so this pair is not documented either way",
                       "compare the kernel with ROCm's supported OS/kernel list "
                       "(rocm.docs.amd.com/projects/install-on-linux/en/latest/reference/system-requirements.html)",
                       **details)
    release = compat.module_release(dkms)
    details.update(amdgpu_module=dkms, amdgpu_release=release)
    if release is None:
        return unknown(f"amdgpu module {dkms} with ROCm {rocm}: which AMD driver release ships module {dkms} is not "
                       "documented in what gpuwarden carries, so the pair cannot be checked against "
                       f"{compat.MATRIX_SOURCE}",
                       "look the driver up with `dkms status` / `modinfo amdgpu` and AMD's matrix", **details)
    ok = compat.verdict(release, rocm)
    if ok is None:
        return unknown(f"amdgpu {dkms} is driver release {release}, which has no row in the matrix gpuwarden "
                       f"carries; ROCm {rocm} on it is undocumented here", f"see {compat.MATRIX_SOURCE}", **details)
    if ok:
        return passed(f"ROCm {rocm} on amdgpu {dkms} (driver {release}): a pair AMD lists as supported", **details)
    supported = ", ".join(compat.SUPPORTED[release])
    return fail(f"ROCm {rocm} on amdgpu {dkms} (driver {release}): AMD supports ROCm {supported} on that driver, "
                f"not {compat.release_line(rocm)}",
                f"install a ROCm release from {supported}, or the amdgpu driver that matches ROCm {rocm}", **details)


# option -> (why it matters, needed for the in-tree driver only)
REQUIRED = {
    "CONFIG_HMM_MIRROR": ("hipHostRegister/userptr registrations need HMM (amdgpu's USERPTR selects it)", False),
    "CONFIG_MMU_NOTIFIER": ("userptr registrations follow CPU page-table changes through MMU notifiers", False),
    "CONFIG_HSA_AMD": ("KFD, the ROCm compute interface (/dev/kfd)", True),
    "CONFIG_DRM_AMDGPU_USERPTR": ("userptr support in amdgpu (host memory registration)", True),
}
ADVISED = {
    "CONFIG_ZONE_DEVICE": "device memory pages, needed for ROCm's shared virtual memory (HSA_AMD_SVM)",
    "CONFIG_DEVICE_PRIVATE": "migrating pages into VRAM for ROCm's shared virtual memory",
    "CONFIG_HSA_AMD_SVM": "ROCm shared virtual memory (hipMallocManaged with XNACK)",
    "CONFIG_PCI_P2PDMA": "peer-to-peer DMA between PCIe devices (AMD's IOMMU page lists it)",
    "CONFIG_DMABUF_MOVE_NOTIFY": "dma-buf sharing of VRAM with other devices (AMD's IOMMU page lists it)",
    "CONFIG_HSA_AMD_P2P": "KFD peer-to-peer over PCIe (AMD's IOMMU page lists it)",
}
IN_TREE_ONLY = {"CONFIG_HSA_AMD_SVM", "CONFIG_HSA_AMD_P2P"}


def kernel_config(io: CheckIO, release: str | None) -> tuple[dict[str, str] | None, str | None]:
    """({option: value} with "n" for `is not set`, where it came from)."""
    text, source = None, None
    if release:
        text = io.text("boot", f"config-{release}")
        source = f"/boot/config-{release}" if text is not None else None
    if text is None:
        raw = io.bytes("proc", "config.gz", limit=4 << 20)
        if raw:
            try:
                text = gzip.GzipFile(fileobj=_io.BytesIO(raw)).read().decode(errors="replace")
                source = "/proc/config.gz"
            except (OSError, EOFError):
                text = None
    if text is None:
        return None, None
    options: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            key, _, value = line.partition("=")
            options[key] = value.strip().strip('"')
        elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
            options[line[2:].split()[0]] = "n"
    return options, source


def check_kernel_config(io: CheckIO) -> Result:
    if not amd_gpus(io):
        return skip("no AMD GPU (the options checked here are amdgpu's)")
    release = kernel_release(io)
    options, source = kernel_config(io, release)
    if options is None:
        return unknown(f"no kernel config found (/boot/config-{release or '<release>'}, /proc/config.gz)",
                       "install the kernel's config file, or `modprobe configs` for /proc/config.gz")
    _, dkms = amdgpu_module(io)
    on = {k for k, v in options.items() if v in ("y", "m")}
    missing = [k for k, (_, tree_only) in REQUIRED.items() if k not in on and not (dkms and tree_only)]
    advised = [k for k in ADVISED if k not in on and not (dkms and k in IN_TREE_ONLY)]
    details = {"source": source, "missing": missing, "advised_missing": advised,
               "amdgpu": "dkms" if dkms else "in-tree"}
    note = " (amdgpu's own options are not checked: AMD's DKMS driver builds them itself)" if dkms else ""
    if missing:
        why = "; ".join(f"{k}: {REQUIRED[k][0]}" for k in missing)
        return fail(f"{source} lacks {', '.join(missing)} ({why}){note}",
                    "run a kernel built with these options (a distribution kernel AMD lists for ROCm has them)",
                    **details)
    if advised:
        why = "; ".join(f"{k}: {ADVISED[k]}" for k in advised)
        return warn(f"{source} lacks {', '.join(advised)} ({why}){note}",
                    "rebuild the kernel with these options if the engines need that feature", **details)
    return passed(f"{source} has {', '.join(list(REQUIRED) + list(ADVISED))}{note}", **details)

