"""The files the doctor reads that a bundle does not already keep, copied into it so `doctor --bundle` can judge.

The bundle's "doctor-inputs" collector calls `collect`. Keep INPUTS in step with what checks/ read: the bundle test
compares `doctor` on a node with `doctor --bundle` on that node's bundle, check by check.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from gpuwarden.ops.bundle.entries import Entry
from gpuwarden.ops.bundle.trees import TreeCopier, read_file

# (root, pattern): root is "sys" (host /sys), "gpu" (the GPU tree: the sim node's on a sim node), "proc", "etc",
# "boot" or "opt"; "*" matches one path segment. Both sysfs roots land in the bundle's tree/sys.
INPUTS: tuple[tuple[str, str], ...] = (
    ("sys", "kernel/mm/transparent_hugepage/enabled"),
    ("sys", "kernel/mm/transparent_hugepage/defrag"),
    ("sys", "kernel/mm/transparent_hugepage/shmem_enabled"),
    ("sys", "devices/system/node/online"),
    ("gpu", "module/ttm/parameters/pages_limit"),
    ("gpu", "class/drm/card*/device/fw_version/*"),
    ("gpu", "class/drm/card*/device/iommu_group/type"),
    ("gpu", "class/drm/card*/device/pp_dpm_pcie"),
    ("gpu", "class/kfd/kfd/topology/nodes/*/io_links/*/properties"),
    ("proc", "sys/kernel/osrelease"),
    ("proc", "sys/kernel/numa_balancing"),
    ("proc", "sys/vm/swappiness"),
    ("proc", "swaps"),
    ("proc", "self/mounts"),
    ("proc", "cpuinfo"),
    ("etc", "security/limits.conf"),
    ("etc", "security/limits.d/*.conf"),
    ("etc", "systemd/system.conf"),
    ("etc", "systemd/system/gpuwarden*.service"),
    ("opt", "rocm/.info/version"),
    ("opt", "rocm-*/.info/version"),
)
DIRS: tuple[tuple[str, str], ...] = (("sys", "class/iommu/*"),)  # presence is the fact
TREE = {"sys": "tree/sys", "gpu": "tree/sys", "proc": "tree/proc", "etc": "tree/etc", "boot": "tree/boot",
        "opt": "tree/opt"}


def expand(root: Path, pattern: str) -> list[str]:
    """Relative paths under `root` matching `pattern`, one directory level per segment."""
    found = [""]
    for segment in pattern.split("/"):
        nxt = []
        for base in found:
            if any(c in segment for c in "*?["):
                try:
                    names = sorted(os.listdir(root / base)) if (root / base).is_dir() else []
                except OSError:
                    names = []
                nxt += [f"{base}/{n}".lstrip("/") for n in names if fnmatch.fnmatchcase(n, segment)]
            else:
                nxt.append(f"{base}/{segment}".lstrip("/"))
        found = nxt
    return found


def collect(roots: dict[str, Path], config_path: Path) -> list[Entry]:
    """Entries for every input that exists; `roots` maps the root names above to where they are on this node."""
    entries: list[Entry] = []
    for name, pattern in INPUTS:
        t = TreeCopier("doctor-inputs", roots[name], TREE[name])
        for rel in expand(roots[name], pattern):
            t.file(rel)
        entries += t.entries
    for name, pattern in DIRS:
        t = TreeCopier("doctor-inputs", roots[name], TREE[name])
        for rel in expand(roots[name], pattern):
            t.dir(rel)
        entries += t.entries
    release = (read_file(roots["proc"] / "sys/kernel/osrelease", 256)[0] or b"").decode(errors="replace").strip()
    if release:
        t = TreeCopier("doctor-inputs", roots["boot"], TREE["boot"])
        t.file(f"config-{release}")
        entries += t.entries
    gz, _, _ = read_file(roots["proc"] / "config.gz", 4 << 20)
    if gz is not None:  # compressed: redaction would corrupt it, and a kernel config holds no secrets
        entries.append(Entry("doctor-inputs", str(roots["proc"] / "config.gz"), "file", path="tree/proc/config.gz",
                             data=gz, redact=False))
    data, status, error = read_file(config_path)
    if data is not None:
        entries.append(Entry("doctor-inputs", str(config_path), "file", path="gpuwarden/node.toml", data=data))
    elif status:
        entries.append(Entry("doctor-inputs", str(config_path), "file", status=status, error=error))
    return entries
