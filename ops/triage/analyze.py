"""The line-at-a-time analyzer: one kernel (or engine) log line in, findings grouped by signature kept.

State is small and bounded (the open detail window, the held line a continuation may extend, pending
OOM records, capped findings), so a file of any size, a pipe or the agent's live kernel-log watch all
use the same object. analyze_text()/analyze_file() wrap it; stream.py feeds it only the lines that can
matter; live.py reports what each new line changed.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.triage import engine, segfault, xid
from gpuwarden.ops.triage.findings import CAUSE, HARDWARE, OTHER, SHARED_CRASH, Finding, Report
from gpuwarden.ops.triage.dispatch import Dispatch
from gpuwarden.ops.triage.logline import HUMAN_HINT, LineParser, LogLine, parse as parse_line
from gpuwarden.ops.triage.patterns import BY_ID, PF_DETAIL, PROCESS_LINE, RULES, Rule
from gpuwarden.ops.triage.plan import DEVICE as _DEVICE, GPU_DRIVER_LINE, HOW_BAD as _HOW_BAD, MISS as _MISS, Hit, Plan, device_of

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<dev>[^)]{1,64})\): (?P<xid>\d+),\s*(?P<rest>[^\n]*)$")
_XID_PROC = re.compile(r"^pid='?(?P<pid>[^,']*)'?, name=(?P<name>[^,]*),\s*")
_XID_CAUSE = re.compile(r"caused by previous Xid (?P<cause>\d+)")
_NV_UUID = re.compile(r"NVRM: GPU at (?:PCI:)?(?P<dev>[\w:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
_NV_DRIVER = re.compile(r"NVRM: loading NVIDIA UNIX (?P<open>Open )?Kernel Module for \S+\s+(?P<version>[\d.]+)")
_OOM_CONSTRAINT = re.compile(
    r"oom-kill:constraint=(?P<constraint>\w+),[^\n]{0,600}?(?:task_memcg=(?P<memcg>[^,]*),)?task=(?P<proc>[^,]*),"
    r"pid=(?P<pid>\d+),uid=(?P<uid>\d+)")
_OOM_KILL = re.compile(
    r"(?P<scope>Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: Kill(?:ed)? process (?P<pid>\d+) "
    r"\((?P<proc>[^)]*)\)(?: total-vm:(?P<vm>\d+)kB, anon-rss:(?P<anon>\d+)kB, file-rss:(?P<file>\d+)kB,"
    r" shmem-rss:(?P<shmem>\d+)kB)?")
_PROCESS = re.compile(PROCESS_LINE)
_PF_DETAIL = tuple(re.compile(p) for p in PF_DETAIL)
# Literals the special handlers need (besides every rule's own): segfaults, Xids, OOM, orphan details.
_ORPHAN_TRIGGERS = frozenset({"process information", "in page starting at", "protection_fault_status", "faulty utcl2",
                              "more_faults", "walker_error", "permission_faults", "mapping_error", "rw: 0x",
                              "cookie node_id", "at page 0x"})
_NVIDIA_TRIGGERS = frozenset({"nvrm: xid", "nvrm: gpu at", "nvrm: loading"})
SPECIALS = ("segfault", "traps:", "oom", "out of memory") + tuple(sorted(_NVIDIA_TRIGGERS | _ORPHAN_TRIGGERS))
_CATCHALL_LEVELS = ("emerg", "alert", "crit", "err")
_NORM_HEX = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{8,}\b")
_NORM_NUM = re.compile(r"\b\d+\b")
MAX_DETAIL_VALUES = 8
MAX_CATCHALL = 20
MAX_FINDINGS = 2000  # distinct signatures kept; past it new ones are counted in a note, never stored
MAX_OOM_PENDING = 64
MEMO_SIZE = 2048  # plans per generation (two kept): a storm's messages fit many times over
# What a line that matters for the lines after it holds: a `dmesg -H` stamp, or a GPU driver word.
_CONTEXT_HINT = re.compile(HUMAN_HINT.pattern + "|amdgpu|nvidia|drm|NVRM")
DEVICE_CARRY = 50  # lines over which a GPU driver line's device is taken for driver lines that name none


def _normalise(message: str) -> str:
    """An error line with its devices, addresses and numbers blanked: the catch-all's signature."""
    return _NORM_NUM.sub("N", _NORM_HEX.sub("0x…", _DEVICE.sub("<dev>", message))).strip()


