"""`fleet bundle`: every node collects its own incident bundle; each is pulled back over SFTP into one
directory with an index and a fleet triage (the same signature on several nodes is said first).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.fleet.fanout import HostResult, fan_out
from gpuwarden.ops.fleet.inventory import Host
from gpuwarden.ops.bundle import kernellog
from gpuwarden.ops.bundle.replay import open_bundle, read_member
from gpuwarden.ops.triage import analyze_text

from gpuwarden.playbooks.fleet.actions import ACTION_DEADLINE_S, ORIGIN_ENV
from gpuwarden.playbooks.fleet.target import FleetTarget, fleet_origin

INDEX = "index.json"
SCHEMA = "fleet-bundle"


@dataclass
class PulledBundle:
    host: Host
    remote_path: str | None = None
    local_path: Path | None = None
    bytes: int | None = None
    sha256: str | None = None
    error: str | None = None
    hint: str | None = None
    findings: list[Any] = field(default_factory=list)  # gpuwarden.ops.triage Finding objects of this node

    def to_dict(self, root: Path) -> dict[str, Any]:
        return {"node": self.host.name, "ok": self.error is None, "remote_path": self.remote_path,
                "file": str(self.local_path.relative_to(root)) if self.local_path else None,
                "bytes": self.bytes, "sha256": self.sha256, "error": self.error, "hint": self.hint,
                "findings": len(self.findings)}


def make_output_dir(output: Path | None) -> Path:
    """A new directory (never an existing one: it may hold an earlier incident's evidence)."""
    path = Path(output) if output else Path.cwd() / time.strftime("fleet-bundle-%Y%m%d-%H%M%S")
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        raise GpuwardenError(f"{path} already exists", "give a new directory with --output; "
                             "an existing one may hold an earlier incident's bundles") from None
    except OSError as exc:
        raise GpuwardenError(f"cannot create {path}: {exc.strerror}", "choose another --output") from None
    return path


def pull_all(target: FleetTarget, out_dir: Path, bundle_args: tuple[str, ...] = (),
             on_node: Callable[[PulledBundle], None] | None = None) -> list[PulledBundle]:
    command = target.remote("bundle", "--json", *bundle_args, env={ORIGIN_ENV: fleet_origin()})
    pulled: dict[str, PulledBundle] = {}

    async def job(conn, host: Host, started: float) -> HostResult:
        item = pulled.setdefault(host.name, PulledBundle(host))
        done = await conn.run(command, check=False)
        try:
            result = json.loads(done.stdout or "")
        except ValueError:
            result = None
        if not isinstance(result, dict) or not result.get("path"):
            last = ((done.stderr or "").strip().splitlines() or [f"exited {done.exit_status}"])[-1]
            item.error = f"the node's bundle failed: {(result or {}).get('error') or last}"
            item.hint = (result or {}).get("hint") or "run `gpuwarden bundle` on that node"
            return HostResult(host, done.exit_status)
        item.remote_path = str(result["path"])
        local = out_dir / node_dir(host.name) / os.path.basename(item.remote_path)
        local.parent.mkdir(mode=0o700, exist_ok=True)
        # deferred: optional extra [fleet]; asyncssh (and cryptography) load only when a node is reached over ssh
        import asyncssh
        try:
            async with conn.start_sftp_client() as sftp:
                await sftp.get(item.remote_path, str(local))
        except asyncssh.ChannelOpenError:
            item.error = f"the node has no SFTP: its bundle stays at {item.remote_path}"
            item.hint = "enable `Subsystem sftp` in the node's sshd_config, or copy the file by hand"
            return HostResult(host, done.exit_status)
        except (asyncssh.SFTPError, OSError) as exc:
            item.error = f"copying {item.remote_path} failed: {exc}"
            item.hint = "the bundle stays on the node; copy it by hand"
            return HostResult(host, done.exit_status)
        os.chmod(local, 0o600)  # incident evidence: as private as the node keeps it
        item.local_path = local
        data = local.read_bytes()
        item.bytes, item.sha256 = len(data), hashlib.sha256(data).hexdigest()
        return HostResult(host, done.exit_status)

    def finished(result: HostResult) -> None:
        item = pulled.setdefault(result.host.name, PulledBundle(result.host))
        if result.error:
            item.error, item.hint = result.error, result.hint
        if item.local_path is not None and item.error is None:
            item.findings = node_findings(item.local_path, result.host.name)
        if on_node is not None:
            on_node(item)

    asyncio.run(fan_out(list(target.hosts), job, target.ssh, parallel=target.parallel,
                        timeout=max(target.timeout, ACTION_DEADLINE_S), on_result=finished))
    return [pulled[h.name] for h in target.hosts]


def node_dir(name: str) -> str:
    """The directory of node `name` under --output: its name, made one path component (an inventory name is
    anything a person wrote; `root@10.0.0.1:2201` stays as it is)."""
    safe = name.replace("/", "_").replace("\0", "_")
    return "_" + safe if safe in ("", ".", "..") else safe


def node_findings(bundle: Path, node: str) -> list[Any]:
    """One node's kernel-log findings, by the same triage as `gpuwarden triage` (gpuwarden.ops.triage.analyze_text)."""
    try:
        with open_bundle(bundle) as tar:
            text = read_member(tar, tar.top, kernellog.PATH)
    except GpuwardenError:
        return []
    if not text:
        return []
    return analyze_text(text.decode(errors="replace"), source=f"{node}:{kernellog.PATH}").findings


def _fleet_signature(finding: Any) -> str:
    """The signature without the node's own device address, so the same fault on two nodes matches."""
    parts = str(finding.signature).split("|")
    return "|".join(parts[1:]) if len(parts) > 1 else parts[0]


def fleet_triage(pulled: list[PulledBundle]) -> list[dict[str, Any]]:
    """Findings grouped across nodes by rule and node-independent signature; most nodes first."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for item in pulled:
        for f in item.findings:
            if f.severity == "info":
                continue
            key = (f.rule, _fleet_signature(f))
            g = groups.setdefault(key, {"rule": f.rule, "category": f.category, "severity": f.severity,
                                        "signature": key[1], "example": f.title, "nodes": [], "count": 0})
            if item.host.name not in g["nodes"]:
                g["nodes"].append(item.host.name)
            g["count"] += f.count
    out = []
    for g in groups.values():
        n = len(g["nodes"])
        what = g["signature"] or g["rule"]
        if g["category"] == "xid":
            what = f"Xid {what}" if what.isdigit() else what
        g["title"] = f"{g['category']} {what} on {n} node{'s' if n != 1 else ''}: {', '.join(g['nodes'])}"
        out.append(g)
    return sorted(out, key=lambda g: (-len(g["nodes"]), g["severity"] != "critical", g["rule"]))


def write_index(out_dir: Path, pulled: list[PulledBundle], groups: list[dict[str, Any]]) -> dict[str, Any]:
    now = time.time()
    doc = jsondoc.document(SCHEMA, {"created": now, "created_iso": jsondoc.iso(now), "origin": fleet_origin(),
                                    "nodes": [p.to_dict(out_dir) for p in pulled], "fleet_triage": groups})
    (out_dir / INDEX).write_text(jsondoc.dumps(doc) + "\n")
    lines = ["# Fleet bundle", "", f"{sum(1 for p in pulled if not p.error)}/{len(pulled)} node(s) collected.", "",
             "## Fleet triage (same signature on several nodes first)", ""]
    lines += [f"- {g['title']}" for g in groups] or ["- no findings in the kernel logs"]
    lines += ["", "## Nodes", ""]
    for p in pulled:
        lines.append(f"- {p.host.name}: " + (str(p.local_path.relative_to(out_dir)) if p.local_path else
                                             f"NOT COLLECTED: {p.error}"))
    (out_dir / "index.md").write_text("\n".join(lines) + "\n")
    return doc
