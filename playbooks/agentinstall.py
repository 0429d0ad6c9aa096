"""`gpuwarden agent --install-systemd`: write the agent's systemd unit, as a playbook (dry run unless --yes).

The unit's text lives here; deploy/systemd/gpuwarden-agent.service is this text for /usr/local/bin/gpuwarden
(a test keeps the two the same).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.statedir import atomic_write

from gpuwarden.playbooks.framework import Playbook, RunContext, SkipStep, Step, StepFailed

UNIT_NAME = "gpuwarden-agent.service"
DEFAULT_EXEC = "/usr/local/bin/gpuwarden"
UNIT = """# gpuwarden node agent: one sampler per node, its history and events, a local API on a unix socket.
# Install with `gpuwarden agent --install-systemd --yes` (which fills in the path of ExecStart), then
#   systemctl daemon-reload && systemctl enable --now gpuwarden-agent
[Unit]
Description=gpuwarden node agent (GPU memory, residual VRAM, engines; local API)
Documentation=man:gpuwarden(1)
After=local-fs.target systemd-modules-load.service
Wants=systemd-modules-load.service

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start}
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=2
TimeoutStopSec=10
SyslogIdentifier=gpuwarden-agent
# The state dir (/run/gpuwarden for root): engine records, journal and locks live there too, so it must
# outlive the agent: preserved across stops and restarts.
RuntimeDirectory=gpuwarden
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes
Environment=GPUWARDEN_STATE_DIR=/run/gpuwarden
# Prometheus /metrics on this node's loopback (README: Monitoring); 0.0.0.0:9835 to scrape it from elsewhere.
Environment=GPUWARDEN_METRICS_LISTEN=127.0.0.1:9835
# 2,000 GPU processes want 2,000 pidfds and as many held sysfs files.
LimitNOFILE=65536

# Hardening that still lets it read /proc, /sys and the GPU device files, follow /dev/kmsg, and signal
# zombies' parents and engine shims for the purge and drain policies.
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths=/run/gpuwarden
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
RestrictNamespaces=yes
SystemCallArchitectures=native
RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6
# kill: signal shims and zombies' parents; sys_ptrace + dac_read_search: read other users' /proc/<pid>/fd
# and environ; syslog: /dev/kmsg; chown/fowner: give the API socket its group.
CapabilityBoundingSet=CAP_KILL CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_DAC_OVERRIDE CAP_SYSLOG CAP_CHOWN CAP_FOWNER
MemoryMax=512M
CPUQuota=50%

[Install]
WantedBy=multi-user.target
"""


def unit_text(program: str = DEFAULT_EXEC) -> str:
    return UNIT.format(exec_start=f"{program} agent --foreground")


def this_program() -> str:
    """The installed `gpuwarden` that runs now (what ExecStart should name)."""
    found = shutil.which("gpuwarden")
    argv0 = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "gpuwarden" and argv0.is_file():
        return str(argv0)
    return str(Path(found).resolve()) if found else DEFAULT_EXEC


class InstallUnitPlaybook(Playbook):
    name = "install-systemd"
    destructive = True

    def __init__(self, unit_dir: Path = Path("/etc/systemd/system"), program: str | None = None,
                 reload: bool = True):
        self.unit_dir = unit_dir
        self.program = program or this_program()
        self.reload = reload
        self.path = unit_dir / UNIT_NAME
        self.description = f"install the agent's systemd unit as {self.path} (ExecStart={self.program} agent)"

    def summary(self) -> dict[str, Any]:
        return {"unit": str(self.path), "program": self.program}

    def preconditions(self, ctx: RunContext) -> list[str]:
        if not self.unit_dir.is_dir():
            return [f"{self.unit_dir} is not a directory (is this a systemd host?)"]
        return []

    def plan(self, ctx: RunContext) -> list[Step]:
        steps = [Step("write-unit", f"write {self.path}" + (" (replacing the one there)" if self.path.exists() else ""),
                      self._write, destructive=True)]
        if self.reload:
            steps.append(Step("daemon-reload", "systemctl daemon-reload", self._daemon_reload))
        return steps

    def _write(self, ctx: RunContext) -> str:
        text = unit_text(self.program)
        try:
            if self.path.exists() and self.path.read_text() == text:
                raise SkipStep(f"{self.path} is already this unit")
            atomic_write(self.path, text, 0o644, root=self.path.parent)  # the unit dir is its own root
        except PermissionError:
            raise StepFailed(f"no permission to write {self.path}", "run it as root (sudo)") from None
        journal.write(ctx.settings.state_dir, "install-systemd", "ok", unit=str(self.path))
        ctx.info("next: systemctl enable --now gpuwarden-agent")
        return f"wrote {self.path}"

    def _daemon_reload(self, ctx: RunContext) -> str:
        systemctl = shutil.which("systemctl")
        if systemctl is None:
            raise SkipStep("no systemctl here: reload systemd by hand")
        try:
            proc = subprocess.run([systemctl, "daemon-reload"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepFailed(f"systemctl daemon-reload: {exc}", "run it by hand") from None
        if proc.returncode != 0:
            raise StepFailed(f"systemctl daemon-reload: {(proc.stderr or proc.stdout).strip()[:200]}",
                             "run it by hand")
        return "systemd reloaded its units"


