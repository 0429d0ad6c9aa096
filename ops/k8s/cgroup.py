"""Which pod and container a process runs in, read from its /proc/<pid>/cgroup text.

Covers cgroup v1 and v2, the systemd and cgroupfs drivers, containerd, CRI-O and dockershim scope names,
a kubelet --cgroup-root prefix, and paths shown relative to the reader's cgroup namespace (`/../..`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A pod UID: a UUID (systemd escapes its dashes as underscores) or a static pod's 32-hex hash.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# systemd driver: <root->kubepods[-<qos>]-pod<uid>.slice, e.g. kubelet-kubepods-burstable-pod<uid>.slice
_SYSTEMD_POD = re.compile(rf"kubepods(?:-(besteffort|burstable))?-pod({_UID})\.slice$")
# cgroupfs driver: .../kubepods[/<qos>]/pod<uid>
_CGROUPFS_POD = re.compile(rf"pod({_UID})$")
# The container's own scope (systemd) or directory (cgroupfs); conmon is CRI-O's monitor, not the container.
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", None: None}
_QOS_DIRS = ("besteffort", "burstable")
DELETED = " (deleted)"


@dataclass(frozen=True)
class PodCgroup:
    """A process's place in the kubelet's cgroup tree."""

    pod_uid: str  # dashed form, as metadata.uid shows it
    container_id: str | None  # 64 hex; None for a process in the pod's own cgroup or CRI-O's conmon
    runtime: str | None  # "containerd", "cri-o", "docker"; None when the path does not say (cgroupfs)
    qos: str  # "guaranteed", "burstable" or "besteffort"
    deleted: bool = False  # the cgroup is gone (v2 shows " (deleted)" for a zombie outliving it)


def parse_path(path: str) -> PodCgroup | None:
    """The pod of one cgroup path, or None when it is not under the kubelet's pods."""
    deleted = path.endswith(DELETED)
    if deleted:
        path = path[:-len(DELETED)]
    parts = [p for p in path.split("/") if p and p != ".."]
    for i, part in enumerate(parts):
        lowered = part.lower()
        found = _SYSTEMD_POD.search(lowered)
        if found:
            qos = found.group(1) or "guaranteed"
            uid = found.group(2)
        else:
            found = _CGROUPFS_POD.fullmatch(lowered) if lowered.startswith("pod") else None
            if not found:
                continue
            parent = parts[i - 1].lower() if i else ""
            # Only under the kubelet's tree (or where a cgroup namespace hid the parents): a directory named
            # pod<hex> elsewhere is not a pod.
            if i and parent != "kubepods" and parent not in _QOS_DIRS and "kubepods" not in path:
                continue
            qos = parent if parent in _QOS_DIRS else "guaranteed"
            uid = found.group(1)
        container_id, runtime = None, None
        for rest in parts[i + 1:]:
            c = _CONTAINER.match(rest.lower())
            if c:
                container_id, runtime = c.group(2), _RUNTIMES[c.group(1)]
                break
        return PodCgroup(pod_uid=_dashed(uid), container_id=container_id, runtime=runtime, qos=qos,
                         deleted=deleted)
    return None


def parse(text: str) -> PodCgroup | None:
    """The pod of a whole /proc/<pid>/cgroup file (v1 lines, the v2 `0::` line, or both).

    Under v1 every controller line names the same place; in hybrid mode the `0::` line may name a
    systemd unit instead, so the first line that names a pod wins, and one naming the container too
    beats one that does not. A v1 zombie shows "/" everywhere: that file names no pod.
    """
    best: PodCgroup | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        found = parse_path(fields[2])
        if found is None:
            continue
        if found.container_id is not None:
            return found
        best = best or found
    return best


def _dashed(uid: str) -> str:
    if len(uid) == 32:
        return uid  # a static pod's hash is its UID as it stands
    return uid.replace("_", "-")
