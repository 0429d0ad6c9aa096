"""What AMD documents about which ROCm user space runs on which amdgpu kernel driver, and nothing more.

A combination that is not in these tables is "unknown", never guessed. Sources (public, read for this table):
- AMD, "User and AMD GPU Driver (amdgpu) support matrix", ROCm/rocm-install-on-linux
  docs/reference/user-kernel-space-compat-matrix.rst at commit 0802f804a1f559fc090666f9ffc44e36d684a83a
  (rocm.docs.amd.com/projects/install-on-linux/en/latest/reference/user-kernel-space-compat-matrix.html, 2025-09-17):
  the rows 30.10.x and 5.3.x-6.4.x below.
- AMD, ROCm/amdgpu-docs docs/compatibility/compatibility-matrix.rst after PR #97: "The AMD GPU Driver (amdgpu)
  30.30.3 is compatible with ROCm 7.2.x, 7.1.x, 7.0.x, 6.4.x, and 6.3.x" (the 30.30.x row).
The driver release a node runs is not on the node: the DKMS module reports its own version (/sys/module/amdgpu/version,
e.g. 6.12.12), and AMD publishes no table from one to the other (ROCm/rocm-install-on-linux issue #684 asks for one).
MODULE_RELEASES holds only pairs seen in AMD's own documents or packages:
- 6.12.12 -> 6.4.x: ROCm/amdgpu-docs docs/install/detailed-install/post-install.rst, sample `dkms status` output
  `amdgpu/6.12.12-2133686.22.04` in the docs for ROCm 6.4 to 6.4.3 (commits 9dcf720 to be09bb2).
- 6.14.14 -> 30.10.x: the same file in the docs for amdgpu 30.10 / 30.10.1 (commits 0bb9161, 7b4b56a),
  `amdgpu/6.14.14-2204008.24.04`.
- 6.8.5 -> 6.2.x: the DKMS package of repo.radeon.com/amdgpu/6.2/ubuntu is amdgpu-6.8.5-2009582
  (chrisaga/amd-dkms-patch README, on ROCm/ROCm issue #3701).
- 6.16.6 -> 30.20.x: ROCm/rocm-install-on-linux issue #684 quotes repo.radeon.com/amdgpu/30.20.1 as driver 6.16.6.
"""

from __future__ import annotations

import re

MATRIX_SOURCE = ("AMD's user and amdgpu driver support matrix (rocm.docs.amd.com/projects/install-on-linux/en/latest/"
                 "reference/user-kernel-space-compat-matrix.html)")

# amdgpu driver release -> ROCm user space releases AMD supports on it
SUPPORTED: dict[str, tuple[str, ...]] = {
    "30.30.x": ("6.3.x", "6.4.x", "7.0.x", "7.1.x", "7.2.x"),
    "30.10.x": ("6.2.x", "6.3.x", "6.4.x", "7.0.x"),
    "6.4.x": ("6.1.x", "6.2.x", "6.3.x", "6.4.x", "7.0.x"),
    "6.3.x": ("6.1.x", "6.2.x", "6.3.x", "6.4.x", "7.0.x"),
    "6.2.x": ("6.0.x", "6.1.x", "6.2.x", "6.3.x", "6.4.x", "7.0.x"),
    "6.1.x": ("5.7.x", "6.0.x", "6.1.x", "6.2.x", "6.3.x", "6.4.x"),
    "6.0.x": ("5.6.x", "5.7.x", "6.0.x", "6.1.x", "6.2.x"),
    "5.7.x": ("5.5.x", "5.6.x", "5.7.x", "6.0.x", "6.1.x"),
    "5.6.x": ("5.4.x", "5.5.x", "5.6.x", "5.7.x", "6.0.x"),
    "5.5.x": ("5.3.x", "5.4.x", "5.5.x", "5.6.x", "5.7.x"),
    "5.4.x": ("5.2.x", "5.3.x", "5.4.x", "5.5.x", "5.6.x"),
    "5.3.x": ("5.1.x", "5.2.x", "5.3.x", "5.4.x", "5.5.x"),
}

# DKMS amdgpu module version (/sys/module/amdgpu/version) -> the driver release it ships in
MODULE_RELEASES: dict[str, str] = {
    "6.8.5": "6.2.x",
    "6.12.12": "6.4.x",
    "6.14.14": "30.10.x",
    "6.16.6": "30.20.x",
}


def release_line(version: str | None) -> str | None:
    """'6.4.1-120' or '7.0.1' -> '6.4.x' (the granularity AMD's matrix uses)."""
    m = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return f"{int(m[1])}.{int(m[2])}.x" if m else None


def module_release(module_version: str | None) -> str | None:
    m = re.match(r"\s*(\d+\.\d+\.\d+)", module_version or "")
    return MODULE_RELEASES.get(m[1]) if m else None


def verdict(driver_release: str, rocm_version: str) -> bool | None:
    """True: AMD lists the pair as supported; False: the driver has a row and the ROCm line is not in it;
    None: the driver release has no row here (unknown, not unsupported)."""
    row = SUPPORTED.get(driver_release)
    line = release_line(rocm_version)
    if row is None or line is None:
        return None
    return line in row
