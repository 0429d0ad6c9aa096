"""Every doctor check, in report order: id, title, group, and the function that decides it.

Ids are stable (scripts pass them to --only); groups select several at once.
"""

from __future__ import annotations

from gpuwarden.ops.doctor.model import Check
from gpuwarden.ops.doctor.checks import agent, answers, health, interposer, kernel, memory, nvidia, params, pcie

# Without persistence mode the NVIDIA driver initializes every GPU inside nvmlInit (seconds on a large node):
# the checks that ask NVML may take that long before a hung call is the likelier story.
NVML_TIMEOUT_S = 4.0

REGISTRY: tuple[Check, ...] = (
    Check("kernel", "Kernel release", "kernel", kernel.check_kernel),
    Check("gpu-driver", "GPU kernel driver loaded, and its version", "kernel", kernel.check_gpu_driver),
    Check("rocm-compat", "ROCm user space against the amdgpu driver (AMD's matrix)", "kernel",
          kernel.check_rocm_compat),
    Check("kernel-config", "Kernel options ROCm needs (HMM, KFD, userptr, P2P)", "kernel", kernel.check_kernel_config),
    Check("gpu-recovery", "amdgpu.gpu_recovery: does a hung GPU get reset", "driver", params.check_gpu_recovery),
    Check("lockup-timeout", "amdgpu.lockup_timeout: when a job counts as hung", "driver", params.check_lockup_timeout),
    Check("kfd-limit", "amdgpu.no_system_mem_limit: KFD's limit on host registrations", "driver",
          params.check_kfd_limit),
    Check("gtt", "GTT size and ttm.pages_limit", "driver", params.check_gtt),
    Check("iommu", "IOMMU mode", "pcie", pcie.check_iommu),
    Check("pcie-acs", "PCIe ACS redirect on the bridges above the GPUs", "pcie", pcie.check_acs),
    Check("pcie-link", "PCIe link width and speed against their maximum", "pcie", pcie.check_link),
    Check("large-bar", "Large BAR: the CPU sees all of VRAM", "pcie", pcie.check_large_bar),
    Check("numa", "NUMA placement of GPUs and engines", "pcie", pcie.check_numa),
    Check("arena-fs", "The arena's filesystem (/dev/shm) has room for it", "memory", memory.check_arena_fs),
    Check("memlock", "RLIMIT_MEMLOCK for the engines", "memory", memory.check_memlock),
    Check("kfd-budget", "KFD registration budget of the launch plan", "memory", memory.check_kfd_budget),
    Check("interposer", "The registration interposer for progress = \"preload\"", "memory",
          interposer.check_interposer),
    Check("thp", "Transparent huge pages", "memory", memory.check_thp),
    Check("swap", "Swap", "memory", memory.check_swap),
    Check("gpu-answers", "Every GPU answers its driver reads within the read deadline", "gpu", answers.check_answers,
          answers.TIMEOUT_S),
    Check("firmware", "Firmware equal across GPUs of one model", "gpu", health.check_firmware, NVML_TIMEOUT_S),
    Check("xgmi-hive", "XGMI hives complete", "gpu", health.check_xgmi),
    Check("ras", "RAS/ECC error counters", "gpu", health.check_ras),
    Check("nvidia-persistence", "NVIDIA persistence mode", "nvidia", nvidia.check_persistence, NVML_TIMEOUT_S),
    Check("nvidia-persistenced", "nvidia-persistenced (it blocks nvidia-smi -r)", "nvidia", nvidia.check_persistenced,
          NVML_TIMEOUT_S),
    Check("nvidia-mig", "NVIDIA MIG mode", "nvidia", nvidia.check_mig, NVML_TIMEOUT_S),
    Check("nvidia-ecc", "NVIDIA ECC mode and uncorrected errors", "nvidia", nvidia.check_ecc, NVML_TIMEOUT_S),
    Check("nvidia-pages", "NVIDIA retired and remapped memory pages", "nvidia", nvidia.check_pages, NVML_TIMEOUT_S),
    Check("agent", "The node agent's socket", "agent", agent.check_agent),
)