def _follow_groups(rule: Rule, message: str, low: str) -> tuple[dict[str, str], dict[tuple[str, str], Finding]] | None:
    """The groups of the first of rule's detail-line patterns that matches message (None: none does), with
    an empty record of the findings they were applied to."""
    for pat, hint in zip(rule.follow, rule.follow_hints):
        if hint is not None and hint not in low:
            continue
        m = pat.search(message)
        if m:
            return {k: v for k, v in m.groupdict().items() if v is not None}, {}
    return None


class _Blank(dict[str, str]):
    """Format mapping where a group that did not take part in the match prints as nothing."""

    def __missing__(self, k: str) -> str:
        return ""


_OPTIONAL = re.compile(r"\[\[(.*?)\]\]")
_FIELD = re.compile(r"\{(\w+)\}")


def format_title(template: str, groups: dict[str, str], device: str | None) -> str:
    """A rule's title with its groups filled in; [[...]] parts whose fields did not all match are left out."""
    values = _Blank(groups, device=device or "the GPU", place=device or groups.get("gpu_no") or "the GPU")
    if "[[" in template:
        template = _OPTIONAL.sub(lambda m: m.group(1) if any(values[f] for f in _FIELD.findall(m.group(1)))
                                 else "", template)
    return template.format_map(values).strip()


