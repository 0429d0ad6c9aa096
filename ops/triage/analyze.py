"""Run the pattern library over a log and group matches into findings by signature.

Also turns a snapshot's residual VRAM into findings, so a bundle's triage covers both.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..units import fmt_bytes
from . import segfault, xid
from .findings import Finding, Report
from .logline import LogLine, join_continuations, parse_lines
from .patterns import RULES, Rule

_DEVICE = re.compile(r"\b(?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\b")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<dev>[^)]*)\): (?P<xid>\d+),\s*(?P<rest>.*)$")
_XID_PROC = re.compile(r"^pid='?(?P<pid>[^,']*)'?, name=(?P<name>[^,]*),\s*")
_NV_UUID = re.compile(r"NVRM: GPU at (?:PCI:)?(?P<dev>[\w:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
_NV_DRIVER = re.compile(r"NVRM: loading NVIDIA UNIX (?P<open>Open )?Kernel Module for \S+\s+(?P<version>[\d.]+)")
_OOM_CONSTRAINT = re.compile(
    r"oom-kill:constraint=(?P<constraint>\w+),.*?(?:task_memcg=(?P<memcg>[^,]*),)?task=(?P<proc>[^,]*),"
    r"pid=(?P<pid>\d+),uid=(?P<uid>\d+)")
_OOM_KILL = re.compile(
    r"(?P<scope>Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: Kill(?:ed)? process (?P<pid>\d+) "
    r"\((?P<proc>[^)]*)\)(?: total-vm:(?P<vm>\d+)kB, anon-rss:(?P<anon>\d+)kB, file-rss:(?P<file>\d+)kB,"
    r" shmem-rss:(?P<shmem>\d+)kB)?")
_CATCHALL_LEVELS = ("emerg", "alert", "crit", "err")
_NORM_HEX = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{8,}\b")
_NORM_NUM = re.compile(r"\b\d+\b")
FOLLOW_WINDOW = 16  # lines after a header that may still carry its detail
MAX_DETAIL_VALUES = 8
MAX_CATCHALL = 20
DEVICE_CARRY = 50  # lines over which a device named earlier is taken for lines that name none


class _Analyzer:
    def __init__(self, source: str):
        self.source = source
        self.findings: dict[tuple[str, str], Finding] = {}
        self.notes: list[str] = []
        self.active: tuple[Rule, Finding, int] | None = None  # rule with follow lines, finding, line idx
        self.oom_pending: dict[str, dict[str, Any]] = {}
        self.catchall = 0
        self.last_device: tuple[str, int] | None = None  # (device, line idx) of the last line naming one

    def finding(self, key: tuple[str, str], **kw: Any) -> Finding:
        f = self.findings.get(key)
        if f is None:
            f = Finding(rule=key[0], signature=key[1], source=self.source, **kw)
            self.findings[key] = f
        return f

    @staticmethod
    def device_of(message: str) -> str | None:
        m = _DEVICE.search(message)
        return m.group(1) if m else None

    def nearby_device(self) -> str | None:
        """The device of a recent line: amdgpu prints some messages ("amdgpu: Failed to ...") without it."""
        if self.last_device and self.idx - self.last_device[1] <= DEVICE_CARRY:
            return self.last_device[0]
        return None

    @staticmethod
    def detail(f: Finding, name: str, value: Any) -> None:
        values = f.details.setdefault(name, [])
        if value not in values and len(values) < MAX_DETAIL_VALUES:
            values.append(value)

    # --- one line ---------------------------------------------------------------------------
    def line(self, idx: int, line: LogLine) -> None:
        msg = line.message
        dev = self.device_of(msg)
        if dev:
            self.last_device = (dev, idx)
        self.idx = idx
        if self.follow(idx, line):
            return
        low = msg.lower()
        # The substring tests are literals these regexes require: they spare a search on most lines.
        if ("segfault" in low or "traps:" in low) and self.crash(line):
            return
        if "nvrm" in low and (self.xid(line) or self.nvidia_context(msg)):
            return
        if ("oom" in low or "out of memory" in low) and self.oom(line):
            return
        matched = False
        for rule in RULES:
            if rule.hint is not None and rule.hint not in low:
                continue
            m = rule.regex.search(msg)
            if m:
                self.record(idx, line, rule, m)
                matched = True
        if not matched:
            self.unclassified(line)

    def follow(self, idx: int, line: LogLine) -> bool:
        if self.active is None:
            return False
        rule, f, at = self.active
        if idx - at > FOLLOW_WINDOW:
            self.active = None
            return False
        dev = self.device_of(line.message)
        if dev and f.devices and dev not in f.devices:
            return False
        for pat in rule.follow:
            m = pat.search(line.message)
            if not m:
                continue
            g = {k: v for k, v in m.groupdict().items() if v is not None}
            if "proc" in g and "pid" in g:
                victim = {"process": g["proc"], "pid": int(g["pid"])}
                if g.get("thread"):
                    victim["thread"] = g["thread"].strip()
                if int(g["pid"]) != 0 or g["proc"]:
                    f.add_victim(victim)
            elif "field" in g:
                self.detail(f, g["field"].lower(), g["value"])
            else:
                for k, v in g.items():
                    self.detail(f, k, v)
            self.active = (rule, f, idx)
            return True
        return False

    def record(self, idx: int, line: LogLine, rule: Rule, m: re.Match) -> None:
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        device = (self.device_of(line.message) or groups.get("dev1") or groups.get("dev2") or groups.get("dev3")
                  or self.nearby_device())
        sig_parts = [device or ""] + [groups.get(k, "") for k in rule.key]
        signature = "|".join(sig_parts)

        class _Default(dict):
            def __missing__(self, k: str) -> str:
                return ""
        title = rule.title.format_map(_Default(groups, device=device or "the GPU")).strip()
        f = self.finding((rule.id, signature), category=rule.category, severity=rule.severity, title=title,
                         meaning=rule.meaning)
        f.add(line.number, line.stamp, line.raw, device)
        for k, v in groups.items():
            if k not in rule.key and k not in rule.victim and not k.startswith("dev"):
                self.detail(f, k, v)
        if rule.victim:
            victim = {("process" if k == "proc" else "pid" if k in ("rpid",) else k):
                      (int(v) if k.endswith("pid") else v) for k, v in groups.items() if k in rule.victim and v}
            # "process  pid 0": the kernel had no process to name (a kernel queue), so nobody to list
            if victim and (victim.get("pid") or victim.get("process")):
                f.add_victim(victim)
        self.active = (rule, f, idx) if rule.follow else self.active

    def crash(self, line: LogLine) -> bool:
        c = segfault.parse(line.message)
        if c is None:
            return False
        f = self.finding(("userspace.crash", c.signature), category="segfault", severity="error",
                         title="", meaning="")
        f.add(line.number, line.stamp, line.raw, None)
        f.add_victim({"process": c.process, "pid": c.pid, "ip": f"{c.ip:#x}",
                      **({"address": f"{c.address:#x}"} if c.address is not None else {}),
                      "error": c.error, **({"cpu": c.cpu} if c.cpu is not None else {}),
                      **({"stamp": line.stamp} if line.stamp else {})})
        f.details.update({"library": c.library, "offset": f"{c.offset:#x}" if c.offset is not None else None,
                          "kind": c.kind, "access": c.access()})
        n = len({(v["process"], v["pid"]) for v in f.victims})
        where = f"{c.where} at offset {c.offset:#x}" if c.offset is not None else c.where
        if n > 1:
            names = sorted({v["process"] for v in f.victims})
            f.title = (f"{n} processes crashed with the same signature: {c.kind} in {where} "
                       f"({', '.join(names)})")
            f.severity = "critical"
        else:
            f.title = f"{c.process}[{c.pid}] {c.kind} in {where}"
        f.meaning = (f"{c.access()}; the same library+offset in several processes means one bug hit by "
                     f"all of them (a shared cause), not independent crashes")
        return True

    def xid(self, line: LogLine) -> bool:
        m = _XID.search(line.message)
        if not m:
            return False
        number, dev, rest = int(m["xid"]), m["dev"], m["rest"]
        meaning, severity = xid.describe(number)
        f = self.finding(("nvidia.xid", f"{dev}|{number}"), category="xid", severity=severity,
                         title=f"NVIDIA Xid {number} on {dev}: {meaning}", meaning=meaning)
        f.details["xid"] = number
        f.add(line.number, line.stamp, line.raw, dev)
        p = _XID_PROC.match(rest)
        if p:
            rest = rest[p.end():]
            if p["pid"] not in ("<unknown>", ""):
                f.add_victim({"process": p["name"].strip(), "pid": int(p["pid"]) if p["pid"].isdigit() else p["pid"]})
        self.detail(f, "message", rest.strip())
        return True

    def nvidia_context(self, msg: str) -> bool:
        """Lines that are context, not trouble: which UUID a bus id is, which driver loaded."""
        m = _NV_UUID.search(msg)
        if m:
            note = f"NVIDIA GPU {m['dev']} is {m['uuid']}"
        else:
            m = _NV_DRIVER.search(msg)
            if not m:
                return False
            note = f"NVIDIA {'open ' if m['open'] else ''}kernel module {m['version']} loaded"
        if note not in self.notes:
            self.notes.append(note)
        return True

    def oom(self, line: LogLine) -> bool:
        m = _OOM_CONSTRAINT.search(line.message)
        if m:
            self.oom_pending[m["pid"]] = {"constraint": m["constraint"], "memcg": m["memcg"], "uid": int(m["uid"]),
                                          "process": m["proc"], "line": line}
            return True
        m = _OOM_KILL.search(line.message)
        if not m:
            return False
        ctx = self.oom_pending.pop(m["pid"], {})
        self._oom_victim(line, m["proc"], int(m["pid"]), ctx, m.groupdict(), m["scope"])
        return True

    def _oom_victim(self, line: LogLine, proc: str, pid: int, ctx: dict, g: dict, scope: str) -> None:
        f = self.finding(("oom.kill", proc), category="oom", severity="error",
                         title=f"OOM killer killed {proc}",
                         meaning="host memory ran out (or a cgroup limit was hit); the victim below is the "
                                 "process the kernel chose, not necessarily the one that grew")
        f.add(line.number, line.stamp, line.raw, None)
        victim: dict[str, Any] = {"process": proc, "pid": pid}
        if g.get("anon"):
            victim["anon_rss"] = int(g["anon"]) * 1024
            victim["total_vm"] = int(g["vm"]) * 1024
        if ctx.get("constraint"):
            victim["constraint"] = ctx["constraint"]
        if ctx.get("memcg"):
            victim["memcg"] = ctx["memcg"]
        if scope.startswith("Memory cgroup"):
            victim["constraint"] = "CONSTRAINT_MEMCG"
        f.add_victim(victim)
        n = len(f.victims)
        rss = f", anon-rss {fmt_bytes(victim['anon_rss'])}" if "anon_rss" in victim and n == 1 else ""
        f.title = f"OOM killer killed {proc}" + (f" ({n} times)" if n > 1 else f" (pid {pid}{rss})")

    def unclassified(self, line: LogLine) -> None:
        msg = line.message
        if not (line.level in _CATCHALL_LEVELS or "*ERROR*" in msg):
            return
        norm = _NORM_NUM.sub("N", _NORM_HEX.sub("0x…", _DEVICE.sub("<dev>", msg))).strip()
        key = ("unclassified", norm)
        if key not in self.findings:
            if self.catchall >= MAX_CATCHALL:
                return
            self.catchall += 1
        f = self.finding(key, category="other", severity="warning", title=f"unclassified error: {norm[:160]}",
                         meaning="an error-level kernel line no pattern knows; read it in context")
        f.add(line.number, line.stamp, line.raw, self.device_of(msg))

    def finish(self) -> None:
        for pid, ctx in self.oom_pending.items():
            # constraint line seen, kill line lost (rate limit or trimmed log)
            self._oom_victim(ctx["line"], ctx["process"], int(pid), ctx, {}, "Out of memory")
        self.oom_pending.clear()


def analyze_text(text: str, source: str = "", snapshot: dict[str, Any] | None = None) -> Report:
    """Findings for one log's text (any of the formats logline knows), plus residual VRAM if given."""
    lines = join_continuations(parse_lines(text))
    a = _Analyzer(source)
    for idx, line in enumerate(lines):
        a.line(idx, line)
    a.finish()
    report = Report(source=source, lines=len(text.splitlines()), findings=list(a.findings.values()),
                    notes=a.notes)
    if snapshot:
        _name_engines(report, snapshot)
        report.findings.extend(residual_findings(snapshot, source))
    if not any(line.stamp for line in lines) and lines:
        report.notes.append("the log has no timestamps: findings cannot be placed in time")
    return report


