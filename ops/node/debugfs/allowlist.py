"""Which debugfs files gpuwarden may open: four named read-only files, built from a fixed template, never a glob.

Several amdgpu/KFD debugfs files ACT when they are opened or read: reading amdgpu_gpu_recover resets the GPU,
amdgpu_evict_vram/amdgpu_evict_gtt evict every buffer, amdgpu_test_ib runs ring tests, kfd/hang_hws hangs the
scheduler firmware on purpose. A tool that walks debugfs can reset a production GPU, so the reader accepts only
a name from ALLOWED with a DRM minor that is a plain integer, and refuses anything else before any filesystem
call. TRIGGERS lists the dangerous names for the tests and the sim node (they are never opened).
"""

from __future__ import annotations

# name -> (path template under the debugfs root, the kernel function whose output it is, first kernel with it)
ALLOWED: dict[str, tuple[str, str, str]] = {
    "kfd_mem_limit": ("kfd/mem_limit", "kfd_debugfs_kfd_mem_limits (amdgpu_amdkfd_gpuvm.c)", "6.2"),
    "gem_info": ("dri/{minor}/amdgpu_gem_info", "amdgpu_debugfs_gem_info_show (amdgpu_gem.c)", "4.x"),
    "vm_info": ("dri/{minor}/amdgpu_vm_info", "amdgpu_debugfs_vm_info_show (amdgpu_vm.c)", "5.11"),
    "vram_mm": ("dri/{minor}/amdgpu_vram_mm", "amdgpu_vram_mgr_debug -> drm_buddy_print / drm_mm_print", "4.x"),
}

# Files that act when opened or read: never opened by gpuwarden (tests prove it over the sim node's tree).
TRIGGERS: tuple[str, ...] = (
    "dri/{minor}/amdgpu_gpu_recover", "dri/{minor}/amdgpu_evict_vram", "dri/{minor}/amdgpu_evict_gtt",
    "dri/{minor}/amdgpu_test_ib", "kfd/hang_hws",
)

MAX_MINOR = 1 << 20


def relative_path(name: str, minor: int | None = None) -> str:
    """The allowed file's path under the debugfs root; ValueError for anything not on the list."""
    if name not in ALLOWED:
        raise ValueError(f"{name!r} is not an allowed debugfs file (allowed: {', '.join(ALLOWED)})")
    template = ALLOWED[name][0]
    if "{minor}" in template:
        if type(minor) is not int or not 0 <= minor < MAX_MINOR:  # bool and str refused too
            raise ValueError(f"debugfs file {name} needs a DRM minor number, got {minor!r}")
        return template.format(minor=minor)
    if minor is not None:
        raise ValueError(f"debugfs file {name} takes no DRM minor")
    return template