class Analyzer:
    """Feed lines in order with feed(); finish() gives the Report. changed() lists what the last feeds touched."""

    def __init__(self, source: str = "", rules: tuple[Rule, ...] = RULES + engine.RULES) -> None:
        self.source = source
        self.rules = rules
        self.dispatch = Dispatch(rules, SPECIALS)
        self.memo: dict[str, Plan] = {}  # message -> what its text alone decides (storms repeat messages)
        self.memo_old: dict[str, Plan] = {}  # the generation before: what is still used moves back to memo
        self.parser = LineParser()
        self.findings: dict[tuple[str, str], Finding] = {}
        self.notes: list[str] = []
        self.active: tuple[Rule, Finding, int] | None = None  # rule with follow lines, its finding, line number
        self.held: LogLine | None = None  # the last prefixed line: an indented continuation extends it
        self.held_matched = False
        self.held_last = 0
        self.oom_pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.orphan_faults: dict[str, Finding] = {}  # device -> fault details whose header is not in the log
        self.tracebacks = engine.TracebackTracker(self._engine_finding)
        self.catchall = 0
        self.dropped = 0  # signatures not kept because of MAX_FINDINGS
        self.last_gpu_device: tuple[str, int] | None = None
        self.number = 0
        self.lines = 0
        self.stamped = 0
        self.touched: set[tuple[str, str]] = set()

    # --- input ------------------------------------------------------------------------------
    def feed(self, raw: str, number: int | None = None) -> None:
        """One raw line (with or without its newline). `number` is its 1-based line number when lines were skipped."""
        self.feed_line(self.parser.parse(number if number is not None else self.number + 1, raw))

    def feed_line(self, line: LogLine) -> None:
        """One line parsed by self.parser, in order (stream.py parses a block at once: lineparse.parse_block)."""
        self.number = line.number
        self.lines += 1
        if line.stamp:
            self.stamped += 1
        held = self.held
        if line.continuation and held is not None and self.number == self.held_last + 1:
            joined = LogLine(held.number, held.raw + "\n" + line.raw, held.message.rstrip() + " " + line.message.strip(),
                             held.stamp, held.mono, held.wall, held.level, held.program, False, True)
            self.held, self.held_last = joined, self.number
            if not self.held_matched:
                self.held_matched = self._line(joined)
            return
        matched = self._line(line)
        self.held, self.held_matched = (line, matched) if line.prefixed else (None, False)
        self.held_last = self.number

    def skip(self, raw: str | None = None) -> None:
        """Count a line the caller knows cannot matter (no rule literal, no open window, not a continuation).

        Given its text, what it tells about the lines after it is kept: a `dmesg -H` stamp moves the clock, a GPU
        driver line names the GPU for the driver lines after it that name none."""
        self.number += 1
        self.lines += 1
        if raw is None or not _CONTEXT_HINT.search(raw):  # most skipped lines: one search
            return
        if HUMAN_HINT.search(raw):
            self.parser.parse(self.number, raw)
        if "amdgpu" in raw or "nvidia" in raw or "drm" in raw or "NVRM" in raw:
            self.note_gpu_line(raw, self.number)

    def note_gpu_line(self, raw: str, number: int) -> bool:
        """A skipped line (no rule literal): when it is a GPU driver line naming a device, that device is taken
        for driver lines after it that name none, as feed() would. True when it was such a line."""
        message = parse_line(number, raw).message  # a parser of its own: a skipped line leaves no parser state
        dev = device_of(message)
        if dev is None or GPU_DRIVER_LINE.search(message) is None:
            return False
        self.last_gpu_device = (dev, number)
        return True

    @property
    def following(self) -> bool:
        """True while an open detail window wants the next lines whatever they say."""
        if self.tracebacks.open:
            return True
        if self.active is None:
            return False
        rule, _, at = self.active
        return self.number - at <= rule.window

    def changed(self) -> list[Finding]:
        """Findings created or grown since the last call (for a live watch)."""
        out = [self.findings[k] for k in self.touched if k in self.findings]
        self.touched.clear()
        return out

    # --- one line ---------------------------------------------------------------------------
    def _line(self, line: LogLine) -> bool:
        msg = line.message
        # One plan per distinct message: its device, the rules whose literals it holds (one RE2 set search),
        # every regex result on it. A repeat runs no regex; what follows is the state the line meets.
        plan = self.memo.get(msg)
        if plan is None:
            plan = self._plan(msg)
        dev = plan.dev
        if plan.gpu_line and dev is not None:  # a GPU driver line names its device (Plan.gpu_line)
            self.last_gpu_device = (dev, self.number)
            active = self.active
            if active is not None and not active[1].devices and active[0].gpu and self.following:
                # a driver line right after a header that named no GPU (a ring timeout): it is about that GPU
                f = active[1]
                f.devices.append(dev)
                f.title = f.title.replace("the GPU", dev, 1)
        if self.active is not None and self._follow(line, plan, self.active):
            return True
        if (plan.traceback or self.tracebacks.open) and self.tracebacks.feed(line):
            return True
        specials = plan.specials
        if specials:
            if ("segfault" in specials or "traps:" in specials) and self._crash(line, plan):
                return True
            if specials & _NVIDIA_TRIGGERS and (self._xid(line, plan) or self._nvidia_context(plan)):
                return True
            if ("oom" in specials or "out of memory" in specials) and self._oom(line, plan):
                return True
        hits = plan.hits
        if hits is None:
            hits = plan.hits = [Hit(rule, m, dev) for rule, m in
                                ((self.rules[i], self.rules[i].regex.search(msg)) for i in plan.candidates) if m]
        for hit in hits:
            self._record(line, hit)
        matched = bool(hits)
        if not matched and specials & _ORPHAN_TRIGGERS:
            matched = self._orphan(line, plan)
        if not matched and (plan.error_word or line.level in _CATCHALL_LEVELS):
            self._unclassified(line, plan)
        return matched

    def _plan(self, msg: str) -> Plan:
        """The plan of a message not in the current generation: from the one before, or made now."""
        plan = self.memo_old.get(msg) or Plan(msg, self.dispatch)
        if len(self.memo) >= MEMO_SIZE:
            # bounded memory without dropping the messages a storm keeps repeating (a plain clear() would)
            self.memo_old, self.memo = self.memo, {}
        self.memo[msg] = plan
        return plan

    def _nearby_gpu_device(self) -> str | None:
        """A recent GPU driver line's device: amdgpu prints some messages ("[drm:...] *ERROR* ring ...") without it."""
        if self.last_gpu_device and self.number - self.last_gpu_device[1] <= DEVICE_CARRY:
            return self.last_gpu_device[0]
        return None

    def _finding(self, key: tuple[str, str], **kw: Any) -> Finding | None:
        f = self.findings.get(key)
        if f is None:
            if len(self.findings) >= MAX_FINDINGS:
                self.dropped += 1
                return None
            f = Finding(rule=key[0], signature=key[1], source=self.source, **kw)
            self.findings[key] = f
        self.touched.add(key)
        return f

    def _add(self, f: Finding, line: LogLine, device: str | None) -> None:
        if line.wall is not None:
            f.add(line.number, line.stamp, line.raw, device, line.wall, "epoch")
        else:
            f.add(line.number, line.stamp, line.raw, device, line.mono, "boot" if line.mono is not None else None)

    @staticmethod
    def _detail(f: Finding, name: str, value: Any) -> None:
        values = f.details.setdefault(name, [])
        if isinstance(values, list) and value not in values and len(values) < MAX_DETAIL_VALUES:
            values.append(value)

    def _follow(self, line: LogLine, plan: Plan, active: tuple[Rule, Finding, int]) -> bool:
        rule, f, at = active
        if self.number - at > rule.window:
            self.active = None
            return False
        dev = plan.dev
        if dev and f.devices and dev not in f.devices and rule.gpu:
            return False
        follow = plan.found.get(id(rule), _MISS)
        if follow is _MISS:
            follow = plan.found[id(rule)] = _follow_groups(rule, plan.message, plan.low)
        if follow is None:
            return False
        g, seen = follow
        key = (f.rule, f.signature)
        if seen.get(key) is not f or "event_severity" in g:
            # the details, devices and victim a detail line adds are there already when the same line was
            # applied to the same finding before (they only grow); a severity it sets is not (the header may
            # have raised it since)
            self._apply_detail(f, rule, g)
            seen[key] = f
        self.touched.add(key)
        return True

    def _apply_detail(self, f: Finding, rule: Rule | None, g: dict[str, str]) -> None:
        if "proc" in g and "pid" in g:
            if int(g["pid"]) != 0 or g["proc"].strip():
                victim: dict[str, Any] = {"process": g["proc"].strip(), "pid": int(g["pid"])}
                if g.get("thread", "").strip():
                    victim["thread"] = g["thread"].strip()
                f.add_victim(victim)
            return
        if "field" in g:
            self._detail(f, g["field"].lower(), g["value"])
            return
        for k, v in g.items():
            if k == "event_severity" and rule is not None and rule.adjust:
                new = rule.adjust({k: v})
                if new:
                    f.severity = new
                self._detail(f, k, v)
            elif k == "pci":
                if v not in f.devices:
                    f.devices.append(v)
            elif k == "gpu_driver":
                if not f.details.get("gpu_driver"):
                    f.title += f" in the GPU driver [{v}]"
                self._detail(f, k, v)
            elif k == "module":
                if not f.details.get("module"):
                    f.title += f" in [{v}]"
                self._detail(f, k, v)
            else:
                self._detail(f, k, v)

    def _record(self, line: LogLine, hit: Hit) -> None:
        rule = hit.rule
        device = hit.device
        if device is None and rule.gpu:
            device = self._nearby_gpu_device()
        key = hit.keys.get(device)
        if key is None:
            key = hit.keys[device] = (rule.id, (device or "") + hit.tail)
        f = self.findings.get(key)
        if f is None:
            title = format_title(rule.title, hit.groups, device)
            f = self._finding(key, category=rule.category, severity=hit.severity, title=title,
                              meaning=rule.meaning, check=rule.check, tier=rule.tier)
            if f is None:
                return
        else:
            self.touched.add(key)
        if hit.how_bad < _HOW_BAD.get(f.severity, 3):
            f.severity = hit.severity
        self._add(f, line, device)
        if rule.id == "amdgpu.page_fault" and device in self.orphan_faults:
            self._merge_orphan(f, self.orphan_faults.pop(device))
        if hit.seen.get(key) is not f:
            for k, v in hit.details:
                self._detail(f, k, v)
            if hit.victim is not None:
                f.add_victim(dict(hit.victim))
            hit.seen[key] = f
        if rule.follow:
            self.active = (rule, f, self.number)

    def _orphan(self, line: LogLine, plan: Plan) -> bool:
        """Detail lines whose header is not in the log: kept, with the process they name."""
        dev = plan.dev
        if "process information:" in plan.low:
            m = plan.search(_PROCESS)
            if m:
                rule = BY_ID["amdgpu.ring_timeout"]
                device = dev or self._nearby_gpu_device()
                f = self._finding((rule.id, f"{device or ''}|?"), category=rule.category, severity=rule.severity,
                                  title=f"a GPU job timed out on {device or 'the GPU'} (its ring timeout line is "
                                        f"not in the log)", meaning=rule.meaning, check=rule.check, tier=rule.tier)
                if f is not None:
                    self._add(f, line, device)
                    self._apply_detail(f, rule, {k: v for k, v in m.groupdict().items() if v is not None})
                return True
        if dev is None:
            return False
        for pat in _PF_DETAIL:
            m = plan.search(pat)
            if not m:
                continue
            rule = BY_ID["amdgpu.page_fault"]
            f = self.orphan_faults.get(dev)
            if f is None:
                f = self._finding((rule.id, f"{dev}|?"), category=rule.category, severity=rule.severity,
                                  title=f"GPU page fault on {dev} (its header line is not in the log)",
                                  meaning=rule.meaning, check=rule.check, tier=rule.tier)
                if f is None:
                    return True
                self._add(f, line, dev)
                self.orphan_faults[dev] = f
            self._apply_detail(f, rule, {k: v for k, v in m.groupdict().items() if v is not None})
            self.active = (rule, f, self.number)
            return True
        return False

    def _merge_orphan(self, f: Finding, orphan: Finding) -> None:
        """A fault's header came after details cut from an earlier one: one finding, not two."""
        self.findings.pop((orphan.rule, orphan.signature), None)
        f.count += orphan.count
        if orphan.first_line is not None and (f.first_line is None or orphan.first_line < f.first_line):
            f.first_line, f.first_stamp, f.first_time = orphan.first_line, orphan.first_stamp, orphan.first_time
        for v in orphan.victims:
            f.add_victim(v)
        for k, values in orphan.details.items():
            for v in values if isinstance(values, list) else [values]:
                self._detail(f, k, v)

    def _crash(self, line: LogLine, plan: Plan) -> bool:
        c = plan.once("segfault", segfault.parse, plan.message)
        if c is None:
            return False
        f = self._finding(("userspace.crash", c.signature), category="segfault", severity="error", title="",
                          meaning="", check="", tier=CAUSE)
        if f is None:
            return True
        self._add(f, line, None)
        when = line.wall if line.wall is not None else line.mono
        f.add_victim({"process": c.process, "pid": c.pid, "ip": f"{c.ip:#x}",
                      **({"address": f"{c.address:#x}"} if c.address is not None else {}),
                      "error": c.error, **({"cpu": c.cpu} if c.cpu is not None else {}),
                      **({"stamp": line.stamp} if line.stamp else {}), **({"time": when} if when is not None else {})})
        f.details.update({"library": c.library, "offset": f"{c.offset:#x}" if c.offset is not None else None,
                          "kind": c.kind, "access": c.access(), "signal": c.signal})
        n = len({(v["process"], v["pid"]) for v in f.victims})
        where = f"{c.where} at offset {c.offset:#x}" if c.offset is not None else c.where
        f.details["short"] = f"{c.kind} in {where}"
        if n > 1:
            names = sorted({v["process"] for v in f.victims})
            f.title = (f"{n} processes crashed with the same signature: {c.kind} in {where} "
                       f"({', '.join(names[:6])})")
            f.severity, f.tier = "critical", SHARED_CRASH
        else:
            f.title = f"{c.process}[{c.pid}] {c.kind} in {where}"
        f.meaning = (f"{c.access()}; the same library+offset in several processes means one bug hit by "
                     f"all of them (a shared cause), not independent crashes")
        f.check = ("what the processes had in common just before (the same library call, e.g. registering the "
                   "same shared memory); a core dump's backtrace (`gpuwarden bundle` collects it)")
        return True

    def _xid(self, line: LogLine, plan: Plan) -> bool:
        m = plan.search(_XID)
        if not m:
            return False
        number, dev, rest = int(m["xid"]), m["dev"].strip(), m["rest"]
        meaning, _ = xid.describe(number)
        hardware = xid.is_hardware(number)
        severity = xid.adjusted_severity(number, rest)
        title = f"NVIDIA Xid {number} on {dev}: {meaning}"
        cause = plan.once("xid_cause", _XID_CAUSE.search, rest)
        if cause:
            title += f"; caused by Xid {cause['cause']} ({xid.describe(int(cause['cause']))[0]})"
        f = self._finding(("nvidia.xid", f"{dev}|{number}"), category="xid", severity=severity, title=title,
                          meaning=meaning, check=xid.CHECK_HARDWARE if hardware else xid.CHECK_APPLICATION,
                          tier=HARDWARE if hardware else CAUSE)
        if f is None:
            return True
        if _HOW_BAD[severity] < _HOW_BAD.get(f.severity, 3):
            f.severity = severity
        f.details["xid"] = number
        self._add(f, line, dev)
        if cause:
            self._detail(f, "caused_by", int(cause["cause"]))
        p = plan.once("xid_proc", _XID_PROC.match, rest)
        if p:
            rest = rest[p.end():]
            if p["pid"] not in ("<unknown>", "", "N/A"):
                f.add_victim({"process": p["name"].strip(), "pid": int(p["pid"]) if p["pid"].isdigit() else p["pid"]})
        elif rest.startswith("name="):
            f.add_victim({"process": rest[5:].split(",", 1)[0].strip()})
        self._detail(f, "message", rest.strip()[:300])
        return True

    def _nvidia_context(self, plan: Plan) -> bool:
        """Lines that are context, not trouble: which UUID a bus id is, which driver loaded."""
        m = plan.search(_NV_UUID)
        if m:
            note = f"NVIDIA GPU {m['dev']} is {m['uuid']}"
        else:
            m = plan.search(_NV_DRIVER)
            if not m:
                return False
            note = f"NVIDIA {'open ' if m['open'] else ''}kernel module {m['version']} loaded"
        if note not in self.notes and len(self.notes) < 64:
            self.notes.append(note)
        return True

    def _oom(self, line: LogLine, plan: Plan) -> bool:
        m = plan.search(_OOM_CONSTRAINT)
        if m:
            self.oom_pending[m["pid"]] = {"constraint": m["constraint"], "memcg": m["memcg"], "uid": int(m["uid"]),
                                          "process": m["proc"], "line": line}
            while len(self.oom_pending) > MAX_OOM_PENDING:
                self.oom_pending.popitem(last=False)
            return True
        m = plan.search(_OOM_KILL)
        if not m:
            return False
        ctx = self.oom_pending.pop(m["pid"], {})
        self._oom_victim(line, m["proc"], int(m["pid"]), ctx, m.groupdict(), m["scope"])
        return True

    def _oom_victim(self, line: LogLine, proc: str, pid: int, ctx: dict[str, Any], g: dict[str, str | None],
                    scope: str) -> None:
        f = self._finding(("oom.kill", proc), category="oom", severity="error", title=f"OOM killer killed {proc}",
                          meaning="host memory ran out (or a cgroup limit was hit); the victim is the process the "
                                  "kernel chose, not necessarily the one that grew",
                          check="which process grew (the task table before the kill, or the cgroup's memory.peak); "
                                "a cgroup OOM means the container limit, not the node, was hit", tier=CAUSE)
        if f is None:
            return
        self._add(f, line, None)
        victim: dict[str, Any] = {"process": proc, "pid": pid}
        anon, vm = g.get("anon"), g.get("vm")
        if anon and vm:  # one optional group of the kill line: both or neither
            victim["anon_rss"] = int(anon) * 1024
            victim["total_vm"] = int(vm) * 1024
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

    def _engine_finding(self, rule: Rule, line: LogLine, title: str, details: dict[str, Any],
                        victim: dict[str, Any] | None = None) -> None:
        """A finding the engine-log tracker built (a Python exception with its last frame)."""
        f = self._finding((rule.id, details.get("signature", title)), category=rule.category,
                          severity=rule.severity, title=title, meaning=rule.meaning, check=rule.check, tier=rule.tier)
        if f is None:
            return
        self._add(f, line, None)
        for k, v in details.items():
            if k != "signature":
                f.details[k] = v
        if victim:
            f.add_victim(victim)

    def _unclassified(self, line: LogLine, plan: Plan) -> None:
        """An error-level line no rule knows (the caller checked the level): one finding per normalised text."""
        dev = plan.dev
        norm = plan.once("norm", _normalise, plan.message)
        key = ("unclassified", norm)
        if key not in self.findings:
            if self.catchall >= MAX_CATCHALL:
                return
            self.catchall += 1
        f = self._finding(key, category="other", severity="warning", title=f"unclassified error: {norm[:160]}",
                          meaning="an error-level kernel line no pattern knows", check="read it in context",
                          tier=OTHER)
        if f is not None:
            self._add(f, line, dev)

    # --- output -----------------------------------------------------------------------------
    def finish(self, lines: int | None = None) -> Report:
        for pid, ctx in list(self.oom_pending.items()):
            # constraint line seen, kill line lost (rate limit or trimmed log)
            self._oom_victim(ctx["line"], ctx["process"], int(pid), ctx, {}, "Out of memory")
        self.oom_pending.clear()
        self.tracebacks.close()
        report = Report(source=self.source, lines=lines if lines is not None else self.lines,
                        findings=list(self.findings.values()), notes=list(self.notes))
        if self.dropped:
            report.notes.append(f"{self.dropped} more distinct events were not kept (over {MAX_FINDINGS})")
        if self.lines and not self.stamped:
            report.notes.append("the log has no timestamps: findings cannot be placed in time")
        return report