def analyze_file(path: Path, snapshot: dict[str, Any] | None = None) -> Report:
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    return analyze_text(text, source=str(path), snapshot=snapshot)


def _name_engines(report: Report, snapshot: dict[str, Any]) -> None:
    """Mark victims that were supervised engines, so "4 processes" reads as "engines e0..e3"."""
    by_pid = {e.get("pid"): e.get("name") for e in snapshot.get("engines", []) or [] if e.get("pid")}
    if not by_pid:
        return
    for f in report.findings:
        for v in f.victims:
            name = by_pid.get(v.get("pid"))
            if name:
                v["engine"] = name


def residual_findings(snapshot: dict[str, Any], source: str = "") -> list[Finding]:
    """Residual VRAM at collection time, one finding per GPU that has some worth showing."""
    out = []
    for r in snapshot.get("residual", []) or []:
        holders = r.get("holders") or []
        if not (r.get("significant") or holders):
            continue
        gpu = r.get("gpu_index")
        amount = r.get("residual")
        who = ", ".join(
            f"{h.get('command') or '?'}[{h.get('pid')}] ({h.get('reason')})" for h in holders[:6]) or "no live holder"
        f = Finding(rule="snapshot.residual_vram", category="residual-vram",
                    severity="error" if r.get("significant") else "warning",
                    title=f"GPU {gpu}: {fmt_bytes(amount) if amount is not None else 'unknown'} residual VRAM, held by {who}",
                    signature=str(gpu), source=source or "snapshot",
                    meaning="VRAM used on the device that no live process accounts for (minus the idle "
                            "baseline): `gpuwarden purge` removes the holders; ownerless leaks need a reset",
                    count=1, devices=[f"gpu{gpu}"],
                    victims=[{"process": h.get("command"), "pid": h.get("pid"), "reason": h.get("reason"),
                              "vram": h.get("vram_bytes")} for h in holders],
                    details={"device_used": r.get("device_used"), "accounted": r.get("accounted"),
                             "baseline": r.get("baseline"), "residual": amount})
        out.append(f)
    return out
