"""Pod Security Standards, `restricted` profile (which includes `baseline`), as kubernetes.io/docs/concepts/security/
pod-security-standards/ defines each control for a pod spec: violations(pod) lists every control a pod breaks,
one line each (the field and its value), the way Pod Security admission would refuse it.
"""

from __future__ import annotations

from typing import Any, Iterator

SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
APPARMOR_TYPES = {"RuntimeDefault", "Localhost"}


def _containers(spec: dict) -> Iterator[tuple[str, dict]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(kind) or ():
            yield f"spec.{kind}[{c.get('name')}]", c


def violations(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    meta = pod.get("metadata") or {}
    out: list[str] = []
    # --- baseline -------------------------------------------------------------------------------------------
    # HostProcess (Windows)
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("hostProcess: spec.securityContext.windowsOptions.hostProcess=true")
    # Host namespaces
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"host namespaces: spec.{key}=true")
    # HostPath volumes
    for v in spec.get("volumes") or ():
        if "hostPath" in v:
            out.append(f"hostPath volumes: spec.volumes[{v.get('name')}].hostPath")
    # Sysctls
    for s in psc.get("sysctls") or ():
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctls: spec.securityContext.sysctls {s.get('name')}")
    # AppArmor (field and annotations), SELinux, seccomp (baseline: not Unconfined) at the pod level
    out += _apparmor("spec.securityContext", psc.get("appArmorProfile"))
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and \
                not (value == "runtime/default" or value.startswith("localhost/")):
            out.append(f"AppArmor: annotation {key}={value}")
    out += _selinux("spec.securityContext", psc.get("seLinuxOptions"))
    # --- restricted ------------------------------------------------------------------------------------------
    # Volume types
    for v in spec.get("volumes") or ():
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume types: spec.volumes[{v.get('name')}] is {', '.join(sorted(kinds - RESTRICTED_VOLUMES))}")
    # Pod-level runAsNonRoot / runAsUser / seccomp
    pod_nonroot = psc.get("runAsNonRoot") is True
    if psc.get("runAsNonRoot") is False:
        out.append("running as non-root: spec.securityContext.runAsNonRoot=false")
    if psc.get("runAsUser") == 0:
        out.append("running as non-root user: spec.securityContext.runAsUser=0")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"seccomp: spec.securityContext.seccompProfile.type={pod_seccomp}")
    for where, c in _containers(spec):
        sc = c.get("securityContext") or {}
        # baseline, per container
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"hostProcess: {where}.securityContext.windowsOptions.hostProcess=true")
        if sc.get("privileged"):
            out.append(f"privileged: {where}.securityContext.privileged=true")
        for p in c.get("ports") or ():
            if p.get("hostPort"):
                out.append(f"host ports: {where}.ports hostPort={p['hostPort']}")
        out += _apparmor(f"{where}.securityContext", sc.get("appArmorProfile"))
        out += _selinux(f"{where}.securityContext", sc.get("seLinuxOptions"))
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"/proc mount type: {where}.securityContext.procMount={sc['procMount']}")
        # restricted, per container
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"privilege escalation: {where}.securityContext.allowPrivilegeEscalation must be false")
        if sc.get("runAsNonRoot") is False or (sc.get("runAsNonRoot") is None and not pod_nonroot):
            out.append(f"running as non-root: {where} (runAsNonRoot true here or for the pod)")
        if sc.get("runAsUser") == 0:
            out.append(f"running as non-root user: {where}.securityContext.runAsUser=0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccomp: {where}.securityContext.seccompProfile.type={seccomp}")
        elif seccomp is None and pod_seccomp is None:
            out.append(f"seccomp: {where} (RuntimeDefault or Localhost here or for the pod)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.append(f"capabilities: {where}.securityContext.capabilities.drop must include ALL")
        added = [a for a in caps.get("add") or () if a != "NET_BIND_SERVICE"]
        if added:
            out.append(f"capabilities: {where}.securityContext.capabilities.add {added}")
    return out


def _apparmor(where: str, profile: dict | None) -> list[str]:
    kind = (profile or {}).get("type")
    return [] if kind is None or kind in APPARMOR_TYPES else [f"AppArmor: {where}.appArmorProfile.type={kind}"]


def _selinux(where: str, opts: dict | None) -> list[str]:
    opts = opts or {}
    out = []
    if opts.get("type", "") not in SELINUX_TYPES:
        out.append(f"SELinux: {where}.seLinuxOptions.type={opts['type']}")
    for key in ("user", "role"):
        if opts.get(key):
            out.append(f"SELinux: {where}.seLinuxOptions.{key}={opts[key]}")
    return out
