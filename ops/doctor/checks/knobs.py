"""Options and variables that do nothing: module options for amdgpu/amdkfd/kfd/ttm, and runtime environment variables.

module-options reads /etc/modprobe.d/*.conf and the kernel command line and compares each option with the parameters
the module registers (/sys/module/<m>/parameters, else the source list in ops/knowledge/knobs.toml) and with the kernel
log's "unknown parameter ... ignored" lines; runtime-env compares the node config's engine env with the variables ROCr,
HIP (clr) and libhsakmt read. Each option or variable that does nothing is named with the catalog entry that says why.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Any

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.knowledge import knobs as knobdata
from gpuwarden.ops.doctor.model import Result, passed, skip, unknown, warn
from gpuwarden.ops.doctor.node import cmdline, is_live_proc, node_config
from gpuwarden.ops.doctor.probe import CheckIO

MODULES = ("amdgpu", "amdkfd", "kfd", "ttm")
# kernel/module/main.c unknown_module_param_cb: "<module>: unknown parameter '<name>' ignored"
_UNKNOWN = re.compile(r"\b(?P<module>[\w-]+): unknown parameter '(?P<param>[^']+)' ignored")
DMESG_TIMEOUT_S = 3.0


def _norm(name: str) -> str:
    # modprobe and the kernel's parameter parser treat '-' and '_' alike in module and parameter names
    return name.replace("-", "_")


@dataclass
class Option:
    module: str
    param: str
    value: str | None
    where: str  # "/etc/modprobe.d/x.conf:3", "kernel command line", "kernel log"
    status: str = "unverified"  # real | no-effect | unknown-parameter | no-module | unverified
    entry: str | None = None
    why: str = ""
    logged: bool = False  # the kernel log says it was ignored

    def shown(self) -> str:
        return f"{self.module}.{self.param}" + ("" if self.value is None else f"={self.value}")

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "param": self.param, "value": self.value, "where": self.where,
                "status": self.status, "entry": self.entry, "why": self.why, "ignored_in_kernel_log": self.logged}


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """modprobe.d lines with comments dropped and backslash continuations joined: (first line number, text)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            out.append((start, pending.strip()))
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def modprobe_options(io: CheckIO) -> list[Option]:
    """Every `options <module> ...` of the modules we judge in /etc/modprobe.d/*.conf, in file order."""
    out: list[Option] = []
    for name in io.listdir("etc", "modprobe.d"):
        if not name.endswith(".conf"):
            continue  # modprobe reads only *.conf there
        rel = f"modprobe.d/{name}"
        for n, line in _logical_lines(io.text("etc", rel) or ""):
            words = line.split()
            if len(words) < 3 or words[0] != "options" or _norm(words[1]) not in MODULES:
                continue
            for word in words[2:]:
                param, eq, value = word.partition("=")
                out.append(Option(_norm(words[1]), _norm(param), value if eq else None, f"/etc/{rel}:{n}"))
    return out


def cmdline_options(io: CheckIO) -> list[Option]:
    out = []
    for arg in cmdline(io):
        key, eq, value = arg.partition("=")
        module, dot, param = key.partition(".")
        if dot and _norm(module) in MODULES and param:
            out.append(Option(_norm(module), _norm(param), value if eq else None, "kernel command line"))
    return out


def kernel_log(io: CheckIO) -> tuple[str | None, str]:
    """The kernel log's text and where it came from: a file the caller named (a bundle, a test), else `dmesg` on the
    live node. (None, why) when neither is available."""
    path = io.probe.extra.get("kernel_log")
    if path:
        io.note(str(path))
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read(), str(path)
        except OSError as exc:
            return None, f"{path}: {exc.strerror}"
    if not is_live_proc(io):
        return None, "no kernel log in this tree"
    io.note("dmesg")
    try:
        res = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=DMESG_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"dmesg: {exc}"
    if res.returncode != 0:
        return None, f"dmesg: {res.stderr.strip() or f'exit {res.returncode}'} (kernel.dmesg_restrict?)"
    return res.stdout, "dmesg"


def logged_unknown(text: str) -> set[tuple[str, str]]:
    return {(_norm(m["module"]), _norm(m["param"])) for m in _UNKNOWN.finditer(text)
            if _norm(m["module"]) in MODULES}


def _judge(io: CheckIO, opt: Option, kb: knobdata.Knobs) -> None:
    absent = kb.absent_modules.get(opt.module)
    if absent and not io.exists("gpu", f"module/{opt.module}"):
        opt.status, opt.entry = "no-module", kb.param_myths.get((opt.module, opt.param), absent["entry"])
        amdgpu = _params(io, "amdgpu", kb)[0]
        hint = f"; amdgpu has {opt.param}: set amdgpu.{opt.param}" if amdgpu and opt.param in amdgpu else ""
        opt.why = f"no module '{opt.module}' on this kernel ({absent['why']}){hint}"
        return
    params, source = _params(io, opt.module, kb)
    if params is None:
        opt.why = f"{opt.module} is not loaded and gpuwarden carries no parameter list for it"
        return
    if opt.param not in params:
        opt.status = "unknown-parameter"
        opt.entry = kb.param_myths.get((opt.module, opt.param), "module-unknown-parameter-ignored")
        opt.why = f"{opt.module} has no parameter '{opt.param}' ({source})"
        return
    noop = kb.noop.get((opt.module, opt.param, opt.value or ""))
    if noop:
        opt.status, opt.entry, opt.why = "no-effect", noop["entry"], noop["why"]
        return
    opt.status, opt.why = "real", f"a parameter of {opt.module} ({source})"