def analyze_text(text: str, source: str = "", snapshot: dict[str, Any] | None = None) -> Report:
    """Findings for one log's text (any of the formats logline knows), plus residual VRAM if given."""
    a = Analyzer(source)
    for raw in text.splitlines():
        a.feed(raw)
    report = a.finish()
    if snapshot:
        add_snapshot(report, snapshot, source)
    return report


def add_snapshot(report: Report, snapshot: dict[str, Any], source: str = "") -> None:
    _name_engines(report, snapshot)
    report.findings.extend(residual_findings(snapshot, source))


def _name_engines(report: Report, snapshot: dict[str, Any]) -> None:
    """Mark victims that were supervised engines, so "4 processes" reads as "engines e0..e3"."""
    by_pid = {e.get("pid"): e.get("name") for e in snapshot.get("engines", []) or []
              if isinstance(e, dict) and e.get("pid")}
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
        if not isinstance(r, dict):
            continue
        holders = [h for h in r.get("holders") or [] if isinstance(h, dict)]
        if not (r.get("significant") or holders):
            continue
        gpu = r.get("gpu_index")
        amount = r.get("residual")
        who = ", ".join(
            f"{h.get('command') or '?'}[{h.get('pid')}] ({h.get('reason')})" for h in holders[:6]) or "no live holder"
        f = Finding(rule="snapshot.residual_vram", category="residual-vram",
                    severity="error" if r.get("significant") else "warning",
                    title=f"GPU {gpu}: {fmt_bytes(amount) if isinstance(amount, int) else 'unknown'} residual VRAM, "
                          f"held by {who}",
                    signature=str(gpu), source=source or "snapshot", tier=CAUSE,
                    meaning="VRAM used on the device that no live process accounts for (minus the idle baseline)",
                    check="`gpuwarden purge` removes the holders; ownerless leaks need a reset (`gpuwarden reset`)",
                    count=1, devices=[f"gpu{gpu}"],
                    victims=[{"process": h.get("command"), "pid": h.get("pid"), "reason": h.get("reason"),
                              "vram": h.get("vram_bytes")} for h in holders[:64]],
                    details={"device_used": r.get("device_used"), "accounted": r.get("accounted"),
                             "baseline": r.get("baseline"), "residual": amount})
        out.append(f)
    return out