def _params(io: CheckIO, module: str, kb: knobdata.Knobs) -> tuple[frozenset[str] | None, str]:
    """The parameters `module` has: the loaded module's sysfs directory, else the source list gpuwarden carries."""
    listed = kb.module_params(module)
    if io.exists("gpu", f"module/{module}/parameters"):
        loaded = frozenset(io.listdir("gpu", f"module/{module}/parameters"))
        # a parameter registered with permission 0 has no sysfs file; the source list still knows it
        return loaded | (listed or frozenset()), f"/sys/module/{module}/parameters of the loaded module"
    if listed is not None:
        return listed, f"{module} is not loaded: the source list of {kb.modules[module]['version']}"
    return None, ""


def check_module_options(io: CheckIO) -> Result:
    kb = knobdata.load()
    options = modprobe_options(io) + cmdline_options(io)
    log, log_source = kernel_log(io)
    logged = logged_unknown(log) if log else set()
    for opt in options:
        _judge(io, opt, kb)
        if (opt.module, opt.param) in logged:
            opt.logged = True
            if opt.status in ("real", "unverified"):  # the running kernel's word beats a list
                opt.status, opt.entry = "unknown-parameter", "module-unknown-parameter-ignored"
                opt.why = f"the kernel log says {opt.module} ignored it"
    seen = {(o.module, o.param) for o in options}
    for module, param in sorted(logged - seen):  # set where this check does not read (initramfs, /usr/lib/...)
        options.append(Option(module, param, None, f"kernel log ({log_source})", "unknown-parameter",
                              kb.param_myths.get((module, param), "module-unknown-parameter-ignored"),
                              f"{module} ignored it at load; the option is set somewhere outside /etc/modprobe.d",
                              logged=True))
    details: dict[str, Any] = {"options": [o.to_dict() for o in options], "kernel_log": log_source if log else None,
                               "kernel_log_unreadable": None if log else log_source}
    if not options:
        return passed("no options for amdgpu, amdkfd, kfd or ttm in /etc/modprobe.d/*.conf, on the kernel command "
                      "line or ignored in the kernel log", **details)
    idle = [o for o in options if o.status in ("no-effect", "unknown-parameter", "no-module")]
    if idle:
        listed = "; ".join(f"{o.shown()} ({o.where}: {o.why}; see `gpuwarden known {o.entry}`)" for o in idle)
        places = sorted({o.where for o in idle})
        return warn(f"{len(idle)} of {len(options)} option(s) do nothing: {listed}",
                    f"remove or correct them in {', '.join(places)} (the module must be reloaded, or the node rebooted, "
                    "for a change to apply)",
                    entries=sorted({o.entry for o in idle if o.entry}), **details)
    unverified = [o for o in options if o.status == "unverified"]
    real = ", ".join(o.shown() for o in options if o.status == "real")
    if unverified:
        return unknown(f"cannot tell whether {', '.join(o.shown() for o in unverified)} exist: "
                       f"{unverified[0].why}" + (f"; real: {real}" if real else ""),
                       "load the module and run the check again", **details)
    return passed(f"every option names a real parameter: {real}", **details)


@dataclass
class _Var:
    engine: str
    name: str
    entry: str
    why: str


def unread_vars(names: list[str], kb: knobdata.Knobs | None = None) -> list[tuple[str, str, str]]:
    """(name, catalog entry, why) for each name in the runtimes' namespaces that none of them reads."""
    kb = kb or knobdata.load()
    out = []
    for name in names:
        if not kb.judged(name) or kb.reader_of(name):
            continue
        if name in kb.env_myths:
            out.append((name, kb.env_myths[name], "a variable write-ups recommend that no runtime reads"))
        else:
            out.append((name, "runtime-env-unread",
                        f"not read by {', '.join(sorted(kb.runtimes))} (lists in ops/knowledge/knobs.toml)"))
    return out


def check_runtime_env(io: CheckIO) -> Result:
    try:
        cfg = node_config(io)
    except GpuwardenError as exc:
        return unknown(f"the node config does not load: {exc.message}", exc.hint or "gpuwarden config check")
    if cfg is None or not cfg.engines:
        return skip("no node config with engines: no engine environment to check")
    kb = knobdata.load()
    found: list[_Var] = []
    judged = 0
    for engine in cfg.engines:
        names = sorted(engine.env)
        judged += sum(1 for n in names if kb.judged(n))
        found += [_Var(engine.name, n, entry, why) for n, entry, why in unread_vars(names, kb)]
    details = {"unread": [{"engine": v.engine, "name": v.name, "entry": v.entry, "why": v.why} for v in found],
               "judged": judged, "sources": {k: v["source"] for k, v in kb.runtimes.items()}}
    if found:
        listed = "; ".join(f"{v.name} in engine {v.engine} ({v.why}; see `gpuwarden known {v.entry}`)" for v in found)
        return warn(f"{len(found)} engine variable(s) do nothing: {listed}",
                    f"remove them from the engines' env in {io.settings.config_path}",
                    entries=sorted({v.entry for v in found}), **details)
    if not judged:
        return passed("no engine sets a ROCm runtime variable (HSA_*, HIP_*, ROCR_*, AMD_*, GPU_*, ROC_*)", **details)
    return passed(f"every ROCm runtime variable the engines set ({judged}) is read by ROCr, HIP or libhsakmt",
                  **details)
